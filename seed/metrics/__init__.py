"""Metrics: the learner's counters and rows, finished episodes, and the sinks rows go to (stdout,
metrics.jsonl, TensorBoard, Weights & Biases)."""
