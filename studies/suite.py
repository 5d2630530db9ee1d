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

import csv
import hashlib
import inspect
import json
import logging
import math
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from stages.registry import STAGES
from studies.corpora import CORPORA, Corpus, materialize, redraw_without_test
from xdpx import io
from xdpx.baselines import SINGLE_PEERS, read_tsv, run_peers
from xdpx.config import EvaluateConfig, Params, PredictConfig, PreproConfig
from xdpx.data.meta import PreparedMeta
from xdpx.distillation import kept_share
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
#: The peer whose time the table sets beside xdpx's prepro + train (single texts, pairs).
TIME_PEER, TIME_PEER_PAIRS = "svm", "pair"


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


def corpus_prepro(
    params: Params, corpus: Corpus, raw: str, prepared: str, **extra: Any
) -> PreproConfig:
    """``params.prepro`` pointed at the corpus's files: ``raw/{train,dev,test}.tsv`` (with a
    header), its columns and the prepro keys it needs (``corpus.prepro``), written to
    ``prepared``; ``extra`` keys last."""
    return params.prepro.model_copy(
        update={
            "data_source": raw,
            "data_dir": prepared,
            "data_files": {s: f"{s}.tsv" for s in ("train", "dev", "test")},
            "format": "tsv",
            "header": True,
            **corpus.columns,
            **corpus.prepro,
            **extra,
        }
    )


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


#: ``--encoder`` shorthands: name -> preset params file (relative to the project root).
ENCODER_PRESETS: dict[str, str] = {
    "minilm": "params/bert-minilm.yaml",
    "e5": "params/bert-e5.yaml",
}


def resolve_encoder(spec: str) -> tuple[str, str]:
    """``(name, params file)`` of an ``--encoder`` value: a shorthand of
    :data:`ENCODER_PRESETS` (``e5``) or a params file (``params/bert-e5.yaml``; its name is
    the file's stem without ``bert-``, so both spellings give ``e5``).

    Raises:
        ValueError: neither a shorthand nor a ``.yaml``/``.yml`` file name.
    """
    if spec in ENCODER_PRESETS:
        return spec, ENCODER_PRESETS[spec]
    if not spec.endswith((".yaml", ".yml")):
        raise ValueError(
            f"--encoder {spec!r}: not one of {', '.join(ENCODER_PRESETS)} nor a params file (.yaml)"
        )
    stem = spec.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return stem.removeprefix("bert-"), spec


def pick_encoder_config(grid: dict[str, dict[str, float]]) -> tuple[str, str]:
    """The ``(learning rate, epoch)`` keys of the best dev accuracy in ``grid`` (``{lr:
    {epoch: dev accuracy}}``, both keys strings as in the JSON); ties: the first learning
    rate in ``grid``'s order, then the earlier epoch.

    Raises:
        ValueError: the grid holds no dev score.
    """
    points = [(lr, ep, dev) for lr, curve in grid.items() for ep, dev in curve.items()]
    if not points:
        raise ValueError("the encoder's dev grid is empty (no evaluation ran)")
    best = max(points, key=lambda p: p[2])[2]
    lr, ep, _ = next(p for p in points if p[2] == best)
    return lr, ep


def _lr_key(lr: float) -> str:
    return f"{lr:g}"


def _epoch_number(key: str) -> int | float:
    """A grid's epoch key as a number: ``"2"`` -> 2 (an epoch's end), ``"0.33"`` -> 0.33
    (an evaluation inside the first epoch, :func:`encoder_row_from_run`)."""
    return int(key) if float(key).is_integer() and "." not in key else float(key)


def run_encoder_row(
    corpus: Corpus,
    params: Params,
    name: str,
    seed: int,
    work_dir: str,
    learning_rates: Sequence[float] | None = None,
    epochs: int | None = None,
    limit: int | None = None,
    written: dict[str, int] | None = None,
    dev_only: bool = False,
    keep_all: bool = False,
) -> dict[str, Any]:
    """One fine-tuned-encoder row: prepro with the preset, a dev grid of learning rate x
    epochs, test for the chosen point only (see the module docstring).

    Args:
        corpus: the corpus.
        params: the preset's resolved params (``train.model: hf_classifier``, ``prepro.
            tokenizer: hf``); paths and columns are replaced per corpus.
        name: the encoder's name in the results (``e5``).
        seed: split seed and ``train.seed``.
        work_dir: this corpus and seed's directory: ``raw/`` (reused when ``written``),
            ``encoder-<name>/prepared``, ``encoder-<name>/lr-<lr>/`` (one run per rate),
            ``encoder-<name>/metrics.json``.
        learning_rates: the grid's rates (None: the preset's ``train.learning_rate`` alone).
        epochs: epochs of each run, each ending with a dev evaluation (None: the preset's
            ``train.max_epoch``).
        limit: at most this many rows per split (smoke runs).
        written: rows per split of raw files already under ``work_dir/raw`` (the n-gram
            row's); None = materialise the corpus there.
        dev_only: as :func:`run_corpus_seed` (splits redrawn from train + dev).
        keep_all: keep every grid run's checkpoints (default: only the chosen run's; a
            12-layer encoder's checkpoint is ~0.5 GB).

    Returns:
        ``{"corpus", "seed", "encoder", "dev_only", "n", "params" (the preset's
        ``train.pretrained_model``, ``prepro.max_len``, ``prepro.truncation``, ``train.
        batch_size``, ``train.threads``), "model", "pair_encoding" ("joint": a cross-encoder;
        None for single texts), "dev", "test", "macro_f1" (the chosen checkpoint's, from
        evaluate), "chosen": {"learning_rate", "epoch"}, "grid": {lr: {epoch: dev}},
        "prepro_seconds", "prepro_train_seconds" (prepro + the chosen run's training),
        "grid_seconds" (prepro + every run's training), "seconds" (all, evaluate
        included)}``; accuracies are fractions in [0, 1], times wall seconds.

    Raises:
        ValueError: the preset's model is not ``hf_classifier``, or its tokenizer not hf.
    """
    if params.train.model != "hf_classifier" or params.prepro.tokenizer != "hf":
        raise ValueError(
            f"encoder {name!r}: the preset must set train.model: hf_classifier and "
            f"prepro.tokenizer: hf (got {params.train.model}, {params.prepro.tokenizer})"
        )
    raw = io.join(work_dir, "raw")
    root = io.join(work_dir, f"encoder-{name}")
    prepared = io.join(root, "prepared")
    counts = written if written is not None else materialize(corpus.name, raw, seed, limit)
    if dev_only and written is None:
        counts = redraw_without_test(raw, seed)
    rates = list(learning_rates or [params.train.learning_rate])
    n_epochs = epochs or params.train.max_epoch
    start = time.perf_counter()
    STAGES["prepro"].run(corpus_prepro(params, corpus, raw, prepared))
    prepro_seconds = time.perf_counter() - start
    grid: dict[str, dict[str, float]] = {}
    train_seconds: dict[str, float] = {}
    run_dirs: dict[str, str] = {}
    for lr in rates:
        key = _lr_key(lr)
        run_dirs[key] = io.join(root, f"lr-{key}")
        events: list[Any] = []
        t0 = time.perf_counter()
        STAGES["train"].run(
            params.train.model_copy(
                update={
                    "data_dir": prepared,
                    "save_dir": run_dirs[key],
                    "overwrite": True,
                    "auto_suffix": False,
                    "resume": False,
                    "resume_from": None,
                    "seed": seed,
                    "learning_rate": lr,
                    "max_epoch": n_epochs,
                    "max_update": None,
                    "max_samples": None,
                    "eval_interval": -1,
                    "eval_interval_warmup": 0,
                    "valid_subset": "dev",
                    "major_metric": "accuracy",
                    "tolerance": max(n_epochs, params.train.tolerance),
                }
            ),
            on_eval=events.append,
        )
        train_seconds[key] = time.perf_counter() - t0
        grid[key] = {str(e.epoch): e.metrics["accuracy"] for e in events}
        log.info("%s seed %d: %s lr %s: dev by epoch %s", corpus.name, seed, name, key, grid[key])  # fmt: skip
    lr_key, epoch = pick_encoder_config(grid)
    if not keep_all:
        for key, path in run_dirs.items():
            if key != lr_key:
                io.rm(path, recursive=True)
    return score_encoder_row(
        corpus, params, name, seed, dev_only, counts, prepared, root, run_dirs[lr_key], grid,
        prepro_seconds, train_seconds, time.perf_counter() - start,
    )  # fmt: skip


def score_encoder_row(
    corpus: Corpus,
    params: Params,
    name: str,
    seed: int,
    dev_only: bool,
    counts: dict[str, int],
    prepared: str,
    root: str,
    run_dir: str,
    grid: dict[str, dict[str, float]],
    prepro_seconds: float,
    train_seconds: dict[str, float],
    seconds_so_far: float,
    note: str | None = None,
) -> dict[str, Any]:
    """The row of the grid point chosen on dev (:func:`pick_encoder_config`): its run's best
    checkpoint (``run_dir``) scored on dev and test by ``stages.evaluate``, the only time the
    test file is read. ``grid``/``train_seconds`` are keyed by learning rate
    (:func:`_lr_key`); the other arguments as :func:`run_encoder_row`'s.

    Raises:
        RuntimeError: the best checkpoint's dev score is not the grid's best (the run's
            ``<best>`` is another checkpoint than the one the grid chose).
    """
    start = time.perf_counter()
    lr_key, epoch = pick_encoder_config(grid)
    evaluated = STAGES["evaluate"].run(
        EvaluateConfig(
            checkpoint=RunDir(run_dir).best_alias,
            data_dir=prepared,
            splits=["dev", "test"],
            metrics_file=io.join(root, "metrics.json"),
            confusion_png=io.join(root, "confusion.png"),
        )
    )
    metrics = evaluated.metrics
    # 1e-6: a grid read from valid.log.tsv (encoder_row_from_run) holds 6 digits
    if not math.isclose(metrics["dev"]["accuracy"], grid[lr_key][epoch], abs_tol=1e-6):
        raise RuntimeError(
            f"{corpus.name} {name}: the best checkpoint of lr {lr_key} scores dev "
            f"{metrics['dev']['accuracy']:.4f}, its epoch {epoch} scored {grid[lr_key][epoch]:.4f}"
        )
    return {
        "corpus": corpus.name,
        "seed": seed,
        "encoder": name,
        "dev_only": dev_only,
        "n": counts,
        "params": {
            "pretrained_model": params.train.pretrained_model,
            "max_len": params.prepro.max_len,
            "truncation": params.prepro.truncation,
            "batch_size": params.train.batch_size,
            "threads": params.train.threads,
        },
        "model": params.train.model,
        "pair_encoding": "joint" if corpus.text2 else None,
        "dev": metrics["dev"]["accuracy"],
        "test": metrics["test"]["accuracy"],
        "macro_f1": metrics["test"]["macro_f1"],
        "chosen": {"learning_rate": float(lr_key), "epoch": _epoch_number(epoch)},
        "grid": grid,
        "prepro_seconds": round(prepro_seconds, 1),
        "prepro_train_seconds": round(prepro_seconds + train_seconds[lr_key], 1),
        "grid_seconds": round(prepro_seconds + sum(train_seconds.values()), 1),
        "seconds": round(seconds_so_far + time.perf_counter() - start, 1),
        **({"note": note} if note else {}),
    }


def encoder_row_from_run(
    corpus: Corpus,
    params: Params,
    name: str,
    seed: int,
    prepared: str,
    run_dir: str,
    prepro_seconds: float,
    train_seconds: float,
    note: str,
) -> dict[str, Any]:
    """An encoder row from a fine-tuning run made outside the suite (``xdpx train`` with the
    preset on the corpus's seed-``seed`` split, e.g. a run taking most of an hour on CPU):
    the dev grid is the run's ``valid.log.tsv`` (one learning rate; the points are the
    evaluations, keyed by epochs done, ``samples_seen / n_train`` to 2 decimals), then
    :func:`score_encoder_row`. ``note`` says how the run was made (shown in the table).

    Raises:
        DataError: the run has no ``valid.log.tsv`` rows.
    """
    from xdpx.data import DataError

    n = {s: PreparedMeta.read(prepared).split(s).rows for s in ("train", "dev", "test")}
    log_file = RunDir(run_dir).valid_log
    with io.open(log_file, "r") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        raise DataError(f"{log_file}: no evaluation rows")
    curve = {f"{int(r['samples_seen']) / n['train']:.2f}": float(r["accuracy"]) for r in rows}
    lr_key = _lr_key(params.train.learning_rate)
    return score_encoder_row(
        corpus, params, name, seed, False, n, prepared, run_dir, run_dir, {lr_key: curve},
        prepro_seconds, {lr_key: train_seconds}, prepro_seconds + train_seconds, note,
    )  # fmt: skip


def summarize_encoder(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One encoder on one corpus: means over its runs (seeds).

    Returns:
        ``{"k", "test", "dev", "macro_f1", "prepro_train_seconds", "grid_seconds"}`` (a
        mean is None when a run lacks it: an older run without macro-F1) plus ``"chosen"``
        (each run's), ``"note"`` (the first run's, if any) and ``"params"`` (the first
        run's).
    """
    return {
        "k": len(runs),
        **{
            key: _mean_of(r.get(key) for r in runs)
            for key in ("test", "dev", "macro_f1", "prepro_train_seconds", "grid_seconds")
        },
        "chosen": [r.get("chosen") for r in runs],
        "params": runs[0].get("params"),
        **({"note": runs[0]["note"]} if runs[0].get("note") else {}),
    }


def _mean_of(values: Any) -> float | None:
    """Mean of ``values``, or None when any is missing."""
    values = list(values)
    return None if not values or None in values else statistics.fmean(values)


def summarize(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean test difference over runs, its standard error and a Student-t 95% interval.

    Args:
        runs: results with ``xdpx.test``, ``baseline.test`` (or ``peers.baseline.test``) and
            ``difference`` (and optionally ``paired_se``, ``xdpx.seconds``,
            ``baseline.seconds``).

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
    bases = [r["baseline"] if "baseline" in r else r["peers"]["baseline"] for r in runs]
    out: dict[str, Any] = {
        "k": k,
        "mean_xdpx": statistics.fmean(r["xdpx"]["test"] for r in runs),
        "mean_baseline": statistics.fmean(b["test"] for b in bases),
        "mean_difference": mean,
        "wins": sum(d > 0 for d in diffs),
        "ties": sum(d == 0 for d in diffs),
        "se": None,
        "ci95": None,
        "paired_se": statistics.fmean(paired) if paired else None,
        "xdpx_seconds": _mean_of(r["xdpx"].get("seconds") for r in runs),
        "baseline_seconds": _mean_of(b.get("seconds") for b in bases),
    }
    if k > 1:
        se = statistics.stdev(diffs) / math.sqrt(k)
        half = float(stats.t.ppf(0.975, k - 1)) * se
        out.update(se=se, ci95=[mean - half, mean + half])
    return out


def summarize_peers(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The peers' side of one corpus's runs (:func:`run_corpus_seed` results).

    Returns:
        ``{"peers": {name: {"test", "dev", "macro_f1", "seconds"} (means over runs; or
        {"missing": why} when a run lacked it)}, "best_peers": {name: times picked},
        "mean_best_peer", "best_peer_macro_f1", "xdpx_macro_f1", "baseline_difference",
        "xdpx_prepro_train_seconds", "time_peer", "time_peer_seconds", "time_ratio"
        (xdpx prepro + train / the time peer's seconds)}``.
    """
    names = list(dict.fromkeys(n for r in runs for n in r["peers"]))
    peers: dict[str, dict[str, Any]] = {}
    for name in names:
        records = [r["peers"].get(name, {"missing": "not run"}) for r in runs]
        missing = [p["missing"] for p in records if "missing" in p]
        if missing:
            peers[name] = {"missing": missing[0]}
            continue
        peers[name] = {
            key: statistics.fmean(p[key] for p in records)
            for key in ("test", "dev", "macro_f1", "seconds")
        }
    best = [r["peers"][r["best_peer"]] for r in runs]
    time_peer = TIME_PEER if TIME_PEER in peers else TIME_PEER_PAIRS
    xdpx_s = _mean_of(r["xdpx"].get("prepro_train_seconds") for r in runs)
    peer_s = peers.get(time_peer, {}).get("seconds")
    return {
        "peers": peers,
        "best_peers": dict(Counter(r["best_peer"] for r in runs)),
        "mean_best_peer": statistics.fmean(p["test"] for p in best),
        "best_peer_macro_f1": statistics.fmean(p["macro_f1"] for p in best),
        "xdpx_macro_f1": _mean_of(r["xdpx"].get("macro_f1") for r in runs),
        "baseline_difference": _mean_of(r.get("baseline_difference") for r in runs),
        "xdpx_prepro_train_seconds": xdpx_s,
        "time_peer": time_peer,
        "time_peer_seconds": peer_s,
        "time_ratio": xdpx_s / peer_s if xdpx_s is not None and peer_s else None,
    }


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def _peer_cell(s: dict[str, Any], name: str) -> str:
    peer = s["peers"].get(name)
    if peer is None:
        return "–"
    return "missing" if "missing" in peer else _pct(peer["test"])


def _seconds(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}" if x < 10 else f"{x:.0f}"


#: The table's columns (one line each; see :func:`format_table`).
TABLE_HEADER = (
    "| corpus | model | seeds | baseline | svm | lr | fastText | pair | best peer "
    "(picked on dev) | xdpx | xdpx − best ± SE | per-text SE | macro-F1 xdpx / best | "
    "xdpx s (prepro+train) | svm s | ratio |"
)


def format_table(per_corpus: dict[str, dict[str, Any]], overall: dict[str, Any]) -> str:
    """The suite's Markdown table: per corpus, then the mean over corpora (points = %).

    Test accuracies (mean over seeds) of today's baseline, each peer, the best peer (with
    how often each peer was picked) and xdpx; the difference xdpx − best peer with its SE
    over seeds and the mean per-text SE; macro-F1 of xdpx and of the best peer; xdpx's
    prepro + train seconds, the ``svm`` peer's (``pair``'s for pairs, marked so) whole
    cost, and their ratio.
    """
    lines = [TABLE_HEADER, "|" + "---|" * TABLE_HEADER.count(" | ") + "---|"]
    for name, s in per_corpus.items():
        se = "" if s["se"] is None else f" ± {_pct(s['se'])}"
        picked = ", ".join(f"{p} {n}" for p, n in s["best_peers"].items())
        time_peer = "" if s["time_peer"] == TIME_PEER else f" ({s['time_peer']})"
        ratio = "–" if s["time_ratio"] is None else f"{s['time_ratio']:.2f}×"
        lines.append(
            f"| {name} | {s['model']} | {s['k']} | {_pct(s['mean_baseline'])} | "
            f"{_peer_cell(s, 'svm')} | {_peer_cell(s, 'lr')} | {_peer_cell(s, 'fasttext')} | "
            f"{_peer_cell(s, 'pair')} | {_pct(s['mean_best_peer'])} ({picked}) | "
            f"{_pct(s['mean_xdpx'])} | {100 * s['mean_difference']:+.2f}{se} | "
            f"{_pct(s['paired_se'])} | {_pct(s['xdpx_macro_f1'])} / "
            f"{_pct(s['best_peer_macro_f1'])} | {_seconds(s['xdpx_prepro_train_seconds'])} | "
            f"{_seconds(s['time_peer_seconds'])}{time_peer} | {ratio} |"
        )
    se = "" if overall["se"] is None else f" ± {_pct(overall['se'])}"
    lines.append(
        f"| **mean of {overall['corpora']}** | | | {_pct(overall['mean_baseline'])} | | | | | "
        f"{_pct(overall['mean_best_peer'])} | {_pct(overall['mean_xdpx'])} | "
        f"**{100 * overall['mean_difference']:+.2f}{se}** | | | | | |"
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


def _corpus_summary(corpus_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One corpus's summary (``per_corpus[name]``) from its runs."""
    return {
        **summarize(corpus_runs),
        **summarize_peers(corpus_runs),
        "model": corpus_runs[0]["xdpx"]["model"],
    }


def student_entry(report_dir: str, teacher: str, seeds_file: str | None = None) -> dict[str, Any]:
    """A distilled student's row of the suite (``students``; the which-model table): what an
    ``xdpx distill`` run on a suite corpus's split gave.

    Reads ``report_dir/decision.json`` (the run: the grid point best on dev, what shipped,
    train.seed 1) and ``seeds_file`` (default ``report_dir/seeds.json``:
    ``bench/distill_seeds.py``'s report, the student and the n-gram alone over more student
    seeds; absent: the run's one seed).

    Args:
        report_dir: the run's ``report_dir``.
        teacher: the teacher's name in the table (e.g. ``e5``, ``minilm``).
        seeds_file: the seeds report, if not ``report_dir/seeds.json``.

    Returns:
        ``{"teacher", "student", "shipped", "k", "dev", "test", "alone_dev", "teacher_dev",
        "kept_share", "report"}``: dev and test are means over the ``k`` student seeds;
        ``kept_share`` = (student dev - alone dev) / (teacher dev - alone dev), None when the
        teacher is not ahead.

    Raises:
        FileNotFoundError: no ``decision.json``.
    """
    decision = json.loads(io.read_text(io.join(report_dir, "decision.json")))
    seeds_file = seeds_file or io.join(report_dir, "seeds.json")
    t_dev = decision["dev"]["teacher"]
    if io.exists(seeds_file):
        seeds = json.loads(io.read_text(seeds_file))
        k = len(seeds["student_runs"]["dev"])
        dev, test = seeds["mean"]["student_dev"], seeds["mean"]["student_test"]
        alone = seeds["mean"]["alone_dev"]
    else:
        k, alone = 1, decision["dev"]["alone"]
        dev, test = decision["dev"]["student"], decision["test"]["student"]
    return {
        "teacher": teacher,
        "student": decision.get("student_run"),
        "shipped": decision["shipped"],
        "k": k,
        "dev": dev,
        "test": test,
        "alone_dev": alone,
        "teacher_dev": t_dev,
        "kept_share": kept_share(t_dev, alone, dev),
        "report": report_dir,
    }


def _result(
    runs: list[dict[str, Any]],
    encoder_runs: Sequence[dict[str, Any]] = (),
    students: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """:func:`run_suite`'s result from its runs (in corpus, then seed order): the per-corpus
    summaries, the mean over corpora (its SE ``sqrt(sum SE_i^2) / n``: the corpora are
    independent), the table, the encoders' runs and per-corpus means, and the distilled
    students (``{corpus: {name: student_entry(...)}}``) when there are any."""
    by_corpus: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_corpus.setdefault(run["corpus"], []).append(run)
    per_corpus = {name: _corpus_summary(rs) for name, rs in by_corpus.items()}
    encoders: dict[str, dict[str, dict[str, Any]]] = {}
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in encoder_runs:
        grouped.setdefault((run["corpus"], run["encoder"]), []).append(run)
    for (corpus, encoder), rs in grouped.items():
        encoders.setdefault(corpus, {})[encoder] = summarize_encoder(rs)
    out: dict[str, Any] = {
        "runs": runs,
        "per_corpus": per_corpus,
        "overall": None,
        "table": "",
    }
    if per_corpus:
        n = len(per_corpus)
        ses = [s["se"] for s in per_corpus.values()]
        overall = {
            "corpora": n,
            "mean_xdpx": statistics.fmean(s["mean_xdpx"] for s in per_corpus.values()),
            "mean_baseline": statistics.fmean(s["mean_baseline"] for s in per_corpus.values()),
            "mean_best_peer": statistics.fmean(s["mean_best_peer"] for s in per_corpus.values()),
            "mean_difference": statistics.fmean(
                s["mean_difference"] for s in per_corpus.values()
            ),  # fmt: skip
            "se": None if None in ses else math.sqrt(sum(se**2 for se in ses)) / n,
        }
        out.update(overall=overall, table=format_table(per_corpus, overall))
    if encoder_runs:
        out.update(encoder_runs=list(encoder_runs), encoders=encoders)
    if students:
        out["students"] = students
    return out


#: What an older single-run suite result (``reports/suite-stsb-minilm.json``: ``xdpx`` an
#: ``hf_classifier``, ``baseline`` instead of ``peers``) says of its encoder row, as a note.
LEGACY_NOTE = (
    "older run (suite format before the peers): one seed, train.threads=1, lr {lr} x "
    "{epochs} epochs, dev every {eval_interval} updates (not per epoch); no macro-F1; "
    "seconds are prepro + train + evaluate"
)


def legacy_encoder_runs(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The encoder rows of an older suite result whose xdpx model was ``hf_classifier``
    (``reports/suite-stsb-minilm.json``, written before the peers and the encoder rows):
    ``dev``, ``test`` and the seconds it has (prepro + train + evaluate, given as
    ``prepro_train_seconds`` with the note saying so); ``macro_f1`` and the grid are None
    (unknown). The encoder's name is the params file's (:func:`resolve_encoder`) with
    `` (older run)``, so that a new run of the same preset merges beside it.

    Raises:
        ValueError: the result is not of that shape.
    """
    name, path = resolve_encoder(result.get("params") or "")
    try:
        from xdpx.config import load_params

        preset = load_params(path, list(result.get("overrides") or []))
        lr, epochs = preset.train.learning_rate, preset.train.max_epoch
        interval = preset.train.eval_interval
    except Exception:  # noqa: BLE001 - the preset has moved on: leave its numbers unknown
        lr = epochs = interval = "?"
    out = []
    for run in result["runs"]:
        x = run["xdpx"]
        if x.get("model") != "hf_classifier" or "peers" in run:
            raise ValueError(f"{run['corpus']} seed {run['seed']}: not an older encoder run")
        out.append(
            {
                "corpus": run["corpus"],
                "seed": run["seed"],
                "encoder": f"{name} (older run)",  # a new run of the preset merges beside it
                "dev_only": False,
                "n": run["n"],
                "params": {"file": path, "overrides": result.get("overrides")},
                "model": x["model"],
                "pair_encoding": "joint" if run["corpus"] == "stsb" else None,
                "dev": x["dev"],
                "test": x["test"],
                "macro_f1": None,
                "chosen": None,
                "grid": None,
                "prepro_train_seconds": x.get("seconds"),
                "grid_seconds": None,
                "seconds": x.get("seconds"),
                "note": LEGACY_NOTE.format(lr=lr, epochs=epochs, eval_interval=interval),
            }
        )
    return out


def _is_legacy_encoder(result: dict[str, Any]) -> bool:
    runs = result.get("runs") or []
    return bool(runs) and all(
        "peers" not in r and r.get("xdpx", {}).get("model") == "hf_classifier" for r in runs
    )


def merge_results(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One result from several :func:`run_suite` results run side by side, on other corpora
    or on other seeds of one corpus (e.g. ``-c 20newsgroups -s 1 -s 3`` and ``-s 2``), or of
    encoders alone (``--encoder-only``, run for hours one corpus at a time): the n-gram runs
    grouped by corpus (in order of first appearance) and by seed, each corpus's summary
    recomputed from all its runs; the encoder runs likewise by corpus, encoder and seed; the
    distilled students (``students``, :func:`student_entry`) by corpus and name. An older
    encoder result (:func:`legacy_encoder_runs`) is converted.

    Raises:
        ValueError: a corpus and seed (or corpus, encoder and seed; or corpus and student)
            appear in two results,
            or ``dev_only`` runs are mixed with runs scored on the test files.
    """
    by_corpus: dict[str, dict[int, dict[str, Any]]] = {}
    by_encoder: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    students: dict[str, dict[str, dict[str, Any]]] = {}
    for result in results:
        if _is_legacy_encoder(result):
            result = {"runs": [], "encoder_runs": legacy_encoder_runs(result)}
        for corpus, named in (result.get("students") or {}).items():
            for name, entry in named.items():
                if name in students.get(corpus, {}):
                    raise ValueError(f"corpus {corpus!r} student {name!r} is in two suite results")  # fmt: skip
                students.setdefault(corpus, {})[name] = entry
        for run in result.get("runs") or []:
            seeds = by_corpus.setdefault(run["corpus"], {})
            if run["seed"] in seeds:
                raise ValueError(f"corpus {run['corpus']!r} seed {run['seed']} is in two suite results")  # fmt: skip
            seeds[run["seed"]] = run
        for run in result.get("encoder_runs") or []:
            keyed = by_encoder.setdefault(run["corpus"], {})
            key = (run["encoder"], run["seed"])
            if key in keyed:
                raise ValueError(
                    f"corpus {run['corpus']!r} encoder {run['encoder']!r} seed {run['seed']} "
                    "is in two suite results"
                )
            keyed[key] = run
    runs = [run for seeds in by_corpus.values() for _, run in sorted(seeds.items())]
    encoder_runs = [
        run
        for keyed in by_encoder.values()
        for _, run in sorted(keyed.items(), key=lambda kv: (kv[0][0], kv[0][1]))
    ]
    if len({bool(run.get("dev_only")) for run in runs + encoder_runs}) > 1:
        raise ValueError("cannot merge --dev-only runs with runs scored on the test files")
    return _result(runs, encoder_runs, students)
