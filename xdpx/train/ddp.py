"""Data parallelism for models whose tables get sparse gradients (``optimizer: lazy_adamw``:
``ngram_lr``, ``match_ngram``), where ``DistributedDataParallel``'s reducer cannot bucket a
sparse gradient (``NotImplementedError: Cannot access storage of SparseTensorImpl``).

:class:`SparseGradDDP` takes DDP's place for them. Backward runs locally (every micro-batch
of the window, as under ``no_sync``); then :meth:`SparseGradDDP.sync_gradients` makes every
rank's gradients the mean over ranks, as DDP's all-reduce does:

* a sparse gradient (``[rows, dim]`` table, ``nnz`` touched rows on this rank) is coalesced
  and its ``(indices, values)`` all-gathered from every rank (padded to the largest ``nnz``),
  concatenated and coalesced again (duplicate rows summed), then divided by the world size.
  Every rank holds the same sparse gradient of only the rows some rank touched, so the lazy
  optimizer updates the rows one process with the global batch would, and costs what the
  batch touches. This is Horovod's sparse allreduce (``allgather`` of ``IndexedSlices``,
  ``horovod/torch/mpi_ops.py: sparse_allreduce_async``) and TensorFlow's ``IndexedSlices``
  aggregation;
* the dense gradients (the bias, any other parameter) are flattened into one buffer and
  all-reduced, as one DDP bucket.

The payload per update is ``world_size * max_nnz * (8 + 4 * dim)`` bytes gathered per rank
against ``rows * dim * 4`` for a dense all-reduce of the table (``bench/ddp_comm.py``).
Rank 0's parameters and buffers are broadcast at construction, as DDP does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["CommStats", "SparseGradDDP", "set_sparse_grad", "sync_gradients", "unwrap"]


@dataclass
class CommStats:
    """Bytes of one :meth:`SparseGradDDP.sync_gradients` call, per rank.

    Attributes:
        sparse_bytes: the all-gathered ``(indices, values)`` of the sparse gradients this rank
            receives (every rank's padded payload, its own included), plus their sizes.
        dense_table_bytes: what a dense all-reduce of the same tables would move per rank
            (their full gradients: ``rows * dim * itemsize``), the baseline.
        dense_bytes: the all-reduced buffer of the dense gradients (bias etc.).
        touched_rows: distinct table rows in the coalesced global gradient.
    """

    sparse_bytes: int = 0
    dense_table_bytes: int = 0
    dense_bytes: int = 0
    touched_rows: int = 0


def set_sparse_grad(module: nn.Module, cfg: Any) -> bool:
    """Switch a model with ``sparse_grad_tables`` (ngram_lr, match_ngram) to sparse gradients
    for them when ``cfg.optimizer`` is ``lazy_adamw`` (the one rule:
    :func:`xdpx.models.uses_sparse_grad`); ``xdpx.train.sampling.place`` calls it before
    choosing DDP or :class:`SparseGradDDP`.

    Returns:
        whether the model's tables now get sparse gradients.
    """
    from xdpx.models import uses_sparse_grad

    sparse = uses_sparse_grad(module, cfg.optimizer)
    if sparse:
        module.sparse_grad = True
    return sparse


def sync_gradients(model: nn.Module) -> CommStats | None:
    """:meth:`SparseGradDDP.sync_gradients` when ``model`` is one (the trainer calls this once
    per update, after the window's last backward); None for any other model (DDP reduces
    inside the backward pass)."""
    return model.sync_gradients() if isinstance(model, SparseGradDDP) else None


def unwrap(model: nn.Module) -> nn.Module:
    """The bare model inside a DDP or :class:`SparseGradDDP` wrapper (else ``model``)."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, SparseGradDDP)):
        return model.module
    return model


class SparseGradDDP(nn.Module):
    """``DistributedDataParallel`` for a model with sparse-gradient tables (see the module
    docstring): forward is the module's; gradients are exchanged by :meth:`sync_gradients`,
    which the trainer calls once per update after the window's last backward.

    Args:
        module: the model, already on its device, with ``sparse_grad`` set.

    Raises:
        RuntimeError: ``torch.distributed`` is not initialised.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("SparseGradDDP needs an initialised torch.distributed group")
        self.module = module
        self.world_size = dist.get_world_size()
        with torch.no_grad():  # every rank starts from rank 0's weights and tables (as DDP)
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)

    def forward(self, *args: Any, **kwargs: Any) -> Any:  # noqa: D102 (the module's)
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """DDP's ``no_sync``: nothing to suspend, gradients are exchanged only by
        :meth:`sync_gradients`."""
        yield

    @torch.no_grad()
    def sync_gradients(self) -> CommStats:
        """Replace every gradient by its mean over the ranks (sparse ones stay sparse and
        coalesced). A parameter without a gradient on every rank keeps none; one that has a
        gradient on some rank only gets zeros for the others (as DDP's unused parameters).

        Returns:
            the :class:`CommStats` of this exchange.
        """
        params = [p for p in self.module.parameters() if p.requires_grad]
        if not params:
            return CommStats()
        # per parameter: 0 no gradient, 1 dense, 2 sparse; the max over ranks says how to join
        kind = [0 if p.grad is None else 2 if p.grad.is_sparse else 1 for p in params]
        kinds = torch.tensor(kind, dtype=torch.int32, device=params[0].device)
        dist.all_reduce(kinds, op=dist.ReduceOp.MAX)
        stats = CommStats()
        dense: list[torch.Tensor] = []
        for p, k in zip(params, kinds.tolist(), strict=True):
            if k == 2:
                grad = p.grad if p.grad is not None else _empty_sparse(p)
                p.grad = self._gather_sparse(grad, stats)
                stats.dense_table_bytes += p.numel() * p.element_size()
            elif k == 1:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dense.append(p.grad)
        if dense:
            flat = torch._utils._flatten_dense_tensors(dense)
            dist.all_reduce(flat)
            flat.div_(self.world_size)
            for g, synced in zip(dense, torch._utils._unflatten_dense_tensors(flat, dense), strict=True):  # fmt: skip
                g.copy_(synced)
            stats.dense_bytes = flat.numel() * flat.element_size()
        return stats

    def _gather_sparse(self, grad: torch.Tensor, stats: CommStats) -> torch.Tensor:
        """All-gather one sparse gradient's rows from every rank; their coalesced sum divided
        by the world size (``[rows, dim]``, sparse)."""
        grad = grad.coalesce()
        indices, values = grad.indices()[0], grad.values()
        device = values.device
        nnz = torch.tensor([indices.numel()], dtype=torch.int64, device=device)
        sizes = [torch.zeros_like(nnz) for _ in range(self.world_size)]
        dist.all_gather(sizes, nnz)
        counts = [int(s) for s in sizes]
        width = max(counts)
        pad = width - indices.numel()
        idx = torch.cat([indices, indices.new_zeros(pad)])
        val = torch.cat([values, values.new_zeros(pad, *values.shape[1:])])
        all_idx = [torch.empty_like(idx) for _ in range(self.world_size)]
        all_val = [torch.empty_like(val) for _ in range(self.world_size)]
        dist.all_gather(all_idx, idx)
        dist.all_gather(all_val, val)
        idx = torch.cat([t[:n] for t, n in zip(all_idx, counts, strict=True)])
        val = torch.cat([t[:n] for t, n in zip(all_val, counts, strict=True)])
        out = torch.sparse_coo_tensor(idx.unsqueeze(0), val, grad.shape, check_invariants=False)
        out = out.coalesce()
        out.values().div_(self.world_size)
        row_bytes = idx.element_size() + math.prod(grad.shape[1:]) * val.element_size()
        stats.sparse_bytes += self.world_size * (width * row_bytes + nnz.element_size())
        stats.touched_rows += out.indices().shape[1]
        return out


def _empty_sparse(p: torch.Tensor) -> torch.Tensor:
    """A sparse gradient of ``p``'s shape with no rows (a rank that touched none)."""
    return torch.sparse_coo_tensor(
        torch.zeros(1, 0, dtype=torch.int64, device=p.device),
        torch.zeros(0, *p.shape[1:], dtype=p.dtype, device=p.device),
        p.shape,
        check_invariants=False,
    )
