"""ONNX export of the classifiers, an onnxruntime parity check and a latency comparison.

The graph has one input and one output (names fixed, so serving code never
guesses)::

    input_ids  int64   [batch, seq_len]   token ids, 0 = padding (right-padded)
    logits     float32 [batch, num_labels]

with ``batch`` and ``seq_len`` dynamic. A pair model (``match_esim``,
``siamese``) has a second input ``input_ids2 int64 [batch, seq_len2]`` (its own
dynamic width; ``xdpx.models.input_names`` gives the names in order). The
legacy TorchScript exporter
(``torch.onnx.export(..., dynamo=False)``) is used on purpose: it writes one
self-contained ``.onnx`` file (the dynamo exporter needs ``onnxscript`` and
stores large weights in a separate ``.onnx.data`` file).

Tracing records one path through Python control flow, so a model whose shape
logic depends on the sequence length (n-gram windows) is only
correct for other lengths if the example is long enough to take the general
path; :func:`build_example` pads to :data:`MIN_EXAMPLE_LEN` tokens for that
reason, and :func:`check_parity` runs batches of several sizes and widths to
prove the dynamic axes really work.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from xdpx import io
from xdpx.inference import Batch, Sample, call_model, pad_batch
from xdpx.models import input_names
from xdpx.serving.runtime import OUTPUT_NAME, ort_logits, ort_session

__all__ = [
    "INPUT_NAME",
    "OUTPUT_NAME",
    "DYNAMIC_AXES",
    "dynamic_axes",
    "MIN_EXAMPLE_LEN",
    "ExportParityError",
    "build_example",
    "export_onnx",
    "ort_session",
    "parity_batches",
    "check_parity",
    "measure_latency",
    "quantize_int8",
    "onnx_accuracy",
    "ort_logits",
]

logger = logging.getLogger("xdpx.serving.export")

INPUT_NAME = "input_ids"


def dynamic_axes(names: Sequence[str] = (INPUT_NAME,)) -> dict[str, dict[int, str]]:
    """Dynamic axes of a graph with inputs ``names`` (ONNX ``dim_param`` names).

    Every input gets ``batch`` and its own sequence axis (``seq_len``, ``seq_len2``,
    ...), so the two texts of a pair may have different widths; ``logits`` gets ``batch``.
    """
    axes = {n: {0: "batch", 1: "seq_len" + (str(k + 1) if k else "")} for k, n in enumerate(names)}
    return {**axes, OUTPUT_NAME: {0: "batch"}}


#: Dynamic axes of the single-input graph.
DYNAMIC_AXES: dict[str, dict[int, str]] = dynamic_axes()
#: Width the export example is padded to at least (longer than any n-gram order / filter).
MIN_EXAMPLE_LEN = 8


class ExportParityError(RuntimeError):
    """onnxruntime logits differ from eager PyTorch logits by more than the tolerance."""


def build_example(
    seqs: Sequence[Sample], min_len: int = 1, pad_id: int = 0, batch: int = 2
) -> Batch:
    """The tracing example: the first ``batch`` samples, right-padded.

    Args:
        seqs: token id arrays, or ``(input_ids, input_ids2)`` tuples (at least one).
        min_len: the model's ``min_len``; the example is at least
            ``max(min_len, MIN_EXAMPLE_LEN)`` wide so every length-dependent branch
            takes its general path while tracing.
        pad_id: padding id.
        batch: number of rows (batch 2 keeps the batch axis from being
            specialised to 1 anywhere in the trace).

    Returns:
        ``[batch, width]`` int64 tensor (rows repeat when ``len(seqs) < batch``); a
        tuple of such tensors for pair samples.

    Raises:
        ValueError: ``seqs`` is empty.
    """
    if not len(seqs):
        raise ValueError("build_example needs at least one sequence")
    rows = [seqs[i % len(seqs)] for i in range(batch)]
    return pad_batch(rows, pad_id, max(min_len, MIN_EXAMPLE_LEN))


def export_onnx(
    model: nn.Module, path: str, opset: int = 17, example_input: Batch | None = None
) -> None:
    """Export ``model`` to one self-contained ONNX file with dynamic batch/sequence axes.

    The graph is traced on ``example_input`` into a local temporary file,
    validated with ``onnx.checker.check_model`` and then written to ``path``
    atomically through :mod:`xdpx.io` (so ``path`` may be an fsspec URL and is
    never left half-written).

    Args:
        model: a classifier mapping ``input_ids [B, T]`` int64 to ``logits [B, C]``
            (a pair model: ``(input_ids, input_ids2)``); exported in eval mode (its
            training flag is restored afterwards). The graph's inputs are named
            ``xdpx.models.input_names(model)``.
        path: destination ``.onnx`` file (local path or fsspec URL).
        opset: ONNX opset version (>= 13).
        example_input: ``[B, T]`` int64 tracing example (a tuple of them, one per input,
            for a pair model); default ``[2, max(min_len, 8)]`` of token id 1 per input
            (see :func:`build_example` for why it should be long).

    Raises:
        ValueError: ``example_input`` is not a 2-D int64 tensor, or not one per input.
        onnx.checker.ValidationError: the exported graph is not valid ONNX.
        RuntimeError: torch cannot export the model.
    """
    names = input_names(model)
    if example_input is None:
        width = max(model.min_len, MIN_EXAMPLE_LEN)
        example_input = tuple(torch.ones(2, width, dtype=torch.int64) for _ in names)
    example = example_input if isinstance(example_input, tuple) else (example_input,)
    if len(example) != len(names):
        raise ValueError(
            f"example_input has {len(example)} tensor(s); the model takes {len(names)}: {names}"
        )
    for t in example:
        if t.dtype != torch.int64 or t.dim() != 2:
            raise ValueError(
                f"example_input must be [batch, seq_len] int64 tensors, got "
                f"{t.dtype} of shape {tuple(t.shape)}"
            )
    was_training = model.training
    model.eval()
    try:
        with tempfile.TemporaryDirectory(prefix="xdpx-onnx-") as tmp:
            local = os.path.join(tmp, "model.onnx")
            with warnings.catch_warnings(record=True) as caught, torch.no_grad():
                warnings.simplefilter("always")
                torch.onnx.export(
                    model,
                    tuple(t.cpu() for t in example),
                    local,
                    input_names=list(names),
                    output_names=[OUTPUT_NAME],
                    dynamic_axes=dynamic_axes(names),
                    opset_version=opset,
                    do_constant_folding=True,
                    dynamo=False,
                )
            for w in caught:  # legacy-exporter deprecation and TracerWarnings: parity decides
                logger.debug("torch.onnx.export: %s", w.message)
            proto = onnx.load(local)
            onnx.checker.check_model(proto, full_check=True)
            with open(local, "rb") as f:
                data = f.read()
    finally:
        model.train(was_training)
    io.write_bytes(path, data)
    logger.info("exported ONNX opset %d (%.1f KiB) -> %s", opset, len(data) / 1024, path)


def parity_batches(n: int, batch_size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` slices covering ``range(n)`` with deliberately mixed batch sizes.

    The first batch has 1 sample, the second 3 (odd size, a width set by its own
    longest row), the rest ``batch_size`` each (last one possibly smaller), so
    the dynamic batch and sequence axes are exercised with several values.

    Args:
        n: number of samples.
        batch_size: size of the regular batches (>= 1).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    out: list[tuple[int, int]] = []
    start = 0
    for size in [1, 3]:
        if start < n:
            out.append((start, min(n, start + size)))
            start = out[-1][1]
    while start < n:
        out.append((start, min(n, start + batch_size)))
        start = out[-1][1]
    return out


def check_parity(
    onnx_path: str,
    model: nn.Module,
    seqs: Sequence[Sample],
    atol: float = 1e-4,
    batch_size: int = 64,
    pad_id: int = 0,
) -> dict[str, Any]:
    """Compare onnxruntime (CPUExecutionProvider) logits with eager PyTorch logits.

    Both runtimes get the very same right-padded ``[B, T]`` batches (see
    :func:`parity_batches`: a batch of 1, a batch of 3, then ``batch_size``
    batches, each padded to its own longest row, at least ``model.min_len``);
    a pair model gets both inputs, each padded to its own width.

    Args:
        onnx_path: exported ``.onnx`` file (local path or fsspec URL).
        model: the eager model the file was exported from (run on CPU, eval mode).
        seqs: token id arrays (pairs: ``(input_ids, input_ids2)`` tuples) to score
            (at least one).
        atol: largest allowed absolute logit difference.
        batch_size: size of the regular batches.
        pad_id: padding id.

    Returns:
        ``{"max_abs_diff", "mean_abs_diff", "num_samples", "argmax_agreement",
        "atol", "batch_shapes"}``: diffs over all ``num_samples * num_labels``
        logits, ``argmax_agreement`` the fraction of samples whose predicted class
        agrees, ``batch_shapes`` the ``[B, T]`` of every batch run (pairs:
        ``[B, T, T2]``).

    Raises:
        ValueError: ``seqs`` is empty.
        ExportParityError: ``max_abs_diff > atol`` or non-finite/mismatched outputs;
            the message gives the numbers and the tolerance.
    """
    if not len(seqs):
        raise ValueError("check_parity needs at least one sequence")
    session = ort_session(onnx_path)
    min_len = model.min_len
    names = input_names(model)
    was_training = model.training
    model.eval()
    eager_chunks, ort_chunks, shapes = [], [], []
    try:
        with torch.no_grad():
            for start, stop in parity_batches(len(seqs), batch_size):
                x = pad_batch(seqs[start:stop], pad_id, min_len)
                xs = x if isinstance(x, tuple) else (x,)
                eager_chunks.append(call_model(model, x).float().cpu().numpy())
                ort_chunks.append(ort_logits(session, names, x))
                shapes.append([xs[0].shape[0]] + [t.shape[1] for t in xs])
    finally:
        model.train(was_training)
    eager = np.concatenate(eager_chunks)
    onnx_out = np.concatenate(ort_chunks)
    if eager.shape != onnx_out.shape:
        raise ExportParityError(
            f"{onnx_path}: onnxruntime logits have shape {onnx_out.shape}, eager {eager.shape}"
        )
    diff = np.abs(eager.astype(np.float64) - onnx_out.astype(np.float64))
    result: dict[str, Any] = {
        "max_abs_diff": float(diff.max()),
        "mean_abs_diff": float(diff.mean()),
        "num_samples": len(seqs),
        "argmax_agreement": float((eager.argmax(1) == onnx_out.argmax(1)).mean()),
        "atol": float(atol),
        "batch_shapes": shapes,
    }
    if not np.isfinite(diff).all() or result["max_abs_diff"] > atol:
        raise ExportParityError(
            f"{onnx_path}: onnxruntime vs eager logits differ by max {result['max_abs_diff']:.3e} "
            f"(mean {result['mean_abs_diff']:.3e}, argmax agreement "
            f"{result['argmax_agreement']:.4f}) over {len(seqs)} samples in "
            f"{len(shapes)} batches; tolerance atol={atol:.1e}"
        )
    logger.info(
        "parity ok: max |diff| %.2e <= %.1e over %d samples, argmax agreement %.4f",
        result["max_abs_diff"],
        atol,
        len(seqs),
        result["argmax_agreement"],
    )
    return result


def _fixed_batch(seqs: Sequence[np.ndarray], batch: int, seq_len: int, pad_id: int) -> np.ndarray:
    """``[batch, seq_len]`` int64 built from ``seqs`` (cycled), truncated/right-padded."""
    out = np.full((batch, seq_len), pad_id, dtype=np.int64)
    for i in range(batch):
        s = np.asarray(seqs[i % len(seqs)])[:seq_len]
        out[i, : len(s)] = s
    return out


def _median_ms(fn: Any, warmup: int, runs: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def measure_latency(
    onnx_path: str,
    model: nn.Module,
    seqs: Sequence[Sample],
    batch_sizes: Sequence[int] = (1, 64),
    percentile: float = 90.0,
    warmup: int = 3,
    runs: int = 20,
    pad_id: int = 0,
) -> dict[str, Any]:
    """Median wall time per batch of eager PyTorch vs onnxruntime on CPU.

    Every batch has the same width: the ``percentile``-th percentile of the
    sample lengths (rounded up, at least ``model.min_len``); rows are the samples
    cycled, truncated or padded to it. For a pair model each input gets the
    percentile of its own lengths. Each runtime gets ``warmup`` untimed calls,
    then ``runs`` calls timed with ``time.perf_counter``. Thread settings are left
    as they are (torch's and onnxruntime's defaults), and both are recorded.

    Args:
        onnx_path: exported ``.onnx`` file.
        model: the eager model (CPU; run in eval mode under ``torch.inference_mode``).
        seqs: token id arrays, or ``(input_ids, input_ids2)`` tuples (at least one).
        batch_sizes: batch sizes to time.
        percentile: length percentile used as the fixed width.
        warmup: untimed calls per runtime and batch size.
        runs: timed calls per runtime and batch size.
        pad_id: padding id.

    Returns:
        ``{"seq_len", "seq_lens" (width per input name), "percentile", "warmup", "runs",
        "torch_threads",
        "ort_intra_op_threads" (0 = onnxruntime's default), "batches": {"<B>": {"eager_ms", "onnxruntime_ms",
        "speedup"}}}``; times are medians in milliseconds per batch, ``speedup`` is
        ``eager_ms / onnxruntime_ms`` (> 1: onnxruntime is faster).

    Raises:
        ValueError: ``seqs`` is empty.
    """
    if not len(seqs):
        raise ValueError("measure_latency needs at least one sequence")
    names = input_names(model)
    columns = [[s[k] for s in seqs] for k in range(len(names))] if len(names) > 1 else [seqs]
    widths = [
        max(
            int(math.ceil(np.percentile([len(s) for s in col], percentile))),
            model.min_len,
            1,
        )
        for col in columns
    ]
    session = ort_session(onnx_path)
    was_training = model.training
    model.eval()
    batches: dict[str, dict[str, float]] = {}
    try:
        with torch.inference_mode():
            for b in batch_sizes:
                feed = {
                    n: _fixed_batch(col, b, w, pad_id)
                    for n, col, w in zip(names, columns, widths, strict=True)
                }
                xt = tuple(torch.from_numpy(x) for x in feed.values())
                eager_ms = _median_ms(lambda xt=xt: model(*xt), warmup, runs)
                ort_ms = _median_ms(
                    lambda feed=feed: session.run([OUTPUT_NAME], feed), warmup, runs
                )
                batches[str(b)] = {
                    "eager_ms": eager_ms,
                    "onnxruntime_ms": ort_ms,
                    "speedup": eager_ms / ort_ms if ort_ms > 0 else float("inf"),
                }
                logger.info(
                    "latency batch %d x %s: eager %.3f ms, onnxruntime %.3f ms (x%.2f)",
                    b,
                    "/".join(map(str, widths)),
                    eager_ms,
                    ort_ms,
                    batches[str(b)]["speedup"],
                )
    finally:
        model.train(was_training)
    return {
        "seq_len": widths[0],
        "seq_lens": dict(zip(names, widths, strict=True)),
        "percentile": percentile,
        "warmup": warmup,
        "runs": runs,
        "torch_threads": torch.get_num_threads(),
        "ort_intra_op_threads": session.get_session_options().intra_op_num_threads,
        "batches": batches,
    }


def quantize_int8(src: str, dst: str) -> None:
    """Write ``dst``, ``src`` with int8 weights: onnxruntime's dynamic quantisation
    (``quantize_dynamic``, ``QInt8`` weights; activations quantised at run time where an
    operator supports it, e.g. MatMul, Gather). Both paths are local files.

    Raises:
        RuntimeError: onnxruntime cannot quantise the graph.
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
    logger.info("int8 dynamic quantisation: %s -> %s", src, dst)


def onnx_accuracy(
    onnx_path: str,
    seqs: Sequence[Sample],
    labels: np.ndarray,
    input_names_: Sequence[str],
    min_len: int = 1,
    pad_id: int = 0,
    batch_size: int = 256,
) -> float:
    """Accuracy of an ONNX classifier on onnxruntime (argmax of ``logits`` vs ``labels``).

    Args:
        onnx_path: the ``.onnx`` file; seqs: samples (pairs: tuples); labels: ``[n]`` class
            indices (-1 = unlabelled, skipped); input_names_: the graph's inputs in order.

    Raises:
        ValueError: no labelled sample.
    """
    keep = np.flatnonzero(np.asarray(labels) >= 0)
    if not len(keep):
        raise ValueError(f"{onnx_path}: no labelled sample to score")
    session = ort_session(onnx_path)
    correct = 0
    for i in range(0, len(keep), batch_size):
        idx = keep[i : i + batch_size]
        x = pad_batch([seqs[j] for j in idx], pad_id, min_len)
        pred = ort_logits(session, input_names_, x).argmax(1)
        correct += int((pred == np.asarray(labels)[idx]).sum())
    return correct / len(keep)
