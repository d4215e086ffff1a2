"""The shared runtime, the lowest room: plumbing that every other room may use and that imports nothing else of seed
(tests/test_contracts.py: LAYERS).

  supervised_thread.py  threads whose death the learner's watchdog sees, whichever room started them; test faults
  host_memory.py        freed host memory kept for reuse by a CPU learner (two mallopt settings)
  checkpoint.py         rotated checkpoint files, written atomically, read with torch.load(weights_only=True)
  cuda_graphs.py        the process's CUDA-graph lock: captures exclusive, replays and eager CUDA work shared
  quick_exit.py         entry points skip the garbage collector's walk over torch's objects at exit
"""
