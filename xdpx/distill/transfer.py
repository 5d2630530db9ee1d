"""The distillation transfer set (Tang et al. 2019): build it, then label it with a teacher.

Tang et al. 2019 ("Distilling Task-Specific Knowledge from BERT into Simple Neural
Networks") train the student on a *transfer set*: the training texts plus many more, made by
augmenting them (:mod:`xdpx.data.augment`) or drawn from unlabelled in-domain text, all
labelled by the teacher. Two steps, each streaming (memory holds ``distill.chunk_rows``
rows, whatever the file sizes):

1. :func:`build_transfer_set` (``python -m xdpx.distill.transfer build``) writes
   ``distill.out_file``, a tsv with a header and no quoting (the project's convention,
   :mod:`xdpx.distill.teacher`): ``id`` (0, 1, ...), the text column(s) named as in ``prepro``,
   the label column (the gold label, empty where there is none) and ``origin``. The rows, in
   this order: every kept row of ``distill.train_file`` (``origin`` ``train``, its gold
   label); then, for each of them in turn, ``augment_copies`` copies (``augment``, copy
   ``c`` of text ``i``: :meth:`xdpx.data.augment.Augmenter.copy`; a pair's two texts are
   augmented each, as sides 0 and 1); then, for a pair task, ``pair_neighbours`` recombined
   pairs per side of each train pair (``neighbour``: a text with its nearest other train
   texts, :func:`xdpx.data.augment.neighbour_pairs`; this step holds the train texts in
   memory); then every kept row of the ``unlabelled`` file(s)
   (``unlabelled``; a label column named in their header is ignored, empty or not).
2. :func:`label_transfer_set` (``python -m xdpx.distill.transfer label``) runs the teacher
   checkpoint over every row (eager, ``batch_size`` at a time, as ``stages.predict``) and
   writes ``distill.labelled_file``: ``id``, the text column(s), the label column (the gold
   label, else the teacher's predicted label, so that prepro takes every row), ``origin``,
   ``gold`` (``1``: the label is gold; ``0``: it is the teacher's), ``pred_label``, then
   ``prob_<label>`` and ``logit_<label>`` per label at full float32 precision. It is a
   teacher file (:func:`xdpx.distill.teacher.read_teacher_file`) and a prepro train file at
   once: prepro it as the student's train split and pass it as ``train.distill_from``; rows
   with ``gold`` 0 are trained on the KL term alone (:func:`xdpx.distill.teacher.distill_loss`).

**Resuming.** The labelled file is written chunk by chunk to ``<labelled_file>.part``; after
each complete chunk the file is flushed to disk and ``<labelled_file>.progress.json`` records
the rows done and the byte size of the part file. A run killed part-way and started again
with the same transfer file, teacher, ``chunk_rows`` and ``batch_size`` cuts the part file
back to the last recorded size and goes on from the next chunk; the batches are then the same
as in an uninterrupted run, so the final file is byte for byte the same. At the end the part
file is renamed to ``labelled_file`` and the marker removed. Another transfer file (size or
modification time), teacher, ``chunk_rows`` or ``batch_size`` starts over.
"""

from __future__ import annotations

import io as _pyio
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from pydantic import BaseModel

from xdpx import io
from xdpx.config import ConfigError, DistillConfig, PreproConfig, load_params
from xdpx.data import DataError, Encoder, PreparedMeta
from xdpx.data.augment import Augmenter, neighbour_pairs
from xdpx.data.readers import iter_examples
from xdpx.data.tokenizers import detect_tokenizer
from xdpx.distill.teacher import (
    GOLD_COLUMN,
    ID_COLUMN,
    LOGIT_PREFIX,
    PROB_PREFIX,
    _field,
    _num,
)

log = logging.getLogger("xdpx.distill.transfer")

__all__ = [
    "ORIGINS",
    "ORIGIN_COLUMN",
    "GOLD_COLUMN",
    "TransferResult",
    "LabelResult",
    "augment_tokenizer",
    "build_transfer_set",
    "label_transfer_set",
    "main",
]

ORIGIN_COLUMN = "origin"
#: The ``origin`` values, in file order.
ORIGINS = ("train", "augment", "neighbour", "unlabelled")


class TransferResult(BaseModel):
    """What :func:`build_transfer_set` wrote: the file, its rows per origin, the tokenizer
    the augmentation used, the unchanged copies (equal to their text) and the seconds taken."""

    out_file: str
    rows: int
    counts: dict[str, int]
    tokenizer: str
    unchanged_copies: int
    seconds: float


class LabelResult(BaseModel):
    """What :func:`label_transfer_set` wrote: the file, its rows, the rows labelled by this
    call (fewer than ``rows`` after a resume), the predicted-label counts of those rows and
    the seconds this call took."""

    labelled_file: str
    rows: int
    labelled_now: int
    label_counts: dict[str, int]
    seconds: float


def _text_columns(prepro: PreproConfig) -> list[str]:
    return [prepro.text_column] + ([prepro.text2_column] if prepro.text2_column else [])


def augment_tokenizer(cfg: DistillConfig, prepro: PreproConfig) -> str:
    """``char`` or ``word``: ``cfg.tokenizer``; ``auto`` = ``prepro.tokenizer`` when that is
    char or word, else prepro's auto rule (:func:`xdpx.data.tokenizers.detect_tokenizer`) on
    the first million characters of the train file's texts."""
    if cfg.tokenizer != "auto":
        return cfg.tokenizer
    if prepro.tokenizer in ("char", "word"):
        return prepro.tokenizer

    def texts() -> Iterator[str]:
        for chunk in iter_examples(cfg.train_file, prepro, True, None, cfg.chunk_rows):
            yield from chunk.texts

    return detect_tokenizer(texts())[0]


def _unlabelled_files(path: str) -> list[str]:
    if io.isdir(path):
        files = [
            f
            for f in io.ls(path)
            if io.isfile(f) and not f.rstrip("/").rsplit("/", 1)[-1].startswith(".")
        ]
        if not files:
            raise DataError(f"distill.unlabelled: directory {path} holds no file")
        return files
    if not io.isfile(path):
        raise DataError(f"distill.unlabelled: {path} not found")
    return [path]


def build_transfer_set(cfg: DistillConfig, prepro: PreproConfig) -> TransferResult:
    """Write the transfer set ``cfg.out_file`` (module docstring), streaming.

    The train file is read twice (its rows, then their copies) and each unlabelled file
    once, ``cfg.chunk_rows`` rows at a time; the output is written atomically
    (:func:`xdpx.io.open_atomic`), so a failed run leaves no partial file.

    Args:
        cfg: the ``distill`` section.
        prepro: the ``prepro`` section: format, header and column names of the files.

    Returns:
        :class:`TransferResult`.

    Raises:
        ConfigError: ``prepro.label_type: score`` (distillation needs classes), or column
            names that clash with ``id`` / ``origin``.
        DataError: a missing file or a malformed line (``file:line: reason``, as prepro).
    """
    start = time.perf_counter()
    if prepro.label_type == "score":
        raise ConfigError(
            "distill: the transfer set is for classification (prepro.label_type=score)"
        )
    columns = [ID_COLUMN, *_text_columns(prepro), prepro.label_column, ORIGIN_COLUMN]
    if len(set(columns)) != len(columns):
        raise ConfigError(f"distill: the transfer set's columns {columns} repeat a name")
    unlabelled = _unlabelled_files(cfg.unlabelled) if cfg.unlabelled else []  # fail early
    kind = augment_tokenizer(cfg, prepro)
    aug = Augmenter(
        kind, cfg.seed, cfg.p_mask, cfg.p_ng, cfg.ngram_max, cfg.p_drop, cfg.p_swap,
        cfg.mask_token,
    )  # fmt: skip
    pair = prepro.text2_column is not None
    counts = dict.fromkeys(ORIGINS, 0)
    unchanged = 0
    next_id = 0

    def rows_of(path: str, require_label: bool, pp: PreproConfig = prepro) -> Iterator[tuple[list[str], list[str] | None, list[str] | None]]:  # fmt: skip
        for chunk in iter_examples(path, pp, require_label, None, cfg.chunk_rows):
            if chunk.skipped:
                log.warning("%s: skipped %d bad lines (prepro.skip_bad_lines)", path, chunk.skipped)
            yield chunk.texts, chunk.texts2, chunk.labels

    with io.open_atomic(cfg.out_file, "w") as f:
        f.write("\t".join(columns) + "\n")

        def write(texts: list[str], texts2: list[str] | None, labels: list[str], origin: str) -> None:  # fmt: skip
            nonlocal next_id
            lines = []
            for k, text in enumerate(texts):
                fields = [str(next_id + k), _field(text)]
                if pair:
                    fields.append(_field(texts2[k]))  # type: ignore[index]
                lines.append("\t".join([*fields, _field(labels[k]), origin]) + "\n")
            f.write("".join(lines))
            next_id += len(texts)
            counts[origin] += len(texts)

        recombine = pair and cfg.pair_neighbours > 0
        first: list[str] = []  # the train pairs' texts, kept for the recombined pairs
        second: list[str] = []
        for texts, texts2, labels in rows_of(cfg.train_file, True):
            write(texts, texts2, labels or [], "train")
            if recombine:
                first += texts
                second += texts2  # type: ignore[arg-type]
        index = 0
        for texts, texts2, _ in rows_of(cfg.train_file, True):
            out: list[str] = []
            out2: list[str] | None = [] if pair else None
            for k, text in enumerate(texts):
                i = index + k
                for c in range(cfg.augment_copies):
                    copy = aug.copy(text, i, c, 0)
                    same = copy == aug.plain(text)
                    out.append(copy)
                    if out2 is not None:
                        copy2 = aug.copy(texts2[k], i, c, 1)  # type: ignore[index]
                        same = same and copy2 == aug.plain(texts2[k])  # type: ignore[index]
                        out2.append(copy2)
                    unchanged += same
            index += len(texts)
            write(out, out2, [""] * len(out), "augment")
        if recombine:
            made = neighbour_pairs(first, second, cfg.pair_neighbours)
            del first, second
            for lo in range(0, len(made), cfg.chunk_rows):
                part = made[lo : lo + cfg.chunk_rows]
                write([a for *_, a, _ in part], [t for *_, t in part], [""] * len(part), "neighbour")  # fmt: skip
        no_label = prepro.model_copy(update={"label_column": "\x00"})  # a header's label: ignored
        for path in unlabelled:
            for texts, texts2, _ in rows_of(path, False, no_label):
                write(texts, texts2, [""] * len(texts), "unlabelled")
    if counts["train"] == 0:
        raise DataError(f"{cfg.train_file}: no training rows")
    seconds = time.perf_counter() - start
    log.info(
        "transfer set: %d rows (%s; %s tokens, %d copies equal to their text) -> %s in %.1f s",
        next_id, counts, kind, unchanged, cfg.out_file, seconds,
    )  # fmt: skip
    return TransferResult(
        out_file=cfg.out_file, rows=next_id, counts=counts, tokenizer=kind,
        unchanged_copies=unchanged, seconds=seconds,
    )  # fmt: skip


# ---------------------------------------------------------------------- labelling
def _transfer_chunks(
    path: str, chunk_rows: int, skip: int
) -> Iterator[tuple[list[str], list[tuple[int, list[str]]]]]:
    """``(header, [(line, fields), ...])`` chunks of a transfer file after its first ``skip``
    rows (the header is checked: ``id``, 1 or 2 text columns, a label column, ``origin``;
    each row: that many fields, ``id`` = its row number).

    Raises:
        DataError: a missing file, a bad header, a row with another number of fields or an
            id out of order (``file:line``).
    """
    if not io.isfile(path):
        raise DataError(f"{path}: transfer set not found (python -m xdpx.distill.transfer build)")
    with io.open(path, "rb") as raw:
        lines = _pyio.TextIOWrapper(raw, encoding="utf-8", newline="")
        header = lines.readline().rstrip("\r\n").split("\t")
        if len(header) not in (4, 5) or header[0] != ID_COLUMN or header[-1] != ORIGIN_COLUMN:
            raise DataError(
                f"{path}:1: not a transfer set header (id, text column(s), label, origin): {header}"
            )
        chunk: list[tuple[int, list[str]]] = []
        row = 0
        for n, line in enumerate(lines, start=2):
            line = line.rstrip("\r\n")
            if not line:
                continue
            if row >= skip:
                fields = line.split("\t")
                if len(fields) != len(header):
                    raise DataError(
                        f"{path}:{n}: expected {len(header)} tab-separated fields "
                        f"({', '.join(header)}), got {len(fields)}"
                    )
                if fields[0] != str(row):
                    raise DataError(f"{path}:{n}: id {fields[0]!r} where {row} was expected")
                if fields[-1] not in ORIGINS:
                    raise DataError(
                        f"{path}:{n}: origin {fields[-1]!r} is not one of {list(ORIGINS)}"
                    )
                chunk.append((n, fields))
                if len(chunk) == chunk_rows:
                    yield header, chunk
                    chunk = []
            row += 1
        if chunk or skip == 0:
            yield header, chunk


def _marker_key(cfg: DistillConfig, teacher_path: str) -> dict[str, Any]:
    """What a resumed run must share with the interrupted one."""
    fs, p = io.fs_of(cfg.out_file)
    info = fs.info(p)
    return {
        "transfer_file": cfg.out_file,
        "transfer_bytes": int(info.get("size", -1)),
        "transfer_mtime": str(info.get("mtime", info.get("LastModified", ""))),
        "teacher": teacher_path,
        "chunk_rows": cfg.chunk_rows,
        "batch_size": cfg.batch_size,
    }


def label_transfer_set(
    cfg: DistillConfig, on_chunk: Callable[[int], None] | None = None
) -> LabelResult:
    """Label every row of the transfer set ``cfg.out_file`` with the teacher ``cfg.teacher``;
    write ``cfg.labelled_file`` chunk by chunk, resumable (module docstring).

    Args:
        cfg: the ``distill`` section.
        on_chunk: called with the rows done after each chunk is safely recorded (tests
            interrupt a run from it).

    Returns:
        :class:`LabelResult`.

    Raises:
        ConfigError: ``labelled_file`` is not a local path, or the teacher is a regression
            model or takes pairs where the transfer set has single texts (or the reverse).
        CheckpointError: the teacher checkpoint is missing or broken.
        DataError: a malformed transfer file (``file:line``), or a gold label the teacher
            does not know.
    """
    from xdpx.checkpoint import load_checkpoint
    from xdpx.inference import as_samples, predict_logits, probs_from_logits

    start = time.perf_counter()
    out = cfg.labelled_file
    if not io.is_local(out):
        raise ConfigError(f"distill.labelled_file={out}: must be a local path (it is appended to)")
    ckpt = load_checkpoint(cfg.teacher)
    teacher_prepro = PreproConfig(**PreparedMeta.read(ckpt.path).prepro)
    if teacher_prepro.label_type == "score":
        raise ConfigError(f"distill.teacher={cfg.teacher}: a regression model has no class logits")
    encoder = Encoder.from_dir(ckpt.path)
    labels = encoder.labels
    part, marker = out + ".part", out + ".progress.json"
    key = _marker_key(cfg, ckpt.path)
    done, size = 0, 0
    if os.path.exists(marker) and os.path.exists(part):
        state = json.loads(io.read_text(marker))
        if {k: state.get(k) for k in key} == key and os.path.getsize(part) >= state["bytes"]:
            done, size = int(state["rows"]), int(state["bytes"])
            log.info("resuming %s after %d labelled rows (%s)", out, done, marker)
        else:
            log.warning("%s: another transfer file, teacher or chunking: starting over", marker)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    counts = dict.fromkeys(labels, 0)
    now = 0
    from tqdm.auto import tqdm

    with io.open(cfg.out_file, "rb") as counted:  # rows for the progress bar: one streamed pass
        total = max(sum(1 for _ in counted) - 1, 0)
    bar = tqdm(total=total, initial=done, desc="label", unit="row", mininterval=5)
    with open(part, "r+b" if done else "wb") as f, bar:
        f.truncate(size)
        f.seek(size)
        for header, chunk in _transfer_chunks(cfg.out_file, cfg.chunk_rows, done):
            n_text = len(header) - 3
            if (n_text == 2) != (teacher_prepro.text2_column is not None):
                raise ConfigError(
                    f"{cfg.out_file}: {n_text} text column(s) but the teacher {ckpt.path} was "
                    f"trained on {'pairs' if teacher_prepro.text2_column else 'single texts'}"
                )
            if done == 0 and f.tell() == 0:
                scores = [f"{PROB_PREFIX}{x}" for x in labels] + [
                    f"{LOGIT_PREFIX}{x}" for x in labels
                ]
                f.write(("\t".join([*header, GOLD_COLUMN, "pred_label", *scores]) + "\n").encode())
            if not chunk:
                break
            texts = [fields[1].strip() for _, fields in chunk]
            texts2 = [fields[2].strip() for _, fields in chunk] if n_text == 2 else None
            logits = predict_logits(
                ckpt.model, as_samples(*encoder.encode_inputs(texts, texts2)), cfg.batch_size,
                encoder.pad_id,
            )  # fmt: skip
            probs = probs_from_logits(logits)
            lines = []
            for (line, fields), z, p in zip(chunk, logits, probs, strict=True):
                gold = fields[-2].strip()
                if gold and gold not in counts:
                    raise DataError(
                        f"{cfg.out_file}:{line}: label {gold!r} (column {header[-2]!r}) is not "
                        f"one of the teacher's {labels}"
                    )
                pred = labels[int(np.argmax(z))]
                counts[pred] += 1
                row = [*fields[:-2], gold or pred, fields[-1], "1" if gold else "0", pred]
                lines.append("\t".join(row + [_num(x) for x in p] + [_num(x) for x in z]) + "\n")
            f.write("".join(lines).encode())
            f.flush()
            os.fsync(f.fileno())
            done += len(chunk)
            now += len(chunk)
            bar.update(len(chunk))
            io.write_text(marker, json.dumps({**key, "rows": done, "bytes": f.tell()}))
            if on_chunk is not None:
                on_chunk(done)
    os.replace(part, out)
    os.remove(marker)
    seconds = time.perf_counter() - start
    log.info(
        "labelled %d transfer rows (%d now, %s) -> %s in %.1f s", done, now, counts, out, seconds
    )
    return LabelResult(
        labelled_file=out, rows=done, labelled_now=now, label_counts=counts, seconds=seconds
    )


def main(argv: list[str] | None = None) -> TransferResult | LabelResult:
    """``python -m xdpx.distill.transfer build|label [--params params.yaml] [section.key=value ...]``
    (a bare ``key=value`` is ``distill.key=value``).

    ``build`` reads the ``distill`` and ``prepro`` sections; ``label`` the ``distill`` one.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ("build", "label"):
        raise SystemExit(
            "usage: python -m xdpx.distill.transfer build|label [--params FILE] [key=value ...]"
        )
    command, rest = args[0], args[1:]
    params = "params.yaml"
    overrides = []
    it = iter(rest)
    for arg in it:
        if arg in ("-p", "--params"):
            params = next(it, params)
        elif "=" in arg:
            head = arg.split("=", 1)[0]
            overrides.append(arg if "." in head else f"distill.{arg}")
        else:
            raise SystemExit(f"unexpected argument {arg!r}")
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    p = load_params(params, overrides)
    if command == "build":
        result: TransferResult | LabelResult = build_transfer_set(p.distill, p.prepro)
    else:
        result = label_transfer_set(p.distill)
    print(result.model_dump_json())
    return result


if __name__ == "__main__":
    main()
