"""Classical baselines: TF-IDF + logistic regression (scikit-learn), ``C`` picked on dev.

What a user would get by hand in ten lines, and what xdpx's defaults must beat:

* single texts: ``TfidfVectorizer(sublinear_tf=True, min_df=2)`` over word 1-2-grams
  (scikit-learn's default token pattern), or character 1-3-grams for Chinese, then
  ``LogisticRegression``;
* sentence pairs: the same word 1-2-gram vectorizer fit on both texts of the training
  pairs, then ``LogisticRegression`` over ``[|u - v|, u * v]`` of the two texts' vectors
  (the element-wise features of Mou et al. 2016 / InferSent, without the encoder).

The vectorizer sees train only. ``C`` is chosen on dev accuracy from :data:`C_GRID` (ties go
to the smaller ``C``, the stronger regularisation); test is scored once, with that ``C``.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from xdpx import io

__all__ = ["C_GRID", "read_tsv", "tfidf_lr", "pair_tfidf_lr", "run_baseline", "baseline_for"]

#: Inverse regularisation strengths tried on dev.
C_GRID: tuple[float, ...] = (1.0, 4.0, 16.0)


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
        "test_accuracy": float((test_pred == y["test"]).mean()),
        "test_correct": (test_pred == y["test"]).astype(np.int8).tolist(),
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
    vec = _vectorizer("word")
    vec.fit(list(texts["train"]) + list(texts2["train"]))

    def features(split: str) -> sp.csr_matrix:
        u, v = vec.transform(texts[split]), vec.transform(texts2[split])
        return sp.hstack([abs(u - v), u.multiply(v)]).tocsr()

    x = {s: features(s) for s in ("train", "dev", "test")}
    y = {s: np.asarray(labels[s]) for s in ("train", "dev", "test")}
    out = _pick_c(x, y, c_grid)
    return {
        "model": "LR over [|u-v|, u*v] of tfidf word 1-2",
        **out,
        "features": 2 * len(vec.vocabulary_),
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
