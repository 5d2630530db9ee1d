"""e2e: a learning-rate grid through DVC's experiment queue (`dvc exp run --queue`, `dvc queue start`).

Queued experiments run in temporary clones under .dvc/tmp/exps, driven by
detached celery workers (filesystem broker; nothing to install or start). Only
files git tracks travel back with an experiment, so `reports/metrics.json`
(a `cache: false` metric) must not be git-ignored for `dvc exp show` to list
its test accuracy; .gitignore keeps it (and the evaluate plots) visible.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from test_dvc import project, sh  # noqa: F401 - `project` is a fixture (a temp git+DVC copy)

pytestmark = pytest.mark.e2e

#: Each experiment: 600 texts, ngram_lr with a small table, 1 epoch -> seconds per stage.
FAST = [
    "-S",
    "train.model=ngram_lr",
    "-S",
    "train.ngram_buckets=16384",
    "-S",
    "train.max_epoch=1",
    "-S",
    "prepro.max_len=128",
    "-S",
    "export.num_samples=32",
]


def queue_status(root: Path, env: dict) -> str:
    return sh("dvc", "queue", "status", cwd=root, env=env)


def wait_for_queue(root: Path, env: dict, timeout_s: float = 900) -> str:
    """Poll `dvc queue status` until no task is Queued or Running (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = queue_status(root, env)
        tasks = [line for line in status.splitlines() if line[:7].strip() and "Status" not in line]
        busy = [t for t in tasks if " Queued" in t or " Running" in t]
        if tasks and not busy and "Worker status" in status:
            return status
        time.sleep(5)
    raise AssertionError(f"queue not done after {timeout_s} s:\n{queue_status(root, env)}")


def stop_workers(root: Path, env: dict) -> None:
    """Idle workers exit by themselves within ~10 s; make sure none outlives the test."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if "0 active, 0 idle" in queue_status(root, env):
            return
        time.sleep(3)
    subprocess.run(["dvc", "queue", "stop", "--kill"], cwd=root, env=env, timeout=120)


def experiments(shown: list[dict]) -> dict[str, dict]:
    """`dvc exp show --json` -> experiment name -> its data (params, metrics)."""
    out = {}
    for baseline in shown:
        for exp in baseline.get("experiments") or []:
            for rev in exp["revs"]:
                out[rev["name"]] = rev["data"]
    return out


def test_queued_learning_rate_grid_runs_both_and_exp_show_has_their_metrics(project):  # noqa: F811
    root, env = project
    # a grid needs the queue: DVC refuses it in the workspace with a clear message
    proc = subprocess.run(
        ["dvc", "exp", "run", "-S", "train.learning_rate=1e-3,3e-3"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and "can't be used without `--queue`" in proc.stderr + proc.stdout

    out = sh("dvc", "exp", "run", "--queue", "-S", "train.learning_rate=1e-3,3e-3", *FAST, cwd=root, env=env)  # fmt: skip
    assert out.count("Queued experiment") == 2, out
    try:
        sh("dvc", "queue", "start", "-j", "1", cwd=root, env=env)
        status = wait_for_queue(root, env)
    finally:
        stop_workers(root, env)
    tasks = [line for line in status.splitlines() if " Success" in line or " Failed" in line]
    assert len(tasks) == 2 and all(" Success" in t for t in tasks), status

    exps = experiments(json.loads(sh("dvc", "exp", "show", "--json", cwd=root, env=env)))
    assert len(exps) == 2, exps.keys()
    by_lr = {}
    for name, data in exps.items():
        train = data["params"]["params.yaml"]["data"]["train"]
        assert train["max_epoch"] == 1 and train["model"] == "ngram_lr"
        metrics = data["metrics"]["reports/metrics.json"]["data"]
        assert 0.5 < metrics["test"]["accuracy"] <= 1.0, (name, metrics)
        assert "accuracy" in metrics["dev"] and "macro_f1" in metrics["test"]
        by_lr[train["learning_rate"]] = metrics["test"]["accuracy"]
    assert sorted(by_lr) == [0.001, 0.003]
