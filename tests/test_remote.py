"""Remote paths (``oss://``, ``s3://``) through xdpx.io: retries, credentials, atomicity, the stages.

The store is real and local: tests/objstore.py's LocalObjectStore (moto's S3 server on
127.0.0.1 plus an OSS-compatible front, with injected faults and outages). Every test sets
fast retry settings (``XDPX_IO_*``) so an outage fails in seconds.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from snapshot import files_under

from stages import evaluate, export, predict, prepro, train
from xdpx import io
from xdpx.checkpoint import CheckpointError, resolve_checkpoint
from xdpx.config import EvaluateConfig, ExportConfig, PredictConfig, PreproConfig, TrainConfig
from xdpx.data import load_split
from xdpx.errors import RemoteIOError

ROOT = Path(__file__).resolve().parents[1]
#: The secret every remote test runs with; no file or log line may contain it.
SECRET = "xdpx-test-SECRET-4f9c2b7d1e"
FAST_RETRIES = {
    "XDPX_IO_RETRIES": "8",
    "XDPX_IO_BACKOFF": "0.01",
    "XDPX_IO_BACKOFF_MAX": "0.1",
    "XDPX_IO_DEADLINE": "30",
    "XDPX_IO_TIMEOUT": "10",
}
#: Train settings of every chain: ngram_lr with a small table, two epochs, a full last/.
TRAIN = {"ngram_buckets": 65536, "max_epoch": 2, "save_full_checkpoint": True, "seed": 3}


def assert_no_secret(paths: list[Path], *texts: str, secrets: tuple[str, ...] = ()) -> int:
    """Fail if a secret (SECRET, ``secrets``, the store's marker) is in any file under ``paths``
    or in ``texts``; returns the number of files checked."""
    from objstore import SECRET_MARKER

    needles = (SECRET, SECRET_MARKER, *secrets)
    checked = 0
    for root in paths:
        for p in [root] if root.is_file() else root.rglob("*"):
            if p.is_file():
                data = p.read_bytes()
                assert not [n for n in needles if n.encode() in data], f"secret written to {p}"
                checked += 1
    for text in texts:
        assert not [n for n in needles if n in text], "secret in the logs or output"
    return checked


# ---------------------------------------------------------------- retry policy and classification
def _client_error(status: int, code: str):
    from botocore.exceptions import ClientError

    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


def _oss_error(status: int, code: str):
    import oss2.exceptions

    return oss2.exceptions.ServerError(status, {}, b"", {"Code": code})


def _wrapped(cause: BaseException, outer: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    "make, transient",
    [
        (lambda: _client_error(503, "SlowDown"), True),
        (lambda: _client_error(500, "InternalError"), True),
        (lambda: _client_error(429, "TooManyRequests"), True),
        (lambda: _client_error(400, "Throttling"), True),
        (lambda: _client_error(403, "AccessDenied"), False),
        (lambda: _client_error(404, "NoSuchKey"), False),
        (lambda: _oss_error(503, "ServerBusy"), True),
        (lambda: _oss_error(403, "SignatureDoesNotMatch"), False),
        (lambda: __import__("oss2").exceptions.RequestError(ConnectionResetError("reset")), True),
        (lambda: ConnectionResetError(errno.ECONNRESET, "reset by peer"), True),
        (lambda: ConnectionRefusedError(errno.ECONNREFUSED, "refused"), True),
        (lambda: TimeoutError("read timed out"), True),
        (
            lambda: __import__("botocore.exceptions").exceptions.EndpointConnectionError(
                endpoint_url="http://x"
            ),
            True,
        ),
        # s3fs/ossfs translate store errors to OSError(EIO) and keep the original as the cause
        (lambda: _wrapped(_client_error(502, "BadGateway"), OSError(errno.EIO, "wrapped")), True),
        (
            lambda: _wrapped(_oss_error(400, "InvalidArgument"), OSError(errno.EIO, "wrapped")),
            False,
        ),
        (lambda: _wrapped(_client_error(500, "InternalError"), FileNotFoundError("gone")), False),
        (lambda: ValueError("bad"), False),
    ],
)
@pytest.mark.unit
def test_transient_errors_are_told_from_permanent_ones(make, transient):
    assert io.is_transient(make()) is transient


@pytest.mark.unit
def test_retry_recovers_then_gives_up_naming_stage_operation_and_url():
    policy = io.RetryPolicy(retries=3, backoff=0.001, backoff_max=0.002, deadline=30)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError(errno.ECONNRESET, "reset by peer")
        return "ok"

    assert io.retry("read", "s3://b/k", flaky, policy) == "ok" and len(calls) == 3

    calls.clear()
    with pytest.raises(FileNotFoundError):  # permanent: one attempt, the error unchanged
        io.retry("read", "s3://b/k", lambda: calls.append(1) or open("/nonexistent/x"), policy)
    assert len(calls) == 1

    calls.clear()

    def down():
        calls.append(1)
        raise _wrapped(_client_error(503, "SlowDown"), OSError(errno.EBUSY, f"slow down {SECRET}"))

    with io.stage("predict"), pytest.raises(RemoteIOError) as err:
        io.retry("write", "s3://b/out.tsv", down, policy)
    assert len(calls) == 4  # the first attempt + 3 retries
    message = str(err.value)
    assert message.startswith("predict: write s3://b/out.tsv failed after 4 attempts")
    assert (err.value.url, err.value.operation, err.value.stage) == (
        "s3://b/out.tsv",
        "write",
        "predict",
    )
    # a credential value seen in the environment is masked in the message
    os.environ["OSS_ACCESS_KEY_SECRET"] = SECRET
    try:
        with pytest.raises(RemoteIOError) as err:
            io.retry("write", "s3://b/out.tsv", down, policy)
    finally:
        del os.environ["OSS_ACCESS_KEY_SECRET"]
    assert SECRET not in str(err.value) and "***" in str(err.value)


@pytest.mark.unit
def test_retry_policy_from_env_and_backoff_bounds(monkeypatch):
    monkeypatch.setenv("XDPX_IO_RETRIES", "2")
    monkeypatch.setenv("XDPX_IO_BACKOFF", "0.25")
    monkeypatch.setenv("XDPX_IO_BACKOFF_MAX", "1")
    policy = io.RetryPolicy.from_env()
    assert (policy.retries, policy.backoff, policy.backoff_max) == (2, 0.25, 1.0)
    delays = [[policy.delay(k) for _ in range(200)] for k in (1, 2, 3, 4, 5)]
    for k, ds in enumerate(delays, start=1):
        assert 0 <= min(ds) and max(ds) <= min(1.0, 0.25 * 2 ** (k - 1))  # full jitter, capped
    assert np.mean(delays[2]) > np.mean(delays[0])  # grows with the retry number
    monkeypatch.setenv("XDPX_IO_RETRIES", "many")
    with pytest.raises(ValueError, match="XDPX_IO_RETRIES='many'"):
        io.RetryPolicy.from_env()


# ---------------------------------------------------------------- credentials
@pytest.mark.unit
def test_oss_credentials_from_env_or_ossutil_profile(tmp_path, monkeypatch):
    for name in ("OSS_ACCESS_KEY_ID", "OSS_ACCESS_KEY_SECRET", "OSS_ENDPOINT", "OSS_REGION"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "ossutilconfig"
    config.write_text(
        "[default]\naccessKeyId = AKIDdefault\naccess-key-secret = " + SECRET + "\n"
        "region = cn-hangzhou\n\n"
        "[profile ci]\naccess_key_id = AKIDci\naccessKeySecret = ci-secret\n"
        "endpoint = http://127.0.0.1:9\n"
    )
    monkeypatch.setenv("OSSUTIL_CONFIG_FILE", str(config))
    options, _ = io._oss_settings()
    assert options == {
        "endpoint": "https://oss-cn-hangzhou.aliyuncs.com",
        "key": "AKIDdefault",
        "secret": SECRET,
    }
    monkeypatch.setenv("OSSUTIL_PROFILE", "ci")
    assert io._oss_settings()[0]["endpoint"] == "http://127.0.0.1:9"
    monkeypatch.setenv("OSS_ACCESS_KEY_ID", "AKIDenv")  # the environment wins over the file
    monkeypatch.setenv("OSS_ACCESS_KEY_SECRET", "env-secret")
    assert io._oss_settings()[0]["key"] == "AKIDenv"
    monkeypatch.setenv("OSSUTIL_PROFILE", "missing")
    with pytest.raises(ValueError, match="no profile 'missing'"):
        io._oss_settings()
    monkeypatch.delenv("OSSUTIL_PROFILE")
    monkeypatch.setenv("OSSUTIL_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(ValueError, match="OSS_ENDPOINT"):
        io.exists("oss://bucket/key")
    # the settings object never shows its values
    monkeypatch.setenv("OSS_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OSS_ACCESS_KEY_SECRET", SECRET)
    assert SECRET not in repr(io._settings("oss"))


@pytest.mark.unit
def test_url_with_credentials_is_refused_without_echoing_them():
    with pytest.raises(ValueError, match="credentials in a URL are refused") as err:
        io.exists(f"s3://AKID:{SECRET}@bucket/key")
    assert SECRET not in str(err.value)


# ---------------------------------------------------------------- the local object store
@pytest.fixture
def remote(store_bucket, monkeypatch, tmp_path_factory):
    """A fresh bucket of the local object store (tests/objstore.py), its credentials in the
    environment, fast retries and a private ``XDPX_CACHE`` (local staging)."""
    for name, value in FAST_RETRIES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDPX_CACHE", str(tmp_path_factory.mktemp("xdpx-cache")))
    return store_bucket


@pytest.mark.parametrize("protocol", ["oss", "s3"])
@pytest.mark.integration
def test_remote_file_ops_and_atomic_writes(remote, protocol):
    base = f"{protocol}://{remote.name}/io"
    io.write_text(f"{base}/a/b.txt", "你好\n")
    assert io.exists(f"{base}/a/b.txt") and io.isfile(f"{base}/a/b.txt")
    assert io.isdir(f"{base}/a") and not io.exists(f"{base}/zz")
    assert io.read_text(f"{base}/a/b.txt") == "你好\n"
    assert io.ls(f"{base}/a") == [f"{base}/a/b.txt"]
    assert io.size(f"{base}/a/b.txt") == len("你好\n".encode())
    with pytest.raises(FileNotFoundError, match=f"{base}/missing.txt"):
        io.read_text(f"{base}/missing.txt")
    # a write that fails half-way leaves the old object and no other key, remote or local
    with pytest.raises(RuntimeError), io.open_atomic(f"{base}/a/b.txt") as f:
        f.write(b"half")
        raise RuntimeError("crash mid-write")
    assert io.read_text(f"{base}/a/b.txt") == "你好\n"
    assert remote.keys() == ["io/a/b.txt"]
    assert not os.listdir(io.cache_dir("tmp"))
    # 3 MiB through local disk and back (the OSS front's multipart minimum is 100 KiB)
    big = os.urandom(3 * 1024 * 1024 + 17)
    io.write_bytes(f"{base}/big.bin", big)
    io.copy(f"{base}/big.bin", f"{base}/copy.bin", progress=True)
    assert io.md5(f"{base}/copy.bin") == hashlib.md5(big).hexdigest()
    assert remote.get_bytes("io/copy.bin") == big
    io.rm(base, recursive=True)
    assert not io.exists(base) and remote.keys() == []


@pytest.mark.parametrize("protocol", ["oss", "s3"])
@pytest.mark.integration
def test_faults_are_retried_and_an_outage_is_reported(remote, monkeypatch, protocol):
    store, base = remote.store, f"{protocol}://{remote.name}/faults"
    monkeypatch.setenv("XDPX_IO_RETRIES", "12")
    store.fail_rate = 0.3
    store.fault_kinds = ("503", "reset", "reset_after")  # reset_after: done, answer lost
    for i in range(20):
        io.write_text(f"{base}/{i}.txt", str(i))
    assert [io.read_text(f"{base}/{i}.txt") for i in range(20)] == [str(i) for i in range(20)]
    io.rm(f"{base}/3.txt")
    assert len(io.ls(base)) == 19 and not io.exists(f"{base}/3.txt")
    assert store.stats.faults >= 10 and all(store.stats.injected.values())
    assert remote.keys() == sorted(f"faults/{i}.txt" for i in range(20) if i != 3)
    store.fail_rate = 0
    store.down()
    monkeypatch.setenv("XDPX_IO_RETRIES", "2")
    with io.stage("evaluate"), pytest.raises(RemoteIOError) as err:
        io.read_text(f"{base}/1.txt")
    assert str(err.value).startswith(f"evaluate: read {base}/1.txt failed after 3 attempts")


@pytest.mark.integration
def test_interrupted_checkpoint_upload_is_never_taken_for_a_checkpoint(remote, monkeypatch):
    """The manifest is removed first and uploaded last: a failed upload leaves no loadable checkpoint."""
    import torch

    from xdpx.checkpoint import load_checkpoint, save_checkpoint
    from xdpx.models import build_model, model_config_from

    cfg = TrainConfig(model="ngram_lr", ngram_buckets=1024)
    mc = model_config_from("ngram_lr", cfg, 50, 2, 0)
    torch.manual_seed(0)
    model = build_model("ngram_lr", mc)
    run = f"oss://{remote.name}/ckpt/run"
    save_checkpoint(f"{run}/best", model, "ngram_lr", mc, {"update": 1}, assets_dir=f"{run}/none")
    assert load_checkpoint(f"{run}/<best>").info["update"] == 1
    real_upload, sent = io._upload, []

    def failing(local, url, progress=None):
        if url.endswith("model.safetensors"):
            raise RemoteIOError(f"write {url} failed after 9 attempts")
        sent.append(url.rsplit("/", 1)[-1])
        real_upload(local, url, progress)

    monkeypatch.setattr(io, "_upload", failing)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    with pytest.raises(RemoteIOError):
        save_checkpoint(f"{run}/best", model, "ngram_lr", mc, {"update": 2}, assets_dir=run)
    assert sent == ["config.json"]  # then model.safetensors failed; manifest.json never sent
    with pytest.raises(CheckpointError, match="no manifest.json"):
        resolve_checkpoint(f"{run}/<best>")
    monkeypatch.setattr(io, "_upload", real_upload)
    save_checkpoint(f"{run}/best", model, "ngram_lr", mc, {"update": 2}, assets_dir=run)
    assert load_checkpoint(f"{run}/best").info["update"] == 2
    assert remote.keys("ckpt/") == [
        "ckpt/run/best/config.json",
        "ckpt/run/best/manifest.json",
        "ckpt/run/best/model.safetensors",
    ]
    assert not os.listdir(io.cache_dir("staging"))  # local staging cleaned up


# ---------------------------------------------------------------- the stages on remote paths
def _chain(raw_source: str, prepared: str, run_dir: str, reports: str, export_dir: str) -> dict:
    """prepro -> train -> evaluate -> predict -> export; returns the results."""
    out = {
        "prepro": prepro.run(PreproConfig(data_source=raw_source, data_dir=prepared, max_len=128))
    }
    out["train"] = train.run(TrainConfig(data_dir=prepared, save_dir=run_dir, **TRAIN))
    ckpt = io.join(run_dir, "<best>")
    out["evaluate"] = evaluate.run(
        EvaluateConfig(
            checkpoint=ckpt,
            data_dir=prepared,
            metrics_file=io.join(reports, "metrics.json"),
            confusion_png=io.join(reports, "confusion.png"),
        )
    )
    out["predict"] = predict.run(
        PredictConfig(
            checkpoint=ckpt,
            data_file=io.join(raw_source, "test.tsv"),
            out_file=io.join(reports, "predictions.tsv"),
        )
    )
    out["export"] = export.run(
        ExportConfig(checkpoint=ckpt, data_dir=prepared, out_dir=export_dir, num_samples=32)
    )
    return out


def _remote_chain(raw: str, base: str) -> dict:
    """Upload the raw TSVs under ``base`` and run the chain with every path under ``base``."""
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
        io.copy(os.path.join(raw, name), f"{base}/raw/{name}")
    return _chain(
        f"{base}/raw", f"{base}/prepared", f"{base}/runs/r1", f"{base}/reports", f"{base}/export"
    )


@pytest.fixture(scope="module")
def local_chain(real_subset, tmp_path_factory):
    """The chain on local paths: what every remote run must reproduce."""
    raw, _ = real_subset
    root = tmp_path_factory.mktemp("local-chain")
    results = _chain(raw, f"{root}/prepared", f"{root}/run", f"{root}/reports", f"{root}/export")
    return root, results


def assert_same_as_local(base: str, remote: dict, root: Path, local: dict) -> None:
    """The remote chain under ``base`` produced what the local chain under ``root`` did."""
    for split in ("train", "dev", "test"):
        a, b = load_split(f"{base}/prepared", split), load_split(f"{root}/prepared", split)
        assert [x.tolist() for x in a.input_ids] == [x.tolist() for x in b.input_ids]
        assert a.labels.tolist() == b.labels.tolist()
    assert remote["train"].best_valid == local["train"].best_valid
    assert remote["evaluate"].metrics == local["evaluate"].metrics
    same = [
        ("runs/r1/best/model.safetensors", "run/best/model.safetensors"),
        ("runs/r1/last/optimizer.pt", "run/last/optimizer.pt"),
        ("runs/r1/valid.log.tsv", "run/valid.log.tsv"),
        ("runs/r1/best/config.json", "run/best/config.json"),
        ("reports/predictions.tsv", "reports/predictions.tsv"),
        ("reports/metrics.json", "reports/metrics.json"),
        ("runs/r1/dvclive/plots/metrics/valid/accuracy.tsv", "run/dvclive/plots/metrics/valid/accuracy.tsv"),
    ]  # fmt: skip
    for remote_name, local_name in same:
        assert io.read_bytes(f"{base}/{remote_name}") == (root / local_name).read_bytes(), (
            remote_name
        )
    report = json.loads(io.read_text(f"{base}/export/report.json"))
    assert report["parity"]["argmax_agreement"] == 1.0
    onnx = io.read_bytes(f"{base}/export/model.onnx")
    assert hashlib.sha256(onnx).hexdigest() == report["onnx_sha256"]
    assert onnx == (root / "export/model.onnx").read_bytes()


@pytest.mark.integration
def test_oss_chain_matches_local_and_writes_no_secret(
    remote, real_subset, local_chain, tmp_path, caplog, capfd
):
    """prepro from oss://, train to oss://, evaluate/predict/export from oss://<run>/<best>."""
    caplog.set_level(logging.DEBUG)
    raw, _ = real_subset
    root, local = local_chain
    base = f"oss://{remote.name}/chain"
    remote_results = _remote_chain(raw, base)
    assert_same_as_local(base, remote_results, root, local)
    assert remote_results["evaluate"].checkpoint == f"{base}/runs/r1/best"
    # no credential anywhere: the downloaded remote tree, the local staging, the logs
    io.download_dir(base, str(tmp_path / "remote"))
    out, err = capfd.readouterr()
    checked = assert_no_secret(
        [tmp_path / "remote", Path(os.environ["XDPX_CACHE"])],
        caplog.text,
        out,
        err,
        secrets=remote.store.secrets,
    )
    assert checked > 40
    params = (tmp_path / "remote/runs/r1/params.yaml").read_text()
    assert f"save_dir: {base}/runs/r1" in params
    assert not [k for k in remote.keys() if ".tmp" in k]


@pytest.mark.integration
def test_chain_with_20_percent_faults_loses_nothing(
    remote, real_subset, local_chain, monkeypatch, caplog
):
    caplog.set_level(logging.INFO, logger="xdpx.io")
    raw, _ = real_subset
    root, local = local_chain
    store = remote.store
    monkeypatch.setenv("XDPX_IO_RETRIES", "12")
    store.fail_rate = 0.2
    store.fault_kinds = ("503", "reset", "reset_after")
    base = f"oss://{remote.name}/faulty"
    remote_results = _remote_chain(raw, base)
    faults = store.stats.injected
    store.fail_rate = 0
    assert_same_as_local(base, remote_results, root, local)
    assert sum(faults.values()) >= 50 and all(faults.values()), faults
    assert "retry 1/12" in caplog.text  # xdpx.io retried (not only the client libraries)
    assert not [k for k in remote.keys() if ".tmp" in k]
    assert store.pending_uploads(remote.name) == []


@pytest.mark.integration
def test_s3_train_outage_then_resume_equals_uninterrupted(remote, real_subset, tmp_path):
    """train on s3://: existing-run checks; an outage mid-run, then resume == one straight run."""
    raw, prepared = real_subset
    store, base = remote.store, f"s3://{remote.name}/resume"
    full = dict(TRAIN, batch_size=128, eval_interval=3, log_interval=2)
    train.run(TrainConfig(data_dir=prepared, save_dir=f"{base}/straight", **full))
    with pytest.raises(FileExistsError, match=f"{base}/straight already holds a run"):
        train.run(TrainConfig(data_dir=prepared, save_dir=f"{base}/straight", max_update=1))
    suffixed = train.run(
        TrainConfig(data_dir=prepared, save_dir=f"{base}/straight", auto_suffix=True, max_update=2)
    )
    assert suffixed.save_dir == f"{base}/straight-2" and io.exists(f"{base}/straight-2/last")
    io.write_text(f"{base}/straight-2/stale.txt", "from before")
    train.run(
        TrainConfig(data_dir=prepared, save_dir=f"{base}/straight-2", overwrite=True, max_update=1)
    )
    assert json.loads(io.read_text(f"{base}/straight-2/result.json"))["num_updates"] == 1
    assert not io.exists(f"{base}/straight-2/stale.txt")  # overwrite replaced the whole run

    # the store goes down at update 8 (last/ was saved at update 6)
    from xdpx.train.trainer import Trainer

    log_row = Trainer._log_train_row

    def outage_at_8(self, *args):
        if self.state.num_updates == 8:
            store.down()
        return log_row(self, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "_log_train_row", outage_at_8)
        mp.setenv("XDPX_IO_RETRIES", "2")
        with pytest.raises(RemoteIOError, match=f"^train: write {base}/split/train.log.tsv"):
            train.run(TrainConfig(data_dir=prepared, save_dir=f"{base}/split", **full))
    store.up()
    state = json.loads(io.read_text(f"{base}/split/last/trainer_state.json"))
    assert state["num_updates"] == 6
    # continued from the remote checkpoint into a local run, and in place on the store
    local = tmp_path / "from-remote"
    train.run(
        TrainConfig(
            data_dir=prepared, save_dir=str(local), resume_from=f"{base}/split/<last>", **full
        )
    )
    assert json.loads((local / "repro.json").read_text())["resumed_from"] == f"{base}/split/last"
    train.run(TrainConfig(data_dir=prepared, save_dir=f"{base}/split", resume=True, **full))
    for name in ("valid.log.tsv", "last/model.safetensors", "best/model.safetensors"):
        straight = io.read_bytes(f"{base}/straight/{name}")
        assert io.read_bytes(f"{base}/split/{name}") == straight, name
        assert (local / name).read_bytes() == straight, name
    straight = json.loads(io.read_text(f"{base}/straight/dvclive/metrics.json"))
    resumed = json.loads(io.read_text(f"{base}/split/dvclive/metrics.json"))
    assert resumed["step"] == straight["step"] and resumed["valid"] == straight["valid"]


@pytest.mark.integration
def test_store_down_names_url_and_stage_and_writes_nothing_locally(
    remote, real_subset, local_chain, tmp_path, monkeypatch
):
    raw, prepared = real_subset
    root, _ = local_chain
    base = f"oss://{remote.name}"
    io.write_text(f"{base}/raw/test.tsv", (Path(raw) / "test.tsv").read_text())
    remote.store.down()
    monkeypatch.setenv("XDPX_IO_RETRIES", "2")
    out = tmp_path / "out"
    before = files_under(tmp_path), files_under(root), files_under(raw)
    cases = [
        ("prepro", f"{base}/raw", lambda: prepro.run(
            PreproConfig(data_source=f"{base}/raw", data_dir=str(out / "prepared")))),
        ("train", f"{base}/run", lambda: train.run(
            TrainConfig(data_dir=prepared, save_dir=f"{base}/run", **TRAIN))),
        ("train", f"{base}/prepared", lambda: train.run(
            TrainConfig(data_dir=f"{base}/prepared", save_dir=str(out / "run"), **TRAIN))),
        ("evaluate", f"{base}/run/best", lambda: evaluate.run(EvaluateConfig(
            checkpoint=f"{base}/run/<best>", data_dir=prepared,
            metrics_file=str(out / "metrics.json"), confusion_png=str(out / "c.png")))),
        ("predict", f"{base}/raw/test.tsv", lambda: predict.run(PredictConfig(
            checkpoint=str(root / "run/<best>"), data_file=f"{base}/raw/test.tsv",
            out_file=str(out / "pred.tsv")))),
        ("export", f"{base}/export", lambda: export.run(ExportConfig(
            checkpoint=str(root / "run/<best>"), data_dir=prepared, out_dir=f"{base}/export",
            num_samples=8))),
    ]  # fmt: skip
    for stage, url, call in cases:
        with pytest.raises(RemoteIOError) as err:
            call()
        message = str(err.value)
        assert message.startswith(f"{stage}: ") and url in message, message
        assert "failed after 3 attempts" in message
    assert (files_under(tmp_path), files_under(root), files_under(raw)) == before
    # the command line: one line naming the stage and the URL, exit status 75 (EX_TEMPFAIL)
    proc = subprocess.run(
        [sys.executable, "-m", "stages.predict", f"predict.checkpoint={root}/run/<best>",
         f"predict.data_file={base}/raw/test.tsv", f"predict.out_file={out}/pred.tsv"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )  # fmt: skip
    assert proc.returncode == 75, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: predict: ") and f"{base}/raw/test.tsv" in last
    assert_no_secret([], proc.stderr, proc.stdout, secrets=remote.store.secrets)
    assert not out.exists()
    remote.store.up()
    assert io.read_text(f"{base}/raw/test.tsv") == (Path(raw) / "test.tsv").read_text()
