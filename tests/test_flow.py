"""e2e: the Prefect flow runs the same DAG on a subset under a real (test) Prefect server."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e

OVERRIDES = [
    "fetch.limit=600",
    "train.model=textcnn",
    "train.embedding_dim=32",
    "train.num_filters=16",
    "train.max_epoch=2",
    "export.num_samples=64",
]


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    import os

    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect_home"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=90):
        yield


def test_flow_runs_all_stages(prefect_server, tmp_path, monkeypatch):
    from flows.pipeline import STAGES, xdpx_pipeline

    monkeypatch.chdir(tmp_path)  # relative default paths land in tmp_path
    results = xdpx_pipeline(params="params.yaml", overrides=OVERRIDES)
    assert list(results) == list(STAGES)
    assert results["fetch"]["total"] == 600
    for path in (
        "data/raw/train.tsv",
        "data/prepared/meta.json",
        "models/default/best/model.safetensors",
        "models/default/valid.log.tsv",
        "reports/metrics.json",
        "reports/confusion.png",
        "reports/predictions.tsv",
        "models/default/export/model.onnx",
        "models/default/export/report.json",
    ):
        assert (tmp_path / path).exists(), path
    metrics = json.loads((tmp_path / "reports/metrics.json").read_text())
    assert metrics["test"]["accuracy"] == results["evaluate"]["metrics"]["test"]["accuracy"]
    assert results["export"]["parity"]["max_abs_diff"] <= 1e-4


def test_flow_rejects_bad_override_before_running(prefect_server, tmp_path, monkeypatch):
    from flows.pipeline import xdpx_pipeline
    from xdpx.config import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        xdpx_pipeline(params="params.yaml", overrides=["train.lerning_rate=1"])
    assert not (tmp_path / "data").exists()
