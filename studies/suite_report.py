"""What the suite reports: the summaries over seeds and peers, the markdown table, the
distilled-student rows and merging result files (old encoder rows included)."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from typing import Any

from studies.encoder_rows import (
    _mean_of as _mean_of,
    resolve_encoder,
    summarize_encoder,
)
from xdpx import io
from xdpx.distill.plan import kept_share

#: The peer whose time the table sets beside xdpx's prepro + train (single texts, pairs).
TIME_PEER, TIME_PEER_PAIRS = "svm", "pair"


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


def ensemble_entry(
    ensemble_dir: str,
    vs_best_peer: dict[str, Any] | None = None,
    served: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An ensemble's row of the suite (``ensembles``; the which-model table and plots): an
    ``xdpx ensemble`` directory built on a suite corpus's split.

    Args:
        ensemble_dir: the directory; its ``report.json`` (weights, dev and test metrics, the
            paired comparisons with every member) is read.
        vs_best_peer: the paired comparison on test with the suite's best peer
            (:func:`xdpx.metrics.paired_comparison`: ``diff``, ``se``, ``p``; and ``peer``,
            its name), or None (not compared).
        served: ``{"req_s", "p99_ms"}`` of the ensemble served at 64 clients
            (``bench/serve_students.py``), or None (not served yet).

    Returns:
        ``{"members", "weights", "k", "dev", "test", "macro_f1", "members_test",
        "members_dev", "vs_members", "vs_best_peer", "req_s", "p99_ms", "report",
        "cascade"}``; accuracies are fractions, a comparison ``{"diff", "se", "p"}`` on
        test; ``cascade`` None, or a cascade's ``{"threshold", "max_defer", "deferred"}``
        (the deferred share per split; ``xdpx ensemble --cascade``).
    """
    report = json.loads(io.read_text(io.join(ensemble_dir, "report.json")))
    splits = report["splits"]
    return {
        "members": [m["name"] for m in report["members"]],
        "weights": report["weights"],
        "k": 1,
        "dev": splits["dev"]["accuracy"],
        "test": splits.get("test", {}).get("accuracy"),
        "macro_f1": splits.get("test", {}).get("macro_f1"),
        "members_dev": {m["name"]: m["splits"]["dev"]["accuracy"] for m in report["members"]},
        "members_test": {
            m["name"]: m["splits"].get("test", {}).get("accuracy") for m in report["members"]
        },  # fmt: skip
        "vs_members": {
            m: {k: c[k] for k in ("diff", "se", "p")}
            for m, c in report["paired"].get("test", {}).items()
        },  # fmt: skip
        "vs_best_peer": vs_best_peer,
        "req_s": (served or {}).get("req_s"),
        "p99_ms": (served or {}).get("p99_ms"),
        "report": io.join(ensemble_dir, "report.json"),
        "cascade": {k: report["cascade"][k] for k in ("threshold", "max_defer", "deferred")}
        if report.get("cascade")
        else None,
    }


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
    distilled students (``students``, :func:`student_entry`) and the ensembles (``ensembles``,
    :func:`ensemble_entry`) by corpus and name. An older
    encoder result (:func:`legacy_encoder_runs`) is converted.

    Raises:
        ValueError: a corpus and seed (or corpus, encoder and seed; or corpus and student)
            appear in two results,
            or ``dev_only`` runs are mixed with runs scored on the test files.
    """
    by_corpus: dict[str, dict[int, dict[str, Any]]] = {}
    by_encoder: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
    named_rows: dict[str, dict[str, dict[str, dict[str, Any]]]] = {k: {} for k in NAMED_SECTIONS}
    for result in results:
        if _is_legacy_encoder(result):
            result = {"runs": [], "encoder_runs": legacy_encoder_runs(result)}
        for section, rows in named_rows.items():
            for corpus, named in (result.get(section) or {}).items():
                for name, entry in named.items():
                    if name in rows.get(corpus, {}):
                        raise ValueError(f"corpus {corpus!r} {section[:-1]} {name!r} is in two suite results")  # fmt: skip
                    rows.setdefault(corpus, {})[name] = entry
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
    return _result(runs, encoder_runs, named_rows["students"], named_rows["ensembles"])


#: The per-corpus sections of named rows that :func:`merge_results` carries over:
#: ``{section: {corpus: {name: entry}}}`` (:func:`student_entry`, :func:`ensemble_entry`).
NAMED_SECTIONS = ("students", "ensembles")


def _result(
    runs: list[dict[str, Any]],
    encoder_runs: Sequence[dict[str, Any]] = (),
    students: dict[str, dict[str, dict[str, Any]]] | None = None,
    ensembles: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """:func:`run_suite`'s result from its runs (in corpus, then seed order): the per-corpus
    summaries, the mean over corpora (its SE ``sqrt(sum SE_i^2) / n``: the corpora are
    independent), the table, the encoders' runs and per-corpus means, and the distilled
    students (``{corpus: {name: student_entry(...)}}``) and the ensembles
    (``{corpus: {name: ensemble_entry(...)}}``) when there are any."""
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
    if ensembles:
        out["ensembles"] = ensembles
    return out
