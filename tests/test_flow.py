"""e2e: the Prefect flow runs the same DAG on a subset under a real (test) Prefect server."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from small_run import SMALL_RUN

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]

OVERRIDES = [
    "fetch.limit=600",
    "train.model=textcnn",
    "train.embedding_dim=32",
    "train.num_filters=16",
    "train.max_epoch=2",
    "export.num_samples=64",
]


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
    _check_outputs_agree(tmp_path)


def _check_outputs_agree(root, run: str = "models/default", reports: str = "reports") -> None:
    """Independent checks of the flow's outputs: evaluate's test accuracy equals the
    accuracy of predict's file (another stage, the same test texts), and the exported ONNX
    graph on onnxruntime gives predict's probabilities (the eager model) for its texts."""
    import numpy as np
    import pandas as pd

    from xdpx.serving.server import ServedModel

    metrics = json.loads((root / reports / "metrics.json").read_text())
    pred = pd.read_csv(root / reports / "predictions.tsv", sep="\t", keep_default_na=False)
    assert metrics["test"]["accuracy"] == pytest.approx((pred["label"] == pred["pred_label"]).mean())  # fmt: skip
    onnx = ServedModel(str(root / run), "onnx")
    head = pred.head(64)
    probs = onnx.probs(onnx.encode(head["text"].tolist()))
    expected = head[[f"prob_{label}" for label in onnx.labels]].to_numpy()
    assert np.abs(probs - expected).max() < 1e-5  # predictions.tsv keeps 6 decimals


def test_flow_trains_with_two_processes_and_runs_the_other_stages_once(prefect_server, tmp_path, monkeypatch):  # fmt: skip
    """train_nproc=2: train under torchrun (2 gloo processes), the rest in the flow; the
    default model (ngram_lr: sparse gradients, xdpx.train.ddp)."""
    from flows.pipeline import STAGES, xdpx_pipeline

    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "params.yaml", tmp_path)  # as shipped (without it: the config's defaults)
    default_model = [o for o in OVERRIDES if not o.startswith(("train.model", "train.embedding_dim", "train.num_filters"))]  # fmt: skip
    results = xdpx_pipeline(params="params.yaml", overrides=[*default_model, "train.threads=1"], train_nproc=2)  # fmt: skip
    assert list(results) == list(STAGES)
    run = tmp_path / "models/default"
    assert json.loads((run / "repro.json").read_text())["world_size"] == 2
    resolved = (run / "params.yaml").read_text()
    assert "optimizer: lazy_adamw" in resolved, resolved
    assert results["train"]["num_updates"] == json.loads((run / "result.json").read_text())["num_updates"] > 0  # fmt: skip
    _check_outputs_agree(tmp_path)


def test_flow_rejects_bad_override_before_running(prefect_server, tmp_path, monkeypatch):
    from flows.pipeline import xdpx_pipeline
    from xdpx.config import ConfigError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        xdpx_pipeline(params="params.yaml", overrides=["train.lerning_rate=1"])
    assert not (tmp_path / "data").exists()


SMALL = SMALL_RUN


def _task_runs(flow_state) -> dict:
    """Task runs of the flow run behind ``flow_state``, by name, read back from the API."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[flow_state.state_details.flow_run_id])
            )
        )
    return {run.name: run for run in runs}


def test_remote_io_error_is_retried(prefect_server, tmp_path, monkeypatch):
    """train fails once with RemoteIOError after writing its run dir; the retry replaces it."""
    import stages.train
    from flows.pipeline import STAGES, xdpx_pipeline
    from xdpx.errors import RemoteIOError

    real_run, calls = stages.train.run, []

    def train_upload_fails_once(cfg):
        calls.append(cfg)
        result = real_run(cfg)
        if len(calls) == 1:
            raise RemoteIOError("put oss://bucket/models/default/best: connection reset")
        return result

    monkeypatch.setattr(stages.train, "run", train_upload_fails_once)
    monkeypatch.chdir(tmp_path)
    state = xdpx_pipeline(
        params="params.yaml", overrides=SMALL, io_retry_delays=(0, 0), return_state=True
    )
    assert state.is_completed(), state.message
    assert len(calls) == 2
    assert (calls[0].overwrite, calls[1].overwrite) == (False, True)  # replaces its own partial run
    runs = _task_runs(state)
    assert sorted(runs) == sorted(STAGES)
    assert runs["train"].run_count == 2 and runs["train"].state.is_completed()
    assert runs["fetch"].run_count == 1
    assert (tmp_path / "models/default/best/model.safetensors").exists()
    assert json.loads((tmp_path / "reports/metrics.json").read_text())["test"]["accuracy"] > 0


def test_remote_io_error_fails_after_retries_naming_stage(prefect_server, tmp_path, monkeypatch):
    import stages.fetch
    from flows.pipeline import StageError, xdpx_pipeline
    from xdpx.errors import RemoteIOError

    calls = []

    def store_down(cfg):
        calls.append(cfg)
        raise RemoteIOError("put oss://bucket/raw/train.tsv: 503 Service Unavailable\n(details)")

    monkeypatch.setattr(stages.fetch, "run", store_down)
    monkeypatch.chdir(tmp_path)
    state = xdpx_pipeline(
        params="params.yaml", overrides=SMALL, io_retry_delays=(0, 0), return_state=True
    )
    assert state.is_failed() and len(calls) == 3  # first attempt + one retry per delay
    expected = "stage 'fetch' failed: RemoteIOError: put oss://bucket/raw/train.tsv: 503 Service Unavailable"
    fetch = _task_runs(state)["fetch"]
    assert fetch.run_count == 3 and fetch.state.is_failed()
    assert fetch.state.message.endswith(expected)  # what the UI shows: one line, stage + error
    assert expected in state.message
    with pytest.raises(StageError, match="stage 'fetch' failed: RemoteIOError"):
        state.result()


def test_bad_input_is_not_retried_and_names_stage(prefect_server, tmp_path, monkeypatch):
    from flows.pipeline import StageError, xdpx_pipeline

    monkeypatch.chdir(tmp_path)
    state = xdpx_pipeline(
        params="params.yaml",
        overrides=["fetch.limit=200", "prepro.data_source=no/such/dir"],
        io_retry_delays=(0, 0),
        return_state=True,
    )
    assert state.is_failed()
    runs = _task_runs(state)
    assert runs["fetch"].state.is_completed()
    assert runs["prepro"].run_count == 1  # bad input: never retried
    assert runs["prepro"].state.message.endswith(
        "stage 'prepro' failed: FileNotFoundError: prepro.data_source: no/such/dir not found"
    )
    assert "train" not in runs and not (tmp_path / "data/prepared").exists()
    with pytest.raises(StageError) as info:
        state.result()
    assert (info.value.stage, info.value.retryable) == ("prepro", False)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_flow_on_a_local_dask_cluster_prepares_raw_shards_and_trains_lazily(
    prefect_server, real_subset, tmp_path, monkeypatch
):
    """Acceptance (issue 22): prepro mapped over 3 raw train files as task runs on a
    2-worker Dask cluster, then lazy-loaded training on the multi-shard data."""
    import os

    from distributed import Client, LocalCluster, get_task_stream
    from test_scale import _shards, _split_raw

    from flows.pipeline import with_dask
    from stages import prepro
    from xdpx.config import PreproConfig
    from xdpx.data import PreparedMeta

    raw, _ = real_subset
    shards = _split_raw(raw, tmp_path / "shards")
    (shards / "test.tsv").write_bytes(open(os.path.join(raw, "test.tsv"), "rb").read())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DASK_LOGGING__DISTRIBUTED", "warning")
    overrides = [
        *SMALL,
        f"prepro.data_source={shards}",
        "prepro.data_files={train: train-*.tsv, dev: dev.tsv, test: test.tsv}",
        "prepro.shard_size=200",
        "train.lazy_load=true",
    ]
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster,
        Client(cluster) as client,
        get_task_stream(client) as stream,
    ):
        state = with_dask(cluster.scheduler_address)(
            params="params.yaml", overrides=overrides, prepro_tasks=True, return_state=True
        )
    workers = {t["worker"] for t in stream.data}
    assert state.is_completed(), state.message
    runs = _task_runs(state)
    files = [n for n in runs if n.startswith("prepro ")]
    assert sorted(files) == sorted(
        [f"prepro tokenize train-0000{k}.tsv" for k in range(3)]
        + [f"prepro remap train-0000{k}.tsv" for k in range(3)]
        + ["prepro encode dev dev.tsv", "prepro encode test test.tsv"]
    )
    assert all(runs[n].state.is_completed() for n in files)
    assert len(workers) == 2, f"the task runs ran on {workers}, not on both Dask workers"
    meta = PreparedMeta.read("data/prepared")
    assert len(meta.splits["train"].source) == 3 and meta.splits["train"].shards >= 6
    local = PreproConfig(
        data_source=str(shards),
        data_files={"train": "train-*.tsv", "dev": "dev.tsv", "test": "test.tsv"},
        data_dir=str(tmp_path / "local"),
        max_len=64,
        shard_size=200,
    )
    prepro.run(local)  # the same files in this process: the same shards, byte for byte
    assert _shards(tmp_path / "local") == _shards(tmp_path / "data/prepared")
    result = state.result()
    assert result["train"]["samples_seen"] > 0
    assert (tmp_path / "models/default/best/model.safetensors").exists()


def test_flow_pretrains_with_mlm_then_fine_tunes_the_adapted_model(
    prefect_server, tmp_path, monkeypatch
):
    """``pretrain=params/pretrain-minilm.yaml``: a ``pretrain`` task (task=mlm on the flow's
    prepared data) runs before ``train``, which fine-tunes its ``pretrained/`` directory."""
    from pathlib import Path

    from flows.pipeline import xdpx_pipeline

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    common = ["train.max_update=2", "train.batch_size=8", "train.threads=1"]
    small = ["fetch.limit=300", "prepro.max_len=32", "export.num_samples=8", "export.latency_runs=2"]  # fmt: skip
    results = xdpx_pipeline(
        params=str(repo / "params/bert-minilm.yaml"),
        overrides=[*small, *common],
        pretrain=str(repo / "params/pretrain-minilm.yaml"),
        pretrain_overrides=["train.save_dir=models/mlm", *common],
    )
    assert list(results)[:4] == ["fetch", "prepro", "pretrain", "train"]
    assert results["pretrain"]["num_updates"] == 2
    assert set(results["pretrain"]["best_valid"]) == {"loss", "perplexity", "accuracy"}
    params = (tmp_path / "models/minilm/params.yaml").read_text()
    assert "pretrained_model: models/mlm/pretrained" in params
    assert (tmp_path / "models/mlm/pretrained/tokenizer.json").exists()
    _check_outputs_agree(tmp_path, "models/minilm", "reports/minilm")


def test_flow_rejects_a_pretrain_config_that_is_not_mlm_before_running(
    prefect_server, tmp_path, monkeypatch
):
    from pathlib import Path

    from flows.pipeline import xdpx_pipeline
    from xdpx.config import ConfigError

    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="train.task is 'classification', expected mlm"):
        xdpx_pipeline(params="params.yaml", pretrain=str(repo / "params.yaml"))
    assert not (tmp_path / "data").exists()
