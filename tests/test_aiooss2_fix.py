"""xdpx/aiooss2_fix.py (aiooss2 issue #96): the patch, its no-op detection, and its .pth hook."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PTH_LINE = "import xdpx.aiooss2_fix; xdpx.aiooss2_fix.install()"

# Builds the upload body the way aiohttp does for aiooss2 (PAYLOAD_REGISTRY -> AsyncPayload).
PROBE = """
import sys
if sys.argv[1] == "install":
    import xdpx.aiooss2_fix as fix
    fix.install()
    assert "aiooss2" not in sys.modules, "install() must not import aiooss2"
from aiohttp.payload import PAYLOAD_REGISTRY
from aiooss2.adapter import SliceableAdapter
try:
    payload = PAYLOAD_REGISTRY.get(SliceableAdapter(b"abc"))
except TypeError as exc:
    print("BROKEN", exc)
else:
    import xdpx.aiooss2_fix as fix
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


def test_upload_body_cannot_be_built_without_the_fix():
    out = probe("install", fix_env="0")
    assert out.startswith("BROKEN") and "abstract method decode" in out, (
        f"{out!r}: aiooss2/aiohttp no longer show issue #96; if aiooss2 shipped PR #97, "
        "delete xdpx/aiooss2_fix.py, the .pth hook in setup.py and this test"
    )


def test_install_patches_on_import_and_apply_is_idempotent():
    # needed() is False after the patch, and a second apply() has nothing left to do
    assert probe("install") == "OK AsyncPayload False False"


def test_plain_interpreter_of_the_installed_wheel_is_patched(xdpx_site):
    """The .pth from the real wheel, processed by site, fixes a process that never imports xdpx."""
    launch = "import site, sys; site.addsitedir(sys.argv.pop(1)); exec(sys.argv.pop(1))"
    prefix = [sys.executable, "-c", launch, str(xdpx_site)]
    assert probe("plain", prefix=prefix) == "OK AsyncPayload False False"
    assert probe("plain", prefix=prefix, fix_env="0").startswith("BROKEN")


def test_apply_patches_only_while_decode_is_abstract():
    from aiohttp.payload import Payload

    from xdpx import aiooss2_fix

    class Broken(Payload):  # aiooss2 <= 0.2.11 with aiohttp >= 3.10.6
        async def write(self, writer):
            pass

    class Fixed(Broken):  # what aiooss2 looks like once PR #97 is released
        def decode(self, encoding="utf-8", errors="strict"):
            return "fixed upstream"

    assert aiooss2_fix.apply(Fixed) is False and Fixed(b"x").decode() == "fixed upstream"
    with pytest.raises(TypeError, match="abstract method decode"):
        Broken(b"x")
    assert aiooss2_fix.needed(Broken) and aiooss2_fix.apply(Broken) is True
    assert not aiooss2_fix.needed(Broken) and aiooss2_fix.apply(Broken) is False
    with pytest.raises(TypeError, match="Unable to decode"):
        Broken(b"x").decode()


def test_disable_env_turns_apply_into_a_no_op(monkeypatch):
    from aiohttp.payload import Payload

    from xdpx import aiooss2_fix

    class Broken(Payload):
        async def write(self, writer):
            pass

    monkeypatch.setenv("XDPX_AIOOSS2_FIX", "0")
    assert aiooss2_fix.apply(Broken) is False and aiooss2_fix.needed(Broken)


@pytest.mark.parametrize("kind", ["wheel", "editable"])
def test_both_wheels_install_the_pth_hook(xdpx_wheels, kind):
    with zipfile.ZipFile(xdpx_wheels[kind]) as whl:
        names = whl.namelist()
        assert "xdpx-aiooss2-fix.pth" in names  # wheel root = site-packages
        assert whl.read("xdpx-aiooss2-fix.pth").decode().strip() == PTH_LINE
        record = whl.read(next(n for n in names if n.endswith(".dist-info/RECORD"))).decode()
    assert "xdpx-aiooss2-fix.pth," in record  # so pip uninstall removes it
    if kind == "editable":  # processed after the editable finder's .pth, so xdpx imports
        assert sorted(n for n in names if n.endswith(".pth"))[-1] == "xdpx-aiooss2-fix.pth"
