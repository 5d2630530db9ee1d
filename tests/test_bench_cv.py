"""bench/baseline_cv.py: xdpx vs the best simple peer over several random splits."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import baseline_cv  # noqa: E402
from bench.baseline import read_split  # noqa: E402


def _split(diff: float, base: float = 0.85) -> dict:
    return {"xdpx": {"test": base + diff}, "baseline": {"test": base}, "difference": diff}


@pytest.mark.unit
def test_summarize_gives_the_mean_difference_its_standard_error_and_t_interval():
    s = baseline_cv.summarize([_split(0.01), _split(-0.002), _split(0.004), _split(0.0)])
    assert s["k"] == 4 and s["wins"] == 2 and s["ties"] == 1
    assert s["mean_difference"] == pytest.approx(0.003)
    sd = math.sqrt(((0.007) ** 2 + 0.005**2 + 0.001**2 + 0.003**2) / 3)
    assert s["se"] == pytest.approx(sd / 2)
    t975_df3 = 3.182446305284263  # Student t, 97.5th percentile, 3 degrees of freedom
    assert s["ci95"] == pytest.approx([0.003 - t975_df3 * sd / 2, 0.003 + t975_df3 * sd / 2])
    one = baseline_cv.summarize([_split(0.01)])
    assert one["se"] is None and one["ci95"] is None and one["mean_difference"] == 0.01


@pytest.mark.integration
def test_two_seeds_give_two_splits_scored_by_both_models_inside_the_work_dir(
    tmp_path, monkeypatch, capsys
):
    from xdpx import baselines

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # nothing may be written outside --work-dir (data/, models/, reports/)
    # two fastText grid points instead of 24 (~11 s a split here; the grid: tests/test_suite.py)
    small_grid = {"epoch": (5,), "lr": (0.5,), "wordNgrams": (1,), "subwords": (False, True)}
    monkeypatch.setattr(baselines, "FASTTEXT_GRID", small_grid)
    work, out = tmp_path / "work", tmp_path / "cv.json"
    result = baseline_cv.main(
        [
            "--seeds", "3", "4",
            "--params", str(cwd / "absent.yaml"),  # all defaults
            "--work-dir", str(work),
            "--json", str(out),
            "fetch.limit=600",
            "train.max_epoch=2",
        ]
    )  # fmt: skip
    assert os.listdir(cwd) == []
    assert json.loads(out.read_text()) == result
    texts = {}
    for split in result["splits"]:
        seed_dir = work / f"seed-{split['seed']}"
        metrics = json.loads((seed_dir / "metrics.json").read_text())
        assert split["xdpx"]["test"] == metrics["test"]["accuracy"]
        assert split["difference"] == split["xdpx"]["test"] - split["best"]["test"]
        peers = {k: v for k, v in split["peers"].items() if k != "baseline" and "dev" in v}
        assert split["best"]["dev"] == max(p["dev"] for p in peers.values())
        assert split["best"]["test"] == split["peers"][split["best"]["name"]]["test"]
        test = read_split(str(seed_dir / "raw" / "test.tsv"))
        assert split["n_test"] == len(test) == 60
        assert 0.5 < split["baseline"]["test"] <= 1.0 and 0.5 < split["xdpx"]["test"] <= 1.0
        texts[split["seed"]] = set(test["text"])
    assert texts[3] != texts[4]  # fetch.seed drew a different test set
    summary = result["summary"]
    diffs = [s["difference"] for s in result["splits"]]
    assert summary["mean_difference"] == pytest.approx(sum(diffs) / 2)
    printed = capsys.readouterr().out
    assert "seed 3: xdpx dev" in printed and "2 splits: test accuracy xdpx" in printed
    assert "best peer" in printed


@pytest.mark.unit
def test_an_argument_that_is_not_an_override_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        baseline_cv.main(["train.max_epoch", "--seeds", "1"])
    assert e.value.code == 2
    assert "unrecognized arguments: train.max_epoch" in capsys.readouterr().err
