"""x-script: finding runs, the sweep table, params diffs and checkpoint cleaning."""

from __future__ import annotations

import json
import logging
import shutil

import pandas as pd
import pytest
import yaml

from stages import train
from xdpx.config import TrainConfig
from xdpx.scripts import (
    aggregate_results,
    clean_checkpoints,
    diff_params,
    find_runs,
    load_run_params,
    write_aggregate,
)

LEARNING_RATES = {"lr_1e-3": 1e-3, "lr_1e-2": 1e-2, "lr_3e-1": 3e-1}


def tiny(prepared: str, save_dir: str, **overrides) -> TrainConfig:
    """A hashed n-gram LR small enough to train 2 epochs of the real subset in about a second."""
    kw = dict(
        data_dir=prepared,
        save_dir=save_dir,
        model="ngram_lr",
        ngram_buckets=1009,
        ngram_orders=[1, 2],
        batch_size=64,
        max_epoch=2,
        log_interval=5,
    )
    return TrainConfig(**{**kw, **overrides})


@pytest.fixture(scope="module")
def sweep(real_subset, tmp_path_factory):
    """Three runs under <root>/sweep that differ only in learning_rate."""
    _, prepared = real_subset
    root = tmp_path_factory.mktemp("scripts")
    results = {
        name: train.run(tiny(prepared, str(root / "sweep" / name), learning_rate=lr))
        for name, lr in LEARNING_RATES.items()
    }
    return root, results


@pytest.mark.integration
def test_find_runs(sweep):
    root, _ = sweep
    expected = [str(root / "sweep" / name) for name in sorted(LEARNING_RATES)]
    assert find_runs(str(root)) == expected
    assert find_runs(str(root / "sweep" / "lr_1e-2")) == [str(root / "sweep" / "lr_1e-2")]
    with pytest.raises(FileNotFoundError, match="nowhere"):
        find_runs(str(root / "nowhere"))


@pytest.mark.integration
def test_aggregate_differing_params_and_order(sweep, tmp_path):
    root, results = sweep
    table = aggregate_results(str(root))
    assert sorted(table["run"]) == sorted(f"sweep/{n}" for n in LEARNING_RATES)
    assert list(table.columns[:4]) == ["run", "best_update", "best_epoch", "best_samples_seen"]
    assert {"valid_accuracy", "valid_loss", "valid_macro_f1"} <= set(table.columns)
    # the only train key that differs (save_dir is the run column already)
    param_columns = [
        c for c in table.columns if c not in ("run",) and not c.startswith(("best_", "valid_"))
    ]
    assert param_columns == ["learning_rate"]
    by_run = table.set_index("run")
    for name, lr in LEARNING_RATES.items():
        row, result = by_run.loc[f"sweep/{name}"], results[name]
        assert row["learning_rate"] == pytest.approx(lr)
        assert row["best_update"] == result.best_update
        assert row["valid_accuracy"] == pytest.approx(result.best_score, abs=1e-6)
        valid = pd.read_csv(root / "sweep" / name / "valid.log.tsv", sep="\t")
        best = valid[valid["update"] == result.best_update].iloc[0]
        assert row["best_samples_seen"] == best["samples_seen"]
        assert row["valid_loss"] == pytest.approx(best["loss"])
    # best accuracy first
    assert table["valid_accuracy"].is_monotonic_decreasing
    assert len(set(table["valid_accuracy"])) > 1  # the order is informative
    # include: every word must occur in the run path
    assert list(aggregate_results(str(root), include=["sweep", "1e-2"])["run"]) == ["sweep/lr_1e-2"]
    assert aggregate_results(str(root), include=["sweep", "nothing"]).empty
    # the TSV holds the same table
    out = tmp_path / "agg.tsv"
    assert write_aggregate(str(root), str(out)) == str(out)
    back = pd.read_csv(out, sep="\t")
    assert list(back.columns) == list(table.columns)
    assert list(back["run"]) == list(table["run"])


def fake_run(path, lr: float, losses: list[float], accuracies: list[float]) -> None:
    """A run directory with only params.yaml and valid.log.tsv (major_metric: loss)."""
    path.mkdir(parents=True)
    train_section = {"major_metric": "loss", "learning_rate": lr, "filter_sizes": [2, int(lr * 10)]}
    (path / "params.yaml").write_text(yaml.safe_dump({"train": train_section}))
    pd.DataFrame(
        {
            "update": [10, 20, 30],
            "epoch": [1, 2, 3],
            "samples_seen": [100, 200, 300],
            "accuracy": accuracies,
            "loss": losses,
        }
    ).to_csv(path / "valid.log.tsv", sep="\t", index=False)


@pytest.mark.unit
def test_aggregate_orders_lower_loss_first_and_stringifies_lists(tmp_path):
    fake_run(tmp_path / "a", 0.1, [0.9, 0.5, 0.7], [0.6, 0.7, 0.9])
    fake_run(tmp_path / "b", 0.2, [0.4, 0.3, 0.35], [0.5, 0.6, 0.65])
    fake_run(tmp_path / "c", 0.3, [0.8, 0.6, 0.45], [0.9, 0.9, 0.9])
    table = aggregate_results(str(tmp_path))
    assert list(table["run"]) == ["b", "c", "a"]  # best losses 0.3 < 0.45 < 0.5
    assert list(table["valid_loss"]) == [0.3, 0.45, 0.5]
    assert list(table["best_update"]) == [20, 30, 20]
    assert list(table["filter_sizes"]) == ["[2, 2]", "[2, 3]", "[2, 1]"]
    assert "major_metric" not in table.columns


@pytest.mark.integration
def test_diff_params_run_vs_starter_and_between_runs(sweep, tmp_path):
    root, _ = sweep
    a, b = root / "sweep" / "lr_1e-3", root / "sweep" / "lr_1e-2"
    assert diff_params(str(a), str(a / "starter.yaml")) == {}
    assert diff_params(str(a / "params.yaml"), str(a / "starter.yaml")) == {}
    assert diff_params(str(a), str(b)) == {
        "learning_rate": (pytest.approx(1e-3), pytest.approx(1e-2)),
        "save_dir": (str(a), str(b)),
    }
    # a flat train section; `3e-1` is a string to YAML 1.1 and lists vs tuples: still equal
    c = root / "sweep" / "lr_3e-1"
    flat = load_run_params(str(c / "starter.yaml"))
    assert flat["learning_rate"] == pytest.approx(0.3)
    text = yaml.safe_dump({k: v for k, v in flat.items() if k != "learning_rate"})
    (tmp_path / "flat.yaml").write_text(text + "learning_rate: 3e-1\nadam_betas: [0.9, 0.999]\n")
    assert load_run_params(str(tmp_path / "flat.yaml"))["learning_rate"] == "3e-1"
    assert diff_params(str(c), str(tmp_path / "flat.yaml")) == {}
    assert diff_params(str(a), str(tmp_path / "flat.yaml")) == {
        "learning_rate": (pytest.approx(1e-3), pytest.approx(0.3)),
        "save_dir": (str(a), str(c)),
    }
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        load_run_params(str(tmp_path / "missing.yaml"))
    (tmp_path / "empty_run").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty_run/params\.yaml not found"):
        diff_params(str(a), str(tmp_path / "empty_run"))


def snapshot(directory) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


@pytest.mark.integration
def test_clean_checkpoints_keeps_best_by_loss_and_last(real_subset, tmp_path, caplog):
    _, prepared = real_subset
    root = tmp_path / "runs"
    run = root / "loss_run"
    result = train.run(
        tiny(
            prepared,
            str(run),
            max_epoch=1,
            eval_interval=3,
            tolerance=10,
            major_metric="loss",
            keep_checkpoints=True,
        )
    )
    assert result.num_updates == 15
    checkpoints = sorted(p.name for p in run.glob("checkpoint-*"))
    assert checkpoints == [f"checkpoint-{u}" for u in (12, 15, 3, 6, 9)]
    # lowest loss at update 6, highest accuracy at update 9, last at 15
    valid = pd.read_csv(run / "valid.log.tsv", sep="\t")
    assert list(valid["update"]) == [3, 6, 9, 12, 15]
    valid["loss"] = [0.70, 0.40, 0.60, 0.65, 0.50]
    valid["accuracy"] = [0.50, 0.60, 0.90, 0.70, 0.80]
    valid.to_csv(run / "valid.log.tsv", sep="\t", index=False)
    assert json.loads((run / "result.json").read_text())["major_metric"] == "loss"
    # debris of interrupted atomic writes
    (run / "last.old-0123abcd").mkdir()
    (run / ".checkpoint-12.tmp-89abcdef").mkdir()
    # a run without valid.log.tsv keeps every checkpoint; a lone last.old-* is a resume fallback
    other = root / "no_valid"
    shutil.copytree(run, other)
    (other / "valid.log.tsv").unlink()
    shutil.rmtree(other / "last")
    shutil.rmtree(other / ".checkpoint-12.tmp-89abcdef")
    kept_dirs = {p.name for p in run.iterdir() if p.is_dir()}
    best_before, last_before = snapshot(run / "best"), snapshot(run / "last")
    other_before = sorted(p.name for p in other.iterdir())

    expected = sorted(
        str(run / n)
        for n in (
            ".checkpoint-12.tmp-89abcdef",
            "checkpoint-12",
            "checkpoint-3",
            "checkpoint-9",
            "last.old-0123abcd",
        )
    )
    with caplog.at_level(logging.WARNING, logger="xdpx.scripts"):
        assert clean_checkpoints(str(root), dry=True) == expected
    assert {p.name for p in run.iterdir() if p.is_dir()} == kept_dirs  # dry removed nothing
    assert any(
        "no_valid" in r.message and "keeping all 5 checkpoints" in r.message for r in caplog.records
    )
    assert any(
        "last.old-0123abcd" in r.message and "only complete copy" in r.message
        for r in caplog.records
    )

    assert clean_checkpoints(str(root)) == expected
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-15", "checkpoint-6"]
    assert not (run / "last.old-0123abcd").exists()
    assert not (run / ".checkpoint-12.tmp-89abcdef").exists()
    assert snapshot(run / "best") == best_before and snapshot(run / "last") == last_before
    assert sorted(p.name for p in other.iterdir()) == other_before
    assert clean_checkpoints(str(root)) == []  # nothing left to clean
