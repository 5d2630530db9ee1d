"""The which-model plots: per suite corpus, test accuracy (± its per-text SE) against served
requests per second (log scale), every model a point and the best peer a line, drawn from
``reports/suite.json`` and the serving reports into ``docs/img/which-model-<corpus>.png`` (the
plotted data kept in the PNG's metadata, :data:`PLOT_DATA_KEY`)."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from studies.serving_reports import (
    SERVE_ENCODER,
    SERVE_LOAD,
    SERVE_LOAD_CORPUS,
    _encoder_serving as _encoder_serving,
    _number as _number,
    _pct as _pct,
    _variants as _variants,
    read_serve_encoder,
    read_serve_load,
)
from xdpx import io

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
    "ensembles": ("C3", "*", "ensemble (weights chosen on dev)"),
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
