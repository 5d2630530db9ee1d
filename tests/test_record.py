"""studies/record.py: a flow run's directory recorded as a DVC experiment, pushed, and brought
back into a fresh clone, on a real run of the pipeline in a git + DVC copy of the project.

The deployment-level check (a process worker, `push: true` against the local object store)
is in tests/test_deploy.py; this file checks the recording itself and its failure modes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from small_run import SMALL_RUN
from snapshot import files_under

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
SMALL = SMALL_RUN
NAME = "20261126-030000-bright-fox"
RUN = f"models/runs/{NAME}"


def sh(args: list[str], cwd: Path, env: dict, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if ok:
        assert proc.returncode == 0, f"{args}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def make_project(root: Path, env: dict) -> None:
    """A git + DVC copy of the project (code, dvc.yaml, params.yaml), committed."""
    root.mkdir()
    for name in ("xdpx", "stages", "flows", "studies", "plots"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "params.yaml", ".gitignore", ".dvcignore"):
        shutil.copy(ROOT / name, root / name)
    sh(["git", "init", "-q", "-b", "main"], root, env)
    sh([sys.executable, "-m", "dvc", "init", "-q"], root, env)
    shutil.copy(ROOT / ".dvc" / "config", root / ".dvc" / "config")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """(checkout, env, origin, dvc_remote): the project committed and pushed to a bare git
    ``origin``, a local DVC remote as default, and one real run under models/runs/<NAME>
    (the stages run with the flow's run_overrides, as a deployment run writes them)."""
    base = tmp_path_factory.mktemp("record")
    env = {
        **os.environ,
        "PYTHONPATH": str(base / "checkout"),
        "DVC_NO_ANALYTICS": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    root, origin, remote = base / "checkout", base / "origin.git", base / "dvc-remote"
    make_project(root, env)
    dvc = [sys.executable, "-m", "dvc"]
    sh(dvc + ["remote", "add", "-d", "storage", str(remote)], root, env)
    sh(["git", "add", "-A"], root, env)
    sh(["git", "commit", "-qm", "project"], root, env)
    sh(["git", "init", "-q", "--bare", str(origin)], base, env)
    sh(["git", "remote", "add", "origin", str(origin)], root, env)
    sh(["git", "push", "-q", "origin", "main"], root, env)
    code = (
        "import sys; from flows.pipeline import run_overrides; from stages.registry import STAGES; "
        "from xdpx.config import load_params; o = sys.argv[2:]; "
        "cfg = load_params('params.yaml', o + run_overrides('params.yaml', o, sys.argv[1])); "
        "[stage.run(getattr(cfg, name)) for name, stage in STAGES.items()]"
    )
    sh([sys.executable, "-c", code, RUN, *SMALL], root, env)
    return root, env, origin, remote


@pytest.fixture(scope="module")
def recorded(project):
    """record_run of the run, with what the checkout looked like before."""
    from studies.record import record_run

    root, env, _, _ = project
    before = {
        "status": sh(["git", "status", "--porcelain", "--ignored"], root, env).stdout,
        "run": files_under(root / RUN),
        "params": (root / "params.yaml").read_bytes(),
    }
    rec = record_run(RUN, NAME, "params.yaml", SMALL, "models/default/best", root=root)
    return rec, before


def test_the_run_becomes_an_experiment_in_the_standard_layout(project, recorded):
    """`dvc exp show` lists it beside the baseline, in the same columns: its overrides as
    params (paths at their params.yaml values) and its reports/metrics.json as metrics."""
    root, env, _, _ = project
    rec, _ = recorded
    assert rec.name == NAME and len(rec.rev) == 40
    assert rec.checkpoint == "models/default/best" and rec.checkpoint_md5.endswith(".dir")
    shown = json.loads(sh([sys.executable, "-m", "dvc", "exp", "show", "--json"], root, env).stdout)
    [baseline] = [b for b in shown if b["rev"] != "workspace"]
    [exp] = [r for e in baseline["experiments"] for r in e["revs"] if r["name"] == NAME]
    assert exp["rev"] == rec.rev
    params = exp["data"]["params"]["params.yaml"]["data"]
    assert params["fetch"]["limit"] == 600 and params["train"]["max_epoch"] == 1
    assert params["train"]["save_dir"] == "models/default"  # not the run directory
    assert params["fetch"]["out_dir"] == "data/raw"
    metrics = exp["data"]["metrics"]["reports/metrics.json"]["data"]
    want = json.loads((root / RUN / "reports/metrics.json").read_text())
    assert metrics == want and 0.5 < metrics["test"]["accuracy"] <= 1
    assert "models/default/dvclive/metrics.json" in exp["data"]["metrics"]


def test_recording_leaves_the_checkout_and_the_run_as_they_were(project, recorded):
    root, env, _, _ = project
    _, before = recorded
    status = sh(["git", "status", "--porcelain", "--ignored"], root, env).stdout
    assert status.replace("!! .dvc/cache/\n", "") == before["status"]  # the outs are in the cache
    assert (root / "params.yaml").read_bytes() == before["params"]
    assert not (root / "dvc.lock").exists()  # the checkout never ran dvc repro
    assert files_under(root / RUN) == before["run"]
    # the cache shares the run's files (hard links), it does not copy them
    weights = root / RUN / "models/default/best/model.safetensors"
    assert weights.stat().st_nlink >= 2
    [cached] = [p for p in (root / ".dvc/cache").rglob("*") if p.is_file() and p.stat().st_ino == weights.stat().st_ino]  # fmt: skip
    assert cached.read_bytes() == weights.read_bytes()
    worktrees = sh(["git", "worktree", "list", "--porcelain"], root, env).stdout
    assert worktrees.count("worktree ") == 1
    assert not list((root / ".dvc" / "tmp").glob("record-*"))


def test_push_then_a_fresh_clone_gets_the_run_back_byte_for_byte(project, recorded, tmp_path):
    """push_run, then on "another machine": git clone, dvc exp pull, dvc exp apply, dvc pull."""
    from studies.record import push_run

    root, env, origin, remote_dir = project
    rec, _ = recorded
    remote = push_run(NAME, "origin", root=root)
    assert (remote.git_remote, remote.dvc_remote, remote.dvc_url) == ("origin", "storage", str(remote_dir))  # fmt: skip
    md5 = rec.checkpoint_md5
    assert remote.object_url(md5) == f"{remote_dir}/files/md5/{md5[:2]}/{md5[2:]}"
    assert Path(remote.object_url(md5)).is_file()  # the checkpoint's directory listing

    clone = tmp_path / "clone"
    dvc = [sys.executable, "-m", "dvc"]
    sh(["git", "clone", "-q", "-b", "main", str(origin), str(clone)], tmp_path, env)
    assert not (clone / "models").exists()
    sh(dvc + ["exp", "pull", "origin", NAME], clone, env)
    sh(dvc + ["exp", "apply", NAME], clone, env)
    sh(dvc + ["pull"], clone, env)
    run = root / RUN / "models/default"
    for part in ("best", "export"):
        want = files_under(run / part)
        if part == "export":  # the timings of the machine that exported (.dvcignore) stay there
            assert want.pop("latency.json")
        assert files_under(clone / "models/default" / part) == want
    assert (clone / "reports/metrics.json").read_bytes() == (root / RUN / "reports/metrics.json").read_bytes()  # fmt: skip
    status = sh(dvc + ["status"], clone, env).stdout
    assert "up to date" in status, status


def test_failures_name_what_failed(project, recorded, tmp_path):
    from studies.record import RecordError, push_run, record_run, remote_of

    root, env, _, remote_dir = project
    dvc = [sys.executable, "-m", "dvc"]
    with pytest.raises(RecordError, match="already exists|conflicts"):
        record_run(RUN, NAME, "params.yaml", SMALL, "models/default/best", root=root)
    with pytest.raises(RecordError, match="git remote 'upstream' not found"):
        remote_of("upstream", root)
    with pytest.raises(RecordError, match="is not a git repository"):
        record_run(RUN, NAME, "params.yaml", SMALL, "models/default/best", root=tmp_path)
    with pytest.raises(RecordError, match="push: .* is not a git repository"):
        remote_of("origin", tmp_path)
    # the DVC remote's directory is a file now: the push fails naming the remote
    remote_dir.rename(remote_dir.with_suffix(".moved"))
    remote_dir.write_text("a file where the remote's directory should be")
    config = (root / ".dvc" / "config").read_bytes()
    try:
        with pytest.raises(RecordError, match=rf"DVC remote 'storage' \({remote_dir}\)") as e:
            push_run(NAME, "origin", root=root)
        assert "the run is recorded locally" in str(e.value)
        sh(dvc + ["remote", "default", "--unset"], root, env)
        with pytest.raises(RecordError, match="no default DVC remote"):
            remote_of("origin", root)
    finally:
        remote_dir.unlink()
        remote_dir.with_suffix(".moved").rename(remote_dir)
        (root / ".dvc" / "config").write_bytes(config)
