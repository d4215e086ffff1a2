"""One learner update and where it runs: the update, the optimizers, the training process (and its
liveness and shared parameters), data-parallel ranks."""
