"""e2e: prefect.yaml deployed on a real Prefect server on 127.0.0.1 and run by a process worker.

The test copies the project (prefect.yaml, params.yaml, dvc.yaml and the code) into a
temporary git + DVC checkout, whose git remote is a bare repository and whose DVC remote is
the local object store (S3), and deploys from there, so the runs write into that copy and
never into this working tree. Every process it starts (server, worker) is stopped at the
end, also on failure; every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from small_run import SMALL_RUN
from snapshot import files_under, modes_under

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ("prefect.yaml", "params.yaml", "dvc.yaml", ".gitignore", ".dvcignore", "plots", "flows", "studies", "stages", "xdpx")  # fmt: skip
GIT_ENV = {
    "DVC_NO_ANALYTICS": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}
PREFECT = [sys.executable, "-m", "prefect"]
OVERRIDES = SMALL_RUN
RUN_TIMEOUT_S = 480


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], log: Path, env: dict, cwd: Path) -> subprocess.Popen:
    """Start a prefect command in its own process group, output to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            PREFECT + args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group of ``proc`` (started by :func:`_start`), SIGKILL after 20 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def _tail(log: Path, n: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-n:]) if log.exists() else ""


def _prefect(args: list[str], env: dict, cwd: Path, timeout: float = 180) -> str:
    """Run a prefect CLI command; its output, or a test failure showing that output."""
    proc = subprocess.run(
        PREFECT + ["--no-prompt", *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"prefect {' '.join(args)} failed:\n{out}"
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A Prefect server on 127.0.0.1 (free port; its SQLite database in a temporary PREFECT_HOME).

    Yields:
        (api_url, env): the API URL and the environment for prefect child processes.
    """
    home = tmp_path_factory.mktemp("prefect_server")
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.pop("XDPX_HOME", None)  # the pull step's default: the checkout `prefect deploy` ran in
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_API_URL=api_url,
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_WORKER_QUERY_SECONDS="2",
        PYTHONUNBUFFERED="1",
    )
    log = home / "server.log"
    proc = _start(["server", "start", "--host", "127.0.0.1", "--port", str(port)], log, env, home)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"prefect server exited:\n{_tail(log)}"
            try:
                if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (
                f"prefect server not healthy in 120 s:\n{_tail(log)}"
            )
            time.sleep(1)
        yield api_url, env
    finally:
        _stop(proc)


@pytest.fixture()
def client(server):
    """A sync Prefect client of ``server``."""
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: server[0]}):
        with get_client(sync_client=True) as c:
            yield c


def _sh(args: list[str], cwd: Path, env: dict) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{args}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _checkout(dest: Path, bucket) -> Path:
    """A git + DVC checkout of the project files a worker needs (no data, models or reports):
    its DVC remote ``storage`` on the object store's S3 front (endpoint committed, keys from
    the environment, as in the README) and its git remote ``origin`` a bare repository."""
    dest.mkdir()
    for name in PROJECT:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    env = {**os.environ, **GIT_ENV}
    dvc = [sys.executable, "-m", "dvc"]
    _sh(["git", "init", "-q", "-b", "main"], dest, env)
    _sh(dvc + ["init", "-q"], dest, env)
    shutil.copy(ROOT / ".dvc" / "config", dest / ".dvc" / "config")
    _sh(dvc + ["remote", "add", "-d", "storage", f"s3://{bucket.name}/xdpx"], dest, env)
    _sh(dvc + ["remote", "modify", "storage", "endpointurl", bucket.store.s3_endpoint], dest, env)
    _sh(["git", "add", "-A"], dest, env)
    _sh(["git", "commit", "-qm", "project"], dest, env)
    origin = dest.parent / "origin.git"
    _sh(["git", "init", "-q", "--bare", str(origin)], dest.parent, env)
    _sh(["git", "remote", "add", "origin", str(origin)], dest, env)
    _sh(["git", "push", "-q", "origin", "main"], dest, env)
    return dest


def _wait_final(client, flow_run_id: str, worker_log: Path):
    """The flow run once it reaches a final state (bounded by RUN_TIMEOUT_S)."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        run = client.read_flow_run(flow_run_id)
        if run.state is not None and run.state.is_final():
            return run
        assert time.monotonic() < deadline, (
            f"flow run still {run.state_name} after {RUN_TIMEOUT_S} s; worker log:\n{_tail(worker_log)}"
        )
        time.sleep(2)


def _assert_readable_by_all(run_dir: Path) -> None:
    """A run's files have the mode of a plain ``open()`` under the worker's umask (inherited
    from this process; 0644 under 0022), or that mode read-only where ``dvc exp save``
    linked them into its cache (DVC makes them read-only), and its directories that of
    ``mkdir`` (0755)."""
    from xdpx import io

    want_file, want_dir = io.file_mode(), io.dir_mode()
    files, dirs = modes_under(run_dir)
    wrong = {p: oct(m) for p, m in dirs.items() if m != want_dir}
    wrong |= {p: oct(m) for p, m in files.items() if m not in (want_file, want_file & ~0o222)}
    latest = stat.S_IMODE(os.stat(run_dir.parent / "LATEST").st_mode)
    assert not wrong and latest == want_file, (wrong, oct(latest))


def test_deployment_run_on_process_worker(server, client, store_bucket, tmp_path, monkeypatch):
    """prefect.yaml -> `prefect deploy --all` -> worker -> `prefect deployment run` -> Completed,
    twice (the schedule's second night); each run in its own directory, with its artifacts,
    recorded as a DVC experiment; the second pushed, and brought back byte for byte into a
    fresh clone."""
    from flows.pipeline import STAGES
    from xdpx.baselines import baseline_for
    from xdpx.config import load_params

    api_url, env = server
    project = _checkout(tmp_path / "checkout", store_bucket)
    for pool in ("cpu", "gpu"):
        _prefect(["work-pool", "create", pool, "--type", "process"], env, tmp_path)
    _prefect(["deploy", "--all"], env, project)

    # What prefect.yaml declares, read back from the server.
    for name in ("cpu", "gpu"):
        deployment = client.read_deployment_by_name(f"xdpx-pipeline/{name}")
        assert deployment.work_pool_name == name
        assert set(deployment.tags) == {"xdpx", name}
        assert deployment.parameters == {
            "params": "params.yaml",
            "overrides": [],
            "runs_root": "models/runs",
            "baseline": True,
            "record": True,
            "push": False,
            "git_remote": "origin",
            "train_nproc": 1,
        }
        [schedule] = deployment.schedules
        assert (schedule.schedule.cron, schedule.active) == ("0 3 * * *", False)
    # Turning the schedule on, as the README says.
    _prefect(
        ["deployment", "schedule", "resume", "xdpx-pipeline/gpu", str(schedule.id)], env, tmp_path
    )
    [schedule] = client.read_deployment_by_name("xdpx-pipeline/gpu").schedules
    assert schedule.active

    # The pull steps pick $XDPX_HOME when set, else the checkout `prefect deploy` ran in.
    from prefect.deployments.steps.core import run_steps

    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("XDPX_HOME", raising=False)
    asyncio.run(run_steps(deployment.pull_steps))
    assert Path.cwd() == project.resolve()
    monkeypatch.setenv("XDPX_HOME", str(other))
    asyncio.run(run_steps(deployment.pull_steps))
    assert Path.cwd() == other.resolve()
    monkeypatch.chdir(tmp_path)

    worker_log = tmp_path / "worker.log"
    # the worker's environment holds the object store's keys (AWS_*), as a GPU host's would
    worker_env = {**env, **store_bucket.store.env()}
    worker = _start(["worker", "start", "--pool", "cpu"], worker_log, worker_env, tmp_path)
    try:
        run_ids, run_dirs = [], []
        for attempt in range(2):  # the nightly schedule's second night must work too
            args = ["-p", f"overrides={json.dumps(OVERRIDES)}"]
            if attempt == 1:
                args += ["-p", "push=true"]  # the second is pushed, the first not
            out = _prefect(["deployment", "run", "xdpx-pipeline/cpu", *args], env, tmp_path)
            flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)
            run = _wait_final(client, flow_run_id, worker_log)
            assert run.state.is_completed(), f"run {attempt + 1}: {run.state}\nworker log:\n{_tail(worker_log)}"  # fmt: skip
            assert run.parameters["overrides"] == OVERRIDES
            latest = (project / "models/runs/LATEST").read_text().strip()
            assert latest.endswith(f"-{run.name}")  # <UTC date>-<time>-<flow run name>
            run_ids.append(flow_run_id)
            run_dirs.append(project / "models/runs" / latest)

        # two runs, two run directories, each with its own model and metrics
        assert len(set(run_dirs)) == 2
        assert sorted(p.name for p in (project / "models/runs").iterdir()) == sorted([*(d.name for d in run_dirs), "LATEST"])  # fmt: skip
        assert not (project / "models/default").exists() and not (project / "reports").exists()
        for run_dir, flow_run_id in zip(run_dirs, run_ids, strict=True):
            metrics = json.loads((run_dir / "reports/metrics.json").read_text())
            assert 0.5 < metrics["test"]["accuracy"] <= 1.0
            assert (run_dir / "models/default/best/model.safetensors").is_file()
            assert (run_dir / "models/default/export/model.onnx").is_file()
            assert "max_epoch: 1" in (run_dir / "models/default/params.yaml").read_text()
            _assert_readable_by_all(run_dir)
            rows = sum(
                len((run_dir / f"data/raw/{split}.tsv").read_text().splitlines()) - 1
                for split in ("train", "dev", "test")
            )
            assert rows == 600

            task_runs = client.read_task_runs(flow_run_filter=_flow_run_filter(flow_run_id))
            recorded = ["baseline", "dvc exp save", *(["dvc exp push"] if flow_run_id == run_ids[1] else [])]  # fmt: skip
            assert sorted(t.name for t in task_runs) == sorted([*STAGES, *recorded])
            assert all(t.state.is_completed() for t in task_runs)

            # the run's results in the UI, read back through the API
            artifacts = {a.key: a for a in client.read_artifacts(flow_run_filter=_flow_run_filter(flow_run_id))}  # fmt: skip
            table = artifacts["xdpx-cpu-metrics"]
            assert table.type == "table"
            rows_ = {r["split"]: r for r in json.loads(table.data)}
            base = baseline_for(load_params(str(project / "params.yaml"), [f"prepro.data_source={run_dir}/data/raw"]).prepro)  # fmt: skip
            want_base = {"dev": base["dev_accuracy_best"], "test": base["test_accuracy"]}
            for split in ("dev", "test"):
                for key in ("accuracy", "macro_f1", "loss"):
                    assert rows_[split][key] == round(metrics[split][key], 4)
                assert rows_[split]["baseline_accuracy"] == round(want_base[split], 4)
            summary = artifacts["xdpx-cpu-summary"]
            assert summary.type == "markdown" and run_dir.name in summary.data
            assert "`fetch.limit=600`" in summary.data and "| test |" in summary.data
            progress = artifacts["xdpx-cpu-progress"]
            assert progress.type == "progress" and float(progress.data) == 100.0
            assert f"| DVC experiment | `{run_dir.name}`" in summary.data
            assert "| classical baseline | `tfidf char 1-3 + LR`" in summary.data
            assert re.search(r"\| data \| \d+ train, \d+ dev, \d+ test rows \|", summary.data)

        # each run is a DVC experiment in `dvc exp show`, its params and metrics in the
        # workspace's columns
        git_env = {**worker_env, **GIT_ENV}
        dvc = [sys.executable, "-m", "dvc"]
        shown = json.loads(_sh(dvc + ["exp", "show", "--json"], project, git_env))
        exps = {r["name"]: r["data"] for b in shown for e in b.get("experiments") or [] for r in e["revs"]}  # fmt: skip
        assert set(exps) == {d.name for d in run_dirs}
        for run_dir in run_dirs:
            data = exps[run_dir.name]
            params = data["params"]["params.yaml"]["data"]
            assert params["fetch"]["limit"] == 600 and params["train"]["max_epoch"] == 1
            want = json.loads((run_dir / "reports/metrics.json").read_text())
            assert data["metrics"]["reports/metrics.json"]["data"] == want

        # only the second was pushed: its git ref on origin, its checkpoint on the store
        refs = _sh(["git", "ls-remote", "origin", "refs/exps/*"], project, git_env)
        assert refs.count("refs/exps/") == 1 and refs.rstrip().endswith(run_dirs[1].name)
        artifacts = {a.key: a for a in client.read_artifacts(flow_run_filter=_flow_run_filter(run_ids[1]))}  # fmt: skip
        link = artifacts["xdpx-cpu-checkpoint"]
        assert link.type == "markdown"  # a link artifact is markdown [text](url)
        url = re.search(r"\((s3://[^)]+)\)", link.data).group(1)
        key = url.removeprefix(f"s3://{store_bucket.name}/")
        assert key.startswith("xdpx/files/md5/") and key.endswith(".dir")
        assert key in store_bucket.keys("xdpx/")

        # another machine: a fresh clone gets the second run's model back, byte for byte
        clone = tmp_path / "clone"
        _sh(["git", "clone", "-q", "-b", "main", str(tmp_path / "origin.git"), str(clone)], tmp_path, git_env)  # fmt: skip
        _sh(dvc + ["exp", "pull", "origin", run_dirs[1].name], clone, git_env)
        _sh(dvc + ["exp", "apply", run_dirs[1].name], clone, git_env)
        _sh(dvc + ["pull"], clone, git_env)
        for part in ("best", "export"):
            got = files_under(clone / "models/default" / part)
            want = files_under(run_dirs[1] / "models/default" / part)
            if part == "export":  # the timings of the machine that exported stay there
                assert want.pop("latency.json") and "latency.json" not in got
            assert got and got == want

        # The UI: the dashboard and the flow run's page load (as a browser asks for them).
        base = api_url.removesuffix("/api")
        for page in ("/", f"/runs/flow-run/{run_ids[-1]}"):
            response = httpx.get(
                base + page, headers={"Accept": "text/html"}, follow_redirects=True, timeout=10
            )  # "/" redirects to the default UI version, e.g. /v2/
            assert response.status_code == 200, page
            assert "<html" in response.text.lower(), page
        assert "api_url" in httpx.get(base + "/ui-settings", timeout=10).json()
    finally:
        _stop(worker)


def _flow_run_filter(flow_run_id: str):
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    return FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
