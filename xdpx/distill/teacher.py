"""Knowledge distillation (Hinton et al. 2015): the teacher file and the KL term.

**Teacher file** (``predict.distill=true``; read by ``train.distill_from``): a
tab-separated file with a header row and no quoting (the project's tsv
convention: texts may contain ``"``; a tab or line break inside a field is
written as a space, which no tokenizer tells apart from a space; pandas reads
it with ``read_csv(path, sep="\\t", quoting=csv.QUOTE_NONE)``), one row per
kept row of the predicted file, in file order:

* ``id``: 0-based index of the row among the kept rows of the predicted file,
  the same numbering prepro stores in the shards' ``id`` column;
* the text column(s), named as in prepro (``text``; pairs also ``text2``),
  whitespace-stripped as prepro reads them;
* with ``predict.concat_origin`` the other input columns (e.g. ``label``);
* ``pred_label``, then ``prob_<label>`` (softmax probabilities) and
  ``logit_<label>`` (raw logits) for every label, at full float32 precision;
* optionally ``gold`` (``1``/``0``): whether the row's training label is a gold label. The
  labelled transfer set (:mod:`xdpx.distill.transfer`) has it; rows with ``0`` carry the
  teacher's own prediction as their label (so prepro takes them) and are trained on the
  KL term alone. Without the column every row is gold.

**Alignment.** The student needs the teacher's outputs for its *training*
split, so the teacher predicts the train split's raw file
(``predict.data_file=data/raw/train.tsv``). :func:`load_teacher_logits` matches
teacher row ``k`` with training sample ``k`` (row order; the ``id`` column,
when present, must be ``0, 1, ...``) and checks each pair: the teacher's text,
encoded with the student's own encoder (vocab, tokenizer, ``max_len`` from
prepro's files), must give exactly the token ids of training sample ``k``.
Any difference (another file, another order, another subset) fails with the
file, the line and the text. A file with only ``prob_<label>`` columns (e.g. an
ordinary ``predictions.tsv``) works too: the logits are recovered as ``log p``
(softmax is shift-invariant, so ``softmax(log p / T)`` is exact).

**Loss** (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network",
section 2)::

    loss = (1 - alpha) * CE(labels, s) + alpha * T^2 * KL(softmax(t / T) || softmax(s / T))

summed over the samples (the trainer normalises the sum by the window size,
as for plain cross-entropy). ``T^2`` keeps the soft term's gradient scale
independent of ``T``. A sample without a gold label (``gold`` 0) takes ``alpha = 1``:
``T^2 * KL`` alone (Tang et al. 2019 train on the teacher's outputs wherever there is no
gold label).
"""

from __future__ import annotations

import io as _pyio
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from xdpx import io
from xdpx.data import DataError, Encoder, PreparedMeta, SplitData

log = logging.getLogger("xdpx.distill.teacher")

__all__ = [
    "ID_COLUMN",
    "PROB_PREFIX",
    "LOGIT_PREFIX",
    "GOLD_COLUMN",
    "Teacher",
    "TeacherFile",
    "distill_kl",
    "distill_loss",
    "teacher_rows",
    "read_teacher_file",
    "load_teacher",
    "load_teacher_logits",
]

ID_COLUMN = "id"
PROB_PREFIX = "prob_"
LOGIT_PREFIX = "logit_"
GOLD_COLUMN = "gold"


# ---------------------------------------------------------------------- loss
def distill_kl(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """``sum_b KL(softmax(t_b / T) || softmax(s_b / T))`` in float32.

    Args:
        student_logits: ``[batch, num_labels]``.
        teacher_logits: ``[batch, num_labels]`` (no gradient flows into them).
        temperature: ``T`` > 0.

    Returns:
        A scalar: the KL divergences (nats) summed over the batch.
    """
    log_q = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_p = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    return F.kl_div(log_q, log_p, reduction="sum", log_target=True)


def distill_loss(
    student_logits: torch.Tensor,
    labels: torch.Tensor,
    teacher_logits: torch.Tensor,
    alpha: float,
    temperature: float,
    gold: torch.Tensor | None = None,
    sample_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hinton et al. (2015): ``(1 - alpha) * CE + alpha * T^2 * KL``, each summed over the batch.

    Args:
        student_logits: ``[batch, num_labels]``.
        labels: ``[batch]`` class indices.
        teacher_logits: ``[batch, num_labels]``.
        alpha: weight of the soft term in [0, 1].
        temperature: ``T`` > 0.
        gold: ``[batch]`` bool, or None (every sample gold). A sample with False has no gold
            label: its loss is ``T^2 * KL`` (alpha 1 for it) and its label is not used.
        sample_weight: ``[batch]`` float, or None (all 1): each sample's loss (both terms) is
            multiplied by it; the student's class weights (``train.class_weight``) by the
            sample's label, as :func:`xdpx.train.losses.training_loss` weights the plain
            cross-entropy.

    Returns:
        ``(loss, ce, kl)``: scalars summed over the batch; ``ce`` is the plain
        cross-entropy with the labels (of the gold samples), ``kl`` the KL term before
        weighting (of every sample).
    """
    if gold is None and sample_weight is None:
        ce = F.cross_entropy(student_logits.float(), labels, reduction="sum")
        kl = distill_kl(student_logits, teacher_logits, temperature)
        return (1.0 - alpha) * ce + (alpha * temperature * temperature) * kl, ce, kl
    dev = student_logits.device
    g = (
        torch.ones(len(labels), device=dev)
        if gold is None
        else gold.to(device=dev, dtype=torch.float32)
    )
    w = torch.ones_like(g) if sample_weight is None else sample_weight.to(dev, torch.float32)
    ce_rows = F.cross_entropy(student_logits.float(), labels, reduction="none")
    log_q = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_p = F.log_softmax(teacher_logits.detach().float() / temperature, dim=-1)
    kl_rows = F.kl_div(log_q, log_p, reduction="none", log_target=True).sum(-1)
    weight = g * alpha + (1.0 - g)  # alpha on gold rows, 1 on the others
    ce = (g * ce_rows).sum()
    loss = (1.0 - alpha) * (w * g * ce_rows).sum()
    loss = loss + temperature * temperature * (w * weight * kl_rows).sum()
    return loss, ce, kl_rows.sum()


# ---------------------------------------------------------------------- writing
def _num(x: float) -> str:
    return f"{x:.9g}"  # round-trips float32


_BREAKS = str.maketrans({"\t": " ", "\n": " ", "\r": " "})


def _field(value: str) -> str:
    """A tsv field: tabs and line breaks become spaces (see the module docstring)."""
    return value.translate(_BREAKS)


def teacher_rows(
    text_columns: Sequence[str],
    texts: Sequence[Sequence[str]],
    labels: Sequence[str],
    logits: np.ndarray,
    probs: np.ndarray,
    extra: dict[str, Sequence[str]] | None = None,
) -> str:
    """The teacher file's text (module docstring): header + one row per example.

    Args:
        text_columns: names of the text column(s), e.g. ``["text"]`` or ``["text1", "text2"]``.
        texts: one sequence of ``n`` texts per text column.
        labels: label strings in class-index order.
        logits: ``[n, num_labels]`` raw logits.
        probs: ``[n, num_labels]`` softmax probabilities.
        extra: other input columns to keep (``concat_origin``), name -> ``n`` values;
            names that clash with the file's own columns are dropped.

    Returns:
        The whole file as one string (write it atomically with ``xdpx.io.write_text``).
    """
    fixed = [ID_COLUMN, *text_columns]
    scores = [f"{PROB_PREFIX}{lab}" for lab in labels] + [f"{LOGIT_PREFIX}{lab}" for lab in labels]
    extra = {k: v for k, v in (extra or {}).items() if k not in fixed + ["pred_label", *scores]}
    lines = ["\t".join(_field(c) for c in fixed + list(extra) + ["pred_label"] + scores)]
    for i in range(len(logits)):
        fields = (
            [str(i), *(_field(col[i]) for col in texts)]
            + [_field(v[i]) for v in extra.values()]
            + [labels[int(np.argmax(logits[i]))]]
            + [_num(p) for p in probs[i]]
            + [_num(z) for z in logits[i]]
        )
        lines.append("\t".join(fields))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------- reading
@dataclass
class TeacherFile:
    """A teacher file read back (:func:`read_teacher_file`).

    Attributes:
        path: where it was read from.
        ids: ``[n]`` values of the ``id`` column, or None when the file has none.
        texts: ``[n]`` first texts; texts2: ``[n]`` second texts (pairs) or None.
        logits: ``[n, num_labels]`` float32 teacher logits in the *requested* label order
            (``log p`` when the file has only probabilities).
        lines: ``[n]`` 1-based line of each row (for messages).
        from_probs: True when the logits were recovered from probabilities.
        gold: ``[n]`` bool from the ``gold`` column, or None when the file has none.
    """

    path: str
    ids: list[int] | None
    texts: list[str]
    texts2: list[str] | None
    logits: np.ndarray
    lines: list[int]
    from_probs: bool
    gold: np.ndarray | None = None


@dataclass
class Teacher:
    """The teacher's outputs aligned with a training split (:func:`load_teacher`).

    Attributes:
        logits: ``[n, num_labels]`` float32, row ``k`` for sample ``k``.
        gold: ``[n]`` bool (False: the sample's label is not gold, it trains on the KL term
            alone), or None when every label is gold.
    """

    logits: np.ndarray
    gold: np.ndarray | None = None


def _records(path: str) -> Iterator[tuple[int, list[str]]]:
    """``(line, fields)`` for each non-empty line of ``path``, split on tabs (no quoting)."""
    with io.open(path, "rb") as raw:
        text = _pyio.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        try:
            for i, line in enumerate(text, start=1):
                line = line.rstrip("\r\n")
                if line:
                    yield i, line.split("\t")
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not valid UTF-8 ({e})") from None


def read_teacher_file(
    path: str, labels: Sequence[str], text_column: str, text2_column: str | None = None
) -> TeacherFile:
    """Read a teacher file and take the scores of ``labels``, in that order.

    Args:
        path: local path or fsspec URL.
        labels: the student's labels (class-index order); each needs a ``logit_<label>``
            column (preferred when every label has one) or a ``prob_<label>`` column.
        text_column / text2_column: the text column names the student's prepro used.

    Raises:
        DataError: missing file, no header, a missing column, teacher labels that differ
            from the student's, a row with the wrong number of fields, a non-numeric,
            non-finite or (probabilities) out-of-range score, a ``gold`` value other than
            0 or 1; each names the file and line.
    """
    if not io.exists(path):
        raise DataError(f"train.distill_from: {path} not found")
    records = _records(path)
    first = next(records, None)
    if first is None:
        raise DataError(f"{path}: empty file, expected a header row (predict.distill=true)")
    header = [h.strip() for h in first[1]]
    col = {name: i for i, name in enumerate(header)}
    needed = [text_column] + ([text2_column] if text2_column else [])
    missing = [c for c in needed if c not in col]
    if missing:
        raise DataError(
            f"{path}:1: no column {missing[0]!r} (the student's prepro text column); columns "
            f"found: {header}. Write the file with `xdpx pred predict.distill=true`"
        )
    teacher_labels = sorted(
        {h[len(p) :] for h in header for p in (PROB_PREFIX, LOGIT_PREFIX) if h.startswith(p)}
    )
    if set(teacher_labels) != set(labels):
        raise DataError(
            f"{path}:1: the teacher's labels {teacher_labels} (prob_*/logit_* columns) differ "
            f"from the student's {sorted(labels)}"
        )
    from_probs = not all(f"{LOGIT_PREFIX}{lab}" in col for lab in labels)
    prefix = PROB_PREFIX if from_probs else LOGIT_PREFIX
    lacking = [lab for lab in labels if f"{prefix}{lab}" not in col]
    if lacking:
        raise DataError(
            f"{path}:1: no column {prefix}{lacking[0]} (nor {LOGIT_PREFIX}{lacking[0]})"
        )
    score_cols = [col[f"{prefix}{lab}"] for lab in labels]
    id_col = col.get(ID_COLUMN)
    gold_col = col.get(GOLD_COLUMN)
    gold: list[bool] | None = [] if gold_col is not None else None
    ids: list[int] | None = [] if id_col is not None else None
    texts: list[str] = []
    texts2: list[str] | None = [] if text2_column else None
    scores: list[list[float]] = []
    lines: list[int] = []
    for line, fields in records:
        if len(fields) != len(header):
            raise DataError(
                f"{path}:{line}: expected {len(header)} tab-separated fields ({', '.join(header)}), "
                f"got {len(fields)}"
            )
        try:
            values = [float(fields[i]) for i in score_cols]
        except ValueError:
            raise DataError(
                f"{path}:{line}: non-numeric {prefix}* value in {[fields[i] for i in score_cols]}"
            ) from None
        if not all(np.isfinite(values)):
            raise DataError(f"{path}:{line}: non-finite {prefix}* value in {values}")
        if from_probs and (min(values) < 0 or abs(sum(values) - 1.0) > 1e-3):
            raise DataError(
                f"{path}:{line}: {PROB_PREFIX}* values {values} are not probabilities (sum to 1)"
            )
        if ids is not None:
            try:
                ids.append(int(fields[id_col]))  # type: ignore[index]
            except ValueError:
                raise DataError(
                    f"{path}:{line}: {ID_COLUMN}={fields[id_col]!r} is not an integer"  # type: ignore[index]
                ) from None
        if gold is not None:
            flag = fields[gold_col].strip()  # type: ignore[index]
            if flag not in ("0", "1"):
                raise DataError(f"{path}:{line}: {GOLD_COLUMN}={flag!r} is not 0 or 1")
            gold.append(flag == "1")
        texts.append(fields[col[text_column]].strip())
        if texts2 is not None:
            texts2.append(fields[col[text2_column]].strip())  # type: ignore[index]
        scores.append(values)
        lines.append(line)
    arr = np.asarray(scores, dtype=np.float64).reshape(len(scores), len(labels))
    if from_probs:
        arr = np.log(np.clip(arr, np.finfo(np.float64).tiny, None))
    return TeacherFile(
        path, ids, texts, texts2, arr.astype(np.float32), lines, from_probs=from_probs,
        gold=np.asarray(gold, dtype=bool) if gold is not None else None,
    )  # fmt: skip


def load_teacher_logits(
    path: str, data_dir: str, split: str, data: SplitData, meta: PreparedMeta | None = None
) -> np.ndarray:
    """Teacher logits aligned with the samples of ``split``: :func:`load_teacher`'s ``logits``
    (same arguments, same checks and errors)."""
    return load_teacher(path, data_dir, split, data, meta).logits


def load_teacher(
    path: str, data_dir: str, split: str, data: SplitData, meta: PreparedMeta | None = None
) -> Teacher:
    """Teacher logits (and gold flags) aligned with the samples of ``split``, after checking
    the alignment.

    Args:
        path: the teacher file (``train.distill_from``).
        data_dir: the student's prepared data (its encoder files and ``meta.json``).
        split: the split trained on (``train.train_subset``), for messages.
        data: that split as loaded by the trainer (``load_split``), in shard order.
        meta: ``data_dir``'s meta.json when the caller has read it (else read here).

    Returns:
        :class:`Teacher`: ``logits`` ``[n, num_labels]`` float32, row ``k`` = the teacher's
        logits for sample ``k``; ``gold`` ``[n]`` bool from the file's ``gold`` column, or None.

    Raises:
        DataError: the file cannot be read (:func:`read_teacher_file`), has another
            number of rows, ids out of order, or a row whose text does not encode to the
            sample's token ids; the message names the file, the line and the fix.
    """
    if meta is None:
        meta = PreparedMeta.read(data_dir)
    prepro = meta.prepro
    split_meta = meta.splits.get(split)
    source = (split_meta and split_meta.source) or f"the {split} file"
    encoder = Encoder.from_dir(data_dir, meta)
    teacher = read_teacher_file(
        path, encoder.labels, prepro.get("text_column", "text"), prepro.get("text2_column")
    )
    n = len(data)
    fix = (
        f"predict the training file itself: xdpx pred predict.data_file={source} "
        "predict.distill=true"
    )
    if len(teacher.texts) != n:
        raise DataError(
            f"{path}: {len(teacher.texts)} teacher rows but split {split!r} of {data_dir} has {n} "
            f"samples (from {source}); {fix}"
        )
    if teacher.ids is not None:
        expected = np.asarray(data.ids).tolist()
        for k, (got, want) in enumerate(zip(teacher.ids, expected, strict=True)):
            if got != want:
                raise DataError(
                    f"{path}:{teacher.lines[k]}: id {got} where sample id {want} of split {split!r} "
                    f"was expected (row {k}); rows must be in the order of {source}; {fix}"
                )
    ids, ids2 = encoder.encode_inputs(teacher.texts, teacher.texts2)
    bad = [
        k
        for k in range(n)
        if not np.array_equal(ids[k], data.input_ids[k])
        or (
            ids2 is not None
            and data.input_ids2 is not None
            and not np.array_equal(ids2[k], data.input_ids2[k])
        )
    ]
    if bad:
        k = bad[0]
        raise DataError(
            f"{path}:{teacher.lines[k]}: text {teacher.texts[k][:60]!r} does not match sample {k} "
            f"of split {split!r} ({source}); {len(bad)} of {n} rows differ: the predictions were "
            f"made on another file or in another order; {fix}"
        )
    log.info(
        "distill_from %s: %d teacher rows aligned with split %r (%s)%s%s",
        path,
        n,
        split,
        source,
        "; logits recovered as log p" if teacher.from_probs else "",
        f"; {int(teacher.gold.sum())} with a gold label" if teacher.gold is not None else "",
    )
    return Teacher(teacher.logits, teacher.gold)
