"""Stage ``predict``: predicted label and class probabilities for every line of a raw file.

The file is read and encoded exactly as prepro did for training (format,
columns, tokenizer, vocab, max_len come from the checkpoint's ``meta.json``).
Output TSV columns: the input columns (``concat_origin``), then ``pred_label``
and one ``prob_<label>`` column per class (a regression checkpoint,
``prepro.label_type: score``: one ``score`` column). With ``distill=true`` the output is
a teacher file for ``train.distill_from`` (see :mod:`xdpx.distill.teacher`): ``id``
and the text column(s) first, csv quoting, and ``prob_<label>`` plus
``logit_<label>`` at full float32 precision.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from pydantic import BaseModel

from xdpx import io
from xdpx.checkpoint import beside_checkpoint, check_reader, load_checkpoint
from xdpx.config import ConfigError, PredictConfig, PreproConfig
from xdpx.data import DataError, Encoder, PreparedMeta, read_examples
from xdpx.data.readers import iter_examples
from xdpx.distill.teacher import teacher_rows
from xdpx.inference import as_samples, format_probs, predict_logits, probs_from_logits
from xdpx.rundir import of_checkpoint, unalias
from xdpx.stage import stage_main

log = logging.getLogger("xdpx.predict")


class PredictResult(BaseModel):
    """Rows predicted, lines skipped as malformed, and the output path."""

    out_file: str
    rows: int
    skipped: int
    label_counts: dict[str, int]


def check(cfg: PredictConfig) -> PredictConfig:
    """Pre-flight checks (``xdpx.checkpoint.check_reader``), before any work."""
    return check_reader("predict", cfg)


@io.stage("predict")
def run(cfg: PredictConfig) -> PredictResult:
    """Predict every line of ``cfg.data_file`` with ``cfg.checkpoint``; write ``cfg.out_file``.

    Raises:
        CheckpointError: missing/incomplete checkpoint or alias.
        DataError: a malformed input line (file:line and reason), unless the
            training prepro had ``skip_bad_lines``.
    """
    cfg = check(cfg)
    ckpt = load_checkpoint(cfg.checkpoint)
    prepro = PreproConfig(**PreparedMeta.read(ckpt.path).prepro)
    encoder = Encoder.from_dir(ckpt.path)
    if cfg.distill and prepro.label_type == "score":
        raise ConfigError(
            "predict.distill writes a classifier's logits for a student; this checkpoint is a "
            "regression (prepro.label_type=score)"
        )
    if not cfg.distill and not (cfg.concat_origin and prepro.format == "jsonl"):
        return _predict_stream(cfg, ckpt, prepro, encoder)
    # the teacher file numbers rows and jsonl's columns are the keys of the whole file:
    # these two read the file whole
    data = read_examples(cfg.data_file, prepro, require_label=False)
    if len(data.texts) == 0:
        raise DataError(f"{cfg.data_file}: no rows to predict")
    seqs = as_samples(*encoder.encode_inputs(data.texts, data.texts2))  # pairs: both texts
    logits = predict_logits(ckpt.model, seqs, cfg.batch_size, encoder.pad_id)
    probs = probs_from_logits(logits)
    labels = encoder.labels
    counts = dict.fromkeys(labels, 0)
    if cfg.distill:
        for p in probs:
            counts[labels[int(p.argmax())]] += 1
        text_columns = [prepro.text_column] + ([prepro.text2_column] if prepro.text2_column else [])
        texts = [data.texts] + ([data.texts2] if data.texts2 is not None else [])
        extra = (
            {c: [r.get(c, "") for r in data.rows] for c in data.columns if c not in text_columns}
            if cfg.concat_origin
            else None
        )
        io.write_text(cfg.out_file, teacher_rows(text_columns, texts, labels, logits, probs, extra))
        log.info("teacher file: %d rows -> %s (%s)", len(probs), cfg.out_file, counts)
        return PredictResult(
            out_file=cfg.out_file, rows=len(probs), skipped=data.skipped, label_counts=counts
        )
    score = prepro.label_type == "score"
    columns = (list(data.columns) if cfg.concat_origin else []) + _columns(labels, score)
    lines = ["\t".join(columns)] if cfg.header else []
    for i, fields in enumerate(_predictions(logits, labels, score, counts)):
        origin = [data.rows[i].get(c, "") for c in data.columns] if cfg.concat_origin else []
        lines.append("\t".join(origin + fields))
    io.write_text(cfg.out_file, "\n".join(lines) + "\n")
    log.info("predicted %d rows -> %s (%s)", len(probs), cfg.out_file, counts)
    return PredictResult(
        out_file=cfg.out_file, rows=len(probs), skipped=data.skipped, label_counts=counts
    )


def _columns(labels: list[str], score: bool) -> list[str]:
    """The prediction columns: ``pred_label`` and ``prob_<label>`` each, or ``score``."""
    return ["score"] if score else ["pred_label"] + [f"prob_{lab}" for lab in labels]


def _predictions(
    logits: np.ndarray, labels: list[str], score: bool, counts: dict[str, int]
) -> list[list[str]]:
    """Each row's prediction fields (:func:`_columns`) from its ``[num_labels]`` logits:
    the label of the largest probability and the probabilities (6 decimals), or the score
    (the one output, 6 decimals); ``counts`` (per label, or rows under ``score``) updated."""
    if score:
        counts["score"] += len(logits)
        return [[f"{x:.6f}"] for x in logits[:, 0].tolist()]
    out = []
    for p in probs_from_logits(logits):
        pred = labels[int(p.argmax())]
        counts[pred] += 1
        out.append([pred, *format_probs(p)])
    return out


def _predict_stream(
    cfg: PredictConfig, ckpt: Any, prepro: PreproConfig, encoder: Encoder
) -> PredictResult:
    """The TSV output, chunk by chunk: memory holds ``prepro.chunk_rows`` rows, not the file."""
    labels = encoder.labels
    counts = dict.fromkeys(labels, 0)
    score = prepro.label_type == "score"
    rows = skipped = 0
    chunks = iter_examples(
        cfg.data_file, prepro, False, None, prepro.chunk_rows, keep_rows=cfg.concat_origin
    )
    with io.open_atomic(cfg.out_file, "w") as f:
        for k, data in enumerate(chunks):
            skipped += data.skipped
            if k == 0 and cfg.header:
                origin = list(data.columns) if cfg.concat_origin else []
                f.write("\t".join(origin + _columns(labels, score)) + "\n")
            if not len(data):
                continue
            seqs = as_samples(*encoder.encode_inputs(data.texts, data.texts2))
            logits = predict_logits(ckpt.model, seqs, cfg.batch_size, encoder.pad_id)
            for i, fields in enumerate(_predictions(logits, labels, score, counts)):
                origin = (
                    [data.rows[i].get(c, "") for c in data.columns] if cfg.concat_origin else []
                )
                f.write("\t".join(origin + fields) + "\n")
            rows += len(logits)
        if not rows:
            raise DataError(f"{cfg.data_file}: no rows to predict")
    log.info("predicted %d rows -> %s (%s)", rows, cfg.out_file, counts)
    return PredictResult(out_file=cfg.out_file, rows=rows, skipped=skipped, label_counts=counts)


def beside(cfg: PredictConfig) -> dict[str, str]:
    """The output of an ad-hoc prediction with ``cfg.checkpoint`` (not the pipeline's):
    ``<its run dir>/predict/<data file stem>.pred.tsv`` (``xdpx.stage.beside_checkpoint``)."""
    stem = cfg.data_file.rstrip("/").rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return {"out_file": io.join(of_checkpoint(unalias(cfg.checkpoint)).predict_dir, f"{stem}.pred.tsv")}  # fmt: skip


def main(argv: list[str] | None = None) -> PredictResult:
    """``python -m stages.predict [--params params.yaml] [predict.key=value ...]``.

    With a checkpoint other than the params' (the pipeline's), ``out_file`` (unless given
    on the command line) goes under that checkpoint's run directory (:func:`beside`).
    """
    return stage_main(
        "predict",
        run,
        lambda r: f"wrote {r.rows} predictions to {r.out_file} ({r.label_counts})",
        argv,
        check,
        lambda configs, args: beside_checkpoint("predict", configs, args, beside),
    )


if __name__ == "__main__":
    main()
