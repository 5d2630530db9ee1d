"""Samples, padding, length bucketing, the epoch order and softmax in numpy: what training,
the data readers, inference and the serving runtime share, without torch (the serving runtime, :mod:`xdpx.serving.runtime`,
imports this module and never torch).

A *sample* is one model input: an int array of token ids for a single-text model, or a
tuple ``(input_ids, input_ids2)`` of two arrays for a pair model (``xdpx.models.input_names``).
:func:`pad_ids` pads a batch of samples into one ``[batch, seq_len]`` int64 array, or a
tuple of arrays (one per input, each as wide as its own longest row);
:func:`xdpx.inference.pad_batch` is the same as torch tensors. Length bucketing has two
forms here: :func:`length_grouped` sorts runs of an epoch's order for training
(``train.group_by_length``), :func:`length_chunks` cuts a serving batch into chunks of
similar length. The epoch order (:func:`epoch_order`, :func:`shard_epoch_order`) is the
trainer's (:mod:`xdpx.train.sampling` re-exports them) and ``xdpx.data.lazy``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = [
    "Sample",
    "as_samples",
    "pad_ids",
    "length_chunks",
    "epoch_order",
    "MEGABATCH_WINDOWS",
    "length_grouped",
    "shard_epoch_order",
    "probs_from_logits",
    "format_probs",
    "window_count",
]

#: One model input: ids of one text, or ``(input_ids, input_ids2)`` of a pair.
Sample = np.ndarray | tuple[np.ndarray, ...]


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


def _pad(seqs: Sequence[np.ndarray], pad_id: int, min_len: int) -> np.ndarray:
    width = max([len(s) for s in seqs] + [min_len])
    out = np.full((len(seqs), width), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def pad_ids(seqs: Sequence[Sample], pad_id: int = 0, min_len: int = 1) -> np.ndarray | tuple[np.ndarray, ...]:  # fmt: skip
    """Right-pad variable-length id sequences into one array (a tuple of arrays for pairs).

    Args:
        seqs: ``batch`` samples: int arrays of token ids, or tuples of them (pairs).
        pad_id: id used for padding.
        min_len: pad to at least this length (e.g. TextCNN's widest filter); for
            pairs, each input is padded to at least this length.

    Returns:
        ``[batch, max(max_len_in_batch, min_len)]`` int64 array; for tuple samples, a tuple
        with one such array per input, each as wide as its own longest row.
    """
    if len(seqs) and isinstance(seqs[0], tuple):
        return tuple(_pad([s[k] for s in seqs], pad_id, min_len) for k in range(len(seqs[0])))
    return _pad(seqs, pad_id, min_len)  # type: ignore[arg-type]


def length_chunks(lengths: Sequence[int], max_padding: float = 0.5) -> list[list[int]]:
    """Indices of a batch, sorted by length and cut into chunks whose padding stays under
    ``max_padding`` of the padded area (``1 - tokens / (rows * longest)``), so a long text
    is batched with texts of its own length.

    Args:
        lengths: ``[n]`` token counts. max_padding: the most padding a chunk may hold.

    Returns:
        Chunks of indices into ``lengths``, shortest texts first; together every index once.
    """
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    chunks: list[list[int]] = []
    chunk: list[int] = []
    tokens = 0
    for i in order:
        n = max(lengths[i], 1)  # sorted: the newcomer is the chunk's longest
        if chunk and 1 - (tokens + n) / ((len(chunk) + 1) * n) > max_padding:
            chunks.append(chunk)
            chunk, tokens = [], 0
        chunk.append(i)
        tokens += n
    if chunk:
        chunks.append(chunk)
    return chunks


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """Permutation of ``range(n)`` for ``epoch``, seeded by ``(seed, epoch)`` only (FAQ: shuffling)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


#: Windows per megabatch of :func:`length_grouped` (``transformers``' LengthGroupedSampler
#: uses megabatches of 50 batches).
MEGABATCH_WINDOWS = 50


def length_grouped(order: np.ndarray, lengths: np.ndarray, megabatch: int) -> np.ndarray:
    """``order`` with each run of ``megabatch`` consecutive ids sorted by length, longest
    first: the windows cut from it hold texts of similar length, so a batch padded to its
    longest text pads little (``train.group_by_length``).

    The grouping of ``transformers``' ``get_length_grouped_indices`` (``group_by_length``):
    a random permutation cut into megabatches of 50 batches, each sorted by decreasing
    length. Which texts an epoch sees is unchanged; only their order within a megabatch.

    Args:
        order: ``[n]`` an epoch permutation (:func:`epoch_order`).
        lengths: ``[n]`` tokens per sample, indexed by sample id (pairs: both sides).
        megabatch: ids per sorted run (``MEGABATCH_WINDOWS`` update windows).
    """
    if megabatch <= 1:
        return order
    runs = [order[i : i + megabatch] for i in range(0, len(order), megabatch)]
    return np.concatenate([r[np.argsort(-lengths[r], kind="stable")] for r in runs])


def shard_epoch_order(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    """Order of the shards in epoch ``epoch`` with ``train.lazy_load``: a permutation drawn
    from ``(seed, epoch)`` (the identity for one shard). The rows inside shard ``s`` follow
    a permutation drawn from ``(seed, epoch, s)`` (:mod:`xdpx.data.lazy`)."""
    if num_shards == 1:
        return np.zeros(1, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(num_shards)


def probs_from_logits(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of ``[n, num_labels]`` logits, in float64 (rows sum to 1)."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def format_probs(probs: Sequence[float]) -> list[str]:
    """Probabilities as the TSV fields ``predict`` and ``serve`` print (6 decimals)."""
    return [f"{x:.6f}" for x in probs]


def window_count(lengths: np.ndarray, window: int, stride: int) -> np.ndarray:
    """Windows per text of ``hf_classifier`` with ``train.window`` (:func:`xdpx.models.hf.
    text_windows`): a text of ``n`` tokens (its two special tokens included) has
    ``L = n - 2`` content tokens and ``1 + max(0, ceil((L - C) / (C - stride)))`` windows,
    ``C = window - 2``.

    Args:
        lengths: ``[n_texts]`` token counts; window, stride: as ``train.window`` and
            ``train.window_stride``.

    Returns:
        ``[n_texts]`` int64 (the encoder's cost per text is about this times one window's).
    """
    c = window - 2
    step = c - stride
    content = np.maximum(np.asarray(lengths, np.int64) - 2, 0)
    return 1 + np.maximum(0, -(-(content - c) // step))
