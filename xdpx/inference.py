"""Batching and batched inference shared by the trainer, evaluate, predict, export and serve.

One code path computes validation scores during training and in ``evaluate``,
so the dev score evaluate reports equals the best one logged in training.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

__all__ = ["pad_batch", "predict_logits", "predict_probs", "format_probs"]


def pad_batch(seqs: Sequence[np.ndarray], pad_id: int = 0, min_len: int = 1) -> torch.Tensor:
    """Right-pad variable-length id sequences into one tensor.

    Args:
        seqs: ``batch`` int arrays of token ids.
        pad_id: id used for padding.
        min_len: pad to at least this length (e.g. TextCNN's widest filter).

    Returns:
        ``[batch, max(max_len_in_batch, min_len)]`` int64 tensor.
    """
    width = max([len(s) for s in seqs] + [min_len])
    out = np.full((len(seqs), width), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return torch.from_numpy(out)


@torch.no_grad()
def predict_logits(
    model: nn.Module,
    seqs: Sequence[np.ndarray],
    batch_size: int = 256,
    pad_id: int = 0,
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """Logits for every sequence, in input order, with the model in eval mode.

    Returns:
        ``[n, num_labels]`` float32 array.
    """
    was_training = model.training
    model.eval()
    min_len = getattr(model, "min_len", 1)
    chunks = []
    for i in range(0, len(seqs), batch_size):
        x = pad_batch(seqs[i : i + batch_size], pad_id, min_len).to(device)
        chunks.append(model(x).float().cpu().numpy())
    model.train(was_training)
    if not chunks:
        raise ValueError("predict_logits got no sequences")
    return np.concatenate(chunks)


def predict_probs(
    model: nn.Module,
    seqs: Sequence[np.ndarray],
    batch_size: int = 256,
    pad_id: int = 0,
    device: str | torch.device = "cpu",
) -> np.ndarray:
    """Softmax probabilities ``[n, num_labels]`` (float64, rows sum to 1)."""
    logits = predict_logits(model, seqs, batch_size, pad_id, device).astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    e = np.exp(logits)
    return e / e.sum(axis=1, keepdims=True)


def format_probs(probs: Sequence[float]) -> list[str]:
    """Probabilities as the TSV fields ``predict`` and ``serve`` print (6 decimals)."""
    return [f"{x:.6f}" for x in probs]
