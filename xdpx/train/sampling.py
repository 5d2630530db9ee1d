"""Data order of training: epoch permutations, update windows, DDP shards, step seeds.

Seeding follows the XDPX FAQ (seeds/000): the order of epoch ``e`` is drawn from
``(seed, e)`` only and the step noise (dropout) of update ``u`` from ``(seed, u)`` (plus the
rank under DDP), so the data order does not depend on ``batch_size``/``update_freq`` as
long as their product is kept, and a resumed run draws what an uninterrupted one draws.

Each update consumes a *window* of ``batch_size * update_freq * world_size`` samples of the
epoch order; rank ``r`` of ``world_size`` takes every ``world_size``-th sample of the window
starting at ``r`` (for full windows the sets ``DistributedSampler`` + batching give). The
order is not padded: the last window of an epoch holds exactly the samples left, so its
shares may differ by one (or be empty), and no sample is seen twice in an epoch.
``DistributedSampler(drop_last=False)`` instead wraps around to a multiple of
``world_size``; that is needed when each rank averages its own loss, not here, where every
rank divides its summed loss by the window's samples per rank (``xdpx.train.trainer``), so the
update equals single-process training on the same window.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# the epoch order and its length grouping live with the other batching helpers (data/lazy.py
# reads them too); re-exported here for the trainer
from xdpx.batching import MEGABATCH_WINDOWS, epoch_order, length_grouped, shard_epoch_order

__all__ = [
    "MEGABATCH_WINDOWS",
    "epoch_order",
    "length_grouped",
    "shard_epoch_order",
    "rank_share",
    "update_seed",
    "total_updates",
    "place",
    "micro_batches",
]


def rank_share(window: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s samples of an update window: every ``world_size``-th sample starting
    at ``rank`` (``DistributedSampler``'s split of a full window; unpadded: see the module
    docstring). The window itself comes from the epoch order (``xdpx.data.lazy``)."""
    return window[rank::world_size]


def update_seed(seed: int, num_updates: int, rank: int = 0) -> int:
    """Seed of the step noise (dropout) of update ``num_updates`` (FAQ: by seed and num_updates).

    Under DDP the rank is mixed in so ranks draw different dropout masks; rank 0
    draws what a single process would.
    """
    entropy = [seed, num_updates] + ([rank] if rank else [])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def total_updates(epoch_len: int, window_size: int, cfg: Any) -> int:
    """Updates the run makes: the smallest of ``max_epoch`` epochs of ``epoch_len`` samples,
    ``max_update`` and ``max_samples`` (in whole windows of ``window_size``)."""
    budgets = [cfg.max_epoch * math.ceil(epoch_len / window_size)]
    if cfg.max_update is not None:
        budgets.append(cfg.max_update)
    if cfg.max_samples is not None:
        budgets.append(math.ceil(cfg.max_samples / window_size))
    return min(budgets)


def place(model: Any, cfg: Any) -> tuple[Any, Any, Any, int, int]:
    """Put ``model`` on ``cfg.device`` (``auto``: CUDA when available) and, under an
    initialised ``torch.distributed`` process group, wrap it in ``DistributedDataParallel``,
    or in :class:`xdpx.train.ddp.SparseGradDDP` when its tables get sparse gradients
    (``model.sparse_grad``, set by :func:`xdpx.train.ddp.set_sparse_grad`), which DDP's
    reducer cannot bucket.

    Returns:
        ``(module, model, device, world_size, rank)``: the bare module and the one to train.

    Raises:
        ValueError: ``auto_ga`` under DDP (one rank cannot change its micro-batch alone).
    """
    import torch
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    world_size = dist.get_world_size() if distributed else 1
    rank = dist.get_rank() if distributed else 0
    if cfg.auto_ga and world_size > 1:
        raise ValueError("train.auto_ga works in a single process only (not under DDP)")
    from xdpx.train.ddp import SparseGradDDP, set_sparse_grad

    set_sparse_grad(model, cfg)  # sparse tables need SparseGradDDP instead of DDP
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    module = model.to(device)
    wrapped = module
    if world_size > 1 and module.sparse_grad:
        wrapped = SparseGradDDP(module)
    elif world_size > 1:
        wrapped = torch.nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if use_cuda else None
        )
    return module, wrapped, device, world_size, rank


def micro_batches(local: np.ndarray, micro_batch_size: int) -> list[np.ndarray]:
    """``local`` (one rank's share of a window) cut into micro-batches of ``micro_batch_size``."""
    return [local[i : i + micro_batch_size] for i in range(0, len(local), micro_batch_size)]
