"""--training_devices: data-parallel training, one training process (a rank) per device under torch.distributed.

    learner ("batch", slot) --> rank 0 (the training process, seed/training/process.py) --("batch", slot)--> rank k
                                  |  every rank reads the whole slot (shared memory) and trains on its own
                                  |  1/N of the batch's columns (the B dimension of time-major [T, B] tensors)
                                  +--- gradients: one flattened all_reduce (sum / N) after each backward ---+
    rank 0 publishes parameters and answers the learner (checkpoints); ranks 1..N-1 only train.

Gradients are averaged by hand (one all_reduce of every gradient flattened into one buffer, then divided by N)
rather than by wrapping the network in DistributedDataParallel: equivalent for the averaged gradient, and it
leaves `agent.network` (its state dict's names, R2D2's several forward passes before one backward) as it is.
Every rank then clips and steps the same averaged gradient from the same parameters, so the parameters stay
identical; `check_in_sync` compares a checksum of them across ranks every `SYNC_CHECK_EVERY` updates.

Loss scaling: each agent's loss is a mean over the batch's columns (V-trace and PPO: over [T, b] elements;
R2D2: over sequences of importance-weighted TD sums), so the mean of the ranks' losses over equal shares is the
whole batch's loss, and the averaged gradient its gradient. Shares of unequal size (a PPO minibatch of an odd
number of columns) scale each rank's loss by its share of the columns (`Shard.loss_scale`). What is not a mean
over columns is computed on the whole batch on every rank: the policy-lag check, and PPO's advantage
normalisation over each minibatch (the whole minibatch's, then sharded); the policy-lag drop is decided on the
largest lag any rank saw (`Shard.agreed_lag`), so every rank drops or trains a batch alike. Logged loss metrics are
rank 0's share's; gradient_norm is the averaged gradient's (the whole batch's).
R2D2: each rank computes its sequences' priorities; rank 0 gathers them in batch order (`gather_columns`).
An agent whose loss is a mean over something else passes its own scale (MuZero: over the trained starts of its
sequences, which padding makes unequal between equal column shares).

Batch norm: a network's BatchNorm layers in training mode normalise with their batch's statistics, which would be
each rank's share's; `synchronise_batch_norm` (called with every data-parallel update) swaps them for
`SyncedBatchNorm`, whose statistics (and their gradients) are those of every rank's share together (torch's
SyncBatchNorm semantics, which torch implements for GPUs only): the same forward, backward and running statistics
as one trainer's BatchNorm on the whole batch.
"""

from __future__ import annotations

import dataclasses
import datetime

import torch
import torch.distributed as dist
from torch import nn

from seed.contracts.training import TrainingBatch, Unroll

SYNC_CHECK_EVERY = 100  # updates between checks that every rank holds the same parameters


def parse_devices(training_devices: str) -> list[str]:
    """'cuda:0,cuda:1' -> ['cuda:0', 'cuda:1'] ('' -> [])."""
    return [d.strip() for d in training_devices.split(",") if d.strip()]


def backend_for(device: str) -> str:
    """torch.distributed backend: NCCL between CUDA devices, gloo between CPU processes."""
    return "nccl" if device.startswith("cuda") else "gloo"


def init_group(device: str, rank: int, world: int, store: dist.Store, timeout_s: float) -> None:
    """Joins the process group of `world` ranks through `store` (rank 0's TCPStore)."""
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def serve_store(timeout_s: float) -> dist.TCPStore:
    """The learner's rendezvous for the ranks: a TCPStore on 127.0.0.1 at a port the kernel picks (`.port`)."""
    return dist.TCPStore("127.0.0.1", 0, None, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def connect_store(port: int, timeout_s: float) -> dist.TCPStore:
    """A rank's client of the learner's store (`serve_store`)."""
    return dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


@dataclasses.dataclass(frozen=True)
class Shard:
    """This process's place among the data-parallel ranks.

    Attributes:
      rank: this process's rank in [0, world).
      world: ranks training together (N).
    """

    rank: int
    world: int

    def columns(self, count: int) -> torch.Tensor:
        """int64 [~count / N]: the indices of this rank's share of `count` columns (contiguous, in order; the first
        count % N ranks get one more)."""
        return torch.tensor_split(torch.arange(count), self.world)[self.rank]

    def loss_scale(self, share: int, count: int) -> float:
        """Factor on the loss of a share of `share` of `count` columns, so that the ranks' mean of the scaled
        losses is the mean over all `count` columns (1.0 for equal shares)."""
        return share * self.world / count

    def batch(self, batch: TrainingBatch) -> tuple[TrainingBatch, float]:
        """(this rank's share of `batch`'s columns, its loss scale)."""
        count = int(batch.unrolls.env_id.shape[0])
        index = self.columns(count).to(batch.unrolls.env_id.device)
        weights = None if batch.importance_weights is None else batch.importance_weights.index_select(0, index)
        share = TrainingBatch(select_columns(batch.unrolls, index), weights, batch.replay_indices,
                              batch.replay_generations)
        return share, self.loss_scale(len(index), count)

    def all_reduce_gradients(self, parameters: list[torch.nn.Parameter]) -> None:
        """Replaces every gradient with its mean over the ranks: one all_reduce of them flattened. Parameters
        without a gradient (unused by the loss) have none on every rank (the same graph) and are skipped."""
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat /= self.world
        for grad, averaged in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(averaged)

    def agreed_lag(self, lag: int) -> int:
        """The largest policy lag (updates) any rank saw in this batch, on every rank: one all_reduce (MAX).

        Every rank reads the same slot, so this is normally `lag` itself; agreeing on it makes the drop decision
        (--max_policy_lag) the same on every rank, and makes rank 0 report a dropped batch, which frees its slot
        for the next batch, only after every rank has read the slot. Without it a rank behind could read the
        slot's next batch, train where rank 0 dropped, and the ranks' updates would pair up wrongly or hang."""
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        agreed = torch.tensor([lag], dtype=torch.int64, device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        return int(agreed.item())

    def gather_columns(self, values: torch.Tensor, count: int) -> torch.Tensor:
        """Every rank's share of per-column values [share] -> the whole batch's [count] in batch order (every rank
        gets it; the shares must be equal: --batch_size divisible by N)."""
        parts = [torch.empty_like(values) for _ in range(self.world)]
        dist.all_gather(parts, values.contiguous())
        gathered = torch.cat(parts)
        if gathered.shape[0] != count:
            raise ValueError(f"gathered columns: got {gathered.shape[0]}, expected {count} (the batch's)")
        return gathered

    def check_in_sync(self, network: torch.nn.Module, update: int) -> None:
        """Raises RuntimeError if the ranks' parameters differ (a float64 checksum of them, compared exactly)."""
        with torch.no_grad():
            checksum = torch.stack([p.double().sum() for p in network.parameters()]).sum().reshape(1)
        sums = [torch.empty_like(checksum) for _ in range(self.world)]
        dist.all_gather(sums, checksum)
        values = [float(s) for s in sums]
        if len(set(values)) > 1:
            raise RuntimeError(f"data-parallel ranks out of sync after update {update}: parameter checksums "
                               f"{values} by rank, expected all equal")


def select_columns(unrolls: Unroll, index: torch.Tensor) -> Unroll:
    """The columns `index` of a time-major batch: steps [L, B, ...] -> [L, b, ...], initial state and env ids
    [B, ...] -> [b, ...]."""
    return Unroll({k: v.index_select(1, index) for k, v in unrolls.steps.items()},
                  {k: v.index_select(0, index) for k, v in unrolls.initial_state.items()},
                  unrolls.env_id.index_select(0, index))




class _AllReduceSum(torch.autograd.Function):
    """The sum over the ranks, differentiable: the gradient of every rank's input is the sum of the ranks'
    output gradients (each rank's loss depends on every rank's input through the sum)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001 - autograd's signature
        total = x.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        total = grad.clone()
        dist.all_reduce(total)
        return total


def _sum_over_ranks(x: torch.Tensor) -> torch.Tensor:
    return _AllReduceSum.apply(x) if torch.is_grad_enabled() and x.requires_grad else _AllReduceSum.forward(None, x)


class SyncedBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm (1d or 2d: input [N, C, ...]) whose training-mode statistics are those of every rank's input
    together: mean and biased variance over all ranks' N x ... elements of each channel (two all_reduces, the
    second of the centred squares), the running variance updated with the unbiased one, as nn.BatchNorm does on
    the whole batch. In eval mode, or without a process group of several ranks, it is nn.BatchNorm. Every rank
    must run the same layers in the same order (the ranks' graphs are the same)."""

    def _check_input_dim(self, input: torch.Tensor) -> None:  # noqa: A002 - torch's name
        if input.dim() < 2:
            raise ValueError(f"SyncedBatchNorm input: got {input.dim()} dimensions, expected [N, C, ...]")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or not dist.is_initialized() or dist.get_world_size() == 1:
            return super().forward(x)
        dims = [0, *range(2, x.dim())]
        shape = [1, -1] + [1] * (x.dim() - 2)
        count = x.new_full((1,), float(x.numel() // x.shape[1]))
        sums = _sum_over_ranks(torch.cat([x.sum(dims), count]))
        n = sums[-1]
        mean = sums[:-1] / n
        centred = x - mean.view(shape)
        variance = _sum_over_ranks(centred.pow(2).sum(dims)) / n
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked.add_(1)
                factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
                self.running_mean.mul_(1.0 - factor).add_(mean.detach(), alpha=factor)
                self.running_var.mul_(1.0 - factor).add_(variance.detach() * (n / (n - 1)), alpha=factor)
        out = centred * torch.rsqrt(variance + self.eps).view(shape)
        if self.affine:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out


def synchronise_batch_norm(network: nn.Module) -> int:
    """Replaces every nn.BatchNorm1d / 2d of `network` by a SyncedBatchNorm holding the same parameter and buffer
    tensors (the optimizer's parameters, the state dict's names and values stay as they are); returns how many were
    replaced (0 once done)."""
    replaced = 0
    for module in list(network.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, (nn.BatchNorm1d, nn.BatchNorm2d)):
                synced = SyncedBatchNorm(child.num_features, child.eps, child.momentum, child.affine,
                                         child.track_running_stats)
                synced.weight, synced.bias = child.weight, child.bias
                for buffer in ("running_mean", "running_var", "num_batches_tracked"):
                    setattr(synced, buffer, getattr(child, buffer))
                synced.train(child.training)
                setattr(module, name, synced)
                replaced += 1
    return replaced
