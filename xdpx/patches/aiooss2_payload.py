"""aiooss2's upload body (``AsyncPayload``) under aiohttp >= 3.10: two fixes, dvc-oss uploads.

1. ``decode`` (aiooss2 issue #96). aiohttp 3.10.6 made ``Payload.decode`` abstract
   (https://github.com/aio-libs/aiohttp/pull/6485); aiooss2 (<= 0.2.11) does not define it, so
   every upload through aiooss2 -- ossfs's ``AioOSSFileSystem``, hence ``dvc push`` to an
   ``oss://`` remote -- fails with ``TypeError: Can't instantiate abstract class AsyncPayload
   with abstract method decode``. Upstream: https://github.com/karajan1001/aiooss2/issues/96,
   fix https://github.com/karajan1001/aiooss2/pull/97 (open, unreleased), also
   https://github.com/fsspec/ossfs/issues/167. Same fix as the PR: ``decode`` raises
   ``TypeError`` (a stream cannot be decoded synchronously; aiohttp's ``AsyncIterablePayload``
   does the same), then ``abc.update_abstractmethods``.
2. ``consumed`` (no upstream issue yet; found with the fault mode of tests/objstore.py). When a
   reused keep-alive connection drops, aiohttp resends an idempotent request (PUT) with the same
   payload unless ``payload.consumed`` (aiohttp >= 3.12; see aiohttp PR #13330). AsyncPayload
   never sets it, so the retry streams an exhausted adapter: an EMPTY object is stored under
   the key and the client only sees a CRC mismatch -- a later ``dvc push`` then skips it as
   present. The fix marks the payload consumed when ``write`` starts, as aiohttp's own
   ``AsyncIterablePayload`` does, so aiohttp raises instead and the caller's retry (see
   ossfs_retry) re-reads the source.

When: each part is applied only while needed -- ``decode`` still abstract, ``write`` not
setting ``_consumed`` -- so once aiooss2 ships fixes this does nothing and can be deleted.
``apply()`` is idempotent.

How: ``xdpx.patches.install()`` (run at interpreter start by the ``xdpx-patches.pth`` file
that installing xdpx adds to site-packages) calls ``apply_to_module`` right after
``aiooss2.adapter`` is first imported, so a plain ``dvc push`` gets it too. Set
``XDPX_AIOOSS2_FIX=0`` to disable it (tests use that to show the failure it prevents).
"""

from __future__ import annotations

import abc
import functools

from xdpx.patches import switched_off

DISABLE_ENV = "XDPX_AIOOSS2_FIX"
UPSTREAM_ISSUE = "https://github.com/karajan1001/aiooss2/issues/96"
UPSTREAM_PR = "https://github.com/karajan1001/aiooss2/pull/97"


def _decode(self, encoding: str = "utf-8", errors: str = "strict") -> str:
    """``Payload.decode`` for a streamed upload body: not possible synchronously (aiooss2 PR #97).

    Raises:
        TypeError: always, as aiohttp's ``AsyncIterablePayload.decode`` does for unread streams.
    """
    raise TypeError("Unable to decode: aiooss2 AsyncPayload is a stream (aiooss2 issue #96)")


def _consuming(write):
    """Wrap ``AsyncPayload.write``: mark the payload consumed before streaming (fix 2)."""

    @functools.wraps(write)
    async def consuming_write(self, writer, *args, **kwargs):
        self._consumed = True  # an adapter is read once: aiohttp must never replay it
        return await write(self, writer, *args, **kwargs)

    return consuming_write


def disabled() -> bool:
    """True when ``XDPX_AIOOSS2_FIX=0`` (or ``false``/``no``/``off``) is set."""
    return switched_off(DISABLE_ENV)


def _decode_missing(cls: type) -> bool:
    return "decode" in getattr(cls, "__abstractmethods__", frozenset())


def _consumed_unmarked(cls: type) -> bool:
    code = getattr(getattr(cls, "write", None), "__code__", None)
    return code is not None and "_consumed" not in code.co_names


def needed(cls: type | None = None) -> bool:
    """True while aiooss2's ``AsyncPayload`` (or ``cls``) lacks either fix.

    Raises:
        ImportError: when ``cls`` is not given and aiooss2 is not installed.
    """
    if cls is None:
        from aiooss2.adapter import AsyncPayload as cls
    return _decode_missing(cls) or _consumed_unmarked(cls)


def apply(cls: type | None = None) -> bool:
    """Give aiooss2's ``AsyncPayload`` (or ``cls``) what it lacks of the two fixes; idempotent.

    Returns:
        True if this call changed the class; False if there was nothing to do (fixed upstream,
        already patched) or it is disabled (``XDPX_AIOOSS2_FIX=0``).

    Raises:
        ImportError: when ``cls`` is not given and aiooss2 is not installed.
    """
    if disabled():
        return False
    if cls is None:
        from aiooss2.adapter import AsyncPayload as cls
    changed = False
    if _decode_missing(cls):
        cls.decode = _decode
        abc.update_abstractmethods(cls)
        changed = True
    if _consumed_unmarked(cls):
        cls.write = _consuming(cls.write)
        changed = True
    return changed


def apply_to_module(module) -> bool:
    """Post-import hook for ``aiooss2.adapter`` (see xdpx.patches): ``apply`` to its AsyncPayload."""
    return apply(module.AsyncPayload)
