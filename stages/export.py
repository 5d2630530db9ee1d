"""Stage ``export``: ONNX model + onnxruntime parity check + latency report.

Procedure for an :class:`~xdpx.config.ExportConfig`:

1. load ``checkpoint`` (``<run>/<best>`` / ``<run>/<last>`` aliases allowed);
2. take the first ``num_samples`` samples of split ``split`` of ``data_dir``
   (pairs: ``(input_ids, input_ids2)``, exported as two graph inputs);
3. export the model (opset ``opset``, dynamic batch and sequence axes) to a
   local staging file and validate it with ``onnx.checker``;
4. compare onnxruntime logits with eager PyTorch logits on batches of mixed
   sizes and widths; a max abs difference above ``atol`` fails the stage with
   :class:`~xdpx.serving.export.ExportParityError`. Nothing claiming success is left in
   ``out_dir`` then: the staged file is discarded and a ``model.onnx`` /
   ``report.json`` from an earlier run is removed (DVC removes a stage's outputs
   before running it, too);
5. time eager vs onnxruntime at batch 1 and 64 (median ms per batch);
6. write into ``out_dir``: ``model.onnx``, the checkpoint's ``vocab.txt``,
   ``target_map.txt`` and ``meta.json`` (so the directory alone is enough to
   serve), ``latency.json`` (step 5's timings: not hashed by DVC, ``.dvcignore``) and
   ``report.json`` last (its presence marks a finished export).

Every file is written atomically through :mod:`xdpx.io`; only the files named
above are touched, so ``out_dir`` may be shared with other outputs.

Usage::

    python -m stages.export [--params params.yaml] [export.key=value ...]
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import tempfile
from typing import Any

import numpy as np
import onnx
import onnxruntime
import torch
from pydantic import BaseModel, Field

from xdpx import io
from xdpx.checkpoint import ASSETS, check_reader, load_checkpoint
from xdpx.config import ExportConfig
from xdpx.data import load_split
from xdpx.inference import Sample, as_samples
from xdpx.models import input_names
from xdpx.serving.export import (
    OUTPUT_NAME,
    ExportParityError,
    build_example,
    check_parity,
    dynamic_axes,
    export_onnx,
    measure_latency,
    onnx_accuracy,
    quantize_int8,
)
from xdpx.stage import stage_main

__all__ = ["ExportResult", "load_samples", "run", "main"]

logger = logging.getLogger("xdpx.serving.export")

ONNX_NAME = "model.onnx"
INT8_NAME = "model.int8.onnx"  # export.quantize: int8
REPORT_NAME = "report.json"
#: eager vs onnxruntime timings (and the int8 graph's): they change with the machine and the
#: moment, so they are kept out of ``report.json`` and ``.dvcignore`` keeps this name out of
#: the export directory's DVC hash (every out a pure function of code, params and data)
LATENCY_NAME = "latency.json"


def _runs(cfg: ExportConfig) -> dict[str, int]:
    """:func:`measure_latency`'s ``runs`` and ``warmup`` from ``export.latency_runs``."""
    return {"runs": cfg.latency_runs, "warmup": min(3, cfg.latency_runs)}


class ExportResult(BaseModel):
    """What :func:`run` wrote and measured.

    Attributes:
        onnx_path: the exported ``model.onnx``.
        report_path: the ``report.json`` beside it.
        checkpoint: resolved checkpoint directory the model came from.
        parity: :func:`xdpx.serving.export.check_parity` numbers (``max_abs_diff``,
            ``mean_abs_diff``, ``num_samples``, ``argmax_agreement``, ``atol``).
        latency: :func:`xdpx.serving.export.measure_latency` result (median ms per batch).
    """

    onnx_path: str
    report_path: str
    checkpoint: str
    parity: dict[str, Any] = Field(description="onnxruntime vs eager logit differences.")
    latency: dict[str, Any] = Field(description="Median ms per batch, eager vs onnxruntime.")


def load_samples(data_dir: str, split: str, limit: int) -> list[Sample]:
    """The first ``limit`` samples of a prepared split (pairs: ``(input_ids, input_ids2)``).

    Args:
        data_dir: prepared data directory (local path or fsspec URL).
        split: split name, e.g. ``"test"``.
        limit: number of sequences wanted (fewer are returned if the split is smaller).

    Returns:
        Up to ``limit`` int64 arrays (tuples of two for separately encoded pairs), in
        split order.

    Raises:
        FileNotFoundError: the split does not exist.
        ValueError: the split is empty.
    """
    data = load_split(data_dir, split)
    ids2 = None if data.input_ids2 is None else data.input_ids2[:limit]
    seqs = as_samples(data.input_ids[:limit], ids2)
    if not seqs:
        raise ValueError(f"split {split!r} of {data_dir} has no samples to check parity on")
    return seqs


def _versions() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def _remove_stale(out_dir: str) -> None:
    """Remove a previous run's report and model so nothing in ``out_dir`` claims success."""
    for name in (REPORT_NAME, ONNX_NAME, INT8_NAME, LATENCY_NAME):
        path = io.join(out_dir, name)
        if io.exists(path):
            logger.warning("removing stale %s", path)
            io.rm(path)


def check(cfg: ExportConfig) -> ExportConfig:
    """Pre-flight checks (``xdpx.checkpoint.check_reader``), before any work."""
    return check_reader("export", cfg)


@io.stage("export")
def run(cfg: ExportConfig) -> ExportResult:
    """Export ``cfg.checkpoint`` to ``{cfg.out_dir}/model.onnx`` and verify it.

    Args:
        cfg: the ``export`` section.

    Returns:
        Paths written, parity numbers and latency.

    Raises:
        CheckpointError: missing/incomplete checkpoint or alias.
        FileNotFoundError: ``cfg.split`` does not exist under ``cfg.data_dir``.
        ValueError: the split is empty.
        ExportParityError: onnxruntime logits differ from eager ones by more than
            ``cfg.atol``; ``out_dir`` then holds no ``model.onnx`` / ``report.json``.
    """
    cfg = check(cfg)
    ckpt = load_checkpoint(cfg.checkpoint)
    model = ckpt.model.cpu().eval()
    pad_id = int(ckpt.model_config.get("pad_id", 0))
    min_len = int(model.min_len)
    seqs = load_samples(cfg.data_dir, cfg.split, cfg.num_samples)
    if len(seqs) < cfg.num_samples:
        logger.warning(
            "split %s has only %d samples (num_samples=%d)", cfg.split, len(seqs), cfg.num_samples
        )
    onnx_path = io.join(cfg.out_dir, ONNX_NAME)
    report_path = io.join(cfg.out_dir, REPORT_NAME)

    with tempfile.TemporaryDirectory(prefix="xdpx-export-") as staging:
        staged = os.path.join(staging, ONNX_NAME)
        example = build_example(seqs, min_len, pad_id)
        export_onnx(model, staged, cfg.opset, example)
        try:
            parity = check_parity(staged, model, seqs, cfg.atol, pad_id=pad_id)
        except ExportParityError:
            _remove_stale(cfg.out_dir)
            raise
        latency = measure_latency(staged, model, seqs, pad_id=pad_id, **_runs(cfg))
        with open(staged, "rb") as f:
            data = f.read()
        int8 = _int8(cfg, staged, model, seqs, min_len, pad_id) if cfg.quantize else None

    # The old report goes first: from here on, report.json exists only when all files are new.
    io.rm(report_path)
    io.write_bytes(onnx_path, data)
    if int8 is not None:
        int8_data = int8.pop("data")
        int8["path"] = io.join(cfg.out_dir, INT8_NAME)
        io.write_bytes(int8["path"], int8_data)
    elif io.exists(io.join(cfg.out_dir, INT8_NAME)):  # an earlier export's: not this model
        io.rm(io.join(cfg.out_dir, INT8_NAME))
    copied = []
    for asset in ASSETS:
        src = io.join(ckpt.path, asset)
        if io.exists(src):
            io.write_bytes(io.join(cfg.out_dir, asset), io.read_bytes(src))
            copied.append(asset)
        else:
            logger.warning("checkpoint %s has no %s; not copied", ckpt.path, asset)

    num_labels = int(ckpt.model_config.get("num_labels", 0)) or None
    report = {
        "status": "ok",
        "onnx_path": onnx_path,
        "onnx_bytes": len(data),
        "onnx_sha256": hashlib.sha256(data).hexdigest(),
        "checkpoint": ckpt.path,
        "model": ckpt.name,
        "num_labels": num_labels,
        "opset": cfg.opset,
        "input_names": list(input_names(model)),
        "output_names": [OUTPUT_NAME],
        "dynamic_axes": {
            k: {str(a): n for a, n in v.items()}
            for k, v in dynamic_axes(input_names(model)).items()
        },
        "input_dtype": "int64",
        "pad_id": pad_id,
        "min_len": min_len,
        "samples": {"data_dir": cfg.data_dir, "split": cfg.split, "num_samples": len(seqs)},
        "parity": parity,
        "assets": copied,
        "versions": _versions(),
    }
    timings = {"onnx": latency}
    if int8 is not None:
        timings["int8"] = int8.pop("latency")
        report["int8"] = int8
    io.write_text(io.join(cfg.out_dir, LATENCY_NAME), json.dumps(timings, indent=2) + "\n")
    io.write_text(report_path, json.dumps(report, indent=2) + "\n")
    logger.info("wrote %s and %s", onnx_path, report_path)
    return ExportResult(
        onnx_path=onnx_path,
        report_path=report_path,
        checkpoint=ckpt.path,
        parity=parity,
        latency=latency,
    )


def _int8(
    cfg: ExportConfig, staged: str, model: Any, seqs: list, min_len: int, pad_id: int
) -> dict[str, Any]:
    """``export.quantize: int8``: quantise the staged fp32 graph, score both on the whole
    ``cfg.split`` (accuracy, onnxruntime) and time the int8 graph like the fp32 one.

    Returns:
        ``{"data" (the file's bytes), "bytes", "sha256", "split", "num_samples",
        "accuracy_fp32", "accuracy_int8", "accuracy_change_points", "latency"}``.
    """
    staged_int8 = os.path.join(os.path.dirname(staged), INT8_NAME)
    quantize_int8(staged, staged_int8)
    split = load_split(cfg.data_dir, cfg.split)
    samples = as_samples(split.input_ids, split.input_ids2)
    names = list(input_names(model))
    fp32 = onnx_accuracy(staged, samples, split.labels, names, min_len, pad_id)
    int8 = onnx_accuracy(staged_int8, samples, split.labels, names, min_len, pad_id)
    with open(staged_int8, "rb") as f:
        data = f.read()
    logger.info("int8: %s accuracy %.4f vs fp32 %.4f (%d bytes vs fp32)", cfg.split, int8, fp32, len(data))  # fmt: skip
    return {
        "data": data,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "split": cfg.split,
        "num_samples": int((split.labels >= 0).sum()),
        "accuracy_fp32": fp32,
        "accuracy_int8": int8,
        "accuracy_change_points": 100 * (int8 - fp32),
        "latency": measure_latency(staged_int8, model, seqs, pad_id=pad_id, **_runs(cfg)),
    }


def main(argv: list[str] | None = None) -> ExportResult:
    """Command line entry: ``python -m stages.export [--params FILE] [key=value ...]``."""

    def summary(result: ExportResult) -> str:
        speed = ", ".join(
            f"batch {b}: eager {v['eager_ms']:.2f} ms vs ort {v['onnxruntime_ms']:.2f} ms"
            for b, v in result.latency["batches"].items()
        )
        return (
            f"export: {result.onnx_path} (parity max |diff| {result.parity['max_abs_diff']:.2e} "
            f"<= {result.parity['atol']:.0e} over {result.parity['num_samples']} samples); {speed}"
        )

    return stage_main("export", run, summary, argv, check)


if __name__ == "__main__":
    main()
