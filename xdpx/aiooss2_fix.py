"""The one place xdpx patches a dependency: aiooss2's ``AsyncPayload`` (dvc-oss uploads).

Why: aiohttp 3.10.6 made ``aiohttp.payload.Payload.decode`` abstract
(https://github.com/aio-libs/aiohttp/pull/6485). aiooss2 (<= 0.2.11) registers its own
``AsyncPayload`` for upload bodies without defining ``decode``, so every upload through
aiooss2 -- ossfs's ``AioOSSFileSystem``, hence ``dvc push`` to an ``oss://`` remote with
dvc-oss -- fails with ``TypeError: Can't instantiate abstract class AsyncPayload with abstract
method decode``. Upstream: issue https://github.com/karajan1001/aiooss2/issues/96, fix
https://github.com/karajan1001/aiooss2/pull/97 (open, unreleased); also
https://github.com/fsspec/ossfs/issues/167.

What: the same fix as the upstream PR: a ``decode`` that raises ``TypeError`` (a streamed
body cannot be decoded synchronously; aiohttp's own ``AsyncIterablePayload`` does the same),
then ``abc.update_abstractmethods`` so the class can be instantiated. Nothing else changes.

When: ``apply()`` patches only while ``decode`` is still abstract on ``AsyncPayload``; once
aiooss2 ships the fix (or with aiohttp < 3.10.6) it detects that and does nothing, so this
module can be deleted after the next aiooss2 release. ``apply()`` is idempotent.

How it reaches a plain ``dvc push``: installing xdpx (``pip install .`` or ``pip install -e .``)
puts ``xdpx-aiooss2-fix.pth`` into site-packages (see setup.py). Python runs its one line,
``install()``, at interpreter start; that only adds a post-import hook (nothing is imported
then), which calls ``apply()`` right after ``aiooss2.adapter`` is first imported, in any process
of that environment: ``dvc``, ``python -m stages.*``, Prefect workers. DVC has no plugin hook
of its own, so a ``.pth`` file is the one mechanism that fixes the user's own ``dvc push``.
Set ``XDPX_AIOOSS2_FIX=0`` to disable it (tests use that to show the failure it prevents).
"""

from __future__ import annotations

import abc
import os
import sys

TARGET = "aiooss2.adapter"
DISABLE_ENV = "XDPX_AIOOSS2_FIX"
UPSTREAM_ISSUE = "https://github.com/karajan1001/aiooss2/issues/96"
UPSTREAM_PR = "https://github.com/karajan1001/aiooss2/pull/97"


def _decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
    """``Payload.decode`` for a streamed upload body: not possible synchronously (aiooss2 PR #97).

    Raises:
        TypeError: always, as aiohttp's ``AsyncIterablePayload.decode`` does for unread streams.
    """
    raise TypeError("Unable to decode: aiooss2 AsyncPayload is a stream (aiooss2 issue #96)")


def disabled() -> bool:
    """True when ``XDPX_AIOOSS2_FIX=0`` (or ``false``/``no``/``off``) is set."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("0", "false", "no", "off")


def needed(cls: type | None = None) -> bool:
    """True while ``decode`` is abstract on aiooss2's ``AsyncPayload`` (or on ``cls``).

    Raises:
        ImportError: when ``cls`` is not given and aiooss2 is not installed.
    """
    if cls is None:
        from aiooss2.adapter import AsyncPayload as cls
    return "decode" in getattr(cls, "__abstractmethods__", frozenset())


def apply(cls: type | None = None) -> bool:
    """Give aiooss2's ``AsyncPayload`` (or ``cls``) the missing ``decode``; idempotent.

    Returns:
        True if the class was patched by this call; False if there was nothing to do (fixed
        upstream, already patched, aiohttp without the abstract method) or it is disabled.

    Raises:
        ImportError: when ``cls`` is not given and aiooss2 is not installed.
    """
    if disabled():
        return False
    if cls is None:
        from aiooss2.adapter import AsyncPayload as cls
    if not needed(cls):
        return False
    cls.decode = _decode
    abc.update_abstractmethods(cls)
    return True


class _PatchingLoader:
    """Wraps the loader of ``aiooss2.adapter``: executes the module, then ``apply()``."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        apply(module.AsyncPayload)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._loader, name)


class _AfterImportFinder:
    """Meta path finder that only intercepts ``aiooss2.adapter`` to wrap its loader."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def install() -> None:
    """Arrange for ``apply()`` to run when aiooss2 is imported (now, if it already is).

    Cheap enough for interpreter start (stdlib only, imports nothing else); idempotent.
    Called by the ``xdpx-aiooss2-fix.pth`` line that installing xdpx puts in site-packages.
    """
    if disabled():
        return
    if TARGET in sys.modules:
        apply(sys.modules[TARGET].AsyncPayload)
        return
    if not any(isinstance(f, _AfterImportFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())
