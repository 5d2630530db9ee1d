"""Flow runs with ``runs_root`` (deployments): each run's outputs under its own directory.

The end-to-end check (three deployment runs on a process worker, their run directories,
``LATEST`` and the artifacts) is in tests/test_deploy.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def test_run_overrides_move_every_output_under_the_run_directory():
    from flows.pipeline import run_overrides
    from xdpx.config import load_params

    params = str(ROOT / "params.yaml")
    run = "models/runs/20261126-030000-bright-fox"
    cfg = load_params(params, run_overrides(params, [], run))
    assert cfg.fetch.out_dir == f"{run}/data/raw" and cfg.prepro.data_source == f"{run}/data/raw"
    assert cfg.prepro.data_dir == cfg.train.data_dir == f"{run}/data/prepared"
    assert cfg.train.save_dir == f"{run}/models/default"
    assert cfg.evaluate.checkpoint == f"{run}/models/default/<best>"  # follows train.save_dir
    assert cfg.export.out_dir == f"{run}/models/default/export"
    assert cfg.evaluate.metrics_file == f"{run}/reports/metrics.json"
    assert cfg.predict.data_file == f"{run}/data/raw/test.tsv"
    assert cfg.predict.out_file == f"{run}/reports/predictions.tsv"
    # the user's own absolute paths and URLs stay where they are
    mine = ["prepro.data_source=/data/mine", "train.save_dir=oss://bucket/models/x"]
    cfg = load_params(params, mine + run_overrides(params, mine, run))
    assert cfg.prepro.data_source == "/data/mine" and cfg.train.save_dir == "oss://bucket/models/x"
    assert cfg.fetch.out_dir == f"{run}/data/raw"
