"""The learner's serving path: the gRPC front end in its own process, the shared step slab, the pipes."""
