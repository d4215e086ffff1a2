"""Measuring tools, kept apart from the runtime: seed-bench (throughput, latency, CPU use), its baselines
(actor-side inference, transport ceiling), seed-report (cost tables) and their shipped data files."""
