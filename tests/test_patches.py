"""xdpx/patches: the aiooss2 #96 fix, the ossfs retries, the dvc-data .dir guard, and the .pth hook
that applies them."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from xdpx import io

ROOT = Path(__file__).resolve().parents[1]
PTH_LINE = "import xdpx.patches; xdpx.patches.install(forget=True)"
PTH_NAME = "xdpx-patches.pth"

# Builds the upload body the way aiohttp does for aiooss2 (PAYLOAD_REGISTRY -> AsyncPayload).
PROBE = """
import sys
if sys.argv[1] == "install":
    import xdpx.patches
    xdpx.patches.install()
assert "aiooss2" not in sys.modules and "ossfs" not in sys.modules, "hook imported a target"
from aiohttp.payload import PAYLOAD_REGISTRY
from aiooss2.adapter import SliceableAdapter
try:
    payload = PAYLOAD_REGISTRY.get(SliceableAdapter(b"abc"))
except TypeError as exc:
    print("BROKEN", exc)
else:
    import xdpx.patches.aiooss2_payload as fix
    print("OK", type(payload).__name__, fix.needed(), fix.apply())
"""


def probe(*args: str, fix_env: str | None = None, prefix: list[str] | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("XDPX_AIOOSS2_FIX", None)
    if fix_env is not None:
        env["XDPX_AIOOSS2_FIX"] = fix_env
    argv = (prefix or [sys.executable, "-c"]) + [PROBE, *args]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


@pytest.mark.e2e
def test_upload_body_cannot_be_built_without_the_fix():
    out = probe("install", fix_env="0")
    assert out.startswith("BROKEN") and "abstract method decode" in out, (
        f"{out!r}: aiooss2/aiohttp no longer show issue #96; if aiooss2 shipped PR #97, "
        "delete xdpx/patches/aiooss2_payload.py, its HOOKS entry and these tests"
    )


@pytest.mark.e2e
def test_install_patches_on_import_and_apply_is_idempotent():
    # needed() is False after the patch, and a second apply() has nothing left to do
    assert probe("install") == "OK AsyncPayload False False"


@pytest.mark.e2e
def test_plain_interpreter_of_the_installed_wheel_is_patched(xdpx_site):
    """The .pth from the real wheel, processed by site, fixes a process that never imports xdpx."""
    launch = "import site, sys; site.addsitedir(sys.argv.pop(1)); exec(sys.argv.pop(1))"
    prefix = [sys.executable, "-c", launch, str(xdpx_site)]
    assert probe("plain", prefix=prefix) == "OK AsyncPayload False False"
    assert probe("plain", prefix=prefix, fix_env="0").startswith("BROKEN")


@pytest.mark.unit
def test_apply_patches_only_while_decode_is_abstract():
    from aiohttp.payload import Payload

    from xdpx.patches import aiooss2_payload as payload_fix

    class Broken(Payload):  # aiooss2 <= 0.2.11 with aiohttp >= 3.10.6
        async def write(self, writer):
            pass

    class Fixed(Broken):  # what aiooss2 looks like once both fixes are released
        def decode(self, encoding="utf-8", errors="strict"):
            return "fixed upstream"

        async def write(self, writer):
            self._consumed = True

    assert payload_fix.apply(Fixed) is False and Fixed(b"x").decode() == "fixed upstream"
    with pytest.raises(TypeError, match="abstract method decode"):
        Broken(b"x")
    assert payload_fix.needed(Broken) and payload_fix.apply(Broken) is True
    assert not payload_fix.needed(Broken) and payload_fix.apply(Broken) is False
    with pytest.raises(TypeError, match="Unable to decode"):
        Broken(b"x").decode()


@pytest.mark.unit
def test_disable_env_turns_apply_into_a_no_op(monkeypatch):
    from aiohttp.payload import Payload

    from xdpx.patches import aiooss2_payload as payload_fix

    class Broken(Payload):
        async def write(self, writer):
            pass

    monkeypatch.setenv("XDPX_AIOOSS2_FIX", "0")
    assert payload_fix.apply(Broken) is False and payload_fix.needed(Broken)


@pytest.mark.parametrize("kind", ["wheel", "editable"])
@pytest.mark.e2e
def test_both_wheels_install_the_pth_hook(xdpx_wheels, kind):
    with zipfile.ZipFile(xdpx_wheels[kind]) as whl:
        names = whl.namelist()
        assert PTH_NAME in names  # wheel root = site-packages
        assert whl.read(PTH_NAME).decode().strip() == PTH_LINE
        record = whl.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
    assert f"{PTH_NAME}," in record  # so pip uninstall removes it
    if kind == "editable":  # processed after the editable finder's .pth, so xdpx imports
        assert sorted(n for n in names if n.endswith(".pth"))[-1] == PTH_NAME


class ListWriter:
    """Stands in for aiohttp's stream writer: collects what a payload writes."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    async def write(self, chunk: bytes) -> None:
        self.chunks.append(chunk)


@pytest.mark.unit
def test_patched_payload_streams_once_and_says_so():
    import asyncio

    from aiohttp.payload import PAYLOAD_REGISTRY
    from aiooss2.adapter import SliceableAdapter

    from xdpx.patches import aiooss2_payload as payload_fix

    payload_fix.apply()
    assert not payload_fix.needed()
    payload = PAYLOAD_REGISTRY.get(SliceableAdapter(b"abc" * 1000))
    assert not payload.consumed
    writer = ListWriter()
    asyncio.run(payload.write(writer))
    assert b"".join(writer.chunks) == b"abc" * 1000
    assert payload.consumed  # so aiohttp's internal retry never replays the drained adapter


@pytest.mark.parametrize("fixed", [True, False], ids=["patched", "decode-fix-only"])
@pytest.mark.integration
def test_dropped_keepalive_upload_is_never_stored_empty(store_bucket, tmp_path, monkeypatch, fixed):
    """A connection reset after the server read a PUT, on a reused keep-alive connection."""
    import ossfs
    from aiooss2.adapter import AsyncPayload

    from xdpx.patches import aiooss2_payload, ossfs_retry

    aiooss2_payload.apply()
    ossfs_retry.apply()
    if not fixed:  # what aiooss2 PR #97 alone gives: aiohttp replays the drained stream
        monkeypatch.setattr(AsyncPayload, "write", AsyncPayload.write.__wrapped__)
    store = store_bucket.store
    fs = ossfs.AioOSSFileSystem(endpoint=store.oss_endpoint, skip_instance_cache=True)
    src = tmp_path / "obj.bin"
    src.write_bytes(os.urandom(50_000))
    fs.pipe(f"{store_bucket.name}/warm", b"w")  # leaves a keep-alive connection in the pool
    store.fail_next(1, "reset")
    if fixed:
        fs.put_file(str(src), f"{store_bucket.name}/obj.bin")
        assert store_bucket.get_bytes("obj.bin") == src.read_bytes()
    else:
        with pytest.raises(OSError, match="CRC"):
            fs.put_file(str(src), f"{store_bucket.name}/obj.bin")
        assert store_bucket.get_bytes("obj.bin") == b""  # the silent damage fix 2 prevents
    assert store.stats.injected["reset"] == 1


@pytest.mark.unit
def test_ossfs_retry_classifies_transient_errors():
    import aiohttp
    import oss2

    from xdpx.patches.ossfs_retry import backoff, is_transient

    def oss_error(cls, status):
        return cls(status, {}, b"", {"Code": "X"})

    def wrapped(err):  # ossfs re-raises oss2 errors as OSError from the original
        try:
            raise OSError(5, "oss error") from err
        except OSError as exc:
            return exc

    assert is_transient(oss_error(oss2.exceptions.ServerError, 503))
    assert is_transient(wrapped(oss_error(oss2.exceptions.ServerError, 500)))
    assert is_transient(oss2.exceptions.RequestError(ConnectionResetError()))
    assert is_transient(aiohttp.ServerDisconnectedError())
    assert is_transient(ConnectionRefusedError())
    assert not is_transient(oss_error(oss2.exceptions.NotFound, 404))
    assert not is_transient(wrapped(oss_error(oss2.exceptions.AccessDenied, 403)))
    assert not is_transient(FileNotFoundError("bucket/key"))
    assert all(0.05 <= backoff(n) <= 2.0 for n in range(1, 12))
    # throttling is transient here as in xdpx.io (it was not before issue 21): one rule
    assert is_transient(wrapped(oss_error(oss2.exceptions.ServerError, 429)))
    slow_down = oss2.exceptions.ServerError(503, {}, b"", {"Code": "SlowDown"})
    assert is_transient(wrapped(slow_down))
    assert is_transient(oss2.exceptions.ServerError(400, {}, b"", {"Code": "QpsLimitExceeded"}))
    assert not is_transient(wrapped(oss_error(oss2.exceptions.ServerError, 400)))
    assert is_transient is io.is_transient


def _throttle_get_object(monkeypatch, fail: int, status: int = 429, code: str = "SlowDown"):
    """Make aiooss2's GetObject answer ``status``/``code`` (as oss2 raises it) ``fail`` times."""
    import oss2
    from aiooss2.api import AioBucket

    real = AioBucket.get_object
    calls: list[str] = []

    async def throttled(self, key, *args, **kwargs):
        calls.append(key)
        if len(calls) <= fail:
            raise oss2.exceptions.ServerError(
                status, {}, b"", {"Code": code, "Message": "Please reduce your request rate."}
            )
        return await real(self, key, *args, **kwargs)

    monkeypatch.setattr(AioBucket, "get_object", throttled)
    return calls


@pytest.mark.integration
def test_ossfs_retry_rides_out_throttling_and_gives_up_with_the_original_error(
    store_bucket, monkeypatch, caplog
):
    """HTTP 429 SlowDown from OSS: retried like xdpx.io retries it, within XDPX_OSS_RETRY_ATTEMPTS."""
    import logging

    import oss2
    import ossfs

    from xdpx.patches import ossfs_retry

    ossfs_retry.apply()
    monkeypatch.setattr(ossfs_retry, "BASE_DELAY", 0.001)
    monkeypatch.setenv("XDPX_OSS_RETRY_ATTEMPTS", "3")
    fs = ossfs.AioOSSFileSystem(endpoint=store_bucket.store.oss_endpoint, skip_instance_cache=True)
    path = f"{store_bucket.name}/t.bin"
    fs.pipe(path, b"payload")

    calls = _throttle_get_object(monkeypatch, fail=2)
    with caplog.at_level(logging.INFO, logger="xdpx.patches.ossfs_retry"):
        assert fs.cat(path) == b"payload"
    assert len(calls) == 3  # two throttled attempts, then the real read
    assert [r.getMessage().split(", retrying in")[0] for r in caplog.records] == [
        "OSS _cat_file: transient OSError, attempt 1/3",
        "OSS _cat_file: transient OSError, attempt 2/3",
    ]

    calls = _throttle_get_object(monkeypatch, fail=99)
    with pytest.raises(OSError) as err:
        fs.cat(path)
    assert len(calls) == 3  # XDPX_OSS_RETRY_ATTEMPTS, then the last error unchanged
    assert isinstance(err.value.__cause__, oss2.exceptions.ServerError)
    assert (err.value.__cause__.status, err.value.__cause__.code) == (429, "SlowDown")

    calls = _throttle_get_object(monkeypatch, fail=99, status=403, code="AccessDenied")
    with pytest.raises(OSError) as err:
        fs.cat(path)
    assert len(calls) == 1  # a real error: no retry
    assert err.value.__cause__.status == 403


@pytest.mark.integration
def test_ossfs_retry_rides_out_faults_and_gives_up_on_outage(store_bucket, monkeypatch):
    import ossfs

    from xdpx.patches import ossfs_retry

    ossfs_retry.apply()
    assert ossfs_retry.apply() is False  # idempotent
    store = store_bucket.store
    fs = ossfs.AioOSSFileSystem(endpoint=store.oss_endpoint, skip_instance_cache=True)
    root = store_bucket.name
    store.fail_rate = 0.3
    blobs = {f"{root}/d/{i}.bin": os.urandom(1000 + i) for i in range(12)}
    for path, data in blobs.items():
        fs.pipe(path, data)
    assert sorted(fs.find(f"{root}/d")) == sorted(blobs)
    assert all(fs.cat(path) == data for path, data in blobs.items())
    assert store.stats.faults >= 5  # faults really happened and were ridden out
    store.fail_rate = 0.0
    monkeypatch.setenv("XDPX_OSS_RETRY_ATTEMPTS", "2")
    store.down()
    with pytest.raises(OSError):
        fs.cat(f"{root}/d/0.bin")


@pytest.mark.e2e
def test_pth_line_leaves_xdpx_to_be_imported_from_sys_path(tmp_path):
    """After the .pth line, a checkout earlier on sys.path still provides ``xdpx``."""
    fake = tmp_path / "checkout" / "xdpx"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("WHERE = 'checkout'\n")
    code = f"{PTH_LINE}; import sys; sys.path.insert(0, {str(fake.parent)!r}); import xdpx; print(xdpx.WHERE)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout.strip()
    assert out == "checkout"


@pytest.mark.unit
def test_dvc_dir_upload_refuses_a_dir_that_lists_a_file_failed_earlier(monkeypatch):
    """dvc-data's own _do_transfer order, faked: dir A's files (one fails), then dir B, whose
    listing shares the failed file but whose bound files all went up."""
    import types

    from dvc_data.hashfile.hash_info import HashInfo

    from xdpx.patches import dvc_dir_upload

    monkeypatch.delenv(dvc_dir_upload.DISABLE_ENV, raising=False)
    shared, own_a, own_b = (HashInfo("md5", v) for v in ("a" * 32, "b" * 32, "c" * 32))
    dir_a, dir_b = HashInfo("md5", "d" * 32 + ".dir"), HashInfo("md5", "e" * 32 + ".dir")
    trees = {dir_a: [shared, own_a], dir_b: [shared, own_b]}
    uploaded = []

    def add(src, dest, hash_infos, **kwargs):
        uploaded.extend(hash_infos)
        return {h for h in hash_infos if h == shared}  # the shared file's upload fails

    def do_transfer(src, dest, **kwargs):
        failed = set(module._add(src, dest, {shared, own_a}))
        if not failed:
            failed |= module._add(src, dest, [dir_a])
        failed |= module._add(src, dest, {own_b})  # shared was bound to A only, as in dvc-data
        if not failed & {own_b}:
            failed |= module._add(src, dest, [dir_b])
        return failed

    def find_tree_by_obj_id(odbs, dir_hash):
        return [(None, None, oid) for oid in trees[dir_hash]]

    module = types.SimpleNamespace(
        _do_transfer=do_transfer, _add=add, find_tree_by_obj_id=find_tree_by_obj_id
    )
    odb = types.SimpleNamespace(fs=types.SimpleNamespace(protocol="local"))
    assert do_transfer(odb, odb) == {shared}  # unpatched: B's .dir goes up
    assert dir_b in uploaded
    uploaded.clear()
    assert dvc_dir_upload.apply(module) is True
    assert dvc_dir_upload.apply(module) is False  # idempotent
    assert module._do_transfer(odb, odb) == {shared, dir_b}
    assert dir_b not in uploaded and own_b in uploaded
    assert dvc_dir_upload._failed.get() is None  # the record lives for one transfer only

    def unreadable(odbs, dir_hash):
        raise OSError("remote read failed")

    module.find_tree_by_obj_id = unreadable  # the check never fails a push: DVC decides
    uploaded.clear()
    assert module._do_transfer(odb, odb) == {shared}
    assert dir_b in uploaded
    monkeypatch.setenv(dvc_dir_upload.DISABLE_ENV, "0")
    fresh = types.SimpleNamespace(
        _do_transfer=do_transfer, _add=add, find_tree_by_obj_id=find_tree_by_obj_id
    )
    assert dvc_dir_upload.apply(fresh) is False and fresh._add is add
