"""xdpx.io: fsspec paths (local and memory://) and atomic writes."""

from __future__ import annotations

import asyncio
import errno
import logging
import os

import pytest

from xdpx import io
from xdpx.errors import RemoteIOError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("base", ["local", "memory://xdpx-test-io"])
def test_round_trip_and_listing(tmp_path, base):
    root = str(tmp_path) if base == "local" else base
    path = io.join(root, "a", "b.txt")
    io.write_text(path, "你好\n")
    assert io.exists(path) and io.isfile(path) and io.isdir(io.join(root, "a"))
    assert io.read_text(path) == "你好\n"
    io.write_bytes(io.join(root, "a", "c.bin"), b"\x00\x01")
    assert [p.rsplit("/", 1)[-1] for p in io.glob(io.join(root, "a", "*"))] == ["b.txt", "c.bin"]
    io.rm(io.join(root, "a"), recursive=True)
    assert not io.exists(path)


@pytest.mark.parametrize("base", ["local", "memory://xdpx-test-atomic"])
def test_failed_write_keeps_previous_file_and_leaves_no_temp(tmp_path, base):
    root = str(tmp_path) if base == "local" else base
    path = io.join(root, "out.txt")
    io.write_text(path, "old")
    with pytest.raises(RuntimeError):
        with io.open_atomic(path, "wb") as f:
            f.write(b"half")
            raise RuntimeError("crash mid-write")
    assert io.read_text(path) == "old"
    assert [p.rsplit("/", 1)[-1] for p in io.glob(io.join(root, "*"))] == ["out.txt"]


def test_open_refuses_write_modes(tmp_path):
    with pytest.raises(ValueError, match="open_atomic"):
        io.open(str(tmp_path / "x"), "w")


def test_replace_dir_swaps_whole_directory(tmp_path):
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "old.txt").write_text("old")
    tmp = io.tmp_sibling(str(final))
    io.write_text(io.join(tmp, "new.txt"), "new")
    io.replace_dir(tmp, str(final))
    assert sorted(os.listdir(final)) == ["new.txt"]
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_dirname_of_paths_and_urls():
    assert io.dirname("models/run/best") == "models/run"
    assert io.dirname("memory://bucket/run/best/") == "memory://bucket/run"
    assert io.dirname("confusion.png") == "."


# ---------------------------------------------------------------- retries (xdpx.retry, issue 21)
def _oss_throttled(status: int = 429, code: str = "SlowDown") -> OSError:
    """What ossfs raises for a throttled OSS request: OSError(EIO) from oss2's ServerError."""
    import oss2

    err = OSError(errno.EIO, "oss error")
    err.__cause__ = oss2.exceptions.ServerError(status, {}, b"", {"Code": code})
    return err


def test_is_transient_never_retries_interrupts_or_wrong_paths():
    assert io.is_transient(_oss_throttled()) and io.is_transient(_oss_throttled(503, "X"))
    assert not io.is_transient(_oss_throttled(404, "NoSuchKey"))
    assert not io.is_transient(KeyboardInterrupt())
    cancelled = asyncio.CancelledError()
    cancelled.__context__ = ConnectionResetError()  # cancelled while handling a reset
    assert not io.is_transient(cancelled)
    gone = FileNotFoundError("k")
    gone.__cause__ = _oss_throttled(503, "ServiceUnavailable")
    assert not io.is_transient(gone)


def test_retry_rides_out_throttling_logs_each_retry_and_gives_up(caplog):
    policy = io.RetryPolicy(retries=2, backoff=0.001, backoff_max=0.001, deadline=30)
    calls = []

    def throttled_twice():
        calls.append(1)
        if len(calls) <= 2:
            raise _oss_throttled()
        return "ok"

    with caplog.at_level(logging.INFO, logger="xdpx.io"):
        assert io.retry("read", "oss://b/k", throttled_twice, policy) == "ok"
    assert len(calls) == 3
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == [
        "read oss://b/k: OSError: [Errno 5] oss error; retry 1/2",
        "read oss://b/k: OSError: [Errno 5] oss error; retry 2/2",
    ]

    calls.clear()

    def throttled():
        calls.append(1)
        raise _oss_throttled()

    with pytest.raises(RemoteIOError, match=r"^read oss://b/k failed after 3 attempts") as err:
        io.retry("read", "oss://b/k", throttled, policy)
    assert len(calls) == 3  # the first attempt + XDPX_IO_RETRIES-style 2 retries
    assert err.value.__cause__ is None and err.value.operation == "read"


def test_retry_starts_no_attempt_past_the_deadline():
    policy = io.RetryPolicy(retries=50, backoff=0.01, backoff_max=0.01, deadline=0.0)
    calls = []

    def down():
        calls.append(1)
        raise ConnectionResetError(errno.ECONNRESET, "reset by peer")

    with pytest.raises(RemoteIOError, match="failed after 1 attempt in"):
        io.retry("list", "s3://b/", down, policy)
    assert len(calls) == 1
