"""``xdpx suite``: one config against the classical baseline on every corpus of the suite.

For each corpus (:mod:`flows.corpora`) and each seed ``s``: the corpus is written as
raw TSV files (split ``s`` where its split is random), then the stages prepro -> train
(``train.seed = s``) -> evaluate (``stages.registry.STAGES``, as functions) run with the params
(``params.yaml`` plus ``key=value`` overrides; only the paths and the corpus's columns are
set per corpus, and for sentence-pair corpora ``train.model`` is ``--pair-model``), and
:func:`xdpx.baselines.run_baseline` runs on the same files (TF-IDF word 1-2-grams, char
1-3-grams for Chinese; pairs: LR over ``[|u-v|, u*v]``; ``C`` on dev). Per corpus it prints
the mean test accuracies, their paired difference with its standard error over seeds, and
the time of each side; over corpora, the mean difference with its standard error
(``sqrt(sum SE_i^2) / n``, the corpora being independent).

Seeds are what makes a difference of a fraction of a point readable: one test set of
1-2k texts has a standard error of ~1 point. Where the test set is fixed (20 Newsgroups,
STS-B) the SE over seeds measures the spread of training and dev cut, not the sampling of
the test texts; :func:`summarize` also gives a per-text paired SE for that (McNemar-style:
the standard deviation of the per-text difference of correctness / sqrt(n)).
"""

from __future__ import annotations

import logging
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from flows.corpora import CORPORA, Corpus, materialize
from stages.registry import STAGES
from xdpx import io
from xdpx.baselines import read_tsv, run_baseline
from xdpx.config import EvaluateConfig, Params, PredictConfig
from xdpx.data.meta import PreparedMeta
from xdpx.models import PAIR_INPUTS, input_names
from xdpx.rundir import RunDir

__all__ = ["run_corpus_seed", "summarize", "run_suite", "format_table", "DEFAULT_PAIR_MODEL"]

log = logging.getLogger("xdpx.suite")

#: ``train.model`` for sentence-pair corpora unless ``--pair-model`` says otherwise.
DEFAULT_PAIR_MODEL = "match_ngram"


def run_corpus_seed(
    corpus: Corpus,
    params: Params,
    seed: int,
    work_dir: str,
    pair_model: str = DEFAULT_PAIR_MODEL,
    limit: int | None = None,
) -> dict[str, Any]:
    """Materialise ``corpus`` with ``seed`` under ``work_dir``; run xdpx and the baseline.

    Args:
        corpus: the corpus.
        params: resolved params; paths and columns are replaced per corpus.
        seed: split seed (corpora with a random split) and ``train.seed``.
        work_dir: directory for this run's raw and prepared data, model and metrics.
        pair_model: ``train.model`` used for a sentence-pair corpus.
        limit: at most this many rows per split (smoke runs); None = the whole corpus.

    Returns:
        ``{"corpus", "seed", "n": {split: rows}, "xdpx": {"dev", "test", "seconds",
        "model", "tokenizer"}, "baseline": {"dev", "test", "C", "seconds", "model"},
        "difference", "paired_se"}``; accuracies are fractions in [0, 1].
    """
    raw, prepared = io.join(work_dir, "raw"), io.join(work_dir, "prepared")
    model_dir = io.join(work_dir, "model")
    counts = materialize(corpus.name, raw, seed, limit)
    start = time.perf_counter()
    prepro_cfg = params.prepro.model_copy(
        update={
            "data_source": raw,
            "data_dir": prepared,
            "data_files": {s: f"{s}.tsv" for s in ("train", "dev", "test")},
            "format": "tsv",
            "header": True,
            **corpus.columns,
        }
    )
    prepared_result = STAGES["prepro"].run(prepro_cfg)
    model = params.train.model
    if corpus.text2 and input_names(model) != PAIR_INPUTS:
        model = pair_model
    STAGES["train"].run(
        params.train.model_copy(
            update={
                "data_dir": prepared,
                "save_dir": model_dir,
                "overwrite": True,
                "auto_suffix": False,
                "resume": False,
                "resume_from": None,
                "seed": seed,
                "model": model,
            }
        )
    )
    checkpoint = RunDir(model_dir).best_alias
    evaluated = STAGES["evaluate"].run(
        EvaluateConfig(
            checkpoint=checkpoint,
            data_dir=prepared,
            splits=["dev", "test"],
            metrics_file=io.join(work_dir, "metrics.json"),
            confusion_png=io.join(work_dir, "confusion.png"),
        )
    )
    ours = evaluated.metrics
    seconds = time.perf_counter() - start
    predictions = io.join(work_dir, "test_predictions.tsv")
    STAGES["predict"].run(
        PredictConfig(
            checkpoint=checkpoint,
            data_file=io.join(raw, "test.tsv"),
            out_file=predictions,
            concat_origin=True,
        )
    )
    meta = PreparedMeta.read(prepared)
    columns = corpus.columns
    base = run_baseline(
        raw,
        text_column=columns["text_column"] or "text",
        label_column="label",
        text2_column=columns["text2_column"],
        analyzer="char" if corpus.language == "zh" else "word",
    )
    pred = read_tsv(predictions, ["label", "pred_label"])
    ours_correct = (pred["label"] == pred["pred_label"]).astype(int).tolist()
    if len(ours_correct) != len(base["test_correct"]):
        raise RuntimeError(
            f"{corpus.name}: {len(ours_correct)} xdpx test predictions vs "
            f"{len(base['test_correct'])} baseline ones"
        )
    diffs = [a - b for a, b in zip(ours_correct, base["test_correct"], strict=True)]
    return {
        "corpus": corpus.name,
        "seed": seed,
        "n": counts,
        "xdpx": {
            "dev": ours["dev"]["accuracy"],
            "test": ours["test"]["accuracy"],
            "seconds": round(seconds, 1),
            "model": model,
            "tokenizer": meta.tokenizer,
            "vocab_size": prepared_result.vocab_size,
        },
        "baseline": {
            "dev": base["dev_accuracy_best"],
            "test": base["test_accuracy"],
            "C": base["C"],
            "seconds": base["seconds"],
            "model": base["model"],
        },
        "difference": ours["test"]["accuracy"] - base["test_accuracy"],
        "paired_se": statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None,
    }


def _mean_of(values: Any) -> float | None:
    """Mean of ``values``, or None when any is missing."""
    values = list(values)
    return None if not values or None in values else statistics.fmean(values)


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean test difference over runs, its standard error and a Student-t 95% interval.

    Args:
        runs: results with ``xdpx.test``, ``baseline.test`` and ``difference`` (and
            optionally ``paired_se``, ``xdpx.seconds``, ``baseline.seconds``).

    Returns:
        ``{"k", "mean_xdpx", "mean_baseline", "mean_difference", "se", "ci95", "wins",
        "ties", "paired_se", "xdpx_seconds", "baseline_seconds"}``; ``se``/``ci95`` are
        None for a single run (no spread to estimate); ``paired_se`` is the mean per-text
        paired SE of the runs and ``*_seconds`` the mean times (None when the runs carry
        none).
    """
    from scipy import stats

    k = len(runs)
    diffs = [r["difference"] for r in runs]
    mean = statistics.fmean(diffs)
    paired = [r["paired_se"] for r in runs if r.get("paired_se") is not None]
    out: dict[str, Any] = {
        "k": k,
        "mean_xdpx": statistics.fmean(r["xdpx"]["test"] for r in runs),
        "mean_baseline": statistics.fmean(r["baseline"]["test"] for r in runs),
        "mean_difference": mean,
        "wins": sum(d > 0 for d in diffs),
        "ties": sum(d == 0 for d in diffs),
        "se": None,
        "ci95": None,
        "paired_se": statistics.fmean(paired) if paired else None,
        "xdpx_seconds": _mean_of(r["xdpx"].get("seconds") for r in runs),
        "baseline_seconds": _mean_of(r["baseline"].get("seconds") for r in runs),
    }
    if k > 1:
        se = statistics.stdev(diffs) / math.sqrt(k)
        half = float(stats.t.ppf(0.975, k - 1)) * se
        out.update(se=se, ci95=[mean - half, mean + half])
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def format_table(per_corpus: dict[str, dict[str, Any]], overall: dict[str, Any]) -> str:
    """The suite's Markdown table: per corpus, then the mean over corpora (points = %)."""
    lines = [
        "| corpus | model | seeds | baseline test | xdpx test | difference ± SE | "
        "per-text SE | wins | xdpx s | baseline s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in per_corpus.items():
        se = "" if s["se"] is None else f" ± {_pct(s['se'])}"
        lines.append(
            f"| {name} | {s['model']} | {s['k']} | {_pct(s['mean_baseline'])} | "
            f"{_pct(s['mean_xdpx'])} | {100 * s['mean_difference']:+.2f}{se} | "
            f"{_pct(s['paired_se'])} | {s['wins']}/{s['k']} | {s['xdpx_seconds'] or 0:.0f} | "
            f"{s['baseline_seconds'] or 0:.0f} |"
        )
    se = "" if overall["se"] is None else f" ± {_pct(overall['se'])}"
    lines.append(
        f"| **mean of {overall['corpora']}** | | | {_pct(overall['mean_baseline'])} | "
        f"{_pct(overall['mean_xdpx'])} | **{100 * overall['mean_difference']:+.2f}{se}** | | | | |"
    )
    return "\n".join(lines)


def run_suite(
    params: Params,
    corpora: Sequence[str] | None = None,
    seeds: Sequence[int] = (1, 2, 3),
    pair_model: str = DEFAULT_PAIR_MODEL,
    work_dir: str | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """Run the suite; see the module docstring.

    Args:
        params: resolved params (the config under test).
        corpora: names from :data:`~flows.corpora.CORPORA` (default: all, in order).
        seeds: seeds per corpus.
        pair_model: ``train.model`` for sentence-pair corpora.
        work_dir: keep every run's data and model here (default: a temporary directory).
        on_run: called with each run's result as it finishes (progress lines).
        limit: at most this many rows per split of each corpus (smoke runs); None = all.

    Returns:
        ``{"runs": [...], "per_corpus": {name: summary + "model"}, "overall": {...},
        "table": markdown}``.

    Raises:
        ValueError: an unknown corpus name.
        SuiteDataError: a corpus's package is not installed.
    """
    names = list(corpora or CORPORA)
    unknown = [n for n in names if n not in CORPORA]
    if unknown:
        raise ValueError(f"unknown corpus {unknown[0]!r}; known: {', '.join(CORPORA)}")
    runs: list[dict[str, Any]] = []
    per_corpus: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="xdpx-suite-") as tmp:
        root = work_dir or tmp
        for name in names:
            corpus_runs = []
            for seed in seeds:
                r = run_corpus_seed(
                    CORPORA[name],
                    params,
                    seed,
                    io.join(root, name, f"seed-{seed}"),
                    pair_model,
                    limit,
                )
                corpus_runs.append(r)
                if on_run:
                    on_run(r)
            runs.extend(corpus_runs)
            per_corpus[name] = {**summarize(corpus_runs), "model": corpus_runs[0]["xdpx"]["model"]}
    n = len(per_corpus)
    ses = [s["se"] for s in per_corpus.values()]
    overall = {
        "corpora": n,
        "mean_xdpx": statistics.fmean(s["mean_xdpx"] for s in per_corpus.values()),
        "mean_baseline": statistics.fmean(s["mean_baseline"] for s in per_corpus.values()),
        "mean_difference": statistics.fmean(s["mean_difference"] for s in per_corpus.values()),
        "se": None if None in ses else math.sqrt(sum(se**2 for se in ses)) / n,
    }
    return {
        "runs": runs,
        "per_corpus": per_corpus,
        "overall": overall,
        "table": format_table(per_corpus, overall),
    }
