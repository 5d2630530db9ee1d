"""Every file and directory the stages write gets the mode a plain ``open()``/``mkdir`` would
under the process umask (0644/0755 under 0022, 0640/0750 under 0027), not 0600/0700: a
serving process or a colleague under another user must be able to read a run.

The deployment run's directories are checked the same way in tests/test_deploy.py."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from small_run import SMALL_RUN
from snapshot import modes_under

from xdpx import io

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def _modes(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    files, dirs = modes_under(root)
    del dirs["."]  # the test's own directory
    return files, dirs


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def test_mode_helpers_follow_the_umask(umask, tmp_path):
    for mask, want_file, want_dir in ((0o022, 0o644, 0o755), (0o027, 0o640, 0o750)):
        umask(mask)
        assert io.umask() == mask
        assert (io.file_mode(), io.dir_mode()) == (want_file, want_dir)
        target = tmp_path / f"f{mask:o}"
        io.write_text(str(target), "x")
        assert stat.S_IMODE(target.stat().st_mode) == want_file
        staged = io.mkdtemp("s-", str(tmp_path))
        assert stat.S_IMODE(os.stat(staged).st_mode) == want_dir
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp file left


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_a_whole_flow_run_directory_is_readable_as_the_umask_says(umask, mask, tmp_path, monkeypatch):  # fmt: skip
    """fetch -> prepro -> train (full checkpoints) -> evaluate -> predict -> export -> LATEST,
    with the paths a deployment run uses (``flows.pipeline.run_overrides``)."""
    from flows.pipeline import _point_latest, run_overrides
    from stages import evaluate, export, fetch, predict, prepro, train
    from xdpx.config import load_params

    umask(mask)
    monkeypatch.chdir(tmp_path)
    run = "models/runs/20261127-030000-calm-owl"
    params = str(ROOT / "params.yaml")
    extra = [*SMALL_RUN, "train.save_full_checkpoint=true", "train.keep_checkpoints=true"]
    cfg = load_params(params, extra + run_overrides(params, extra, run))
    fetch.run(cfg.fetch)
    prepro.run(cfg.prepro)
    train.run(cfg.train)
    evaluate.run(cfg.evaluate)
    predict.run(cfg.predict)
    export.run(cfg.export)
    _point_latest("models/runs", run)

    files, dirs = _modes(tmp_path / "models")
    for want in (
        "runs/LATEST",
        "runs/20261127-030000-calm-owl/data/prepared/meta.json",
        "runs/20261127-030000-calm-owl/models/default/best/model.safetensors",
        "runs/20261127-030000-calm-owl/models/default/last/model.safetensors",
        "runs/20261127-030000-calm-owl/models/default/export/model.onnx",
        "runs/20261127-030000-calm-owl/reports/metrics.json",
    ):
        assert want in files, want
    assert len(files) > 30
    want_file, want_dir = 0o666 & ~mask, 0o777 & ~mask
    wrong = {p: oct(m) for p, m in files.items() if m != want_file}
    wrong |= {p + "/": oct(m) for p, m in dirs.items() if m != want_dir}
    assert not wrong, f"umask {mask:o}: want {want_file:o}/{want_dir:o}, got {wrong}"
