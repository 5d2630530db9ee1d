"""``xdpx suite``: one config against the classical baseline and the strongest simple peers on
every corpus of the suite.

For each corpus (:mod:`studies.corpora`) and each seed ``s``: the corpus is written as
raw TSV files (split ``s`` where its split is random), then the stages prepro -> train
(``train.seed = s``) -> evaluate (``stages.registry.STAGES``, as functions) run with the params
(``params.yaml`` plus ``key=value`` overrides; only the paths and the corpus's columns are
set per corpus, and for sentence-pair corpora ``train.model`` is ``--pair-model``; a model
without ``reads_spelled_oov`` gets ``prepro.oov: unk``), and
:func:`xdpx.baselines.run_peers` runs on the same files and seed: today's ``baseline``
(TF-IDF word 1-2-grams, char 1-3-grams for Chinese, + LR; pairs: LR over ``[|u-v|, u*v]``)
and the peers, each with its hyper-parameters picked on dev: ``svm`` (TF-IDF word 1-2 +
char_wb 2-5, char 1-4 for Chinese, + LinearSVC), ``lr`` (the same features + LR),
``fasttext`` (when installed; reported as missing otherwise) and, for pairs, ``pair`` (LR
over ``[|u-v|, u*v, cos]``).

The **best peer** of a corpus and seed is the one of :data:`BEST_OF` (``svm``, ``lr``,
``fasttext`` for single texts; ``pair`` for pairs) with the best dev accuracy (ties: the
first in that order); the run's ``difference`` is xdpx's test accuracy minus the best
peer's. Per corpus the table gives the mean test accuracies of the baseline, each peer, the
best peer and xdpx, the paired difference with its standard error over seeds, the per-text
SE, the macro-F1 of xdpx and of the best peer, and the time of each side: xdpx's prepro +
train seconds beside the ``svm`` peer's (``pair`` for pairs) whole grid; over corpora, the
mean difference with its standard error (``sqrt(sum SE_i^2) / n``, the corpora being
independent).

The peers' results can be kept and reused (``peer_cache``; the CLI keeps them under
``~/.cache/xdpx/suite-peers`` unless ``--no-peer-cache``): they depend on the corpus's
files, the seed, fastText's grid, the peers' code and the library versions
(:func:`peer_cache_key`), not on xdpx's config, so a second run of another default takes
xdpx's time only (the peers are ~95% of a whole suite's, most of it fastText's grid).

**Encoder rows** (``encoders`` of :func:`run_suite`, ``xdpx suite --encoder e5``): per corpus
and seed, a fine-tuned transformer from a preset (:data:`ENCODER_PRESETS`, or any params
file with ``train.model: hf_classifier``) on the same raw files; on pair corpora the preset's
tokenizer encodes the two texts jointly (``[CLS] a [SEP] b [SEP]``): a cross-encoder.
:func:`run_encoder_row` prepares the data once, trains one run per learning rate of a short
grid with a dev evaluation at every epoch end (no early stop), and picks the (learning rate,
epoch) of the best dev accuracy (ties: the first rate of the list, then the earlier epoch);
the epoch is read off that one run's per-epoch dev scores, so its learning-rate schedule is
that of the whole run (warm-up and decay over ``epochs``), not of a shorter one. The chosen
run's best checkpoint (the trainer keeps the best dev evaluation) is the only one scored on
test. The runs go to ``encoder_runs`` and their means per corpus to ``encoders`` beside the
n-gram rows; :func:`merge_results` merges an encoder-only result into a whole suite's.

Seeds are what makes a difference of a fraction of a point readable: one test set of
1-2k texts has a standard error of ~1 point. Where the test set is fixed (20 Newsgroups,
STS-B) the SE over seeds measures the spread of training and dev cut, not the sampling of
the test texts; :func:`summarize` also gives a per-text paired SE for that (McNemar-style:
the standard deviation of the per-text difference of correctness / sqrt(n)).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from stages.registry import STAGES
from studies.corpora import CORPORA, Corpus, materialize, redraw_without_test
from studies.encoder_rows import (  # noqa: F401 - re-exported
    ENCODER_PRESETS,
    _epoch_number as _epoch_number,
    _lr_key as _lr_key,
    _mean_of as _mean_of,
    corpus_prepro,
    encoder_row_from_run,
    pick_encoder_config,
    resolve_encoder,
    run_encoder_row,
    score_encoder_row,
    summarize_encoder,
)
from studies.suite_report import (  # noqa: F401 - re-exported
    LEGACY_NOTE,
    TABLE_HEADER,
    TIME_PEER,
    TIME_PEER_PAIRS,
    _corpus_summary as _corpus_summary,
    _is_legacy_encoder as _is_legacy_encoder,
    _pct as _pct,
    _peer_cell as _peer_cell,
    _result as _result,
    _seconds as _seconds,
    format_table,
    legacy_encoder_runs,
    merge_results,
    student_entry,
    summarize,
    summarize_peers,
)
from xdpx import io
from xdpx.baselines import SINGLE_PEERS, read_tsv, run_peers
from xdpx.config import EvaluateConfig, Params, PredictConfig
from xdpx.data.meta import PreparedMeta
from xdpx.models import PAIR_INPUTS, input_names, reads_spelled_oov
from xdpx.rundir import RunDir

__all__ = [
    "merge_results",
    "student_entry",
    "run_encoder_row",
    "pick_encoder_config",
    "resolve_encoder",
    "summarize_encoder",
    "ENCODER_PRESETS",
    "run_corpus_seed",
    "pick_best_peer",
    "summarize",
    "summarize_peers",
    "run_suite",
    "format_table",
    "DEFAULT_PAIR_MODEL",
    "BEST_OF",
]

log = logging.getLogger("xdpx.suite")

#: ``train.model`` for sentence-pair corpora unless ``--pair-model`` says otherwise.
DEFAULT_PAIR_MODEL = "match_ngram"


#: The peers a best peer is picked from (by dev accuracy; ties: the first), single texts.
BEST_OF: tuple[str, ...] = SINGLE_PEERS
#: ... and for sentence pairs.
BEST_OF_PAIRS: tuple[str, ...] = ("pair",)


def pick_best_peer(peers: dict[str, dict[str, Any]], candidates: Sequence[str]) -> str:
    """The candidate with the best dev accuracy (ties: the first in ``candidates``), among
    those that ran (not ``missing``).

    Raises:
        ValueError: none of the candidates ran.
    """
    ran = [p for p in candidates if p in peers and "missing" not in peers[p]]
    if not ran:
        raise ValueError(f"none of the peers {list(candidates)} ran")
    return max(ran, key=lambda p: (peers[p]["dev"], -ran.index(p)))


def _peer_record(result: dict[str, Any]) -> dict[str, Any]:
    if "missing" in result:
        return {"missing": result["missing"]}
    return {
        "model": result["model"],
        "dev": result["dev_accuracy_best"],
        "test": result["test_accuracy"],
        "macro_f1": result["test_macro_f1"],
        "seconds": result["seconds"],
        "params": result.get("params", {"C": result.get("C")}),
        "dev_grid": result["dev_accuracy"],
        **{k: result[k] for k in ("failed", "retried", "cached") if result.get(k)},
    }


#: bump when the peers' records change shape (a cached result of another shape is not read)
PEER_CACHE_VERSION = 1


def peer_cache_key(raw: str, corpus: Corpus, seed: int, fasttext_grid: Any = None) -> str:
    """What the peers' results on ``raw/{train,dev,test}.tsv`` depend on, as a sha256: the
    three files' bytes, the corpus's columns and language, the seed, fastText's grid, the
    source of :mod:`xdpx.baselines` (the peers' code) and the versions of scikit-learn,
    numpy, scipy and fastText. xdpx's own config and code are not in it: a suite run of
    another default reuses the peers of an earlier one on the same data."""
    from importlib import metadata

    import xdpx.baselines

    h = hashlib.sha256()
    for split in ("train", "dev", "test"):
        h.update(hashlib.sha256(io.read_bytes(io.join(raw, f"{split}.tsv"))).digest())
    versions = {}
    for dist in ("scikit-learn", "numpy", "scipy", "fasttext-numpy2-wheel"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    facts = {
        "version": PEER_CACHE_VERSION,
        "columns": corpus.columns,
        "language": corpus.language,
        "seed": seed,
        "fasttext_grid": fasttext_grid,
        "versions": versions,
    }
    h.update(json.dumps(facts, sort_keys=True, default=str).encode())
    h.update(inspect.getsource(xdpx.baselines).encode())
    return h.hexdigest()


def _json_safe(obj: Any) -> Any:
    """numpy scalars and arrays as Python numbers and lists (for ``json.dumps``)."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def cached_run_peers(
    raw: str,
    corpus: Corpus,
    seed: int,
    fasttext_grid: dict[str, Sequence[Any]] | None = None,
    cache_dir: str | None = None,
) -> dict[str, dict[str, Any]]:
    """:func:`xdpx.baselines.run_peers` on the corpus's files, or its earlier results on the
    same :func:`peer_cache_key` from ``cache_dir`` (None: always run). Results are written
    there atomically, one JSON file per key; a peer reported missing (fastText not
    installed, or failed on every point) is not cached, so a later run tries again. A
    reused result keeps the seconds it took when it ran, and says ``"cached": true``.

    Returns:
        As :func:`~xdpx.baselines.run_peers`.
    """
    path = None
    if cache_dir:
        path = io.join(cache_dir, peer_cache_key(raw, corpus, seed, fasttext_grid) + ".json")
    if path and io.exists(path):
        try:
            results = json.loads(io.read_text(path))
        except ValueError:  # not ours, or damaged by hand: run again and replace it
            log.warning("peer cache %s is not valid JSON; running the peers again", path)
        else:
            log.info("%s seed %d: peers' results from %s", corpus.name, seed, path)
            return {name: {**r, "cached": True} for name, r in results.items()}
    columns = corpus.columns
    results = run_peers(
        raw,
        text_column=columns["text_column"] or "text",
        label_column="label",
        text2_column=columns["text2_column"],
        language=corpus.language,
        seed=seed,
        fasttext_grid=fasttext_grid,
    )
    if path and not any("missing" in r for r in results.values()):
        io.makedirs(cache_dir)
        io.write_text(path, json.dumps(results, default=_json_safe))
    return results


def run_corpus_seed(
    corpus: Corpus,
    params: Params,
    seed: int,
    work_dir: str,
    pair_model: str = DEFAULT_PAIR_MODEL,
    limit: int | None = None,
    fasttext_grid: dict[str, Sequence[Any]] | None = None,
    written: dict[str, int] | None = None,
    peer_cache: str | None = None,
    dev_only: bool = False,
) -> dict[str, Any]:
    """Materialise ``corpus`` with ``seed`` under ``work_dir``; run xdpx, the baseline and
    the peers.

    Args:
        corpus: the corpus.
        params: resolved params; paths and columns are replaced per corpus.
        seed: split seed (corpora with a random split), ``train.seed`` and fastText's seed.
        work_dir: directory for this run's raw and prepared data, model and metrics.
        pair_model: ``train.model`` used for a sentence-pair corpus.
        limit: at most this many rows per split (smoke runs); None = the whole corpus.
        fasttext_grid: the fastText peer's grid (None: ``xdpx.baselines.FASTTEXT_GRID``).
        written: the rows per split of raw files already under ``work_dir/raw`` in the
            corpus's layout (``bench/baseline_cv.py`` fetches them with its params); None =
            materialise the corpus there.
        peer_cache: reuse and keep the peers' results here (:func:`cached_run_peers`);
            None = run them.
        dev_only: compare without the test file: the splits are redrawn from train + dev
            by ``seed`` (:func:`~studies.corpora.redraw_without_test`), and the run's "test"
            numbers are of a held-out part of them.

    Returns:
        ``{"corpus", "seed", "n": {split: rows}, "xdpx": {"dev", "test", "macro_f1",
        "prepro_train_seconds", "seconds" (prepro, train, evaluate and predict), "model",
        "tokenizer", "vocab_size"}, "peers": {name: {"model", "dev", "test", "macro_f1",
        "seconds", "params", "dev_grid"} or {"missing": why}}, "best_peer", "difference"
        (xdpx - best peer, test), "paired_se", "baseline_difference"}``; accuracies are
        fractions in [0, 1].
    """
    raw, prepared = io.join(work_dir, "raw"), io.join(work_dir, "prepared")
    model_dir = io.join(work_dir, "model")
    counts = written if written is not None else materialize(corpus.name, raw, seed, limit)
    if dev_only:
        counts = redraw_without_test(raw, seed)
    model = params.train.model
    if corpus.text2 and input_names(model) != PAIR_INPUTS:
        model = pair_model
    # a model that cannot read spelled unknown words gets them as one [UNK] (prepro.oov)
    spell = params.prepro.oov == "spell" and reads_spelled_oov(model)
    start = time.perf_counter()
    prepro_cfg = corpus_prepro(params, corpus, raw, prepared, oov="spell" if spell else "unk")
    prepared_result = STAGES["prepro"].run(prepro_cfg)
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
    prepro_train_seconds = time.perf_counter() - start
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
    predictions = io.join(work_dir, "test_predictions.tsv")
    STAGES["predict"].run(
        PredictConfig(
            checkpoint=checkpoint,
            data_file=io.join(raw, "test.tsv"),
            out_file=predictions,
            concat_origin=True,
        )
    )
    seconds = time.perf_counter() - start
    meta = PreparedMeta.read(prepared)
    results = cached_run_peers(raw, corpus, seed, fasttext_grid, peer_cache)
    for name, result in results.items():
        if "missing" in result:
            log.warning("%s seed %d: peer %s not run: %s", corpus.name, seed, name, result["missing"])  # fmt: skip
    peers = {name: _peer_record(result) for name, result in results.items()}
    best = pick_best_peer(peers, BEST_OF_PAIRS if corpus.text2 else BEST_OF)
    pred = read_tsv(predictions, ["label", "pred_label"])
    ours_correct = (pred["label"] == pred["pred_label"]).astype(int).tolist()
    best_correct = results[best]["test_correct"]
    if len(ours_correct) != len(best_correct):
        raise RuntimeError(
            f"{corpus.name}: {len(ours_correct)} xdpx test predictions vs "
            f"{len(best_correct)} of the {best} peer"
        )
    diffs = [a - b for a, b in zip(ours_correct, best_correct, strict=True)]
    test = ours["test"]["accuracy"]
    return {
        "corpus": corpus.name,
        "seed": seed,
        "dev_only": dev_only,
        "n": counts,
        "xdpx": {
            "dev": ours["dev"]["accuracy"],
            "test": test,
            "macro_f1": ours["test"]["macro_f1"],
            "prepro_train_seconds": round(prepro_train_seconds, 1),
            "seconds": round(seconds, 1),
            "model": model,
            "tokenizer": meta.tokenizer,
            "vocab_size": prepared_result.vocab_size,
        },
        "peers": peers,
        "best_peer": best,
        "difference": test - peers[best]["test"],
        "paired_se": statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None,
        "baseline_difference": test - peers["baseline"]["test"],
    }


def run_suite(
    params: Params,
    corpora: Sequence[str] | None = None,
    seeds: Sequence[int] = (1, 2, 3),
    pair_model: str = DEFAULT_PAIR_MODEL,
    work_dir: str | None = None,
    on_run: Callable[[dict[str, Any]], None] | None = None,
    limit: int | None = None,
    fasttext_grid: dict[str, Sequence[Any]] | None = None,
    peer_cache: str | None = None,
    dev_only: bool = False,
    encoders: Sequence[tuple[str, Params]] = (),
    encoder_lrs: Sequence[float] | None = None,
    encoder_epochs: int | None = None,
    encoder_only: bool = False,
    on_encoder_run: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the suite; see the module docstring.

    Args:
        params: resolved params (the config under test).
        corpora: names from :data:`~studies.corpora.CORPORA` (default: all, in order).
        seeds: seeds per corpus.
        pair_model: ``train.model`` for sentence-pair corpora.
        work_dir: keep every run's data and model here (default: a temporary directory).
        on_run: called with each run's result as it finishes (progress lines).
        limit: at most this many rows per split of each corpus (smoke runs); None = all.
        fasttext_grid: the fastText peer's grid (None: ``xdpx.baselines.FASTTEXT_GRID``).
        peer_cache: reuse and keep the peers' results here (:func:`cached_run_peers`; the
            CLI's default is ``~/.cache/xdpx/suite-peers``); None = run them every time.
        dev_only: never read a test file (see :func:`run_corpus_seed`): for choosing a
            default, as the project's rule says.
        encoders: ``(name, preset params)`` of the fine-tuned encoders to run per corpus
            and seed (:func:`run_encoder_row`, on the same raw files as the n-gram row).
        encoder_lrs: their learning-rate grid (None: each preset's own rate).
        encoder_epochs: epochs per encoder run (None: each preset's ``max_epoch``).
        encoder_only: run the encoders alone (no n-gram row, no peers): a result for
            :func:`merge_results` into a whole suite's.
        on_encoder_run: called with each encoder run's result as it finishes.

    Returns:
        ``{"runs": [...], "per_corpus": {name: :func:`summarize` + :func:`summarize_peers`
        + "model"}, "overall": {...} (None without n-gram runs), "table": markdown,
        "encoder_runs": [...], "encoders": {corpus: {encoder: :func:`summarize_encoder`}}}``.

    Raises:
        ValueError: an unknown corpus name, or ``encoder_only`` without encoders.
        SuiteDataError: a corpus's package is not installed.
    """
    names = list(corpora or CORPORA)
    unknown = [n for n in names if n not in CORPORA]
    if unknown:
        raise ValueError(f"unknown corpus {unknown[0]!r}; known: {', '.join(CORPORA)}")
    if encoder_only and not encoders:
        raise ValueError("encoder_only needs at least one encoder (--encoder)")
    runs: list[dict[str, Any]] = []
    encoder_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="xdpx-suite-") as tmp:
        root = work_dir or tmp
        for name in names:
            for seed in seeds:
                seed_dir = io.join(root, name, f"seed-{seed}")
                written = None
                if not encoder_only:
                    r = run_corpus_seed(
                        CORPORA[name],
                        params,
                        seed,
                        seed_dir,
                        pair_model,
                        limit,
                        fasttext_grid,
                        peer_cache=peer_cache,
                        dev_only=dev_only,
                    )
                    runs.append(r)
                    written = r["n"]
                    if on_run:
                        on_run(r)
                for enc_name, enc_params in encoders:
                    e = run_encoder_row(
                        CORPORA[name],
                        enc_params,
                        enc_name,
                        seed,
                        seed_dir,
                        encoder_lrs,
                        encoder_epochs,
                        limit,
                        written,
                        dev_only,
                    )
                    written = e["n"]
                    encoder_runs.append(e)
                    if on_encoder_run:
                        on_encoder_run(e)
    return _result(runs, encoder_runs)
