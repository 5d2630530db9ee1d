"""x-viz learning curves: panels, samples-seen axis, epoch lines, best dot, reference runs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from matplotlib.lines import Line2D

from stages import train
from xdpx.config import TrainConfig
from xdpx.viz import learning_curves_figure, plot_learning_curves

pytestmark = pytest.mark.integration

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def runs(real_subset, tmp_path_factory):
    """Two tiny n-gram LR runs on the real subset: batch 32 x 3 epochs and batch 64 x 2 epochs."""
    _, prepared = real_subset
    root = tmp_path_factory.mktemp("curves")
    common = dict(
        data_dir=prepared,
        model="ngram_lr",
        ngram_buckets=1009,
        ngram_orders=[1, 2],
        eval_interval=-1,
    )
    a = train.run(
        TrainConfig(
            save_dir=str(root / "bs32"), batch_size=32, max_epoch=3, log_interval=5, **common
        )
    )
    b = train.run(
        TrainConfig(
            save_dir=str(root / "bs64"), batch_size=64, max_epoch=2, log_interval=3, **common
        )
    )
    return root, a, b


def panels(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes}


def red_lines(ax) -> list[float]:
    """x of the vertical red lines (axvline: constant x data)."""
    xs = []
    for line in ax.lines:
        x = np.asarray(line.get_xdata(), dtype=float)
        if line.get_color() == "red" and len(x) == 2 and x[0] == x[1]:
            xs.append(float(x[0]))
    return sorted(xs)


def green_dots(ax) -> list[tuple[float, float]]:
    return [
        (float(line.get_xdata()[0]), float(line.get_ydata()[0]))
        for line in ax.lines
        if line.get_color() == "green" and line.get_marker() == "o"
    ]


def curve(ax, label: str) -> Line2D:
    (line,) = [line for line in ax.lines if line.get_label() == label]
    return line


def test_panels_axis_epoch_lines_and_best_dot(runs):
    root, a, _ = runs
    run = root / "bs32"
    valid = pd.read_csv(run / "valid.log.tsv", sep="\t")
    result = json.loads((run / "result.json").read_text())
    fig = learning_curves_figure(str(run))
    by_title = panels(fig)
    assert {
        "train loss",
        "train accuracy",
        "valid accuracy",
        "valid loss",
        "valid macro_f1",
    } <= set(by_title)
    assert not any(t.startswith("train lr") or "grad_norm" in t for t in by_title)
    assert all(ax.get_xlabel() == "samples seen" for ax in fig.axes)
    # epoch boundaries at k * samples_per_epoch, up to the last samples seen, in every panel
    assert result["samples_per_epoch"] == a.samples_per_epoch > 0
    expected = [k * a.samples_per_epoch for k in (1, 2, 3)]
    assert a.samples_seen == expected[-1]
    for ax in fig.axes:
        assert red_lines(ax) == expected, ax.get_title()
    # the green dot: the row of best_update, each valid panel at that row's value of its metric
    best = valid[valid["update"] == result["best_update"]].iloc[0]
    assert green_dots(by_title["valid accuracy"]) == [
        (pytest.approx(best["samples_seen"]), pytest.approx(result["best_score"]))
    ]
    assert best["accuracy"] == pytest.approx(result["best_score"], abs=1e-6)
    assert green_dots(by_title["valid loss"]) == [
        (pytest.approx(best["samples_seen"]), pytest.approx(best["loss"]))
    ]
    assert green_dots(by_title["train loss"]) == []
    # curves: x = samples seen of the log rows
    (train_curve,) = [ln for ln in by_title["train loss"].lines if ln.get_color() != "red"]
    train_log = pd.read_csv(run / "train.log.tsv", sep="\t")
    np.testing.assert_array_equal(train_curve.get_xdata(), train_log["samples_seen"])
    np.testing.assert_allclose(train_curve.get_ydata(), train_log["loss"])


def test_fallbacks_without_result_json(runs, tmp_path):
    """No result.json: boundaries from the epoch changes, best by params.yaml major_metric."""
    root, a, _ = runs
    run = tmp_path / "copy"
    shutil.copytree(root / "bs32", run, ignore=shutil.ignore_patterns("best", "last", "dvclive"))
    (run / "result.json").unlink()
    valid = pd.read_csv(run / "valid.log.tsv", sep="\t")
    fig = learning_curves_figure(str(run))
    by_title = panels(fig)
    # the last epoch may be unfinished, so only boundaries a later epoch follows are drawn
    assert red_lines(by_title["valid accuracy"]) == [a.samples_per_epoch, 2 * a.samples_per_epoch]
    best = valid.loc[valid["accuracy"].idxmax()]
    assert green_dots(by_title["valid accuracy"]) == [
        (pytest.approx(best["samples_seen"]), pytest.approx(best["accuracy"]))
    ]


def test_reference_runs_overlay_and_legend(runs):
    root, _, b = runs
    main, ref = root / "bs64", root / "bs32"
    fig = learning_curves_figure(str(main), ref_dirs=[str(ref)])
    by_title = panels(fig)
    for title in ("train loss", "valid accuracy"):
        ax = by_title[title]
        legend = ax.get_legend()
        assert legend is not None, title
        assert {"bs64", "bs32"} <= {t.get_text() for t in legend.get_texts()}
    ref_valid = pd.read_csv(ref / "valid.log.tsv", sep="\t")
    ref_train = pd.read_csv(ref / "train.log.tsv", sep="\t")
    np.testing.assert_array_equal(
        curve(by_title["valid accuracy"], "bs32").get_xdata(), ref_valid["samples_seen"]
    )
    np.testing.assert_allclose(
        curve(by_title["valid accuracy"], "bs32").get_ydata(), ref_valid["accuracy"]
    )
    np.testing.assert_array_equal(
        curve(by_title["train loss"], "bs32").get_xdata(), ref_train["samples_seen"]
    )
    main_train = pd.read_csv(main / "train.log.tsv", sep="\t")
    np.testing.assert_array_equal(
        curve(by_title["train loss"], "bs64").get_xdata(), main_train["samples_seen"]
    )
    # epoch lines and the best dot belong to the main run only (it stops at 2 epochs)
    assert b.samples_seen == 2 * b.samples_per_epoch
    assert red_lines(by_title["train loss"]) == [b.samples_per_epoch, 2 * b.samples_per_epoch]
    assert len(green_dots(by_title["valid accuracy"])) == 1


def test_add_summary_column_gets_its_own_panel(runs, tmp_path):
    root, _, _ = runs
    run = tmp_path / "summary"
    shutil.copytree(root / "bs32", run, ignore=shutil.ignore_patterns("best", "last", "dvclive"))
    train_log = pd.read_csv(run / "train.log.tsv", sep="\t")
    train_log["gate_mean"] = np.linspace(0.1, 0.9, len(train_log))
    train_log.to_csv(run / "train.log.tsv", sep="\t", index=False)
    fig = learning_curves_figure(str(run))
    by_title = panels(fig)
    assert "train gate_mean" in by_title
    (line,) = [ln for ln in by_title["train gate_mean"].lines if ln.get_color() != "red"]
    np.testing.assert_array_equal(line.get_xdata(), train_log["samples_seen"])
    np.testing.assert_allclose(line.get_ydata(), train_log["gate_mean"])
    only = learning_curves_figure(str(run), metrics=["train/gate_mean", "valid/accuracy"])
    assert [ax.get_title() for ax in only.axes] == ["train gate_mean", "valid accuracy"]
    with pytest.raises(ValueError, match="valid/bleu"):
        learning_curves_figure(str(run), metrics=["valid/bleu"])


def test_png_written_and_missing_files_named(runs, tmp_path):
    root, _, _ = runs
    out = tmp_path / "plots" / "curves.png"
    assert plot_learning_curves(str(root / "bs32"), str(out), ref_dirs=[str(root / "bs64")]) == str(
        out
    )
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"not_a_run/train\.log\.tsv not found"):
        learning_curves_figure(str(empty))
    with pytest.raises(FileNotFoundError, match="missing_run"):
        learning_curves_figure(str(root / "bs32"), ref_dirs=[str(tmp_path / "missing_run")])
