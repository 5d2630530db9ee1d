"""k-fold cross-validation (``xdpx/cv.py``, ``flows/cv.py``, ``xdpx cv``): the folds partition
the train split, stratified; ``xdpx cv`` end to end; the Prefect flow runs folds at once."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from xdpx.config import ConfigError, load_params
from xdpx.cv import (
    HELDOUT,
    check_params,
    check_save_dir,
    fold_assignment,
    fold_paths,
    format_table,
    prepare_folds,
    summarize,
)
from xdpx.data import PreparedMeta, load_split
from xdpx.data.readers import DataError

ROOT = Path(__file__).resolve().parents[1]
PARAMS = str(ROOT / "params.yaml")
#: Small and quick: hashed n-grams in 2^16 buckets, one epoch, one thread.
FAST = [
    "train.max_epoch=1",
    "train.ngram_buckets=65536",
    "train.threads=1",
    "evaluate.batch_size=64",
]


def _params(prepared: str, tmp_path: Path, *more: str):
    return load_params(
        PARAMS,
        [
            f"train.data_dir={prepared}",
            f"cv.save_dir={tmp_path / 'cv'}",
            f"cv.report={tmp_path / 'cv.json'}",
            *FAST,
            *more,
        ],
    )


# ------------------------------------------------------------------ unit
@pytest.mark.unit
def test_assignment_is_stratified_and_seeded():
    labels = np.array([0] * 50 + [1] * 23 + [2] * 7)
    a = fold_assignment(labels, 5, seed=3)
    assert sorted(set(a.tolist())) == [0, 1, 2, 3, 4]
    for c in range(3):
        per_fold = np.bincount(a[labels == c], minlength=5)
        assert np.all(np.abs(per_fold - (labels == c).sum() / 5) < 1), (c, per_fold)
    assert np.array_equal(a, fold_assignment(labels, 5, seed=3))
    assert not np.array_equal(a, fold_assignment(labels, 5, seed=4))


@pytest.mark.unit
def test_too_many_folds_for_the_rarest_class_names_it():
    labels = np.array([0] * 20 + [1] * 3)
    with pytest.raises(DataError, match=r"cv.folds=4 but class 'pos' has only 3 rows.*at most 3"):
        fold_assignment(labels, 4, seed=1, label_names=["neg", "pos"])
    with pytest.raises(DataError, match="rows have no label"):
        fold_assignment(np.array([0, 1, -1, 0]), 2, seed=1)
    with pytest.raises(ValueError, match="folds must be >= 2"):
        fold_assignment(labels, 1, seed=1)


@pytest.mark.unit
def test_config_rejects_bad_folds_and_settings_cv_cannot_honour(tmp_path):
    with pytest.raises(ConfigError, match=r"invalid cv\.folds=1"):
        load_params(PARAMS, ["cv.folds=1"])
    assert load_params(PARAMS, ["cv.folds=3"]).cv.folds == 3
    for override, message in (
        ("train.valid_subset=train", "is the split being folded"),
        ("train.distill_from=teacher.tsv", "distill_from"),
    ):
        with pytest.raises(ConfigError, match=message):
            check_params(load_params(PARAMS, [override]))


@pytest.mark.unit
def test_a_non_empty_save_dir_is_refused_unless_overwrite(tmp_path):
    save = tmp_path / "cv"
    check_save_dir(str(save), overwrite=False)  # missing: fine
    (save / "fold-0").mkdir(parents=True)
    with pytest.raises(FileExistsError, match=r"not empty \(fold-0\).*cv.overwrite=true"):
        check_save_dir(str(save), overwrite=False)
    check_save_dir(str(save), overwrite=True)
    assert not save.exists()


@pytest.mark.unit
def test_summary_is_mean_standard_error_and_t_interval():
    folds = [{"accuracy": 0.8, "loss": 0.5}, {"accuracy": 0.9, "loss": 0.4}, {"accuracy": 0.7}]
    s = summarize(folds)
    assert list(s) == ["accuracy"]  # loss is missing from a fold
    acc = np.array([0.8, 0.9, 0.7])
    t975_df2 = 4.302652729911275  # Student t, 97.5th percentile, 2 degrees of freedom
    se = acc.std(ddof=1) / math.sqrt(3)
    assert s["accuracy"]["mean"] == pytest.approx(acc.mean())
    assert s["accuracy"]["se"] == pytest.approx(se)
    assert s["accuracy"]["ci95"] == pytest.approx([0.8 - t975_df2 * se, 0.8 + t975_df2 * se])
    table = format_table(s)
    assert "0.8000 ± 0.0577" in table and "fold 2" in table
    with pytest.raises(ValueError, match="at least 2 folds"):
        summarize(folds[:1])


# ------------------------------------------------------------------ integration
@pytest.mark.integration
def test_folds_partition_the_train_split_stratified(real_subset, tmp_path):
    _, prepared = real_subset
    params = _params(prepared, tmp_path, "cv.folds=3")
    folds = prepare_folds(params)
    source = load_split(prepared, "train")
    dev = load_split(prepared, "dev")
    src_meta = PreparedMeta.read(prepared)
    all_ids = set(source.ids.tolist())
    assert len(all_ids) == len(source)
    held_ids: list[set[int]] = []
    per_class = np.bincount(source.labels)
    for k, fold in enumerate(folds):
        assert fold.fold == k and fold.data_dir == fold_paths(params.cv.save_dir, k).data
        meta = PreparedMeta.read(fold.data_dir)
        assert set(meta.splits) == {"train", "dev", HELDOUT}  # test is never copied
        assert (meta.labels, meta.vocab_size) == (src_meta.labels, src_meta.vocab_size)
        for name in ("vocab.txt", "target_map.txt"):
            assert (Path(fold.data_dir) / name).read_bytes() == (Path(prepared) / name).read_bytes()
        train, held = load_split(fold.data_dir, "train"), load_split(fold.data_dir, HELDOUT)
        t_ids, h_ids = set(train.ids.tolist()), set(held.ids.tolist())
        assert not t_ids & h_ids and t_ids | h_ids == all_ids
        assert (fold.n_train, fold.n_heldout) == (len(train), len(held))
        assert meta.splits[HELDOUT].label_counts == np.bincount(held.labels).tolist()
        # a held-out row is the prepared row, unchanged
        by_id = {i: n for n, i in enumerate(source.ids.tolist())}
        for row in range(0, len(held), 37):
            src = by_id[int(held.ids[row])]
            assert np.array_equal(held.input_ids[row], source.input_ids[src])
            assert held.labels[row] == source.labels[src]
        # stratified: each class's rows in the fold within 1 of (its rows in train) / K
        counts = np.bincount(held.labels, minlength=len(per_class))
        assert np.all(np.abs(counts - per_class / 3) < 1), (k, counts, per_class)
        fold_dev = load_split(fold.data_dir, "dev")
        assert np.array_equal(fold_dev.ids, dev.ids) and np.array_equal(fold_dev.labels, dev.labels)
        held_ids.append(h_ids)
    assert set().union(*held_ids) == all_ids
    assert sum(len(h) for h in held_ids) == len(all_ids)  # disjoint
    sizes = [len(h) for h in held_ids]
    assert max(sizes) - min(sizes) <= 1
    with pytest.raises(FileExistsError, match="cv.save_dir"):
        prepare_folds(params)  # a second run does not silently mix with the first


# ------------------------------------------------------------------ e2e
def _xdpx(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xdpx.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.e2e
def test_xdpx_cv_end_to_end_reports_fold_metrics_and_their_mean_and_se(real_subset, tmp_path):
    _, prepared = real_subset
    proc = _xdpx("cv", PARAMS, "--folds", "3", f"train.data_dir={prepared}", *FAST, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "reports/cv.json").read_text())  # cv.report's default
    assert report["folds"] == 3 and [f["fold"] for f in report["per_fold"]] == [0, 1, 2]
    for fold in report["per_fold"]:
        paths = fold_paths("models/cv", fold["fold"])
        metrics = json.loads((tmp_path / paths.metrics_file).read_text())
        assert fold["heldout"] == metrics[HELDOUT]
        assert json.loads((tmp_path / paths.result).read_text()) == fold
        assert (tmp_path / paths.model / "best").is_dir()
    assert sum(f["n_heldout"] for f in report["per_fold"]) == len(load_split(prepared, "train"))
    for name in ("accuracy", "macro_f1", "loss"):
        values = np.array([f["heldout"][name] for f in report["per_fold"]])
        s = report["summary"][name]
        assert s["values"] == values.tolist()
        assert s["mean"] == pytest.approx(np.mean(values), abs=1e-12)
        assert s["se"] == pytest.approx(np.std(values, ddof=1) / np.sqrt(3), abs=1e-12)
    for line in ("fold 0: heldout accuracy", "fold 2: heldout accuracy", "mean ± SE", "macro_f1"):
        assert line in proc.stdout, proc.stdout
    again = _xdpx("cv", PARAMS, "--folds", "3", f"train.data_dir={prepared}", cwd=tmp_path)
    assert again.returncode == 2 and "cv.overwrite=true" in again.stderr


@pytest.mark.e2e
def test_xdpx_cv_bad_input_is_one_line_before_any_work(real_subset, tmp_path):
    _, prepared = real_subset
    proc = _xdpx("cv", PARAMS, "--folds", "1000", f"train.data_dir={prepared}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "error: cv.folds=1000 but class" in proc.stderr and "lower cv.folds" in proc.stderr
    proc = _xdpx("cv", "cv.fold=3", cwd=tmp_path)
    assert proc.returncode == 2 and "did you mean 'folds'" in proc.stderr
    assert not (tmp_path / "models").exists()


@pytest.mark.e2e
def test_flow_runs_the_folds_at_the_same_time_and_writes_the_report(
    prefect_server, real_subset, tmp_path, monkeypatch
):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.cv import xdpx_cv

    _, prepared = real_subset
    monkeypatch.chdir(tmp_path)
    overrides = [f"train.data_dir={prepared}", "cv.folds=2", *FAST]
    state = xdpx_cv(params=PARAMS, overrides=overrides, return_state=True)
    assert state.is_completed(), state.message
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])
            )
        )
    by_name = {r.name: r for r in runs}
    assert sorted(by_name) == ["aggregate", "fold 0", "fold 1", "prepare folds"]
    a, b = by_name["fold 0"], by_name["fold 1"]
    assert a.start_time < b.end_time and b.start_time < a.end_time, "the folds did not overlap"
    report = json.loads((tmp_path / "reports/cv.json").read_text())
    assert report == state.result()
    assert [f["fold"] for f in report["per_fold"]] == [0, 1]
    for fold in report["per_fold"]:  # each ran in its own process, logged beside its outputs
        assert (tmp_path / fold_paths("models/cv", fold["fold"]).log).read_text()
    ends = sorted((f["started"], f["ended"]) for f in report["per_fold"])
    assert ends[1][0] < ends[0][1]  # the processes' own clocks agree: they overlapped
