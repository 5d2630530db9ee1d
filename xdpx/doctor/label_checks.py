"""Checks of what the labels say: rows that are probably mislabelled (confident learning)
and tokens that give a label away (leaked labels, shortcuts).

Both read the alignment classifier of :func:`xdpx.doctor.data_checks.check_alignment`
(a bag-of-tokens ``LinearSVC`` 3-fold cross-validated on up to 6,000 training rows): its
out-of-fold decision values, turned into probabilities by one temperature fit on the same
rows (:func:`oof_probabilities`), are what confident learning needs (Northcutt, Jiang and
Chuang 2021, "Confident Learning: Estimating Uncertainty in Dataset Labels", JAIR 70),
computed by ``cleanlab`` (``cleanlab.filter.find_label_issues``). No model is trained
here beyond that classifier: the two checks cost about a second on the demo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from xdpx.doctor.checks import Check, Probe
from xdpx.doctor.data_checks import _doc, _raw_lines, split_sample

#: Warn when one split's estimated share of mislabelled rows is more than this many times
#: another's (and :data:`NOISE_MIN_GAP` above it, and 3 standard errors). Real corpora have
#: a few percent of label noise, and a linear bag-of-tokens classifier counts some of its
#: own errors as label issues: on the demo corpus train, dev and test are estimated at 6.9%,
#: 6.3% and 5.8%; on STS-B (pairs) 17.0%, 12.1% and 18.4%; on 20 Newsgroups 2.9% and 3.2%;
#: 25% of the demo's train labels flipped gives train 30.7% against dev 11.5%.
NOISE_RATIO = 2.0
NOISE_MIN_GAP = 0.05
#: Splits whose label distribution is this far (total variation) from train's are not
#: compared (a shifted split, e.g. 20newsgroups-lt's balanced test against its long-tailed
#: train, looks noisy to a classifier fit on train's prior).
NOISE_MAX_SHIFT = 0.1
#: Splits with fewer labelled rows are reported, not compared (on the tests' 1,200-row demo
#: subset a 120-row test split read 5.0% against train's 12.6%).
NOISE_MIN_ROWS = 300
#: Suspect rows printed under the label check (``--label-issues FILE`` exports them all).
SHOWN_ISSUES = 5

#: A token (or token bigram) gives a label away when at least :data:`LEAK_PURITY` of the
#: training texts that hold it have that label and it is in at least :data:`LEAK_COVERAGE`
#: of that label's texts (at least :data:`LEAK_MIN_TEXTS` texts, binomial p < 1e-6 against
#: the label's share). Calibrated on the suite's corpora: the strongest clean predictors are
#: topic words and header artefacts such as 'clipper' -> sci.crypt (in 51% of its texts on
#: 20newsgroups-lt, purity 1.00) and 'athos rutgers' -> soc.religion.christian (26%, the
#: moderator's address); a marker appended to every text of one class covers ~98% of it.
LEAK_PURITY = 0.99
LEAK_COVERAGE = 0.6
LEAK_MIN_TEXTS = 20
#: Candidates shown in the OK line (the strongest predictors below the leak bar).
SHOWN_PREDICTORS_COVERAGE = 0.2
#: A held-out score this high while the majority class is below 0.9 is too good to be true
#: for most tasks (Karpathy, "A Recipe for Training Neural Networks": look for leaks).
TOO_GOOD = 0.99


@dataclass
class Noise:
    """Confident learning's verdict on one split.

    Attributes:
        split: the split's name.
        rows: labelled rows read (up to 6,000).
        share: the estimated share of mislabelled rows (``cleanlab``'s confident-learning
            filter, which is also its ``num_label_issues``), in [0, 1].
        per_class: ``{label: share of that label's rows flagged}``.
        label_share: ``{label: share of the rows}`` (the split's label distribution).
        issues: row positions (into the split's sample) flagged, most likely first
            (lowest probability of the given label).
        probs: ``[rows, C]`` probabilities of the fitted classes.
        labels: ``[rows]`` given labels as class positions (into ``classes``).
    """

    split: str
    rows: int
    share: float
    per_class: dict[str, float]
    label_share: dict[str, float]
    issues: np.ndarray
    probs: np.ndarray
    labels: np.ndarray

    @property
    def se(self) -> float:
        """The binomial standard error of :attr:`share`."""
        return math.sqrt(max(self.share * (1 - self.share), 1e-6) / max(self.rows, 1))


def _as_matrix(scores: np.ndarray) -> np.ndarray:
    """``[n]`` two-class decision values as ``[n, 2]`` (``-s/2, s/2``: the same softmax as
    a sigmoid of ``s``); ``[n, C]`` unchanged."""
    return np.stack([-scores / 2, scores / 2], 1) if scores.ndim == 1 else scores


def fit_temperature(scores: np.ndarray, labels: np.ndarray) -> float:
    """The temperature ``t`` minimising the cross-entropy of ``softmax(t * scores)`` on
    ``labels`` (class positions): Platt-style calibration with one parameter (Guo et al.
    2017, "On Calibration of Modern Neural Networks"), on out-of-fold scores.

    Args:
        scores: ``[n]`` or ``[n, C]`` decision values.
        labels: ``[n]`` class positions in ``[0, C)``.

    Returns:
        ``t`` in [0.01, 100].
    """
    from scipy.optimize import minimize_scalar
    from scipy.special import log_softmax

    d = _as_matrix(scores)
    rows = np.arange(len(labels))
    fit = minimize_scalar(lambda t: -log_softmax(d * t, 1)[rows, labels].mean(), bounds=(0.01, 100.0), method="bounded")  # fmt: skip
    return float(fit.x)


def oof_probabilities(scores: np.ndarray, labels: np.ndarray, temperature: float) -> np.ndarray:
    """``softmax(temperature * scores)``: ``[n, C]`` probabilities from decision values."""
    from scipy.special import softmax

    return softmax(_as_matrix(scores) * temperature, 1)


def _noise(split: str, probs: np.ndarray, labels: np.ndarray, names: list[str]) -> Noise:
    from cleanlab.filter import find_label_issues

    if len(np.unique(labels)) < 2:  # cleanlab needs two given classes
        flagged = np.zeros(len(labels), bool)
    else:
        flagged = find_label_issues(labels, probs, filter_by="confident_learning")
    given = probs[np.arange(len(labels)), labels]
    issues = np.flatnonzero(flagged)
    issues = issues[np.argsort(given[issues], kind="stable")]
    per_class = {n: float(flagged[labels == k].mean()) for k, n in enumerate(names) if (labels == k).any()}  # fmt: skip
    label_share = {n: float((labels == k).mean()) for k, n in enumerate(names)}
    return Noise(split, len(labels), float(flagged.mean()), per_class, label_share, issues, probs, labels)  # fmt: skip


def noise_estimates(p: Probe) -> dict[str, Noise]:
    """Confident learning on train (the alignment classifier's out-of-fold probabilities)
    and on every other labelled split (the mean decision values of the same three fold
    models, so every split is scored by classifiers of the same strength; the same
    temperature), cached in ``p.shared["noise"]``. Rows of a class the train sample does not
    hold are left out of the other splits' estimate.

    Returns:
        ``{split: Noise}``; empty when the alignment check did not run or labels look
        unrelated to the texts (alignment FAIL).
    """
    if "noise" in p.shared:
        return p.shared["noise"]
    bag = p.shared.get("bag")
    out: dict[str, Noise] = {}
    p.shared["noise"] = out
    if bag is None or bag["pvalue"] >= 0.05:
        return out
    classes = np.unique(bag["y"])
    names = [p.meta.labels[int(c)] for c in classes]
    y = np.searchsorted(classes, bag["y"])
    temperature = fit_temperature(bag["scores"], y)
    bag["temperature"] = temperature
    out["train"] = _noise("train", oof_probabilities(bag["scores"], y, temperature), y, names)
    for split, m in p.meta.splits.items():
        if split == p.cfg.train_subset or not m.has_labels or not m.rows:
            continue
        sample = split_sample(p, split)
        ys = sample.labels
        known = np.isin(ys, classes)
        if known.sum() < 30:
            continue
        # the fold models' mean decision values: as strong a classifier as scored train
        scores = np.mean([m.decision_function(sample.x[known]) for m in bag["fold_models"]], 0)  # fmt: skip
        probs = oof_probabilities(scores, ys[known], temperature)
        out[split] = _noise(split, probs, np.searchsorted(classes, ys[known]), names)
    return out


def _shift(a: Noise, b: Noise) -> float:
    """Total variation distance between two splits' label distributions."""
    return 0.5 * sum(abs(a.label_share.get(k, 0.0) - b.label_share.get(k, 0.0)) for k in {*a.label_share, *b.label_share})  # fmt: skip


def noisier(a: Noise, b: Noise) -> bool:
    """Is ``a``'s estimated label noise well above ``b``'s? :data:`NOISE_RATIO` times as
    much, :data:`NOISE_MIN_GAP` more and 3 standard errors of the difference, between
    splits of at least :data:`NOISE_MIN_ROWS` rows whose label distributions are within
    :data:`NOISE_MAX_SHIFT`."""
    gap = a.share - b.share
    se = math.sqrt(a.se**2 + b.se**2)
    return (
        min(a.rows, b.rows) >= NOISE_MIN_ROWS
        and a.share > NOISE_RATIO * b.share
        and gap > max(NOISE_MIN_GAP, 3 * se)
        and _shift(a, b) <= NOISE_MAX_SHIFT
    )


def label_issue_rows(p: Probe) -> list[dict[str, Any]]:
    """Every train row confident learning flags, most likely mislabelled first: ``{file,
    line, given, suggested, confidence, text}`` (``confidence``: the classifier's
    probability of ``suggested``; ``file``/``line``: the raw file's, when it is readable;
    ``text``: the raw text, pairs joined by a tab). ``xdpx doctor --label-issues FILE``
    writes them."""
    noise = noise_estimates(p).get("train")
    if noise is None or not len(noise.issues):
        return []
    bag = p.shared["bag"]
    classes = np.unique(bag["y"])
    sids = bag["ids"][noise.issues]
    raw = _raw_lines(p, sids)
    rows = []
    for pos, sid in zip(noise.issues, sids, strict=True):
        where, texts, _ = raw.get(int(sid), ("", None, None))
        name, _, line = where.strip().rpartition(":")
        best = int(noise.probs[pos].argmax())
        rows.append(
            {
                "file": name or None,
                "line": int(line) if line.isdigit() else None,
                "sample": int(sid),
                "given": p.meta.labels[int(classes[noise.labels[pos]])],
                "suggested": p.meta.labels[int(classes[best])],
                "confidence": round(float(noise.probs[pos, best]), 4),
                "text": "\t".join(texts) if texts else None,
            }
        )
    return rows


def check_label_issues(p: Probe) -> Check:
    """How many rows are probably mislabelled, per split and class, and which.

    Confident learning (``cleanlab.filter.find_label_issues``, ``filter_by =
    "confident_learning"``) over the alignment classifier's probabilities
    (:func:`noise_estimates`): train's from its out-of-fold scores, the other splits' from
    the classifier fit on train. Lists the :data:`SHOWN_ISSUES` likeliest train rows as
    ``file:line  given -> suggested (confidence)``. WARN when train's estimated noise is
    well above another split's, or another split's well above train's
    (:func:`noisier`): a bad merge of label sources, a weak labeller or a relabelled split.
    The rows themselves are in ``Check.table`` (``xdpx doctor --label-issues FILE``).
    """
    noise = noise_estimates(p)
    if "train" not in noise:
        return Check("skip", "label_issues", "needs the alignment classifier (alignment OK or WARN)")  # fmt: skip
    train = noise["train"]
    rows = label_issue_rows(p)

    def said(n: Noise) -> str:
        classes = ", ".join(f"{k} {v:.1%}" for k, v in n.per_class.items()) if len(n.per_class) <= 6 else f"worst {max(n.per_class, key=n.per_class.get)} {max(n.per_class.values()):.1%}"  # fmt: skip
        return f"{n.split} {n.share:.1%} of {n.rows} ({classes})"

    lines = [
        f"{r['file']}:{r['line']}  {r['given']} -> {r['suggested']} ({r['confidence']:.2f})"
        + (f"  {r['text'][:80]}" if r["text"] else "")
        for r in rows[:SHOWN_ISSUES]
    ]
    what = "estimated mislabelled rows (confident learning over the bag-of-tokens classifier's probabilities): " + "; ".join(said(n) for n in noise.values())  # fmt: skip
    others = [n for s, n in noise.items() if s != "train"]
    train_worse = [n.split for n in others if noisier(train, n)]
    split_worse = [n.split for n in others if noisier(n, train)]
    fix = "relabel them (xdpx doctor --label-issues FILE exports every flagged row with its suggested label), drop them, or prepro.conflicts=drop for texts labelled twice"  # fmt: skip
    if train_worse:
        return Check("warn", "label_issues", f"{what}: train's labels look much noisier than {' and '.join(train_worse)}'s (a bad merge of label sources, a weak labeller); the likeliest below; {fix}", lines, table=rows)  # fmt: skip
    if split_worse:
        return Check("warn", "label_issues", f"{what}: {' and '.join(split_worse)}'s labels look much noisier than train's (another labeller or source for that split; its score misleads model selection); {fix}", lines, table=rows)  # fmt: skip
    return Check("ok", "label_issues", f"{what}: no split stands out (each estimate also counts some of the classifier's own errors; the suite's clean corpora read 3% to 17%)", lines, table=rows)  # fmt: skip


@dataclass
class Predictor:
    """A token or token bigram and the label it predicts in train's sample: ``texts``
    holding it, ``coverage`` (share of the label's texts holding it), ``purity`` (share of
    its texts with the label), the binomial ``pvalue``, ``counts`` per label, the
    vectoriser's ``feature`` (token ids) and two ``examples`` (sample ids)."""

    text: str
    label: str
    texts: int
    coverage: float
    purity: float
    pvalue: float
    counts: dict[str, int]
    feature: str
    examples: list[int]


def token_predictors(p: Probe, min_coverage: float = SHOWN_PREDICTORS_COVERAGE) -> list[Predictor]:  # fmt: skip
    """Tokens and token bigrams of the alignment sample (token ids, pairs as both texts)
    with purity >= :data:`LEAK_PURITY` for one label, coverage >= ``min_coverage`` of it
    and at least :data:`LEAK_MIN_TEXTS` texts, binomial p < 1e-6 against the label's share
    (one-sided, ``scipy.stats.binom``); strongest coverage first. A bigram whose tokens
    are a listed unigram's is dropped."""
    from scipy.stats import binom
    from sklearn.feature_extraction.text import CountVectorizer

    bag = p.shared["bag"]
    y = bag["y"]
    docs = _docs(p.data.samples(bag["ids"]))
    vec = CountVectorizer(token_pattern=r"\S+", ngram_range=(1, 2), binary=True, min_df=LEAK_MIN_TEXTS, lowercase=False)  # fmt: skip
    try:
        m = vec.fit_transform(docs).tocsc()
    except ValueError:  # no feature in LEAK_MIN_TEXTS texts
        return []
    names = vec.get_feature_names_out()
    classes = np.unique(y)
    onehot = (y[:, None] == classes[None, :]).astype(np.float64)
    per = np.asarray(m.T @ onehot)  # [features, classes]: texts holding it, per label
    total = per.sum(1)
    sizes = onehot.sum(0)
    purity, coverage = per / total[:, None], per / sizes[None, :]
    out: list[Predictor] = []
    for f, c in np.argwhere((purity >= LEAK_PURITY) & (coverage >= min_coverage)):
        pvalue = float(binom.sf(per[f, c] - 1, total[f], sizes[c] / len(y)))
        if pvalue >= 1e-6:
            continue
        text = " ".join("|" if t == "SEP" else (p.tokens[int(t)] if int(t) < len(p.tokens) else f"<{t}>") for t in names[f].split())  # fmt: skip
        counts = {p.meta.labels[int(k)]: int(per[f, j]) for j, k in enumerate(classes) if per[f, j]}  # fmt: skip
        examples = [int(bag["ids"][i]) for i in m[:, f].indices[:2]]
        out.append(Predictor(text, p.meta.labels[int(classes[c])], int(total[f]), float(coverage[f, c]), float(purity[f, c]), pvalue, counts, str(names[f]), examples))  # fmt: skip
    out.sort(key=lambda q: (-q.coverage, len(q.feature)))
    unigrams = {q.feature for q in out if " " not in q.feature}
    return [q for q in out if " " not in q.feature or not set(q.feature.split()) & unigrams]


def _docs(samples: list[Any]) -> list[str]:
    """Token-id documents of ``samples``; a pair's two texts joined by ``SEP``."""
    return [f"{_doc(s[0])} SEP {_doc(s[1])}" if isinstance(s, tuple) else _doc(s) for s in samples]  # fmt: skip


def _split_counts(p: Probe, q: Predictor) -> list[str]:
    """``"dev: pos 903, neg 2"`` for each other labelled split: texts holding ``q``'s
    feature, per label (the split's first 6,000 labelled rows)."""
    out = []
    needle = q.feature.split()
    for split, m in p.meta.splits.items():
        if split == p.cfg.train_subset or not m.has_labels or not m.rows:
            continue
        sample = split_sample(p, split)
        ys = sample.labels
        hold = np.array([_holds(d, needle) for d in _docs(sample.samples)], bool)
        if not len(ys):
            continue
        counts = np.bincount(ys[hold], minlength=len(p.meta.labels))
        shown = (
            ", ".join(f"{p.meta.labels[k]} {int(n)}" for k, n in enumerate(counts) if n) or "none"
        )
        out.append(f"{split}: {shown} of {len(ys)}")
    return out


def _holds(doc: str, needle: list[str]) -> bool:
    words = doc.split()
    k = len(needle)
    return any(words[i : i + k] == needle for i in range(len(words) - k + 1))


def check_shortcuts(p: Probe) -> Check:
    """Labels leaked into the text: a token or token bigram whose presence alone predicts
    one label (purity >= :data:`LEAK_PURITY`) over much of that label's training texts
    (coverage >= :data:`LEAK_COVERAGE`), significant by a binomial test
    (:func:`token_predictors`): a scraping or join artefact, a source marker, the label
    itself in the text. WARN naming the token, its counts per label in train's sample and
    in the other splits, and example lines. Also WARN when the alignment classifier's
    held-out score is implausibly high (>= :data:`TOO_GOOD` with the majority class below
    0.9). The OK line names the strongest predictors below the bar (topic words)."""
    bag = p.shared.get("bag")
    if bag is None or bag["pvalue"] >= 0.05:
        return Check("skip", "shortcuts", "needs the alignment classifier (alignment OK or WARN)")  # fmt: skip
    found = token_predictors(p)
    leaks = [q for q in found if q.coverage >= LEAK_COVERAGE]
    n = len(bag["y"])
    if leaks:
        lines = []
        for q in leaks[:3]:
            counts = ", ".join(f"{k} {v}" for k, v in q.counts.items())
            lines.append(f"{q.text!r} -> {q.label}: train {counts} of {n} ({q.coverage:.0%} of {q.label}'s texts, purity {q.purity:.3f}); " + "; ".join(_split_counts(p, q)))  # fmt: skip
            for where, texts, label in _raw_lines(p, np.array(q.examples, np.int64)).values():
                lines.append(f"  e.g. {where.strip()} ({label}): {' | '.join(texts)[:90]}")
        names = ", ".join(f"{q.text!r} -> {q.label} ({q.coverage:.0%} of its texts)" for q in leaks[:3])  # fmt: skip
        return Check("warn", "shortcuts", f"{len(leaks)} token(s) alone give the label away: {names}: a marker left by scraping or joining files, a source tag, or the label in the text; a model reads the marker, and dev/test scores that hold it are inflated: remove it from the raw text (or make it the same for every label) and prepare again", lines)  # fmt: skip
    if bag["accuracy"] >= TOO_GOOD and bag["majority"] < 0.9:
        return Check("warn", "shortcuts", f"a bag-of-tokens classifier scores {bag['accuracy']:.3f} on held-out folds (majority {bag['majority']:.3f}): too good to be true for most tasks; look for the label (or an id that encodes it) in the texts")  # fmt: skip
    strongest = "; strongest: " + ", ".join(f"{q.text!r} -> {q.label} in {q.coverage:.0%} of its texts (purity {q.purity:.2f})" for q in found[:3]) if found else ""  # fmt: skip
    return Check("ok", "shortcuts", f"no token alone gives a label away (purity >= {LEAK_PURITY} over >= {LEAK_COVERAGE:.0%} of a label's texts){strongest}")  # fmt: skip
