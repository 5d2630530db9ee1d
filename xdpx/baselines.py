"""Classical baselines and the suite's peers: scikit-learn and fastText, hyper-parameters on dev.

Today's baseline (:func:`tfidf_lr`, :func:`pair_tfidf_lr`; what ``flows.pipeline`` reports
beside a run through :func:`baseline_for`) is what a user would get by hand in ten lines:

* single texts: ``TfidfVectorizer(sublinear_tf=True, min_df=2)`` over word 1-2-grams
  (scikit-learn's default token pattern), or character 1-3-grams for Chinese, then
  ``LogisticRegression``;
* sentence pairs: the same word 1-2-gram vectorizer fit on both texts of the training
  pairs, then ``LogisticRegression`` over ``[|u - v|, u * v]`` of the two texts' vectors
  (the element-wise features of Mou et al. 2016 / InferSent, without the encoder).

The peers (:func:`run_peers`, ``xdpx suite``) are what a careful user writes in twenty lines:

* features for single texts (:func:`peer_vectorizer`): a ``FeatureUnion`` of TF-IDF word
  1-2-grams and ``char_wb`` 2-5-grams (``min_df=2``, sublinear tf), or TF-IDF character
  1-4-grams for Chinese; fit on train once and shared by the two scikit-learn peers;
* ``svm`` (:func:`svm_peer`): ``LinearSVC``, ``C`` in :data:`SVM_C_GRID`;
* ``lr`` (:func:`lr_peer`): ``LogisticRegression``, ``C`` in :data:`LR_C_GRID`;
* ``fasttext`` (:func:`fasttext_peer`): ``fasttext.train_supervised`` over
  :data:`FASTTEXT_GRID` (lower-cased text; Chinese with its characters separated by
  spaces), one thread and a fixed seed; an optional dependency (``xdpx[suite]``);
* ``pair`` (:func:`pair_lr`): ``LogisticRegression`` over ``[|u - v|, u * v, cos(u, v)]`` of
  the word + ``char_wb`` vectors of the two texts (the vectorizer fit on both texts of the
  train pairs), ``C`` in :data:`LR_C_GRID`.

The vectorizers see train only; the scikit-learn fits in :func:`run_peers` and the peers use
one BLAS thread. Hyper-parameters are chosen on dev accuracy (ties go to the
first value of the grid: the smaller ``C``, the stronger regularisation); test is scored
once, with the chosen values. Every result has the test accuracy, the per-text correctness
(for paired comparisons), the test macro-F1 and ``seconds``: the peer's whole cost
(vectorizing, fitting every grid value, scoring), the shared vectorization counted in full
for each peer that uses it.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from xdpx import io

__all__ = [
    "C_GRID",
    "SVM_C_GRID",
    "LR_C_GRID",
    "FASTTEXT_GRID",
    "SINGLE_PEERS",
    "PeerUnavailable",
    "read_tsv",
    "tfidf_lr",
    "pair_tfidf_lr",
    "run_baseline",
    "baseline_for",
    "peer_vectorizer",
    "vectorize",
    "svm_peer",
    "lr_peer",
    "fasttext_peer",
    "pair_lr",
    "run_peers",
]

#: Inverse regularisation strengths tried on dev.
C_GRID: tuple[float, ...] = (1.0, 4.0, 16.0)
#: ``C`` of the ``svm`` peer (``LinearSVC``).
SVM_C_GRID: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0)
#: ``C`` of the ``lr`` and ``pair`` peers (``LogisticRegression``).
LR_C_GRID: tuple[float, ...] = (1.0, 4.0, 16.0, 64.0)
#: The ``fasttext`` peer's grid (every combination, in this order; ``subwords``: char
#: n-grams ``minn=2, maxn=5`` when True, none (``minn=maxn=0``) when False).
FASTTEXT_GRID: dict[str, tuple] = {
    "epoch": (5, 25),
    "lr": (0.1, 0.5, 1.0),
    "wordNgrams": (1, 2),
    "subwords": (True, False),
}
#: Tries of one fastText grid point before it counts as failed (see :func:`fasttext_peer`).
FASTTEXT_TRIES = 3
#: The single-text peers, in table order (``run_peers`` also runs ``baseline``).
SINGLE_PEERS: tuple[str, ...] = ("svm", "lr", "fasttext")


class PeerUnavailable(RuntimeError):
    """A peer's optional dependency (fastText) is not installed."""


def read_tsv(path: str, columns: Sequence[str]) -> pd.DataFrame:
    """Read a raw split (header row, tab-separated, no quoting) as strings.

    Raises:
        KeyError: a column is missing (names the file and the columns found).
    """
    with io.open(path, "rb") as f:
        df = pd.read_csv(f, sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False, dtype=str)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise KeyError(f"{path}: missing column(s) {missing}; found {list(df.columns)}")
    return df[list(columns)]


def _vectorizer(analyzer: str):
    from sklearn.feature_extraction.text import TfidfVectorizer

    if analyzer == "char":
        return TfidfVectorizer(analyzer="char", ngram_range=(1, 3), min_df=2, sublinear_tf=True)
    return TfidfVectorizer(analyzer="word", ngram_range=(1, 2), min_df=2, sublinear_tf=True)


def _pick_c(x: dict[str, Any], y: dict[str, np.ndarray], c_grid: Sequence[float]) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression

    dev_acc: dict[float, float] = {}
    models = {}
    for c in c_grid:
        model = LogisticRegression(C=c, max_iter=2000).fit(x["train"], y["train"])
        dev_acc[c] = float((model.predict(x["dev"]) == y["dev"]).mean())
        models[c] = model
    best = max(c_grid, key=lambda c: (dev_acc[c], -c))
    test_pred = models[best].predict(x["test"])
    return {
        "dev_accuracy": {str(c): a for c, a in dev_acc.items()},
        "C": best,
        "dev_accuracy_best": dev_acc[best],
        **_test_scores(test_pred, y["test"]),
    }


def _test_scores(pred: np.ndarray, gold: np.ndarray) -> dict[str, Any]:
    """Test accuracy, per-text correctness (0/1) and macro-F1 over the test labels."""
    from sklearn.metrics import f1_score

    pred, gold = np.asarray(pred), np.asarray(gold)
    correct = pred == gold
    f1 = f1_score(gold, pred, labels=np.unique(gold), average="macro", zero_division=0)
    return {
        "test_accuracy": float(correct.mean()),
        "test_correct": correct.astype(np.int8).tolist(),
        "test_macro_f1": float(f1),
    }


def tfidf_lr(
    texts: dict[str, Sequence[str]],
    labels: dict[str, Sequence[str]],
    analyzer: str = "word",
    c_grid: Sequence[float] = C_GRID,
) -> dict[str, Any]:
    """TF-IDF (``analyzer`` ``word``: 1-2-grams, ``char``: 1-3-grams) + LR, C on dev.

    Args:
        texts: ``train``/``dev``/``test`` -> texts.
        labels: the same splits -> labels.
        analyzer: ``word`` or ``char``.
        c_grid: candidate ``C`` values.

    Returns:
        ``{"model", "dev_accuracy": {C: acc}, "C", "dev_accuracy_best", "test_accuracy",
        "test_correct" (0/1 per test text), "features", "n", "seconds"}``.
    """
    start = time.perf_counter()
    vec = _vectorizer(analyzer)
    x = {"train": vec.fit_transform(texts["train"])}
    x.update({s: vec.transform(texts[s]) for s in ("dev", "test")})
    y = {s: np.asarray(labels[s]) for s in ("train", "dev", "test")}
    out = _pick_c(x, y, c_grid)
    grams = "char 1-3" if analyzer == "char" else "word 1-2"
    return {
        "model": f"tfidf {grams} + LR",
        **out,
        "features": len(vec.vocabulary_),
        "n": {s: len(v) for s, v in y.items()},
        "seconds": round(time.perf_counter() - start, 2),
    }


def pair_features(
    vec: Any,
    texts: dict[str, Sequence[str]],
    texts2: dict[str, Sequence[str]],
    cosine: bool,
) -> dict[str, sp.csr_matrix]:
    """The pair features of each split: ``[|u - v|, u * v]`` (with ``cosine``, a last
    column ``cos(u, v)`` of the L2-normalised vectors) of the vectors ``u``, ``v`` of the
    two texts, ``vec`` (a scikit-learn vectorizer) fit on both texts of the train pairs.

    Returns:
        ``train``/``dev``/``test`` -> ``[n, 2 * features (+ 1)]`` CSR matrices.
    """
    from sklearn.preprocessing import normalize

    vec.fit(list(texts["train"]) + list(texts2["train"]))

    def features(split: str) -> sp.csr_matrix:
        u, v = vec.transform(texts[split]).tocsr(), vec.transform(texts2[split]).tocsr()
        parts = [abs(u - v), u.multiply(v)]
        if cosine:
            parts.append(sp.csr_matrix(np.asarray(normalize(u).multiply(normalize(v)).sum(axis=1))))
        return sp.hstack(parts).tocsr()

    return {s: features(s) for s in ("train", "dev", "test")}


def pair_tfidf_lr(
    texts: dict[str, Sequence[str]],
    texts2: dict[str, Sequence[str]],
    labels: dict[str, Sequence[str]],
    c_grid: Sequence[float] = C_GRID,
) -> dict[str, Any]:
    """LR over ``[|u - v|, u * v]`` of TF-IDF word 1-2-gram vectors ``u``, ``v`` of the two
    texts of a pair (the vectorizer fit on both texts of the train pairs), C on dev.

    Returns:
        As :func:`tfidf_lr`.
    """
    start = time.perf_counter()
    x = pair_features(_vectorizer("word"), texts, texts2, cosine=False)
    y = {s: np.asarray(labels[s]) for s in ("train", "dev", "test")}
    out = _pick_c(x, y, c_grid)
    return {
        "model": "LR over [|u-v|, u*v] of tfidf word 1-2",
        **out,
        "features": int(x["train"].shape[1]),
        "n": {s: len(v) for s, v in y.items()},
        "seconds": round(time.perf_counter() - start, 2),
    }


def run_baseline(
    data_dir: str,
    text_column: str = "text",
    label_column: str = "label",
    text2_column: str | None = None,
    analyzer: str = "word",
    c_grid: Sequence[float] = C_GRID,
) -> dict[str, Any]:
    """The baseline on ``data_dir/{train,dev,test}.tsv``: :func:`pair_tfidf_lr` when
    ``text2_column`` is set, else :func:`tfidf_lr` with ``analyzer`` (``auto``: ``char``
    when :func:`xdpx.data.tokenizers.detect_tokenizer` picks it for the train texts,
    prepro's own ``auto`` rule, else ``word``).

    Raises:
        KeyError: a column is missing from a file.
    """
    cols = [text_column, *([text2_column] if text2_column else []), label_column]
    frames = {s: read_tsv(io.join(data_dir, f"{s}.tsv"), cols) for s in ("train", "dev", "test")}
    texts = {s: df[text_column].tolist() for s, df in frames.items()}
    labels = {s: df[label_column].tolist() for s, df in frames.items()}
    if text2_column:
        texts2 = {s: df[text2_column].tolist() for s, df in frames.items()}
        return pair_tfidf_lr(texts, texts2, labels, c_grid)
    if analyzer == "auto":
        from xdpx.data.tokenizers import detect_tokenizer

        analyzer = detect_tokenizer(texts["train"])[0]
    return tfidf_lr(texts, labels, analyzer, c_grid)


def baseline_for(prepro: Any) -> dict[str, Any] | None:
    """The baseline on the raw files of a ``prepro`` config (``xdpx.config.PreproConfig``),
    when they are one headed ``train``/``dev``/``test.tsv`` each in ``data_source`` (fetch's
    layout); None for any other layout (globs, csv, jsonl, no header, no dev or test).

    Single texts get character 1-3-grams or word 1-2-grams by prepro's ``auto`` rule
    (:func:`run_baseline` with ``analyzer="auto"``). It holds the three files and their
    TF-IDF matrices in memory.

    Returns:
        As :func:`tfidf_lr` without ``test_correct``; None when the layout does not fit.

    Raises:
        KeyError: a column is missing from a file.
    """
    from xdpx.config import PreproConfig

    split_files = PreproConfig.model_fields["data_files"].default  # fetch's layout
    if prepro.format != "tsv" or not prepro.header or dict(prepro.data_files) != split_files:
        return None
    if not all(io.exists(io.join(prepro.data_source, f)) for f in split_files.values()):
        return None
    result = run_baseline(
        prepro.data_source,
        text_column=prepro.text_column,
        label_column=prepro.label_column,
        text2_column=prepro.text2_column,
        analyzer="auto",
    )
    result.pop("test_correct")
    return result


# ------------------------------------------------------------------ the suite's peers
def peer_vectorizer(language: str = "en"):
    """The peers' TF-IDF features: word 1-2-grams + ``char_wb`` 2-5-grams (a
    ``FeatureUnion``), or, for ``language`` ``zh`` (or ``char``), character 1-4-grams;
    ``min_df=2`` and sublinear tf throughout."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import FeatureUnion

    opts = {"min_df": 2, "sublinear_tf": True}
    if language in ("zh", "char"):
        return TfidfVectorizer(analyzer="char", ngram_range=(1, 4), **opts)
    return FeatureUnion(
        [
            ("word", TfidfVectorizer(analyzer="word", ngram_range=(1, 2), **opts)),
            ("char_wb", TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), **opts)),
        ]
    )


def _features_name(language: str) -> str:
    return "tfidf char 1-4" if language in ("zh", "char") else "tfidf word 1-2 + char_wb 2-5"


def vectorize(texts: dict[str, Sequence[str]], language: str = "en") -> dict[str, Any]:
    """:func:`peer_vectorizer` fit on train, applied to the three splits.

    Returns:
        ``{"x": {split: csr matrix}, "features": columns, "name", "seconds"}``.
    """
    start = time.perf_counter()
    vec = peer_vectorizer(language)
    x = {"train": vec.fit_transform(texts["train"])}
    x.update({s: vec.transform(texts[s]) for s in ("dev", "test")})
    return {
        "x": x,
        "features": int(x["train"].shape[1]),
        "name": _features_name(language),
        "seconds": time.perf_counter() - start,
    }


def _grid_search(
    fit: Any,
    grid: Sequence[Any],
    predict: Any,
    y: dict[str, np.ndarray],
) -> tuple[Any, dict[str, float], dict[str, Any]]:
    """Fit ``fit(value)`` for each grid value, dev accuracy of ``predict(model, "dev")``;
    the first value with the best dev accuracy wins and scores test. Only the best model so
    far is kept.

    Returns:
        ``(best value, {str(value): dev accuracy}, test scores)``.
    """
    dev_acc: list[float] = []
    best, best_model = 0, None
    for i, value in enumerate(grid):
        model = fit(value)
        dev_acc.append(float((np.asarray(predict(model, "dev")) == y["dev"]).mean()))
        if i == 0 or dev_acc[i] > dev_acc[best]:  # strictly: grid order breaks ties
            best, best_model = i, model
        del model
    scores = _test_scores(predict(best_model, "test"), y["test"])
    return grid[best], {str(v): a for v, a in zip(grid, dev_acc, strict=True)}, scores


def _one_blas_thread():
    """One BLAS/OpenMP thread for the scikit-learn fits: L-BFGS-B's updates of the
    ``features x classes`` vectors ran ~4x slower with two threads on two shared cores."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1)


def _sklearn_peer(
    kind: str,
    x: dict[str, Any],
    labels: dict[str, Sequence[str]],
    c_grid: Sequence[float],
    model_name: str,
    features: int,
    extra_seconds: float,
) -> dict[str, Any]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import LinearSVC

    start = time.perf_counter()
    y = {s: np.asarray(labels[s]) for s in ("train", "dev", "test")}

    def fit(c: float):
        if kind == "svm":
            model = LinearSVC(C=c, max_iter=10000)
        else:
            model = LogisticRegression(C=c, max_iter=5000)
        return model.fit(x["train"], y["train"])

    with _one_blas_thread():
        best, dev_acc, scores = _grid_search(fit, list(c_grid), lambda m, s: m.predict(x[s]), y)
    return {
        "model": model_name,
        "dev_accuracy": dev_acc,
        "C": best,
        "params": {"C": best},
        "dev_accuracy_best": dev_acc[str(best)],
        **scores,
        "features": features,
        "n": {s: len(v) for s, v in y.items()},
        "seconds": round(extra_seconds + time.perf_counter() - start, 2),
    }


def svm_peer(
    texts: dict[str, Sequence[str]],
    labels: dict[str, Sequence[str]],
    language: str = "en",
    c_grid: Sequence[float] = SVM_C_GRID,
    features: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """:func:`peer_vectorizer` features + ``LinearSVC``, ``C`` on dev.

    Args:
        texts: ``train``/``dev``/``test`` -> texts.
        labels: the same splits -> labels.
        language: ``zh`` for character 1-4-grams, else word + ``char_wb``.
        c_grid: candidate ``C`` values (ties: the first).
        features: :func:`vectorize`'s result for these texts, to share it (its time is
            counted in ``seconds`` all the same); None = vectorize here.

    Returns:
        As :func:`tfidf_lr`, plus ``"params"`` (the chosen values) and ``"test_macro_f1"``.
    """
    feats = features or vectorize(texts, language)
    name = f"{feats['name']} + LinearSVC"
    return _sklearn_peer("svm", feats["x"], labels, c_grid, name, feats["features"], feats["seconds"])  # fmt: skip


def lr_peer(
    texts: dict[str, Sequence[str]],
    labels: dict[str, Sequence[str]],
    language: str = "en",
    c_grid: Sequence[float] = LR_C_GRID,
    features: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """:func:`peer_vectorizer` features + ``LogisticRegression``, ``C`` on dev; as
    :func:`svm_peer`."""
    feats = features or vectorize(texts, language)
    name = f"{feats['name']} + LR"
    return _sklearn_peer("lr", feats["x"], labels, c_grid, name, feats["features"], feats["seconds"])  # fmt: skip


def _fasttext_text(text: str, language: str) -> str:
    """fastText's input: lower-cased, whitespace-normalised; Chinese: one token per character."""
    text = text.lower()
    if language in ("zh", "char"):
        return " ".join(c for c in text if not c.isspace())
    return " ".join(text.split())


def _grid_points(grid: dict[str, Sequence[Any]]) -> list[dict[str, Any]]:
    import itertools

    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*grid.values())]


_FASTTEXT_WORKER = """
import json, sys, fasttext
train, args, inputs, out = sys.argv[1:]
model = fasttext.train_supervised(input=train, verbose=0, **json.loads(args))
with open(inputs, encoding="utf-8") as f:
    texts = json.load(f)
pred = {s: [labels[0] for labels in model.predict(t, k=1)[0]] for s, t in texts.items()}
with open(out, "w", encoding="utf-8") as f:
    json.dump(pred, f)
"""


def _fasttext_isolated(path: str, args: dict[str, Any], inputs_path: str) -> dict[str, list[str]]:
    """``fasttext.train_supervised(input=path, **args)`` in a fresh interpreter that holds
    nothing else, and its top label for each text of ``inputs_path`` (JSON: split -> texts).

    Returns:
        split -> fastText labels (``__label__<i>``), in the order of the texts.

    Raises:
        RuntimeError: the training failed there (its last stderr line, e.g. "Encountered
            NaN.").
    """
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="xdpx-fasttext-") as tmp:
        out = os.path.join(tmp, "pred.json")
        done = subprocess.run(
            [sys.executable, "-c", _FASTTEXT_WORKER, path, json.dumps(args), inputs_path, out],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
            raise RuntimeError(lines[-1].removeprefix("RuntimeError: "))
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def fasttext_peer(
    texts: dict[str, Sequence[str]],
    labels: dict[str, Sequence[str]],
    language: str = "en",
    grid: dict[str, Sequence[Any]] | None = None,
    seed: int = 1,
) -> dict[str, Any]:
    """fastText supervised (``fasttext.train_supervised`` on a temporary train file, its rows
    shuffled by ``seed``: fastText does not shuffle, and on a file sorted by label it learns
    only the last labels), every combination of ``grid`` (default :data:`FASTTEXT_GRID`)
    tried and picked on dev accuracy (ties: the first in grid order). One thread and
    ``seed``: deterministic.

    Each grid point trains, and predicts dev and test, in a fresh interpreter
    (:func:`_fasttext_isolated`): fastText 0.9.2 (``fasttext-numpy2-wheel``) in a process
    that has done other work first (read the corpus, ran other tests) gives results that
    depend on that process's heap, not only on the data: "Encountered NaN" on an input that
    trains fine in a fresh interpreter, or, in a pytest worker, 58% dev accuracy where a
    fresh interpreter gets 88% (4 topics of 20 Newsgroups). A point that fails is tried up
    to :data:`FASTTEXT_TRIES` times (``"retried"`` lists the errors of the points that
    needed it); one that fails every time (a diverging ``lr``) counts as dev accuracy 0
    and is logged in ``"failed"``.

    Returns:
        As :func:`svm_peer`; ``dev_accuracy`` keyed by the grid point's
        ``epoch=.. lr=.. wordNgrams=.. subwords=..``.

    Raises:
        PeerUnavailable: fastText is not installed.
    """
    import importlib.util

    if importlib.util.find_spec("fasttext") is None:  # it runs in fresh interpreters only
        raise PeerUnavailable(
            "fastText is not installed: pip install 'xdpx[suite]' (fasttext-numpy2-wheel) "
            "or make suite-data"
        )
    import os
    import tempfile

    start = time.perf_counter()
    points = _grid_points(grid or FASTTEXT_GRID)
    y = {s: np.asarray(labels[s]) for s in ("train", "dev", "test")}
    classes = sorted(set(y["train"]))
    index = {c: i for i, c in enumerate(classes)}
    inputs = {s: [_fasttext_text(t, language) for t in texts[s]] for s in ("dev", "test")}
    failed: dict[str, str] = {}
    retried: dict[str, list[str]] = {}
    tmp = tempfile.TemporaryDirectory(prefix="xdpx-fasttext-")
    path, inputs_path = os.path.join(tmp.name, "train.txt"), os.path.join(tmp.name, "inputs.json")
    try:
        with open(inputs_path, "w", encoding="utf-8") as f:
            json.dump(inputs, f)
        # fastText reads its file in order (no shuffling) with a decaying lr: a file sorted
        # by label, as corpora often are, trains it to predict the last labels only
        order = np.random.default_rng(seed).permutation(len(y["train"]))
        with open(path, "w", encoding="utf-8") as f:
            for i in order:
                f.write(
                    f"__label__{index[y['train'][i]]} {_fasttext_text(texts['train'][i], language)}\n"
                )

        def key(p: dict[str, Any]) -> str:
            return " ".join(f"{k}={v}" for k, v in p.items())

        def fit(p: dict[str, Any]):
            subwords = p.get("subwords", True)
            args = {k: v for k, v in p.items() if k != "subwords"}
            args.update(minn=2 if subwords else 0, maxn=5 if subwords else 0, thread=1, seed=seed)
            errors = []
            for _ in range(FASTTEXT_TRIES):
                try:
                    pred = _fasttext_isolated(path, args, inputs_path)
                except RuntimeError as e:
                    errors.append(str(e))
                    continue
                if errors:
                    retried[key(p)] = errors
                return pred
            failed[key(p)] = "; ".join(errors)
            return None

        def predict(pred: dict[str, list[str]] | None, split: str) -> np.ndarray:
            if pred is None:  # a failed grid point: no prediction is right
                return np.full(len(y[split]), "\x00failed", dtype=object)
            return np.asarray([classes[int(lab[len("__label__") :])] for lab in pred[split]])

        points_keys = [key(p) for p in points]
        best, dev_acc, scores = _grid_search(fit, points, predict, y)
    finally:
        tmp.cleanup()
    if len(failed) == len(points):
        raise RuntimeError(f"fastText failed on every grid point: {failed}")
    dev_acc = dict(zip(points_keys, dev_acc.values(), strict=True))
    grams = "chars" if language in ("zh", "char") else "words"
    return {
        "model": f"fastText supervised ({grams}, lower-cased)",
        "dev_accuracy": dev_acc,
        "params": dict(best),
        "dev_accuracy_best": dev_acc[key(best)],
        **scores,
        "failed": failed,
        "retried": retried,
        "n": {s: len(v) for s, v in y.items()},
        "seconds": round(time.perf_counter() - start, 2),
    }


def pair_lr(
    texts: dict[str, Sequence[str]],
    texts2: dict[str, Sequence[str]],
    labels: dict[str, Sequence[str]],
    c_grid: Sequence[float] = LR_C_GRID,
) -> dict[str, Any]:
    """The pair peer: LR over ``[|u - v|, u * v, cos(u, v)]`` of the word 1-2 + ``char_wb``
    2-5 TF-IDF vectors ``u``, ``v`` of the two texts (:func:`peer_vectorizer`, fit on both
    texts of the train pairs; ``cos`` of the L2-normalised vectors), ``C`` on dev.

    Returns:
        As :func:`svm_peer`.
    """
    from sklearn.linear_model import LogisticRegression

    start = time.perf_counter()
    x = pair_features(peer_vectorizer("en"), texts, texts2, cosine=True)
    y = {s: np.asarray(labels[s]) for s in ("train", "dev", "test")}

    def fit(c: float):
        return LogisticRegression(C=c, max_iter=5000).fit(x["train"], y["train"])

    with _one_blas_thread():
        best, dev_acc, scores = _grid_search(fit, list(c_grid), lambda m, s: m.predict(x[s]), y)
    return {
        "model": "LR over [|u-v|, u*v, cos] of tfidf word 1-2 + char_wb 2-5",
        "dev_accuracy": dev_acc,
        "C": best,
        "params": {"C": best},
        "dev_accuracy_best": dev_acc[str(best)],
        **scores,
        "features": int(x["train"].shape[1]),
        "n": {s: len(v) for s, v in y.items()},
        "seconds": round(time.perf_counter() - start, 2),
    }


def run_peers(
    data_dir: str,
    text_column: str = "text",
    label_column: str = "label",
    text2_column: str | None = None,
    language: str = "en",
    seed: int = 1,
    fasttext_grid: dict[str, Sequence[Any]] | None = None,
) -> dict[str, dict[str, Any]]:
    """Today's baseline and the peers on ``data_dir/{train,dev,test}.tsv``.

    Single texts: ``baseline`` (:func:`tfidf_lr`, char 1-3-grams for ``language`` ``zh``),
    ``svm``, ``lr`` (sharing one :func:`vectorize`) and ``fasttext``; pairs (``text2_column``
    set): ``baseline`` (:func:`pair_tfidf_lr`) and ``pair`` (:func:`pair_lr`).

    Returns:
        peer name -> its result; a peer whose dependency is missing (or fastText when it
        failed on every grid point) is ``{"missing": message}`` instead.

    Raises:
        KeyError: a column is missing from a file.
    """
    cols = [text_column, *([text2_column] if text2_column else []), label_column]
    frames = {s: read_tsv(io.join(data_dir, f"{s}.tsv"), cols) for s in ("train", "dev", "test")}
    texts = {s: df[text_column].tolist() for s, df in frames.items()}
    labels = {s: df[label_column].tolist() for s, df in frames.items()}
    if text2_column:
        texts2 = {s: df[text2_column].tolist() for s, df in frames.items()}
        with _one_blas_thread():
            base = pair_tfidf_lr(texts, texts2, labels)
        return {"baseline": base, "pair": pair_lr(texts, texts2, labels)}
    with _one_blas_thread():
        out: dict[str, dict[str, Any]] = {
            "baseline": tfidf_lr(texts, labels, "char" if language == "zh" else "word")
        }
    feats = vectorize(texts, language)
    out["svm"] = svm_peer(texts, labels, language, features=feats)
    out["lr"] = lr_peer(texts, labels, language, features=feats)
    try:
        out["fasttext"] = fasttext_peer(texts, labels, language, fasttext_grid, seed)
    except (PeerUnavailable, RuntimeError) as e:  # not installed, or failed on every point
        out["fasttext"] = {"missing": str(e)}
    return out
