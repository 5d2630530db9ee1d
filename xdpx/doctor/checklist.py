"""The training checklists of ``xdpx doctor``, run on the user's own config, data and model.

When a model does not learn, experienced engineers go through a checklist by hand: the
Hugging Face course's "Debugging the training pipeline" (decode a batch back to text, check
the labels and ``num_labels``, look at the first loss, overfit one batch, check the learning
rate), self-check lists for non-converging models (data/label alignment, padding masks,
loss reduction under gradient accumulation, ``DistributedSampler.set_epoch``) and framework
FAQs (NaN loss, out-of-range labels). Each function here runs one item of those lists
through xdpx's own code paths (``stages.train``'s model building, the Trainer's data order,
micro-batching and update) and returns a :class:`Check`: OK, WARN or FAIL with one line
naming the cause and what to change, or SKIP saying why the check does not apply.

:func:`run_checklist` runs them all (about a minute on 2 CPU cores for the demo);
``fast=True`` is the subset that ``train.preflight_doctor`` runs before training (all but
overfitting one batch). Every check works on a fresh copy of the model built exactly as
``stages.train`` builds it (same seed, same ``prepare``); nothing is written.
"""

from __future__ import annotations

import copy
import logging
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xdpx import io
from xdpx.config import TrainConfig
from xdpx.data import PreparedMeta
from xdpx.data.lazy import TrainData, open_train_split
from xdpx.data.vocab import PAD, UNK, read_tokens
from xdpx.errors import DivergenceError, PreflightError
from xdpx.inference import Batch, call_model, pad_batch
from xdpx.train.diagnosis import find_nonfinite
from xdpx.train.sampling import rank_share
from xdpx.train.setup import TrainSetup, resolve

__all__ = [
    "Check",
    "FAST",
    "LR_RANGES",
    "Probe",
    "run_checklist",
    "preflight_doctor",
]

#: Statuses in increasing severity (``skip``: the check does not apply, with the reason).
STATUSES = ("ok", "skip", "warn", "fail")


@dataclass
class Check:
    """One finding of the doctor.

    Attributes:
        status: ``ok``, ``warn``, ``fail`` or ``skip`` (does not apply; ``detail`` says why).
        name: the check (``labels[train]``, ``padding``, ``overfit_batch``, ...).
        detail: one line: what was measured, the cause and what to change.
        lines: extra lines printed under it (the decoded batch).
        seconds: wall time of the check.
    """

    status: str
    name: str
    detail: str
    lines: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        """``OK    name: detail`` style, aligned."""
        return f"{self.status.upper():5} {self.name}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        """The check as a JSON object (``reports/doctor.json``)."""
        return asdict(self)


#: Usual peak learning rates of AdamW per model family: ``(low, high, source)``. Outside
#: ``[low, high]`` the ``learning_rate`` check warns.
LR_RANGES: dict[str, tuple[float, float, str]] = {
    "ngram_lr": (1e-3, 1e-1, "AdamW on a linear model; xdpx's default 1e-2 was chosen on dev over 10 splits (docs/benchmark-suite.md)"),
    "match_ngram": (1e-3, 1e-1, "AdamW on a linear model; xdpx's default 1e-2 (docs/benchmark-suite.md)"),
    "textcnn": (1e-4, 1e-2, "Adam's default 1e-3 (Kingma & Ba 2015), used for TextCNN/BiLSTM classifiers"),
    "bilstm": (1e-4, 1e-2, "Adam's default 1e-3 (Kingma & Ba 2015)"),
    "match_esim": (1e-4, 1e-2, "ESIM trains with Adam at 4e-4 (Chen et al. 2017)"),
    "siamese": (1e-4, 1e-2, "Adam's default 1e-3 (Kingma & Ba 2015)"),
    "hf_classifier": (1e-5, 2e-4, "BERT fine-tuning uses 2e-5..5e-5 (Devlin et al. 2019, A.3), compact BERTs up to 1e-4 (Turc et al. 2019)"),
}  # fmt: skip

#: Checks in the fast subset (``train.preflight_doctor``, ``xdpx doctor --fast``).
FAST = (
    "first_batch",
    "num_labels",
    "inputs",
    "alignment",
    "split_consistency",
    "learning_rate",
    "schedule",
    "initial_loss",
    "padding",
    "grad_flow",
    "data_order",
    "reduction",
)

#: Relative gradient difference under which accumulation equals one big batch (float32 sums
#: in another order differ by ~1e-6).
GRAD_RTOL = 1e-4
#: Padding invariance: logits may differ by this much (absolute) when only padding changes.
PAD_ATOL = 1e-5


# ---------------------------------------------------------------------------- the probe
@dataclass
class Probe:
    """What the checks share: the config, the prepared data as the trainer reads it and the
    model as ``stages.train`` builds it (never trained here: each check copies it).

    Attributes:
        cfg: the ``train`` section, ``learning_rate`` resolved.
        meta: the prepared data's ``meta.json``.
        data: the training split (:class:`~xdpx.data.lazy.TrainData`).
        template: the freshly initialised model.
        model_config: its constructor arguments.
        tokens: ``vocab.txt`` in id order.
        workdir: a temporary directory for the trainers' (unused) save_dirs, removed by
            :meth:`close`.
    """

    cfg: TrainConfig
    meta: PreparedMeta
    data: TrainData
    template: nn.Module
    model_config: dict[str, Any]
    tokens: list[str]
    workdir: str = field(default_factory=lambda: io.mkdtemp("xdpx-doctor-"))
    #: results one check leaves for a later one (the alignment classifier's features)
    shared: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        """Remove :attr:`workdir`; stop a lazy split's read-ahead threads."""
        import shutil

        shutil.rmtree(self.workdir, ignore_errors=True)
        close = getattr(getattr(self.data, "split", None), "close", None)
        if close is not None:
            close()

    @classmethod
    def open(cls, cfg: TrainConfig, setup: TrainSetup | None = None) -> Probe:
        """Read the data and build the model from ``cfg`` as ``stages.train`` does: through
        the one set-up step (:func:`xdpx.train.setup.resolve`; ``setup``: its result when the
        caller has it, e.g. ``train.preflight_doctor``).

        Raises:
            FileNotFoundError, DataError: no prepared data; ValueError: the model does not
            fit the data (``xdpx.models.check_model_fits_data``).
        """
        setup = setup if setup is not None else resolve(cfg)
        cfg, meta = setup.cfg, setup.meta
        data, _, texts = open_train_split(
            cfg.data_dir, cfg.train_subset, cfg.seed, cfg.lazy_load, meta
        )
        model, model_config, _ = setup.build(texts)
        return cls(cfg, meta, data, model, model_config, read_tokens(setup.vocab_file))

    @property
    def num_labels(self) -> int:
        """Labels in the target map."""
        return len(self.meta.labels)

    @property
    def pad_id(self) -> int:
        return self.meta.pad_id

    def model(self, dropout: bool = False) -> nn.Module:
        """A fresh copy of the initial model; ``dropout=False``: eval mode (deterministic),
        except RNN modules on CUDA, whose backward needs train mode (their dropout only acts
        between stacked layers)."""
        model = copy.deepcopy(self.template)
        model.train(dropout)
        if not dropout and torch.cuda.is_available():
            for m in model.modules():
                if isinstance(m, nn.RNNBase):
                    m.train()
        return model

    def first_ids(self, n: int | None = None) -> np.ndarray:
        """The sample ids of the trainer's first micro-batch (epoch 1, ``batch_size``), or the
        first ``n`` of epoch 1's order."""
        self.data.set_epoch(1)
        return self.data.window(0, n or self.cfg.batch_size)

    def batch(self, ids: np.ndarray, extra_pad: int = 0) -> tuple[Batch, torch.Tensor]:
        """Padded inputs and labels of ``ids`` (each input padded ``extra_pad`` wider)."""
        samples = self.data.samples(ids)
        min_len = getattr(self.template, "min_len", 1)
        x = pad_batch(samples, self.pad_id, min_len)
        if extra_pad:
            x = _pad_more(x, self.pad_id, extra_pad)
        return x, torch.from_numpy(self.data.labels(ids))

    def trainer(self, model: nn.Module, samples: np.ndarray | None = None, **updates: Any) -> Any:
        """A :class:`~xdpx.train.trainer.Trainer` over this data (or over ``samples`` only, as a new
        split), with ``cfg`` keys replaced by ``updates``; no validation split. It writes
        nothing unless ``fit`` or a save runs, and its save_dir is a temporary directory."""
        from xdpx.data.lazy import InMemoryData
        from xdpx.train.trainer import Trainer

        cfg = self.cfg.model_copy(update={"save_dir": tempfile.mkdtemp(dir=self.workdir), **updates})  # fmt: skip
        data: TrainData = self.data
        if samples is not None:
            data = InMemoryData(self.data.samples(samples), self.data.labels(samples), cfg.seed)
        return Trainer(
            model, cfg, data, None, None, None, self.cfg.model, self.model_config,
            self.cfg.data_dir, self.pad_id,
        )  # fmt: skip


def _pad_more(x: Batch, pad_id: int, extra: int) -> Batch:
    if isinstance(x, tuple):
        return tuple(_pad_more(t, pad_id, extra) for t in x)  # type: ignore[misc]
    return F.pad(x, (0, extra), value=pad_id)


def _loss(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float(F.cross_entropy(logits.float(), y))


def _fmt(x: float) -> str:
    return f"{x:.3g}"


# ---------------------------------------------------------------------------- the checks
def check_first_batch(p: Probe) -> Check:
    """Decode the trainer's first micro-batch back to text next to the raw lines.

    Shows up to 4 samples: the raw file, line and label, and the token ids decoded with
    ``vocab.txt`` (tokenizer pieces, ``[UNK]``, the cut at ``max_len`` and the padding of
    the batch visible). FAIL when a decoded label differs from the raw line's label (the
    shards are not aligned with the raw file: prepare again); WARN when more than 10% of
    the batch's tokens are ``[UNK]`` (a vocabulary from another corpus or tokenizer).
    """
    ids = p.first_ids()
    samples = p.data.samples(ids)
    labels = p.data.labels(ids)
    width = [max(len(_sides(s)[k]) for s in samples) for k in range(len(_sides(samples[0])))]
    raw = _raw_lines(p, ids[:4])
    join = "" if p.meta.tokenizer == "char" else " "
    lines, mismatch = [], []
    for sid, sample, label in zip(ids[:4], samples, labels, strict=False):
        name = p.meta.labels[label] if 0 <= label < p.num_labels else f"<id {label}>"
        where, raw_texts, raw_label = raw.get(int(sid), ("", None, None))
        lines.append(f"sample {int(sid)} {where}label {name}")
        for k, side in enumerate(_sides(sample)):
            if raw_texts is not None:
                lines.append(f"  raw{k + 1 if len(width) > 1 else ''}:     {_clip(raw_texts[k])}")
            cut = " [cut at max_len]" if len(side) >= p.meta.max_len else ""
            pad = width[k] - len(side)
            text = join.join(p.tokens[t] if t < len(p.tokens) else f"<{t}>" for t in side)
            lines.append(
                f"  decoded{k + 1 if len(width) > 1 else ''}: {_clip(text)}{cut}"
                + (f" {PAD}x{pad}" if pad else "")
            )
        if raw_label is not None and raw_label != name:
            mismatch.append(f"sample {int(sid)} ({where.strip()}) is {raw_label!r} in the raw file but {name!r} in the shards")  # fmt: skip
    flat = np.concatenate([np.asarray(side) for s in samples for side in _sides(s)])
    unk = p.tokens.index(UNK) if UNK in p.tokens else -1
    unk_share = float(np.mean(flat == unk)) if len(flat) else 0.0
    shape = " + ".join(f"[{len(ids)}, {w}]" for w in width)
    detail = f"{len(ids)} samples, ids {shape}, {unk_share:.1%} [UNK]; decoded below"
    if mismatch:
        return Check("fail", "first_batch", "prepared labels differ from the raw file: " + "; ".join(mismatch[:2]) + ": run prepro again (the shards are stale or misaligned)", lines)  # fmt: skip
    if unk_share > 0.10:
        return Check("warn", "first_batch", f"{unk_share:.0%} of the first batch's tokens are [UNK]: the vocabulary does not cover this text (prepro.vocab_file from another corpus, prepro.threshold/nwords too strict, or a pretrained vocabulary without this script: prepro.transliterate)", lines)  # fmt: skip
    return Check("ok", "first_batch", detail, lines)


def _sides(sample: Any) -> tuple[np.ndarray, ...]:
    return sample if isinstance(sample, tuple) else (sample,)


def _clip(text: str, n: int = 100) -> str:
    text = text.replace("\t", " ").replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


def _raw_lines(p: Probe, ids: np.ndarray) -> dict[int, tuple[str, list[str], str | None]]:
    """``{sample id: ("train.tsv:LINE ", [text, text2], raw label)}`` for the samples of
    ``ids`` whose raw file is readable (the shards' ``id`` is the row among a file's kept
    rows; ``part-<file>-<k>`` names the file). Empty when the raw files are gone."""
    from xdpx.config import PreproConfig
    from xdpx.data.readers import DataError, iter_examples
    from xdpx.data.shards import split_shards

    entry = p.meta.splits.get(p.cfg.train_subset)
    sources = entry.source if entry is not None else None
    if not sources:
        return {}
    sources = [sources] if isinstance(sources, str) else list(sources)
    try:
        cfg = PreproConfig(**{k: v for k, v in p.meta.prepro.items() if k in PreproConfig.model_fields})  # fmt: skip
        shards = split_shards(p.cfg.data_dir, p.cfg.train_subset)
    except (ValueError, DataError):
        return {}
    # global sample index -> (file index, row in the file)
    starts, files, pos = [], [], 0
    for path, rows in shards:
        if rows is None:
            return {}
        starts.append(pos)
        files.append(int(path.rsplit("/", 1)[-1].split("-")[1]))
        pos += rows
    first_row: dict[int, int] = {}
    for s, f in zip(starts, files, strict=True):
        first_row.setdefault(f, s)
    wanted: dict[int, dict[int, int]] = {}
    for sid in ids.tolist():
        j = int(np.searchsorted(starts, sid, side="right")) - 1
        f = files[j]
        wanted.setdefault(f, {})[sid - first_row[f]] = sid
    out: dict[int, tuple[str, list[str], str | None]] = {}
    for f, rows in wanted.items():
        if f >= len(sources) or not io.isfile(sources[f]):
            continue
        seen = 0
        try:
            for chunk in iter_examples(sources[f], cfg, require_label=False):
                for k in range(len(chunk)):
                    sid = rows.get(seen + k)
                    if sid is not None:
                        texts = [chunk.texts[k]] + ([chunk.texts2[k]] if chunk.texts2 else [])
                        label = chunk.labels[k] if chunk.labels else None
                        name = sources[f].rsplit("/", 1)[-1]
                        out[sid] = (f"{name}:{chunk.line_numbers[k]} ", texts, label)
                seen += len(chunk)
                if seen > max(rows):
                    break
        except DataError:
            continue
    return out


def check_num_labels(p: Probe) -> Check:
    """The model's logits against the target map: ``logits.shape[-1]`` must equal the number
    of labels (one more: a class the data never has; one less: the last label cannot be
    predicted and its samples crash cross-entropy)."""
    x, _ = p.batch(p.first_ids(8))
    with torch.no_grad():
        logits = call_model(p.model(), x)
    n_out, k = int(logits.shape[-1]), p.num_labels
    labels = ", ".join(p.meta.labels)
    if n_out != k:
        more = (
            "one class that no sample has"
            if n_out == k + 1
            else f"{n_out - k} classes no sample has"
        )
        less = "the last label can never be predicted and its samples are out of range for the loss"  # fmt: skip
        why = more if n_out > k else less
        return Check("fail", "num_labels", f"the model outputs {n_out} logits but the target map has {k} labels ({labels}): {why}; num_labels must be the target map's size (model_config num_labels={p.model_config.get('num_labels')}; prepro.target_map_file)")  # fmt: skip
    return Check("ok", "num_labels", f"the model's {n_out} logits match the target map's {k} labels ({labels})")  # fmt: skip


def check_inputs(p: Probe) -> Check:
    """NaN/Inf and out-of-range values before they reach the loss.

    Token ids of every prepared split must lie in ``[0, vocab_size)`` and labels in
    ``[0, num_labels)`` (``-1``: unlabelled); the model's parameters must be finite; on the
    first batch every module's output must be finite (forward hooks,
    :func:`xdpx.train.diagnosis.find_nonfinite`). Reads at most 200,000 rows per split.
    """
    from xdpx.data.lazy import LazySplit

    problems: list[str] = []
    vocab_size = int(p.model_config.get("vocab_size", p.meta.vocab_size))
    limit = 200_000
    for split in p.meta.splits:
        lazy = LazySplit(p.cfg.data_dir, split)
        try:
            seen = 0
            for shard in lazy.iter_shards():
                for name, col in (("input_ids", shard.input_ids), ("input_ids2", shard.input_ids2)):  # fmt: skip
                    if not col:
                        continue
                    flat = np.concatenate(col)
                    bad = (flat < 0) | (flat >= vocab_size)
                    if bad.any():
                        problems.append(f"{split}: {int(bad.sum())} {name} outside [0, {vocab_size})")  # fmt: skip
                lab = shard.labels
                out = (lab >= p.num_labels) | (lab < -1)
                if out.any():
                    i = int(np.flatnonzero(out)[0])
                    problems.append(f"{split} row id {int(shard.ids[i])}: label id {int(lab[i])} outside [0, {p.num_labels}) of the target map ({int(out.sum())} rows in all)")  # fmt: skip
                seen += len(lab)
                if seen >= limit:
                    break
        finally:
            lazy.close()
    if problems:
        return Check("fail", "inputs", "; ".join(problems[:3]) + ": labels must be in the target map and ids in the vocabulary: prepare the data again with this target map / vocab.txt")  # fmt: skip
    model = p.model()
    bad_params = [n for n, t in model.named_parameters() if not bool(torch.isfinite(t).all())]
    x, y = p.batch(p.first_ids())
    where = find_nonfinite(model, x, y)
    if bad_params or not where.startswith("nothing"):
        params = f"parameter(s) {', '.join(bad_params[:3])} hold NaN/Inf; " if bad_params else ""
        return Check("fail", "inputs", f"{params}NaN/Inf on the first batch, first in the {where}: corrupt initial or pretrained weights (train.pretrained_model), or an operation that overflows (log/div of 0, fp16 range)")  # fmt: skip
    return Check("ok", "inputs", f"ids in [0, {vocab_size}), labels in [0, {p.num_labels}), parameters and every module's output finite on the first batch")  # fmt: skip


#: The alignment classifier's budget: rows of train it reads, n-gram features it keeps
#: (the most frequent), its solver. LinearSVC (liblinear, one-vs-rest) costs ~linear in
#: classes x rows x features; scikit-learn's lbfgs LogisticRegression took 93 s of a 102 s
#: doctor on a 52-class corpus of 5.8k long texts (issue 36), this 4 s on 60 classes.
ALIGN_MAX_ROWS = 6000
ALIGN_MAX_FEATURES = 50_000


def _doc(t: np.ndarray) -> str:
    return " ".join(map(str, t.tolist()))


def bag_features(vec: Any, samples: list[Any], fit: bool = False) -> Any:
    """TF-IDF rows of ``samples`` (token ids as words, 1-2-grams); pairs as
    ``[|u - v|, u * v]`` of the two texts' rows (the pair baseline's features)."""
    import scipy.sparse as sp

    if not samples or not isinstance(samples[0], tuple):
        docs = [_doc(s) for s in samples]
        return vec.fit_transform(docs) if fit else vec.transform(docs)
    if fit:
        vec.fit([_doc(s[0]) for s in samples] + [_doc(s[1]) for s in samples])
    u = vec.transform([_doc(s[0]) for s in samples])
    v = vec.transform([_doc(s[1]) for s in samples])
    return sp.hstack([abs(u - v), u.multiply(v)]).tocsr()


def bag_classifier() -> Any:
    """The alignment classifier: scikit-learn's ``LinearSVC(C=0.5)`` (liblinear,
    one-vs-rest; see :data:`ALIGN_MAX_FEATURES` for why not lbfgs logistic regression)."""
    from sklearn.svm import LinearSVC

    return LinearSVC(C=0.5)


def check_alignment(p: Probe, max_rows: int = ALIGN_MAX_ROWS) -> Check:
    """Are the labels related to the texts at all? A bag-of-tokens linear classifier
    (TF-IDF 1-2-grams of the token ids, the :data:`ALIGN_MAX_FEATURES` most frequent, and
    scikit-learn's ``LinearSVC``), 3-fold cross-validated on up to ``max_rows`` training
    samples, must beat the majority class by more than chance: if it does not, labels were
    shuffled or sorted apart from their texts, or the wrong column is the label. The
    one-sided binomial test against the majority-class rate must give p < 0.001 (WARN
    below that with p < 0.05). Leaves its features in ``p.shared`` for
    :func:`check_split_consistency`."""
    from scipy.stats import binomtest
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    n = len(p.data)
    p.data.set_epoch(1)
    ids = np.sort(p.data.window(0, min(n, max_rows)))
    y = p.data.labels(ids)
    counts = np.bincount(y[y >= 0], minlength=p.num_labels)
    if len(ids) < 60 or (counts >= 3).sum() < 2:
        return Check("skip", "alignment", f"needs >= 60 training samples in >= 2 classes of >= 3 (has {len(ids)})")  # fmt: skip
    keep = np.isin(y, np.flatnonzero(counts >= 3))
    ids, y = ids[keep], y[keep]
    vec = TfidfVectorizer(token_pattern=r"\S+", ngram_range=(1, 2), sublinear_tf=True, min_df=2, max_features=ALIGN_MAX_FEATURES)  # fmt: skip
    x = bag_features(vec, p.data.samples(ids), fit=True)
    folds = StratifiedKFold(n_splits=3, shuffle=True, random_state=0)
    pred = cross_val_predict(bag_classifier(), x, y, cv=folds)
    correct = int((pred == y).sum())
    majority = float(np.bincount(y).max() / len(y))
    acc = correct / len(y)
    pvalue = binomtest(correct, len(y), majority, alternative="greater").pvalue
    p.shared["bag"] = {"vec": vec, "x": x, "y": y, "accuracy": acc, "majority": majority, "pvalue": pvalue}  # fmt: skip
    what = f"a bag-of-tokens classifier scores {acc:.3f} on held-out folds of {len(y)} training samples vs {majority:.3f} for the majority class (p={pvalue:.2g})"  # fmt: skip
    fix = "labels look unrelated to the texts: check that the label column is aligned with the text column (labels shuffled or sorted apart from the texts, the wrong prepro.label_column/text_column, a header mix-up)"  # fmt: skip
    if pvalue >= 0.05:
        return Check("fail", "alignment", f"{what}: {fix}")
    if pvalue >= 1e-3:
        return Check("warn", "alignment", f"{what}: barely above chance; {fix}")
    return Check("ok", "alignment", what)


def _split_head(data_dir: str, split: str, max_rows: int) -> tuple[list[Any], np.ndarray]:
    """The first ``max_rows`` labelled samples of ``split`` (shard by shard) and their labels."""
    from xdpx.data.lazy import LazySplit
    from xdpx.inference import as_samples

    samples: list[Any] = []
    labels: list[np.ndarray] = []
    shards = LazySplit(data_dir, split)
    try:
        for d in shards.iter_shards():
            keep = np.flatnonzero(d.labels >= 0)[: max_rows - len(samples)]
            rows = as_samples(d.input_ids, d.input_ids2)
            samples += [rows[i] for i in keep]
            labels.append(d.labels[keep])
            if len(samples) >= max_rows:
                break
    finally:
        shards.close()
    return samples, np.concatenate(labels) if labels else np.zeros(0, np.int64)


def check_split_consistency(p: Probe, max_rows: int = ALIGN_MAX_ROWS) -> Check:
    """Do the other splits mean by each label what train does? :func:`check_alignment`'s
    classifier, fit on its train samples, scores the first ``max_rows`` labelled rows of
    every other split (dev, test). FAIL when a split scores below its own majority-class
    rate (one-sided binomial test, p < 0.01: e.g. dev's labels inverted with respect to
    train's, as when dev comes from a source whose 0/1 are swapped), or far below the
    classifier's held-out train score: more than half its gain over the majority class
    lost, and by more than 3 standard errors of the split's accuracy (the split's labels
    then disagree with train's on much of it; early stopping would pick by a meaningless
    dev score). WARN: texts that prepro found under another label in train
    (``meta.json`` ``conflicts.across_train``), listed."""
    from scipy.stats import binomtest

    bag = p.shared.get("bag")
    if bag is None or bag["pvalue"] >= 0.05:
        return Check("skip", "split_consistency", "needs the alignment classifier (alignment OK or WARN)")  # fmt: skip
    others = [s for s, m in p.meta.splits.items() if s != p.cfg.train_subset and m.has_labels and m.rows]  # fmt: skip
    if not others:
        return Check("skip", "split_consistency", "no labelled split besides train")
    clf = bag_classifier().fit(bag["x"], bag["y"])
    a_train, m_train = bag["accuracy"], bag["majority"]
    scored, bad = [], []
    for split in others:
        samples, y = _split_head(p.cfg.data_dir, split, max_rows)
        if not len(y):
            continue
        acc = float((clf.predict(bag_features(bag["vec"], samples)) == y).mean())
        majority = float(np.bincount(y).max() / len(y))
        scored.append(f"{split} {acc:.3f} (majority {majority:.3f}, {len(y)} rows)")
        below = binomtest(round(acc * len(y)), len(y), majority, alternative="less").pvalue
        se = math.sqrt(max(a_train * (1 - a_train), 1e-6) / len(y))
        if below < 0.01:
            bad.append(f"{split} scores {acc:.3f}, below its majority-class rate {majority:.3f} (p={below:.2g})")  # fmt: skip
        elif acc < a_train - max(0.5 * (a_train - m_train), 3 * se):
            bad.append(f"{split} scores {acc:.3f}, far below {a_train:.3f} on held-out train folds (majority {m_train:.3f})")  # fmt: skip
    what = f"a classifier fit on train scores {', '.join(scored)} vs {a_train:.3f} on held-out train folds"  # fmt: skip
    if bad:
        return Check("fail", "split_consistency", f"{'; '.join(bad)}: the labels of {' and '.join(b.split()[0] for b in bad)} do not mean what train's mean (inverted or permuted labels, another source's label scheme, the wrong label column in that file); early stopping would pick by a meaningless score")  # fmt: skip
    across = (p.meta.conflicts or {}).get("across_train") or {}
    if any(across.values()):
        shown = "; ".join((p.meta.conflicts or {}).get("examples", [])[:3])
        counts = ", ".join(f"{n} in {s}" for s, n in across.items() if n)
        return Check("warn", "split_consistency", f"{what}; texts that train labels otherwise: {counts} (e.g. {shown}); prepro.conflicts=drop removes them")  # fmt: skip
    return Check("ok", "split_consistency", what)


def schedule_multipliers(cfg: TrainConfig, total: int) -> np.ndarray:
    """``[total]`` the learning rate of updates 1..``total`` as a share of its peak, from
    the scheduler the trainer builds (:func:`xdpx.train.optim.build_scheduler`: update ``k``
    runs at ``peak * lr_lambda(k - 1)``)."""
    from xdpx.train.optim import build_scheduler

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = build_scheduler(opt, cfg, total)
    fn = sched.lr_lambdas[0]
    return np.array([fn(k) for k in range(total)], dtype=np.float64)


def schedule_findings(cfg: TrainConfig, multipliers: np.ndarray, first_eval: int) -> tuple[str, str]:  # fmt: skip
    """``(status, detail)`` of a run's lr schedule (:func:`check_schedule`'s rules)."""
    from xdpx.train.optim import warmup_updates

    total = len(multipliers)
    warmup = warmup_updates(cfg, total)
    peak = float(multipliers.max()) if total else 0.0
    what = f"{cfg.lr_scheduler} over {total:,} updates, {warmup:,} of warmup; the lr peaks at {100 * peak:.3g}% of learning_rate, first evaluation at update {first_eval:,}"  # fmt: skip
    if warmup > total:
        return "fail", f"{what}: train.warmup_steps/warmup_ratio gives {warmup:,} updates of warmup, longer than the run's whole budget of {total:,} (max_epoch, max_update, max_samples): the lr never leaves the warmup; shorten the warmup or raise the budget"  # fmt: skip
    if peak < 0.1:
        return "fail", f"{what}: the lr never reaches 10% of its peak; check lr_scheduler and warmup against the budget"  # fmt: skip
    before = multipliers[warmup : max(first_eval - 1, warmup)]
    if len(before) and (before < 0.01).mean() > 0.1:
        dead = int(np.argmax(multipliers[warmup:] < 0.01)) + warmup + 1
        return "warn", f"{what}: the lr is below 1% of its peak from update {dead:,}, long before the first evaluation: those updates barely train; evaluate earlier (train.eval_interval) or lengthen the schedule"  # fmt: skip
    return "ok", what


def check_schedule(p: Probe) -> Check:
    """The learning rate of every update of the run, from the config and the train size as
    the trainer computes them (budget: :func:`xdpx.train.sampling.total_updates` of one process;
    schedule: :func:`schedule_multipliers`; first evaluation: ``eval_interval`` updates
    after ``eval_interval_warmup``, or the first epoch end). FAIL: the warmup is longer
    than the budget (the lr never leaves it), or the lr never reaches 10% of its peak.
    WARN: after the warmup, more than a tenth of the updates before the first evaluation
    run below 1% of the peak (a schedule that decays to ~0 long before anything is
    evaluated)."""
    from xdpx.train.sampling import total_updates

    cfg = p.cfg
    window = cfg.batch_size * cfg.update_freq
    total = total_updates(len(p.data), window, cfg)
    if total < 1:
        return Check("skip", "schedule", "the budget allows no update")
    per_epoch = math.ceil(len(p.data) / window)
    if cfg.eval_interval > 0:
        first = max(cfg.eval_interval, math.ceil(cfg.eval_interval_warmup / cfg.eval_interval) * cfg.eval_interval)  # fmt: skip
    else:
        first = max(per_epoch, math.ceil(cfg.eval_interval_warmup / per_epoch) * per_epoch)
    status, detail = schedule_findings(cfg, schedule_multipliers(cfg, total), min(first, total))
    return Check(status, "schedule", detail)


def check_learning_rate(p: Probe) -> Check:
    """``learning_rate`` (and ``head_learning_rate``) against :data:`LR_RANGES`, the usual
    peak learning rates of the model family with their source."""
    rng = LR_RANGES.get(p.cfg.model)
    if rng is None:
        return Check("skip", "learning_rate", f"no usual range known for model {p.cfg.model}")
    low, high, source = rng
    out = []
    for key, lr in (("learning_rate", p.cfg.learning_rate), ("head_learning_rate", p.cfg.head_learning_rate)):  # fmt: skip
        if lr is None or (key == "head_learning_rate" and p.cfg.model != "hf_classifier"):
            continue
        lo, hi = (low, high) if key == "learning_rate" else (low, 1e-2)
        if not lo <= lr <= hi:
            side = "above" if lr > hi else "below"
            risk = "updates overshoot: the loss jumps or diverges" if lr > hi else "training barely moves in the budget"  # fmt: skip
            out.append(f"train.{key}={_fmt(lr)} is {side} the usual range {_fmt(lo)}..{_fmt(hi)} for {p.cfg.model} ({source}): {risk}; try {_fmt(math.sqrt(lo * hi))} or train.learning_rate=null (the model's default)")  # fmt: skip
    if out:
        return Check("warn", "learning_rate", "; ".join(out))
    return Check("ok", "learning_rate", f"{_fmt(p.cfg.learning_rate)} within the usual {_fmt(low)}..{_fmt(high)} for {p.cfg.model} ({source})")  # fmt: skip


def check_initial_loss(p: Probe) -> Check:
    """Cross-entropy of the untrained model on the first 256 samples of epoch 1 against
    ``ln(num_labels)``, the loss of a uniform guess (Karpathy 2019, "A Recipe for Training
    Neural Networks": verify loss @ init). Far above: the initial logits are large (bad init
    or a scale bug) or confidently wrong (labels mismatched to logits); far below: the
    labels leak into the inputs, or the head is already trained."""
    ids = p.first_ids(256)
    model = p.model()
    losses = []
    with torch.no_grad():
        for i in range(0, len(ids), 64):
            x, y = p.batch(ids[i : i + 64])
            losses.append(F.cross_entropy(call_model(model, x).float(), y, reduction="sum"))
    loss = float(sum(losses)) / len(ids)
    expect = math.log(p.num_labels)
    what = f"{loss:.3f} at init vs ln({p.num_labels}) = {expect:.3f} for a uniform guess"
    if not math.isfinite(loss):
        return Check("fail", "initial_loss", f"{what}: see the inputs check")
    if loss > expect + 1.0:
        return Check("warn", "initial_loss", f"{what}: the untrained model is confidently wrong: initial logits too large (bad init or a scale bug) or labels mismatched to logits (check num_labels and the target map)")  # fmt: skip
    if loss < 0.5 * expect:
        return Check("warn", "initial_loss", f"{what}: far below a guess before training: the labels leak into the inputs, or the head is already trained (a pretrained model with its classifier?)")  # fmt: skip
    return Check("ok", "initial_loss", what)


def check_padding(p: Probe) -> Check:
    """Padding invariance: in eval mode, the logits of the first batch (padded to its longest
    sample) must equal each sample's logits alone (padded only to the model's ``min_len``)
    and the batch's logits with 7 more padding columns, within :data:`PAD_ATOL`."""
    ids = p.first_ids(16)
    model = p.model()
    with torch.no_grad():
        x, _ = p.batch(ids)
        batch = call_model(model, x)
        wider = call_model(model, p.batch(ids, extra_pad=7)[0])
        alone = torch.cat([call_model(model, p.batch(ids[i : i + 1])[0]) for i in range(len(ids))])  # fmt: skip
    d_alone = float((batch - alone).abs().max())
    d_wider = float((batch - wider).abs().max())
    worst = max(d_alone, d_wider)
    what = f"max |logit change| {worst:.1e} between a sample alone, in its batch and with 7 more pad columns"  # fmt: skip
    if worst > PAD_ATOL:
        return Check("fail", "padding", f"{what} (> {PAD_ATOL:g}): padding is not masked: pad positions reach the pooling/attention (mask them with input_ids != pad_id), so predictions depend on the batch")  # fmt: skip
    return Check("ok", "padding", what)


def check_grad_flow(p: Probe) -> Check:
    """One backward pass on the first batch (train mode): every trainable parameter must get
    a gradient, and not all zeros; frozen parameters are listed."""
    model = p.model(dropout=True)
    x, y = p.batch(p.first_ids())
    torch.manual_seed(p.cfg.seed)
    loss = F.cross_entropy(call_model(model, x).float(), y)
    if not loss.requires_grad:
        return Check("fail", "grad_flow", "the loss does not require a gradient: it is detached from the model (a .detach()/.item()/torch.no_grad() in forward, or every parameter frozen)")  # fmt: skip
    loss.backward()
    frozen, none, zero = [], [], []
    for name, t in model.named_parameters():
        if not t.requires_grad:
            frozen.append(name)
        elif t.grad is None:
            none.append(name)
        elif not bool((t.grad.coalesce().values() if t.grad.is_sparse else t.grad).any()):
            zero.append(name)
    trainable = sum(1 for t in model.parameters() if t.requires_grad)
    note = f"; frozen: {_names(frozen)}" if frozen else ""
    if len(none) == trainable:
        return Check("fail", "grad_flow", "no parameter gets a gradient: the loss is detached from the model (a .detach()/.item()/torch.no_grad() in forward)")  # fmt: skip
    if none or zero:
        parts = []
        if none:
            parts.append(f"no gradient for {_names(none)} (never used in forward: a dead branch, or unused weights; DDP then needs find_unused_parameters)")  # fmt: skip
        if zero:
            parts.append(f"all-zero gradient for {_names(zero)} (dead ReLUs, a zero multiplier or a mask that removes everything)")  # fmt: skip
        return Check("warn", "grad_flow", "; ".join(parts) + note)
    return Check("ok", "grad_flow", f"all {trainable} trainable parameter tensors get non-zero gradients{note}")  # fmt: skip


def _names(names: list[str], k: int = 4) -> str:
    return ", ".join(names[:k]) + (f" and {len(names) - k} more" if len(names) > k else "")


def check_data_order(p: Probe) -> Check:
    """The training order the trainer draws: shuffled within an epoch (no correlation with
    the file order, labels not clustered in batches), different across epochs, and under
    DDP (2 simulated ranks, each with its own data object, as under torchrun) disjoint rank
    shares that cover each window and change with the epoch (``DistributedSampler`` needs
    ``set_epoch``; xdpx draws each epoch's order from ``(seed, epoch)``)."""
    data, n = p.data, len(p.data)
    if n < 8:
        return Check("skip", "data_order", f"{n} training samples: too few to judge an order")
    limit = min(n, 20_000)  # positions looked at (whole windows; LazyData reads no rows here)
    data.set_epoch(1)
    o1 = data.window(0, limit)
    data.set_epoch(2)
    o2 = data.window(0, limit)
    fails, warns = [], []
    rho = float(np.corrcoef(np.arange(len(o1)), o1)[0, 1]) if len(o1) > 2 else 0.0
    if abs(rho) > 0.3:
        fails.append(f"shuffling is off: the epoch order follows the file order (correlation {rho:.2f} between position and sample id), so batches hold neighbouring lines (often one label or one source); draw a new permutation each epoch")  # fmt: skip
    labels = data.labels(o1)
    b = p.cfg.batch_size
    cut = len(labels) - len(labels) % b if len(labels) >= 2 * b else len(labels)
    same = labels[1:cut] == labels[: cut - 1]
    same = same[(np.arange(1, cut) % b) != 0] if b > 1 else same  # pairs inside a batch
    freq = np.bincount(labels[labels >= 0]) / max(1, (labels >= 0).sum())
    expected = float((freq**2).sum())
    observed = float(same.mean()) if len(same) else expected
    if observed > expected + 0.15 and not fails:
        warns.append(f"batches cluster by label: {observed:.2f} of neighbouring samples share a label vs {expected:.2f} under shuffling (label-sorted shards with lazy_load? one file per class?)")  # fmt: skip
    if np.array_equal(o1, o2):
        fails.append("every epoch sees the same order: the sampler ignores the epoch (DistributedSampler.set_epoch(epoch) not called, or a sampler seeded once); draw each epoch's order from (seed, epoch)")  # fmt: skip
    ddp = _ddp_shares(p)
    fails += ddp
    what = f"epoch order uncorrelated with the file (r={rho:.2f}), {observed:.2f} same-label neighbours vs {expected:.2f} expected, epochs 1 and 2 differ, 2 simulated DDP ranks disjoint and covering"  # fmt: skip
    if fails:
        return Check("fail", "data_order", "; ".join(fails))
    if warns:
        return Check("warn", "data_order", "; ".join(warns))
    return Check("ok", "data_order", what)


def _ddp_shares(p: Probe, world_size: int = 2) -> list[str]:
    """Problems of the rank shares under ``world_size`` simulated ranks (first 4 windows of
    epochs 1 and 2): each rank has its own data object, as under torchrun."""
    window = p.cfg.batch_size * p.cfg.update_freq * world_size
    ranks = [
        open_train_split(p.cfg.data_dir, p.cfg.train_subset, p.cfg.seed, p.cfg.lazy_load)[0]
        for _ in range(world_size)
    ]
    shares: dict[tuple[int, int], np.ndarray] = {}
    problems = []
    for epoch in (1, 2):
        for r, d in enumerate(ranks):
            d.set_epoch(epoch)
            own = [rank_share(d.window(pos, window), r, world_size) for pos in range(0, 4 * window, window)]  # fmt: skip
            shares[epoch, r] = np.concatenate(own)
        windows = [ranks[0].window(pos, window) for pos in range(0, 4 * window, window)]
        union = np.sort(np.concatenate([shares[epoch, r] for r in range(world_size)]))
        if len(np.unique(union)) < len(union):
            problems.append(f"DDP ranks overlap in epoch {epoch}: {len(union) - len(np.unique(union))} samples are trained twice per window (each rank must take a disjoint share, e.g. DistributedSampler(rank=...))")  # fmt: skip
        elif not np.array_equal(union, np.sort(np.concatenate(windows))):
            problems.append(f"DDP ranks miss samples in epoch {epoch} (their shares do not cover the window: ranks draw different orders; seed every rank alike)")  # fmt: skip
    if all(np.array_equal(shares[1, r], shares[2, r]) for r in range(world_size)):
        problems.append("under DDP each rank sees the same samples in the same order every epoch: the distributed sampler's order does not change with the epoch (call sampler.set_epoch(epoch) before each epoch)")  # fmt: skip
    for d in ranks:
        close = getattr(getattr(d, "split", None), "close", None)
        if close is not None:
            close()
    return problems


def check_reduction(p: Probe) -> Check:
    """Loss reduction under gradient accumulation: the gradient of one update window of
    ``update_freq`` micro-batches (the Trainer's own accumulation, ``update_freq`` 2 when
    the config has 1) must equal the gradient of the mean loss over the same samples as
    one concatenated batch (relative difference <= :data:`GRAD_RTOL`). Eval mode, so that
    dropout does not differ; checked on plain cross-entropy (no FreeLB, no distillation)."""
    k = max(2, p.cfg.update_freq)
    b = min(p.cfg.batch_size, 16)
    ids = p.first_ids(b * k)
    if len(ids) < k:
        return Check("skip", "reduction", f"needs {k} samples")
    model = p.model()
    trainer = p.trainer(model, batch_size=b, update_freq=k, adv=None, distill_from=None)
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer._forward_backward(ids, ids, trainer._loss_units(ids))
    g_acc = _grads(model)
    ref = p.model()
    x, y = p.batch(ids)
    logits = call_model(ref, x)
    loss = trainer.objective.loss(logits, y, ids) / len(ids)
    loss.backward()
    g_ref = _grads(ref)
    diff = float((g_acc - g_ref).norm() / g_ref.norm().clamp(min=1e-30))
    ratio = float(g_acc.norm() / g_ref.norm().clamp(min=1e-30))
    what = f"{k} micro-batches of {b} vs one batch of {len(ids)}: gradient ratio {ratio:.3f}, relative difference {diff:.1e}"  # fmt: skip
    if diff <= GRAD_RTOL:
        return Check("ok", "reduction", what)
    if abs(ratio - k) < 0.05 * k:
        cause = f"the loss is summed over the {k} micro-batches instead of averaged: divide each micro-batch's loss by update_freq (or the summed per-sample loss by the window's samples)"  # fmt: skip
    elif abs(ratio - 1 / k) < 0.05 / k:
        cause = f"the accumulated gradient is {k}x too small: the loss is divided by update_freq twice"  # fmt: skip
    elif abs(ratio - 1) < 0.05:
        cause = "same size, other direction: the loss depends on how samples are batched (padding not masked? see padding)"  # fmt: skip
    else:
        cause = "the loss is not normalised by the window's samples (a per-micro-batch mean, or a sum over samples)"  # fmt: skip
    return Check("fail", "reduction", f"{what}: {cause}")


def _grads(model: nn.Module) -> torch.Tensor:
    parts = [
        (t.grad.to_dense() if t.grad.is_sparse else t.grad).flatten()
        for t in model.parameters()
        if t.requires_grad and t.grad is not None
    ]
    return torch.cat(parts).double() if parts else torch.zeros(1, dtype=torch.float64)


def check_overfit_batch(p: Probe, max_updates: int = 150, max_seconds: float = 120.0) -> Check:
    """Overfit one fixed batch (the Hugging Face course's test): train the fresh model on the
    first batch (at most 32 samples) with the config's optimizer and peak learning rate
    (constant schedule, no dropout) through the Trainer's own update, until the loss is
    below 0.05 and every sample is right, for at most ``max_updates`` updates or
    ``max_seconds``. A model that cannot fit 32 samples will not fit the data: the message
    names the suspect part from the loss curve."""
    ids = p.first_ids(min(p.cfg.batch_size, 32))
    model = p.model()
    trainer = p.trainer(
        model, np.asarray(ids), batch_size=len(ids), update_freq=1, lr_scheduler="constant",
        warmup_steps=0, warmup_ratio=0.0, adv=None, distill_from=None, max_update=max_updates,
        max_loss=None,
    )  # fmt: skip
    window = np.arange(len(ids))
    x, y = p.batch(ids)
    start, losses = time.perf_counter(), []
    with torch.no_grad():
        losses.append(_loss(call_model(model, x), y))
    try:
        for u in range(max_updates):
            trainer._update(window)
            with torch.no_grad():
                logits = call_model(model, x)
            losses.append(_loss(logits, y))
            if losses[-1] < 0.05 and bool((logits.argmax(-1) == y).all()):
                what = f"loss {losses[0]:.3f} -> {losses[-1]:.4f} in {u + 1} updates on a fixed batch of {len(ids)} (lr {_fmt(p.cfg.learning_rate)})"  # fmt: skip
                return Check("ok", "overfit_batch", what)
            if time.perf_counter() - start > max_seconds:
                break
    except DivergenceError as e:
        return Check("fail", "overfit_batch", f"the loss became NaN/Inf after {len(losses)} updates on one batch ({e}): learning rate {_fmt(p.cfg.learning_rate)} too high, or a numerically unstable layer (see the inputs check)")  # fmt: skip
    first, last, best = losses[0], losses[-1], min(losses)
    budget = f" (the {max_seconds:g} s budget)" if len(losses) - 1 < max_updates else ""
    what = f"loss {first:.3f} -> {last:.3f} (best {best:.3f}) in {len(losses) - 1} updates{budget} on a fixed batch of {len(ids)}"  # fmt: skip
    if last > first or last > 2 * best + 0.05:
        cause = f"it rises or jumps: learning rate {_fmt(p.cfg.learning_rate)} too high (lower it 10x)"  # fmt: skip
    elif last > 0.9 * first:
        cause = "it barely moves: learning rate too low, frozen or detached parameters (see grad_flow), or labels the model cannot see"  # fmt: skip
    else:
        cause = "it falls but not to ~0: too little capacity or information for these samples (max_len cuts them? [UNK]s? duplicate texts with different labels?) or a too low learning rate"  # fmt: skip
    return Check("fail", "overfit_batch", f"{what}: {cause}")


#: Every check in run order: ``(name, function)``.
CHECKS: list[tuple[str, Callable[[Probe], Check]]] = [
    ("first_batch", check_first_batch),
    ("num_labels", check_num_labels),
    ("inputs", check_inputs),
    ("alignment", check_alignment),
    ("split_consistency", check_split_consistency),
    ("learning_rate", check_learning_rate),
    ("schedule", check_schedule),
    ("initial_loss", check_initial_loss),
    ("padding", check_padding),
    ("grad_flow", check_grad_flow),
    ("data_order", check_data_order),
    ("reduction", check_reduction),
    ("overfit_batch", check_overfit_batch),
]

#: Checks skipped after a FAIL of another: ``{failed check: checks that need it to pass}``
#: (sound labels and logits; gradients that reach the model).
_NEEDS = {
    "num_labels": {"initial_loss", "padding", "grad_flow", "reduction", "overfit_batch"},
    "inputs": {"initial_loss", "padding", "grad_flow", "reduction", "overfit_batch"},
    "grad_flow": {"reduction", "overfit_batch"},
}


def run_checklist(
    cfg: TrainConfig,
    fast: bool = False,
    on_check: Callable[[Check], None] | None = None,
    setup: TrainSetup | None = None,
) -> list[Check]:
    """Run the training checklist on the data and model of ``cfg``.

    Args:
        cfg: the ``train`` section (data_dir, model, batch_size, update_freq, ...).
        fast: only :data:`FAST` (no overfitting: what ``train.preflight_doctor`` runs).
        on_check: called with each finding as soon as it is made (progress output).
        setup: ``cfg`` resolved by :func:`xdpx.train.setup.resolve` when the caller has it.

    Returns:
        The findings in :data:`CHECKS` order. A check that raises becomes a FAIL naming the
        error; the checks that need sound labels and logits are SKIPped after a FAIL of
        ``num_labels`` or ``inputs``, those that need gradients after one of ``grad_flow``. ``task: mlm`` gets one SKIP: these checks are for
        classification.
    """
    out: list[Check] = []

    def emit(c: Check) -> None:
        out.append(c)
        if on_check is not None:
            on_check(c)

    if cfg.task != "classification":
        emit(Check("skip", "checklist", f"train.task={cfg.task}: the training checks are for classification (labels, logits); run them on the fine-tuning config"))  # fmt: skip
        return out
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    try:
        probe = Probe.open(cfg, setup)
    except Exception as e:  # noqa: BLE001 - reported, not raised: the doctor goes on
        emit(Check("fail", "model", f"cannot build {cfg.model} on {cfg.data_dir}: {e}"))
        return out
    emit(Check("ok", "model", f"{cfg.model}: {sum(t.numel() for t in probe.template.parameters()):,} parameters, {len(probe.data):,} training samples, built as stages.train does", seconds=time.perf_counter() - start))  # fmt: skip
    failed: list[str] = []
    try:
        for name, fn in CHECKS:
            if fast and name not in FAST:
                continue
            t0 = time.perf_counter()
            blocked = [f for f in failed if name in _NEEDS.get(f, ())]
            if blocked:
                c = Check("skip", name, f"needs {' and '.join(blocked)} to pass (see its FAIL above)")  # fmt: skip
            else:
                try:
                    c = fn(probe)
                except Exception as e:  # noqa: BLE001
                    c = Check("fail", name, f"the check crashed: {type(e).__name__}: {e}")
            c.seconds = time.perf_counter() - t0
            if c.status == "fail":
                failed.append(name)
            emit(c)
    finally:
        probe.close()
    return out


def preflight_doctor(cfg: TrainConfig, setup: TrainSetup | None = None) -> None:
    """``train.preflight_doctor``: run the fast subset of ``xdpx doctor``'s training checks
    (:data:`xdpx.doctor.checklist.FAST`) before anything is written; log each finding.
    ``setup``: ``cfg`` resolved already (``stages.train``), so meta.json is not read again.

    Raises:
        PreflightError: a check failed; the message names each failed check and its fix.
    """

    def show(c: Any) -> None:
        level = {"fail": logging.ERROR, "warn": logging.WARNING}.get(c.status, logging.INFO)
        logging.getLogger("xdpx.train").log(level, "preflight_doctor %s", c.line())

    fails = [c for c in run_checklist(cfg, fast=True, on_check=show, setup=setup) if c.status == "fail"]  # fmt: skip
    if fails:
        raise PreflightError(
            f"train.preflight_doctor: {len(fails)} check(s) failed before training: "
            + " | ".join(f"{c.name}: {c.detail}" for c in fails)
            + " (`xdpx doctor` prints the full report; train.preflight_doctor=false skips it)"
        )
