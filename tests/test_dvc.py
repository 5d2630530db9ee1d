"""e2e: `dvc repro` on a subset, a no-op second repro, metrics, and `dvc exp run -S`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
SMALL = {
    "fetch": {"limit": 600},
    "train": {"model": "textcnn", "embedding_dim": 32, "num_filters": 16, "max_epoch": 2},
    "export": {"num_samples": 64},
}


def sh(*args: str, cwd: Path, env: dict) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (
        f"{' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc.stdout + proc.stderr


def make_project(root: Path, repro: bool = True) -> tuple[Path, dict]:
    """A fresh git+DVC clone-alike of this project in ``root`` with a small params.yaml,
    committed; with ``repro``, ``dvc repro`` has run and its lock and outputs are committed
    too. Returns ``(root, env)``: the environment runs this interpreter's dvc."""
    root.mkdir(parents=True, exist_ok=True)
    for name in ("xdpx", "stages", "plots"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", ".gitignore", ".dvcignore"):
        shutil.copy(ROOT / name, root / name)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for section, values in SMALL.items():
        params[section].update(values)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    sh("git", "init", "-q", cwd=root, env=env)
    sh("dvc", "init", "-q", cwd=root, env=env)
    shutil.copy(ROOT / ".dvc" / "config", root / ".dvc" / "config")
    sh("git", "add", "-A", cwd=root, env=env)
    sh("git", "commit", "-qm", "init", cwd=root, env=env)
    if repro:
        sh("dvc", "repro", cwd=root, env=env)  # each test starts from a committed repro
        sh("git", "add", "-A", cwd=root, env=env)
        sh("git", "commit", "-qm", "first repro", cwd=root, env=env)
    return root, env


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """:func:`make_project` with the committed repro."""
    return make_project(tmp_path_factory.mktemp("project"))


@contextlib.contextmanager
def restored(root: Path, env: dict) -> Iterator[None]:
    """Put the workspace back to the committed repro afterwards (``dvc exp run`` leaves its
    params, lock and outputs there), so the tests run alone and in any order."""
    try:
        yield
    finally:
        sh("git", "checkout", "--", ".", cwd=root, env=env)
        sh("dvc", "checkout", "--force", cwd=root, env=env)


def test_repro_then_noop_then_metrics(project, tmp_path):
    root, env = project
    assert (root / "models/default/export/model.onnx").exists()
    again = sh("dvc", "repro", cwd=root, env=env)
    assert "Data and pipelines are up to date" in again
    status = sh("dvc", "status", cwd=root, env=env)
    assert "up to date" in status
    shown = json.loads(sh("dvc", "metrics", "show", "--json", cwd=root, env=env))
    metrics = json.loads((root / "reports/metrics.json").read_text())
    assert 0 <= metrics["test"]["accuracy"] <= 1 and "macro_f1" in metrics["test"]
    assert _workspace_metrics(shown) == metrics
    out = tmp_path / "plots"  # outside the project: its git status stays clean
    html = sh("dvc", "plots", "show", "-o", str(out), cwd=root, env=env)
    page = (out / "index.html").read_text()
    assert "cdn.jsdelivr" not in page and "vegaEmbed" in page, html


def test_reproducing_from_nothing_leaves_the_committed_lock_unchanged(project):
    """Commit the first repro's dvc.lock and metrics, delete every output and the DVC cache
    (a fresh clone without `dvc pull`), reproduce: the tree is clean, because every out is a
    pure function of code, params and data (wall times, git state and latency live in
    run.json, time.log.tsv and export/latency.json, which are not hashed)."""
    root, env = project
    run = root / "models/default"
    info = json.loads((run / "run.json").read_text())
    assert info["git_commit"] and info["wall_time"] > 0 and "git_dirty_diff" not in json.loads((run / "repro.json").read_text())  # fmt: skip
    assert (run / "time.log.tsv").read_text().startswith("update\tsamples_seen\twall_time\n")
    assert "wall_time" not in (run / "train.log.tsv").read_text()
    assert "onnx" in json.loads((run / "export/latency.json").read_text())
    for name in ("data/raw", "data/prepared", "models", ".dvc/cache"):
        shutil.rmtree(root / name)
    for f in (root / "reports").iterdir():
        f.unlink()
    sh("dvc", "repro", cwd=root, env=env)
    assert sh("git", "status", "--short", cwd=root, env=env) == ""
    assert "up to date" in sh("dvc", "status", cwd=root, env=env)


def test_touching_a_file_of_a_stages_import_closure_makes_it_out_of_date(project):
    """xdpx/train/optim.py runs only in train: editing it makes `dvc status` report train alone
    (through its dep xdpx/train; the downstream reruns only if train's outputs change).
    xdpx/inference.py runs in train, evaluate, predict and export: all four are reported,
    nothing upstream."""
    root, env = project
    for name, stages, dep in (
        ("train/optim.py", {"train"}, "xdpx/train"),
        ("inference.py", {"train", "evaluate", "predict", "export"}, "xdpx/inference.py"),
    ):
        path = root / "xdpx" / name
        original = path.read_text()
        path.write_text(original + "\n# touched\n")
        try:
            status = sh("dvc", "status", cwd=root, env=env)
        finally:
            path.write_text(original)
        reported = {
            line[:-1]
            for line in status.splitlines()
            if line.endswith(":") and not line.startswith((" ", "\t"))
        }
        assert reported == stages, (name, status)
        assert dep in status
    assert "up to date" in sh("dvc", "status", cwd=root, env=env)


def _workspace_metrics(shown: dict) -> dict:
    """``reports/metrics.json`` as ``dvc metrics show --json`` gives it for the workspace
    (its one entry; DVC 3 keys it ``""``)."""
    [workspace] = shown.values()
    return workspace["data"]["reports/metrics.json"]["data"]


def _experiment_rows(shown: list) -> Iterator[dict]:
    """The ``data`` of every experiment row of ``dvc exp show --json`` (DVC 3)."""
    for commit in shown:
        for exp in commit.get("experiments") or []:
            for rev in exp["revs"]:
                yield rev["data"]


def test_exp_run_set_params_lists_metric_and_moving_save_dir_moves_the_downstream(project):
    """`dvc exp run -S train.learning_rate=0.003 -S train.save_dir=models/other` (one run of
    the pipeline for both: each is ~30 s of stage processes here):

    - it reruns train and after, not fetch or prepro, and `dvc exp show` lists that
      experiment with the param and the metrics it wrote;
    - evaluate, predict and export read models/other/best (dvc.lock records its hash as
      their dep) and export writes under it; the dev metrics are those of models/other's
      best validation row.
    """
    import pandas as pd

    root, env = project
    with restored(root, env):
        out = sh("dvc", "exp", "run", "-S", "train.learning_rate=0.003",
                 "-S", "train.save_dir=models/other", cwd=root, env=env)  # fmt: skip
        assert "Running stage 'train'" in out
        assert "Running stage 'fetch'" not in out and "Running stage 'prepro'" not in out
        written = json.loads((root / "reports/metrics.json").read_text())
        shown = json.loads(sh("dvc", "exp", "show", "--json", cwd=root, env=env))
        lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
        assert (root / "models/other/export/model.onnx").exists()
        valid = pd.read_csv(root / "models/other/valid.log.tsv", sep="\t")
    row = next(
        d
        for d in _experiment_rows(shown)
        if d["params"]["params.yaml"]["data"]["train"]["learning_rate"] == 0.003
    )
    assert row["params"]["params.yaml"]["data"]["train"]["save_dir"] == "models/other"
    assert row["metrics"]["reports/metrics.json"]["data"] == written
    assert 0 <= written["test"]["accuracy"] <= 1
    best = next(o for o in lock["train"]["outs"] if o["path"] == "models/other/best")
    for stage in ("evaluate", "predict", "export"):
        dep = next(d for d in lock[stage]["deps"] if d["path"] == "models/other/best")
        assert dep["md5"] == best["md5"], stage
    assert written["dev"]["accuracy"] == pytest.approx(valid["accuracy"].max(), abs=1e-6)
