"""The parameters' version is read under the same lock as the parameters (seed/training/shared_parameters.py): a reader
that comes while the writer (another process: record locks do not exclude threads) is halfway through copying
update v + 1 waits for it, and gets v + 1's tensors labelled v + 1, never v + 1's tensors labelled v (a version
read before the lock) nor half of each.

The window is made reachable by a hook in the writer: it copies the first tensor, says so, and copies the second
only when told, so the reader always arrives mid-copy."""

from __future__ import annotations

import threading

import torch
import torch.multiprocessing as mp

from seed.training.shared_parameters import SharedParameters

OLD, NEW = 4, 5  # versions; every element of version v's tensors is float(v)


def _writer(parameters: SharedParameters, halfway, go) -> None:
    with parameters.writing(NEW, lambda waited_s: None) as tensors:
        tensors["a"].fill_(float(NEW))
        halfway.set()
        if not go.wait(30):
            raise TimeoutError("the test never let the writer finish")
        tensors["b"].fill_(float(NEW))


def test_a_reader_arriving_mid_copy_gets_the_new_tensors_with_the_new_version():
    context = mp.get_context("spawn")
    parameters = SharedParameters({"a": torch.full((64,), float(OLD)), "b": torch.full((64,), float(OLD))}, OLD)
    halfway, go = context.Event(), context.Event()
    writer = context.Process(target=_writer, args=(parameters, halfway, go), daemon=True)
    writer.start()
    try:
        assert halfway.wait(60), "the writer never reached the middle of its copy"
        got = {}

        def read() -> None:
            with parameters.reading(lambda waited_s: None) as (tensors, version):
                got.update(version=version, a=tensors["a"].clone(), b=tensors["b"].clone())

        reader = threading.Thread(target=read)
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and not got, f"the reader did not wait for the writer's lock: {got}"
        go.set()
        reader.join(30)
        assert not reader.is_alive()
    finally:
        go.set()
        writer.join(30)
    assert writer.exitcode == 0
    assert got["version"] == NEW, got["version"]
    assert torch.equal(got["a"], torch.full((64,), float(NEW))) and torch.equal(got["b"], torch.full((64,), float(NEW)))
    parameters.close()
