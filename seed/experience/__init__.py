"""From inference steps to training batches: the unroll store, the FIFO queue or the prioritized
replay, and Priority Refresh."""
