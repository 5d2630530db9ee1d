"""Checks of the inputs and the labels: the first batch decoded next to its raw lines,
``num_labels``, non-finite or out-of-range inputs, labels aligned with the texts (a
bag-of-tokens classifier) and meaning the same in every split."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from xdpx import io
from xdpx.data.vocab import PAD, UNK
from xdpx.doctor.checks import Check, Probe
from xdpx.inference import call_model
from xdpx.train.diagnosis import find_nonfinite


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


def predicted_classes(scores: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The labels ``LinearSVC.predict`` gives for its ``decision_function`` values
    ``scores`` (``[n]`` for two classes, positive = ``classes[1]``; else ``[n, C]``, the
    argmax), ``classes`` the fitted classes in order."""
    if scores.ndim == 1:
        return classes[(scores > 0).astype(int)]
    return classes[scores.argmax(1)]


def fitted_bag(p: Probe) -> Any:
    """:func:`bag_classifier` fit on :func:`check_alignment`'s train sample, once per probe
    (``p.shared["bag"]["clf"]``), for the checks that score the other splits."""
    bag = p.shared["bag"]
    if "clf" not in bag:
        bag["clf"] = bag_classifier().fit(bag["x"], bag["y"])
    return bag["clf"]


@dataclass
class SplitSample:
    """The first labelled rows of a split as the bag-of-tokens classifiers see them.

    Attributes:
        samples: token ids per row (tuples for pairs).
        labels: ``[n]`` label ids.
        x: ``[n, features]`` sparse TF-IDF rows (:func:`bag_features`), None when empty.
        scores: ``[n]`` or ``[n, C]`` decision values of :func:`fitted_bag` (fit on all of
            train's sample).
    """

    samples: list[Any]
    labels: np.ndarray
    x: Any
    scores: np.ndarray


def split_sample(p: Probe, split: str, max_rows: int = ALIGN_MAX_ROWS) -> SplitSample:
    """The first ``max_rows`` labelled rows of ``split`` (:class:`SplitSample`), cached in
    ``p.shared`` (split consistency and the label checks read the same rows)."""
    cache = p.shared.setdefault("split_samples", {})
    if split not in cache:
        samples, y = _split_head(p.cfg.data_dir, split, max_rows)
        x = bag_features(p.shared["bag"]["vec"], samples) if len(y) else None
        scores = fitted_bag(p).decision_function(x) if len(y) else np.zeros(0)
        cache[split] = SplitSample(samples, y, x, scores)
    return cache[split]


def check_alignment(p: Probe, max_rows: int = ALIGN_MAX_ROWS) -> Check:
    """Are the labels related to the texts at all? A bag-of-tokens linear classifier
    (TF-IDF 1-2-grams of the token ids, the :data:`ALIGN_MAX_FEATURES` most frequent, and
    scikit-learn's ``LinearSVC``), 3-fold cross-validated on up to ``max_rows`` training
    samples, must beat the majority class by more than chance: if it does not, labels were
    shuffled or sorted apart from their texts, or the wrong column is the label. The
    one-sided binomial test against the majority-class rate must give p < 0.001 (WARN
    below that with p < 0.05). Leaves its sample ids, features and labels in ``p.shared``
    for :func:`check_split_consistency` and the learning check
    (:func:`xdpx.doctor.fitting.check_learning`)."""
    from scipy.stats import binomtest
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.model_selection import StratifiedKFold

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
    # decision values, not labels, and the fold models: the label check
    # (xdpx.doctor.label_checks) turns these out-of-fold scores into the probabilities
    # confident learning needs, and scores the other splits with the same fold models (as
    # strong as the ones that scored train), at no extra fit
    fold_models, scores = [], None
    for fit_rows, held in folds.split(x, y):
        m = bag_classifier().fit(x[fit_rows], y[fit_rows])
        d = m.decision_function(x[held])
        scores = np.zeros((len(y), *d.shape[1:])) if scores is None else scores
        scores[held] = d
        fold_models.append(m)
    pred = predicted_classes(scores, np.unique(y))
    correct = int((pred == y).sum())
    majority = float(np.bincount(y).max() / len(y))
    acc = correct / len(y)
    pvalue = binomtest(correct, len(y), majority, alternative="greater").pvalue
    p.shared["bag"] = {"vec": vec, "x": x, "y": y, "ids": ids, "scores": scores, "fold_models": fold_models, "accuracy": acc, "majority": majority, "pvalue": pvalue}  # fmt: skip
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
    clf = fitted_bag(p)
    a_train, m_train = bag["accuracy"], bag["majority"]
    scored, bad, above = [], [], []
    for split in others:
        sample = split_sample(p, split, max_rows)
        y = sample.labels
        if not len(y):
            continue
        acc = float((predicted_classes(sample.scores, clf.classes_) == y).mean())
        majority = float(np.bincount(y).max() / len(y))
        scored.append(f"{split} {acc:.3f} (majority {majority:.3f}, {len(y)} rows)")
        below = binomtest(round(acc * len(y)), len(y), majority, alternative="less").pvalue
        se = math.sqrt(max(a_train * (1 - a_train), 1e-6) / len(y))
        if below < 0.01:
            bad.append(f"{split} scores {acc:.3f}, below its majority-class rate {majority:.3f} (p={below:.2g})")  # fmt: skip
        elif acc < a_train - max(0.5 * (a_train - m_train), 3 * se):
            bad.append(f"{split} scores {acc:.3f}, far below {a_train:.3f} on held-out train folds (majority {m_train:.3f})")  # fmt: skip
        elif acc > a_train + max(0.5 * (a_train - m_train), 3 * se):
            above.append((split, acc))
    what = f"a classifier fit on train scores {', '.join(scored)} vs {a_train:.3f} on held-out train folds"  # fmt: skip
    if bad:
        return Check("fail", "split_consistency", f"{'; '.join(bad)}: the labels of {' and '.join(b.split()[0] for b in bad)} do not mean what train's mean (inverted or permuted labels, another source's label scheme, the wrong label column in that file); early stopping would pick by a meaningless score")  # fmt: skip
    if above:
        # far above train's own folds: train's labels noisier than the split's (a bad merge
        # of label sources), or a split easier than train; the label-noise estimate decides
        from xdpx.doctor.label_checks import noise_estimates

        noise = noise_estimates(p)
        named = [(s, a) for s, a in above if s in noise and noise["train"].share > 2 * noise[s].share]  # fmt: skip
        if named:
            said = "; ".join(f"{s} scores {a:.3f}, far above {a_train:.3f} on held-out train folds (majority {m_train:.3f}), and train's labels look {noise['train'].share / max(noise[s].share, 1e-9):.1f}x as noisy as {s}'s (estimated {noise['train'].share:.1%} vs {noise[s].share:.1%} mislabelled)" for s, a in named)  # fmt: skip
            return Check("warn", "split_consistency", f"{said}: noisy train labels (a bad merge of label sources, a weak labeller) cap what any model learns from train; label_issues lists the likely mislabelled rows (xdpx doctor --label-issues FILE exports them)")  # fmt: skip
        what += "; " + ", ".join(f"{s} above the folds" for s, _ in above) + " (train's labels not noisier than theirs: an easier split)"  # fmt: skip
    across = (p.meta.conflicts or {}).get("across_train") or {}
    if any(across.values()):
        shown = "; ".join((p.meta.conflicts or {}).get("examples", [])[:3])
        counts = ", ".join(f"{n} in {s}" for s, n in across.items() if n)
        return Check("warn", "split_consistency", f"{what}; texts that train labels otherwise: {counts} (e.g. {shown}); prepro.conflicts=drop removes them")  # fmt: skip
    return Check("ok", "split_consistency", what)
