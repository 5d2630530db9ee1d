"""e2e: a learning-rate grid through DVC's experiment queue (`dvc exp run --queue`, `dvc queue start`).

Queued experiments run in temporary clones under .dvc/tmp/exps, driven by
detached celery workers (filesystem broker; nothing to install or start). Only
files git tracks travel back with an experiment, so `reports/metrics.json`
(a `cache: false` metric) must not be git-ignored for `dvc exp show` to list
its test accuracy; .gitignore keeps it (and the evaluate plots) visible.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import warnings
from pathlib import Path

import pytest
from test_dvc import make_project, sh

pytestmark = pytest.mark.e2e

#: Each experiment: 600 texts, ngram_lr with a small table, 1 epoch -> seconds per stage.
FAST = [
    "-S",
    "train.model=ngram_lr",
    "-S",  # textcnn's keys back at their defaults: ngram_lr refuses keys it never reads
    "train.embedding_dim=128",
    "-S",
    "train.num_filters=128",
    "-S",
    "train.ngram_buckets=16384",
    "-S",
    "train.max_epoch=1",
    "-S",
    "prepro.max_len=128",
]
#: What each queued experiment reproduces: the pipeline up to the stage that writes the
#: metrics `dvc exp show` lists (predict and export, two stage processes more in each clone,
#: are tests/test_dvc.py's and tests/test_deploy.py's).
TARGET = "evaluate"


#: Where DVC's celery queue keeps its worker logs (`<name>.out`) and pid files, under the repo.
CELERY_DIR = Path(".dvc", "tmp", "exps", "celery")


#: What `dvc queue status` printed once in CI (exit 255) while a task was moving from
#: Running to Success: a json.JSONDecodeError on a task file read while the worker was
#: writing it. Polling again is what a user would do.
PARTIAL_READ = "unexpected error - Expecting value"


def queue_status(root: Path, env: dict, tries: int = 5) -> str:
    """`dvc queue status`'s output; a read that caught a task file half-written
    (``PARTIAL_READ``) is asked again, up to ``tries`` times one second apart.

    Raises:
        AssertionError: the command failed otherwise, or every try was a partial read.
    """
    for attempt in range(tries):
        proc = subprocess.run(
            ["dvc", "queue", "status"], cwd=root, env=env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        if proc.returncode == 0:
            return proc.stdout + proc.stderr
        if PARTIAL_READ not in proc.stdout + proc.stderr or attempt == tries - 1:
            break
        time.sleep(1)
    raise AssertionError(f"dvc queue status failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def start_worker(root: Path, env: dict) -> None:
    """`dvc queue start -j 1`, returning at once.

    DVC's worker is a forked daemon that keeps the caller's stdout/stderr open until
    the worker exits; with captured pipes, `subprocess.run` would block until the whole
    queue is done, outside any bound of ours. Its output goes to a file instead.
    """
    with open(root / "queue-start.log", "ab") as log:
        proc = subprocess.run(
            ["dvc", "queue", "start", "-j", "1"],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=120,
        )
    assert proc.returncode == 0, (root / "queue-start.log").read_text()


def diagnostics(root: Path, env: dict) -> str:
    """What to read when the queue misbehaves: status, each running task's console
    output, the celery workers' logs and the process tree (DVC, celery, stages)."""
    status = subprocess.run(
        ["dvc", "queue", "status"], cwd=root, env=env, capture_output=True, text=True, timeout=120
    ).stdout
    parts = [f"--- dvc queue status\n{status}"]
    for line in status.splitlines():
        if " Running" in line:
            task = line.split()[0]
            logs = subprocess.run(
                ["dvc", "queue", "logs", task],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            parts.append(f"--- dvc queue logs {task}\n{(logs.stdout + logs.stderr)[-3000:]}")
    for log in sorted((root / CELERY_DIR).glob("*.out")):
        parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-4000:]}")
    ps = subprocess.run(
        ["ps", "-eo", "pid,ppid,etimes,pcpu,stat,args", "--forest"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    keep = ("dvc", "celery", "stages.", "PID")
    parts.append(
        "--- processes\n" + "\n".join(ln for ln in ps.splitlines() if any(k in ln for k in keep))
    )
    return "\n".join(parts)


def restart_worker(root: Path, env: dict) -> None:
    """End worker 1 if its process is still alive (SIGTERM, then SIGKILL), then start one."""
    pid_file = root / CELERY_DIR / "dvc-exp-worker-1.pid"
    if pid_file.exists():
        pid = int(pid_file.read_text())
        for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.5)
    start_worker(root, env)


def wait_for_queue(
    root: Path, env: dict, expected: int, timeout_s: float = 540, stall_s: float = 45
) -> str:
    """Poll `dvc queue status` until ``expected`` tasks have ended (Success or Failed) and
    none is Queued or Running (bounded). Counting the ended ones matters: between leaving
    the queue and showing as Running a task can be missing from the listing altogether
    (seen once in CI: the status had one Success line and nothing else, a moment later
    two Success lines).

    DVC 3.x's worker sometimes stops taking tasks with some still Queued: it exits
    (DVC issue #10562) or stays alive and idle (#8165, #10398); users recover with
    another `dvc queue start`. When tasks are Queued and none is Running for `stall_s`
    seconds, a live worker is ended and a new one started (at most twice), with a warning.

    Raises:
        AssertionError: the queue is not done after `timeout_s` seconds; the message
            has the `diagnostics`.
    """
    deadline = time.monotonic() + timeout_s
    idle_since, restarts = None, 0
    while time.monotonic() < deadline:
        status = queue_status(root, env)
        tasks = [line for line in status.splitlines() if line[:7].strip() and "Status" not in line]
        queued = [t for t in tasks if " Queued" in t]
        running = [t for t in tasks if " Running" in t]
        ended = [t for t in tasks if " Success" in t or " Failed" in t]
        if len(ended) >= expected and not queued and not running and "Worker status" in status:
            return status
        if queued and not running:
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since > stall_s and restarts < 2:
                warnings.warn(
                    f"DVC queue stalled with {len(queued)} task(s) Queued: restarting the worker"
                    f"\n{diagnostics(root, env)}",
                    stacklevel=2,
                )
                restart_worker(root, env)
                idle_since, restarts = None, restarts + 1
        else:
            idle_since = None
        time.sleep(5)  # each `dvc queue status` costs ~1 s of CPU that the experiments need
    raise AssertionError(
        f"queue not done after {timeout_s} s ({restarts} worker restarts):\n"
        f"{diagnostics(root, env)}"
    )


def stop_workers(root: Path, env: dict) -> None:
    """`dvc queue stop`: idle workers shut down at once (they would exit by themselves after
    ~10 s); make sure none outlives the test (bounded, then `--kill`)."""
    subprocess.run(["dvc", "queue", "stop"], cwd=root, env=env, capture_output=True, timeout=120)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if "0 active, 0 idle" in queue_status(root, env):
            return
        time.sleep(1)
    subprocess.run(["dvc", "queue", "stop", "--kill"], cwd=root, env=env, timeout=120)


@pytest.fixture()
def project(tmp_path):
    """A git+DVC copy of the project without a baseline repro: each queued experiment runs
    the pipeline up to :data:`TARGET` in its own clone, and `dvc exp show` lists only what
    they made."""
    return make_project(tmp_path / "project", repro=False)


def experiments(shown: list[dict]) -> dict[str, dict]:
    """`dvc exp show --json` -> experiment name -> its data (params, metrics)."""
    out = {}
    for baseline in shown:
        for exp in baseline.get("experiments") or []:
            for rev in exp["revs"]:
                out[rev["name"]] = rev["data"]
    return out


def test_queued_learning_rate_grid_runs_both_and_exp_show_has_their_metrics(project):
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

    out = sh("dvc", "exp", "run", "--queue", "-S", "train.learning_rate=1e-3,3e-3", *FAST, TARGET, cwd=root, env=env)  # fmt: skip
    assert out.count("Queued experiment") == 2, out
    try:
        start_worker(root, env)
        status = wait_for_queue(root, env, expected=2)
    finally:
        stop_workers(root, env)
    tasks = [line for line in status.splitlines() if " Success" in line or " Failed" in line]
    assert len(tasks) == 2 and all(" Success" in t for t in tasks), diagnostics(root, env)

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
