"""Batching and batched inference shared by the trainer, evaluate, predict, export and serve.

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

#: One model input: ids of one text, or ``(input_ids, input_ids2)`` of a pair.
Sample = np.ndarray | tuple[np.ndarray, ...]
#: One padded batch: ``[batch, seq_len]``, or one such tensor per model input.
Batch = torch.Tensor | tuple[torch.Tensor, ...]


def as_samples(
    input_ids: Sequence[np.ndarray], input_ids2: Sequence[np.ndarray] | None = None
) -> list[Sample]:
    """Samples from the columns of a split (``SplitData``) or an encoder's output.

    Args:
        input_ids: ``n`` id arrays.
        input_ids2: ``n`` second-text id arrays of a separately encoded pair task, or None.

    Returns:
        ``input_ids`` itself (as a list) when ``input_ids2`` is None, else ``n``
        tuples ``(input_ids[i], input_ids2[i])``.

    Raises:
        ValueError: the two columns differ in length.
    """
    if input_ids2 is None:
        return list(input_ids)
    if len(input_ids2) != len(input_ids):
        raise ValueError(
            f"input_ids ({len(input_ids)}) and input_ids2 ({len(input_ids2)}) differ in length"
        )
    return list(zip(input_ids, input_ids2, strict=True))


def _pad(seqs: Sequence[np.ndarray], pad_id: int, min_len: int) -> torch.Tensor:
    width = max([len(s) for s in seqs] + [min_len])
    out = np.full((len(seqs), width), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return torch.from_numpy(out)


def pad_batch(seqs: Sequence[Sample], pad_id: int = 0, min_len: int = 1) -> Batch:
    """Right-pad variable-length id sequences into one tensor (a tuple of tensors for pairs).

    Args:
        seqs: ``batch`` samples: int arrays of token ids, or tuples of them (pairs).
        pad_id: id used for padding.
        min_len: pad to at least this length (e.g. TextCNN's widest filter); for
            pairs, each input is padded to at least this length.

    Returns:
        ``[batch, max(max_len_in_batch, min_len)]`` int64 tensor; for tuple samples,
        a tuple with one such tensor per input, each as wide as its own longest row.
    """
    if len(seqs) and isinstance(seqs[0], tuple):
        return tuple(_pad([s[k] for s in seqs], pad_id, min_len) for k in range(len(seqs[0])))
    return _pad(seqs, pad_id, min_len)  # type: ignore[arg-type]


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
    min_len = getattr(model, "min_len", 1)
    order = np.arange(len(seqs))
    if getattr(model, "length_sorted_inference", False):
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


def probs_from_logits(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``[n, num_labels]`` logits, in float64 (rows sum to 1)."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def format_probs(probs: Sequence[float]) -> list[str]:
    """Probabilities as the TSV fields ``predict`` and ``serve`` print (6 decimals)."""
    return [f"{x:.6f}" for x in probs]
