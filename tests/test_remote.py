"""Remote paths (``s3://``, ``oss://``) through xdpx.io: retries, credentials, atomicity, the stages.

The stores are real servers on 127.0.0.1: moto's S3 server for ``s3://``. Every test sets
fast retry settings (``XDPX_IO_*``) so an outage fails in well under a minute.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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


def closed_port() -> int:
    """A 127.0.0.1 port with nothing listening (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def files_under(root: str | Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under a local directory (a snapshot)."""
    root = Path(root)
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def assert_no_secret(paths: list[Path], *texts: str) -> int:
    """Fail if SECRET is in any file under ``paths`` or in ``texts``; returns files checked."""
    checked = 0
    for root in paths:
        for p in [root] if root.is_file() else root.rglob("*"):
            if p.is_file():
                assert SECRET.encode() not in p.read_bytes(), f"secret written to {p}"
                checked += 1
    for text in texts:
        assert SECRET not in text
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
def test_transient_errors_are_told_from_permanent_ones(make, transient):
    assert io.is_transient(make()) is transient


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


def test_url_with_credentials_is_refused_without_echoing_them():
    with pytest.raises(ValueError, match="credentials in a URL are refused") as err:
        io.exists(f"s3://AKID:{SECRET}@bucket/key")
    assert SECRET not in str(err.value)


# ---------------------------------------------------------------- a real S3 server (moto)
@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 with bucket ``xdpx``; env: credentials, endpoint, fast retries."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "AKIDxdpxtest",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        "XDPX_CACHE_DIR": str(tmp_path_factory.mktemp("xdpx-cache")),
        **FAST_RETRIES,
    }
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        import boto3

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="xdpx")
        yield endpoint
    server.stop()


def test_remote_file_ops_and_atomic_writes(s3):
    base = "s3://xdpx/io"
    io.write_text(f"{base}/a/b.txt", "你好\n")
    assert io.exists(f"{base}/a/b.txt") and io.isfile(f"{base}/a/b.txt")
    assert io.isdir(f"{base}/a") and not io.exists(f"{base}/zz")
    assert io.read_text(f"{base}/a/b.txt") == "你好\n"
    assert io.ls(f"{base}/a") == [f"{base}/a/b.txt"]
    assert io.size(f"{base}/a/b.txt") == len("你好\n".encode())
    with pytest.raises(FileNotFoundError, match="s3://xdpx/io/missing.txt"):
        io.read_text(f"{base}/missing.txt")
    # a write that fails half-way leaves the old object and no other key
    with pytest.raises(RuntimeError), io.open_atomic(f"{base}/a/b.txt") as f:
        f.write(b"half")
        raise RuntimeError("crash mid-write")
    assert io.read_text(f"{base}/a/b.txt") == "你好\n"
    assert io.ls(base) == [f"{base}/a"] and io.ls(f"{base}/a") == [f"{base}/a/b.txt"]
    assert not os.listdir(io.cache_dir("tmp"))  # the local staging file is gone too
    # copy through local disk and back, with md5 equality
    big = os.urandom(3 * 1024 * 1024 + 17)
    io.write_bytes(f"{base}/big.bin", big)
    io.copy(f"{base}/big.bin", f"{base}/copy.bin", progress=True)
    assert io.md5(f"{base}/copy.bin") == hashlib.md5(big).hexdigest()
    io.rm(base, recursive=True)
    assert not io.exists(base)


def test_interrupted_checkpoint_upload_is_never_taken_for_a_checkpoint(s3, monkeypatch):
    """The manifest is removed first and uploaded last: a failed upload leaves no loadable checkpoint."""
    import torch

    from xdpx.checkpoint import load_checkpoint, save_checkpoint
    from xdpx.models import build_model, model_config_from

    cfg = TrainConfig(model="ngram_lr", ngram_buckets=1024)
    mc = model_config_from("ngram_lr", cfg, 50, 2, 0)
    torch.manual_seed(0)
    model = build_model("ngram_lr", mc)
    path = "s3://xdpx/ckpt/run/best"
    save_checkpoint(path, model, "ngram_lr", mc, {"update": 1}, assets_dir="s3://xdpx/none")
    assert load_checkpoint(io.join("s3://xdpx/ckpt/run", "<best>")).info["update"] == 1
    real_upload, sent = io._upload, []

    def failing(local, url, progress=None):
        if url.endswith("config.json"):
            raise RemoteIOError(f"write {url} failed after 9 attempts")
        sent.append(url.rsplit("/", 1)[-1])
        real_upload(local, url, progress)

    monkeypatch.setattr(io, "_upload", failing)
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    with pytest.raises(RemoteIOError):
        save_checkpoint(path, model, "ngram_lr", mc, {"update": 2}, assets_dir="s3://xdpx/none")
    assert "manifest.json" not in sent
    with pytest.raises(CheckpointError, match="no manifest.json"):
        resolve_checkpoint("s3://xdpx/ckpt/run/<best>")
    monkeypatch.setattr(io, "_upload", real_upload)
    save_checkpoint(path, model, "ngram_lr", mc, {"update": 2}, assets_dir="s3://xdpx/none")
    assert load_checkpoint(path).info["update"] == 2
    assert sorted(p.rsplit("/", 1)[-1] for p in io.ls(path)) == [
        "config.json",
        "manifest.json",
        "model.safetensors",
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


@pytest.fixture(scope="module")
def local_chain(real_subset, tmp_path_factory):
    """The chain on local paths: what every remote run must reproduce."""
    raw, _ = real_subset
    root = tmp_path_factory.mktemp("local-chain")
    results = _chain(raw, f"{root}/prepared", f"{root}/run", f"{root}/reports", f"{root}/export")
    return root, results


def upload_raw(raw: str, dest: str) -> None:
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
        io.copy(os.path.join(raw, name), io.join(dest, name))


def test_s3_chain_matches_local_and_writes_no_secret(
    s3, real_subset, local_chain, tmp_path, caplog, capfd
):
    caplog.set_level(logging.DEBUG)
    raw, _ = real_subset
    root, local = local_chain
    base = "s3://xdpx/chain"
    upload_raw(raw, f"{base}/raw")
    remote = _chain(
        f"{base}/raw", f"{base}/prepared", f"{base}/runs/r1", f"{base}/reports", f"{base}/export"
    )
    # same data, same model, same scores as on local disk
    for split in ("train", "dev", "test"):
        a, b = load_split(f"{base}/prepared", split), load_split(f"{root}/prepared", split)
        assert [x.tolist() for x in a.input_ids] == [x.tolist() for x in b.input_ids]
    assert remote["train"].best_valid == local["train"].best_valid
    assert remote["evaluate"].metrics == local["evaluate"].metrics
    assert (
        io.read_bytes(f"{base}/runs/r1/best/model.safetensors")
        == (root / "run/best/model.safetensors").read_bytes()
    )
    for name in ("valid.log.tsv", "best/config.json", "best/vocab.txt"):
        assert io.read_text(f"{base}/runs/r1/{name}") == (root / "run" / name).read_text(), name
    assert (
        io.read_text(f"{base}/reports/predictions.tsv")
        == (root / "reports/predictions.tsv").read_text()
    )
    assert (
        json.loads(io.read_text(f"{base}/export/report.json"))["parity"]["argmax_agreement"] == 1.0
    )
    assert io.exists(f"{base}/export/model.onnx") and io.exists(f"{base}/reports/valid_curve.png")
    dvclive = json.loads(io.read_text(f"{base}/runs/r1/dvclive/metrics.json"))
    assert dvclive["valid"]["accuracy"] == pytest.approx(
        json.loads((root / "run/dvclive/metrics.json").read_text())["valid"]["accuracy"]
    )
    # no credential anywhere: the downloaded remote tree, the local staging, the logs
    io.download_dir(base, str(tmp_path / "remote"))
    out, err = capfd.readouterr()
    checked = assert_no_secret(
        [tmp_path / "remote", Path(os.environ["XDPX_CACHE_DIR"])], caplog.text, out, err
    )
    assert checked > 40
    params = (tmp_path / "remote/runs/r1/params.yaml").read_text()
    assert "save_dir: s3://xdpx/chain/runs/r1" in params


def test_remote_run_dir_checks_and_resume(s3, real_subset, tmp_path):
    """Existing-run checks and a bit-exact resume, with save_dir on the store."""
    raw, prepared = real_subset
    base = "s3://xdpx/resume"
    full = dict(TRAIN, batch_size=128, eval_interval=3, log_interval=2)
    train.run(TrainConfig(data_dir=prepared, save_dir=f"{base}/straight", **full))
    with pytest.raises(FileExistsError, match=f"{base}/straight already holds a run"):
        train.run(TrainConfig(data_dir=prepared, save_dir=f"{base}/straight", max_update=1))
    suffixed = train.run(
        TrainConfig(data_dir=prepared, save_dir=f"{base}/straight", auto_suffix=True, max_update=2)
    )
    assert suffixed.save_dir == f"{base}/straight-2" and io.exists(f"{base}/straight-2/last")
    # a run that crashes at update 8 (last/ saved at 6) and is resumed ends like the straight run
    from xdpx.trainer import Trainer

    class Crash(Exception):
        pass

    log_row = Trainer._log_train_row

    def crashing(self, *args):
        if self.state.num_updates >= 7:
            raise Crash(f"killed at update {self.state.num_updates}")
        return log_row(self, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "_log_train_row", crashing)
        with pytest.raises(Crash):
            train.run(TrainConfig(data_dir=prepared, save_dir=f"{base}/split", **full))
    state = json.loads(io.read_text(f"{base}/split/last/trainer_state.json"))
    assert state["num_updates"] == 6
    train.run(TrainConfig(data_dir=prepared, save_dir=f"{base}/split", resume=True, **full))
    for name in ("valid.log.tsv", "last/model.safetensors", "best/model.safetensors"):
        assert io.read_bytes(f"{base}/split/{name}") == io.read_bytes(f"{base}/straight/{name}"), (
            name
        )
    straight = json.loads(io.read_text(f"{base}/straight/dvclive/metrics.json"))
    split = json.loads(io.read_text(f"{base}/split/dvclive/metrics.json"))
    assert split["step"] == straight["step"] and split["valid"] == straight["valid"]
    # a local run continued from the remote checkpoint of another ends the same way too
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Trainer, "_log_train_row", crashing)
        with pytest.raises(Crash):
            train.run(TrainConfig(data_dir=prepared, save_dir=f"{base}/crashed", **full))
    local = tmp_path / "from-remote"
    train.run(
        TrainConfig(
            data_dir=prepared, save_dir=str(local), resume_from=f"{base}/crashed/<last>", **full
        )
    )
    assert json.loads((local / "repro.json").read_text())["resumed_from"] == f"{base}/crashed/last"
    assert (local / "valid.log.tsv").read_bytes() == io.read_bytes(f"{base}/straight/valid.log.tsv")
    assert (local / "last/model.safetensors").read_bytes() == io.read_bytes(
        f"{base}/straight/last/model.safetensors"
    )


def _store_down_env(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("XDPX_IO_RETRIES", "2")


def test_store_down_names_url_and_stage_and_writes_nothing_locally(
    s3, real_subset, local_chain, tmp_path, monkeypatch
):
    raw, prepared = real_subset
    root, _ = local_chain
    _store_down_env(monkeypatch)
    out = tmp_path / "out"
    before = files_under(tmp_path), files_under(root)
    cases = [
        (
            "prepro",
            lambda: prepro.run(
                PreproConfig(data_source="s3://xdpx/down/raw", data_dir=str(out / "p"))
            ),
            "s3://xdpx/down/raw",
        ),
        (
            "train",
            lambda: train.run(
                TrainConfig(data_dir=prepared, save_dir="s3://xdpx/down/run", **TRAIN)
            ),
            "s3://xdpx/down/run",
        ),
        (
            "evaluate",
            lambda: evaluate.run(
                EvaluateConfig(
                    checkpoint="s3://xdpx/down/run/<best>",
                    data_dir=prepared,
                    metrics_file=str(out / "metrics.json"),
                )
            ),
            "s3://xdpx/down/run/best",
        ),
        (
            "predict",
            lambda: predict.run(
                PredictConfig(
                    checkpoint=str(root / "run/<best>"),
                    data_file="s3://xdpx/down/test.tsv",
                    out_file=str(out / "pred.tsv"),
                )
            ),
            "s3://xdpx/down/test.tsv",
        ),
        (
            "export",
            lambda: export.run(
                ExportConfig(
                    checkpoint=str(root / "run/<best>"),
                    data_dir=prepared,
                    out_dir="s3://xdpx/down/export",
                    num_samples=8,
                )
            ),
            "s3://xdpx/down/export",
        ),
    ]
    for stage, call, url in cases:
        with pytest.raises(RemoteIOError) as err:
            call()
        assert str(err.value).startswith(f"{stage}: "), err.value
        assert url in str(err.value) and "failed after 3 attempts" in str(err.value)
    assert (files_under(tmp_path), files_under(root)) == before
    # the command line: one line naming stage and URL, exit status 75 (EX_TEMPFAIL)
    proc = subprocess.run(
        [sys.executable, "-m", "stages.predict", f"predict.checkpoint={root}/run/<best>",
         "predict.data_file=s3://xdpx/down/test.tsv", f"predict.out_file={out}/p.tsv"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )  # fmt: skip
    assert proc.returncode == 75, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: predict: ") and "s3://xdpx/down/test.tsv" in last
    assert SECRET not in proc.stderr + proc.stdout
    assert not out.exists()
