"""Retries with backoff for ossfs's async OSS filesystem (what dvc-oss uses).

Why: ossfs (2025.5.0) and aiooss2 (0.2.11) retry nothing but 5xx pages of a listing, and ossfs
has no option for it, so one transient HTTP 5xx, connection reset or refused connection aborts
a whole ``dvc push``/``dvc pull`` to an ``oss://`` remote ("unexpected error"). dvc-s3 does not
have the problem: botocore retries. Re-running ``dvc push`` does not help under a steady error
rate: every run starts with existence checks and listings, and the first error ends it.

What: the ``AioOSSFileSystem`` methods below are retried as a whole when the error is transient
by :func:`xdpx.retry.is_transient`, the rule :mod:`xdpx.io` uses too (HTTP 5xx and 429,
throttling codes such as ``SlowDown``/``ServerBusy``, connection resets/refusals, timeouts;
never 404, 403 or another 4xx): up to ``XDPX_OSS_RETRY_ATTEMPTS`` attempts (default 8),
sleeping ``min(2 s, 0.1 s * 2**n)`` scaled by a jitter in [0.5, 1] between them (AWS's
"exponential backoff and jitter"), in a tenacity loop (:func:`xdpx.retry.retrying`); each
retry is logged at INFO, and the last error is raised unchanged once the attempts are spent.
Only the outermost patched call retries (a context variable marks it),
so nested calls do not multiply attempts. Every patched method is safe to repeat: reads, and
uploads that re-read their source (``put_object_from_file``, ``resumable_upload``, bytes for
``put_object``/``upload_part``); a download rewrites its target file from the start.

Not covered: a stream already returned to the caller (``open(...).read()`` on an
``AioOSSFile``) that breaks mid-read. Off with ``XDPX_OSS_RETRY=0``; applied by
``xdpx.patches.install()`` when ``ossfs.async_oss`` is imported. Remove once ossfs retries.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import os
import random

from xdpx import retry as shared
from xdpx.patches import switched_off
from xdpx.retry import is_transient

logger = logging.getLogger(__name__)

__all__ = ["apply", "apply_to_module", "attempts", "backoff", "disabled", "is_transient"]

DISABLE_ENV = "XDPX_OSS_RETRY"
ATTEMPTS_ENV = "XDPX_OSS_RETRY_ATTEMPTS"
DEFAULT_ATTEMPTS = 8
BASE_DELAY = 0.1  # seconds
MAX_DELAY = 2.0  # seconds
#: AioOSSFileSystem methods retried as a whole (each one is safe to repeat)
METHODS = ("_call_oss", "_ls_dir", "_info", "_cat_file", "_get_object")
_MARK = "__xdpx_retry__"
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("xdpx_oss_retry", default=False)


def disabled() -> bool:
    """True when ``XDPX_OSS_RETRY=0`` (or ``false``/``no``/``off``) is set."""
    return switched_off(DISABLE_ENV)


def attempts() -> int:
    """Attempts per call, from ``XDPX_OSS_RETRY_ATTEMPTS`` (default 8; at least 1).

    Raises:
        ValueError: naming the variable when it is not an integer.
    """
    raw = os.environ.get(ATTEMPTS_ENV, "").strip()
    try:
        return max(1, int(raw)) if raw else DEFAULT_ATTEMPTS
    except ValueError:
        raise ValueError(f"{ATTEMPTS_ENV}={raw!r} is not an integer") from None


def backoff(attempt: int) -> float:
    """Seconds to sleep after failed attempt number ``attempt`` (1-based), jittered.

    ``min(MAX_DELAY, BASE_DELAY * 2**(attempt - 1))`` (2 s, 0.1 s) times U(0.5, 1).
    """
    return min(MAX_DELAY, BASE_DELAY * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


def _with_retries(func):
    """``func`` (an async method) retried on transient errors; nested calls run once."""

    @functools.wraps(func)
    async def with_retries(*args, **kwargs):
        if _inside.get():
            return await func(*args, **kwargs)
        token = _inside.set(True)
        try:
            limit = attempts()

            def on_retry(error: BaseException, attempt: int, sleep: float) -> None:
                logger.info(
                    "OSS %s: transient %s, attempt %d/%d, retrying in %.2f s",
                    func.__name__,
                    type(error).__name__,
                    attempt,
                    limit,
                    sleep,
                )

            controller = shared.retrying(
                attempts=limit, delay=backoff, on_retry=on_retry, asynchronous=True
            )
            return await controller(func, *args, **kwargs)
        finally:
            _inside.reset(token)

    setattr(with_retries, _MARK, True)
    return with_retries


def apply(cls: type | None = None) -> bool:
    """Wrap ``METHODS`` of ossfs's ``AioOSSFileSystem`` (or ``cls``) with retries; idempotent.

    Returns:
        True if this call patched the class; False if already patched or disabled.

    Raises:
        ImportError: when ``cls`` is not given and ossfs is not installed.
    """
    if disabled():
        return False
    if cls is None:
        from ossfs.async_oss import AioOSSFileSystem as cls
    if getattr(cls._call_oss, _MARK, False):
        return False
    for name in METHODS:
        setattr(cls, name, _with_retries(getattr(cls, name)))
    return True


def apply_to_module(module) -> bool:
    """Post-import hook for ``ossfs.async_oss`` (see xdpx.patches)."""
    return apply(module.AioOSSFileSystem)
