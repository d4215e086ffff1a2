"""The actor's side: env loops that stream steps to the learner (gRPC or the shared-memory link), the
`seed-actor` entry point and the actor's throughput statistics."""
