"""Batched inference in torch, shared by the trainer, evaluate, predict, export and the
eager serving backend (the numpy half, samples, padding, length bucketing and softmax, is
:mod:`xdpx.batching`, re-exported here).

One code path computes validation scores during training and in ``evaluate``,
so the dev score evaluate reports equals the best one logged in training.

A *sample* is one model input: an int array of token ids for a single-text
model, or a tuple ``(input_ids, input_ids2)`` of two arrays for a pair model
(``xdpx.models.input_names``). A batch of samples pads into one ``[batch,
seq_len]`` tensor, or into a tuple of tensors (one per input, each padded to
its own width), and the model is called as ``model(*inputs)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from xdpx.batching import Sample, as_samples, format_probs, pad_ids, probs_from_logits
from xdpx.data.shards import sample_lengths

__all__ = [
    "Sample",
    "Batch",
    "as_samples",
    "pad_batch",
    "to_device",
    "call_model",
    "predict_logits",
    "predict_probs",
    "predict_logits_sharded",
    "probs_from_logits",
    "format_probs",
]

#: One padded batch: ``[batch, seq_len]``, or one such tensor per model input.
Batch = torch.Tensor | tuple[torch.Tensor, ...]


def pad_batch(seqs: Sequence[Sample], pad_id: int = 0, min_len: int = 1) -> Batch:
    """:func:`xdpx.batching.pad_ids` as torch tensors: ``[batch, max(longest, min_len)]``
    int64 (a tuple of them, one per input, for pair samples)."""
    x = pad_ids(seqs, pad_id, min_len)
    return tuple(torch.from_numpy(t) for t in x) if isinstance(x, tuple) else torch.from_numpy(x)


def to_device(x: Batch, device: str | torch.device) -> Batch:
    """Move a padded batch (a tensor or a tuple of tensors) to ``device``."""
    if isinstance(x, tuple):
        return tuple(t.to(device) for t in x)
    return x.to(device)


def call_model(model: nn.Module, x: Batch) -> torch.Tensor:
    """``model(*x)`` for a tuple batch (pair models), ``model(x)`` for a tensor."""
    return model(*x) if isinstance(x, tuple) else model(x)


@torch.no_grad()
def predict_logits(
    model: nn.Module,
    seqs: Sequence[Sample],
    batch_size: int = 256,
    pad_id: int = 0,
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """Logits for every sample, in input order, with the model in eval mode.

    A model whose padding is masked out (``model.length_sorted_inference``: the transformers
    of :mod:`xdpx.models.hf`) is run on the samples sorted by length, so each batch pads to
    about its own texts' length (a 2-3x saving on skewed lengths); the rows are put back in
    input order. Other models (a CNN max-pools over its padding) keep input-order batches.

    Returns:
        ``[n, num_labels]`` float32 array.

    Raises:
        ValueError: ``seqs`` is empty.
    """
    if not len(seqs):
        raise ValueError("predict_logits got no sequences")
    was_training = model.training
    model.eval()
    min_len = model.min_len
    order = np.arange(len(seqs))
    if model.length_sorted_inference:
        order = np.argsort(sample_lengths(list(seqs)), kind="stable")
    chunks = []
    for i in range(0, len(seqs), batch_size):
        batch = [seqs[j] for j in order[i : i + batch_size]]
        x = to_device(pad_batch(batch, pad_id, min_len), device)
        chunks.append(call_model(model, x).float().cpu().numpy())
    model.train(was_training)
    out = np.empty((len(seqs), chunks[0].shape[1]), dtype=np.float32)
    out[order] = np.concatenate(chunks)
    return out


def predict_probs(
    model: nn.Module,
    seqs: Sequence[Sample],
    batch_size: int = 256,
    pad_id: int = 0,
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """Softmax probabilities ``[n, num_labels]`` (float64, rows sum to 1)."""
    return probs_from_logits(predict_logits(model, seqs, batch_size, pad_id, device))


def predict_logits_sharded(
    model: nn.Module,
    seqs: Sequence[Sample],
    batch_size: int,
    pad_id: int,
    device: str | torch.device,
    rank: int,
    world_size: int,
) -> np.ndarray:
    """:func:`predict_logits` under ``torch.distributed``: rank ``r`` scores every
    ``world_size``-th sample from ``r`` and the logits are gathered, so every rank returns
    the same ``[n, num_labels]`` array (float64 under DDP). ``world_size == 1``: plain
    ``predict_logits``. Probabilities: :func:`probs_from_logits` of it (row by row, so the
    same as gathering each rank's probabilities)."""
    if world_size == 1:
        return predict_logits(model, seqs, batch_size, pad_id, device)
    import torch.distributed as dist

    idx = np.arange(rank, len(seqs), world_size)
    local = (
        predict_logits(model, [seqs[i] for i in idx], batch_size, pad_id, device)
        if len(idx)
        else None
    )
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, (idx, local))
    num_labels = next(p.shape[1] for _, p in gathered if p is not None)
    out = np.zeros((len(seqs), num_labels))
    for i, p in gathered:
        if p is not None:
            out[i] = p
    return out
