"""Publishing the trained parameters to an inference network without stalling inference.

The training thread `publish`es a snapshot into a staging copy on the inference device and bumps a version;
the inference thread `refresh`es between batches, copying staging into its network in place (so CUDA graphs
that read the network's tensors stay valid). On GPUs both copies are ordered with CUDA events instead of
synchronisation: the inference stream waits for the staged copy, and the next publish waits until inference
has finished reading staging. Neither thread ever waits for the other's kernels on the host. Both take a short
lock around their copy; on the CPU the copy itself runs under it, so there a publish and a refresh do wait for
each other's copy of the parameters.
"""

from __future__ import annotations

import threading

import torch


def copy_tensors(targets: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """targets[i] <- sources[i]: one multi-tensor copy when each pair shares a device, else tensor by tensor
    (asynchronous only where the memory allows it: a copy into pageable host memory completes before it returns)."""
    if all(s.device == t.device for s, t in zip(sources, targets, strict=True)):
        torch._foreach_copy_(targets, sources, non_blocking=True)
    else:
        for t, s in zip(targets, sources, strict=True):
            t.copy_(s, non_blocking=True)


class ParameterPublisher:
    """Args:
      network: the inference network (its state-dict tensors are updated in place).
      device: its device.
      version: the policy version the network holds now (the learner's train_steps: 0, or a resumed count).
    """

    def __init__(self, network: torch.nn.Module, device: torch.device, version: int = 0):
        state = network.state_dict()
        self.names = list(state)
        self.targets = [state[name] for name in self.names]
        self.staging = [torch.empty_like(t) for t in self.targets]
        self.cuda = device.type == "cuda"
        self._lock = threading.Lock()
        self._version = version
        self._applied = version
        self._staged: torch.cuda.Event | None = None
        self._consumed: torch.cuda.Event | None = None

    @property
    def published(self) -> int:
        """The version of the newest snapshot in staging."""
        return self._version

    @property
    def applied(self) -> int:
        """The version the inference network holds (train_steps when it was published)."""
        return self._applied

    def publish(self, parameters: dict[str, torch.Tensor], version: int | None = None) -> None:
        """Training side: snapshot `parameters` (a state dict on any device) into staging, as `version` (the
        learner's train_steps after the update; default: the previous version + 1)."""
        with torch.no_grad(), self._lock:
            if self.cuda and self._consumed is not None:
                torch.cuda.current_stream(self.targets[0].device).wait_event(self._consumed)
            copy_tensors(self.staging, [parameters[name] for name in self.names])
            if self.cuda:
                self._staged = torch.cuda.Event()
                self._staged.record(torch.cuda.current_stream(self.targets[0].device))
            self._version = self._version + 1 if version is None else version

    def read(self, targets: dict[str, torch.Tensor], newer_than: int) -> int:
        """A second reader (the priority refresher): copies the newest published snapshot into `targets` (a
        state dict of the same names, any device) if its version is above `newer_than`; returns the version
        `targets` now hold. The copy runs under the publish lock and is complete on return."""
        if self._version <= newer_than:  # also before the first publish, when staging holds nothing yet
            return newer_than
        with torch.no_grad(), self._lock:
            if self.cuda:
                torch.cuda.current_stream(self.targets[0].device).wait_event(self._staged)
            copy_tensors([targets[name] for name in self.names], self.staging)
            # The next publish overwrites staging as soon as the lock is free: finish reading it first.
            for device in {t.device for t in [*self.staging, *targets.values()] if t.is_cuda}:
                torch.cuda.synchronize(device)
            return self._version

    def refresh(self) -> bool:
        """Inference side, between batches: applies the newest snapshot if there is one; whether it did."""
        if self._version == self._applied:
            return False
        with torch.no_grad(), self._lock:
            if self.cuda:
                torch.cuda.current_stream(self.targets[0].device).wait_event(self._staged)
            copy_tensors(self.targets, self.staging)
            if self.cuda:
                self._consumed = torch.cuda.Event()
                self._consumed.record(torch.cuda.current_stream(self.targets[0].device))
            self._applied = self._version
        return True
