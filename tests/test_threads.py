"""Torch's intra-op threads in the learner's processes (--torch_threads): the automatic choice by core count and
the learner process applying it."""

import os

import torch

from seed.config import torch_threads
from seed.learner.builder import setup_process
from seed.learner.configuration import resolve_config


def test_automatic_threads_are_one_on_small_machines_and_half_the_cores_above():
    assert [torch_threads(0, cores) for cores in (1, 2, 4, 6, 16, 96)] == [1, 1, 1, 3, 8, 48]
    assert torch_threads(3, 2) == 3  # asked for: kept, even above the cores


def test_the_learner_process_sets_the_threads_it_is_given(tmp_path):
    before = torch.get_num_threads()
    try:
        for requested in (0, 2):
            setup_process(resolve_config({"logdir": str(tmp_path), "torch_threads": requested}))
            assert torch.get_num_threads() == torch_threads(requested, os.cpu_count())
    finally:
        torch.set_num_threads(before)
