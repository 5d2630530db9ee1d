"""One notion of a transient remote error, and the tenacity retries built on it.

Two places retry remote storage calls, with their own bounds but this one rule for *what* is
worth retrying: :mod:`xdpx.io` (whole-file operations through fsspec; ``XDPX_IO_*`` knobs)
and :mod:`xdpx.patches.ossfs_retry` (ossfs's async methods in every process, ``dvc`` included;
``XDPX_OSS_RETRY*`` knobs). Both build their retry loop with :func:`retrying`.

Imports only the standard library and tenacity (the OSS patch loads it when ossfs is imported):
errors of botocore, aiohttp, requests/urllib3, http.client, fsspec and oss2 are recognised by
class name, HTTP status, error code and errno, never by importing those libraries.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from typing import NoReturn

import tenacity

__all__ = ["is_transient", "retrying"]

#: Exception class names (anywhere in the MRO) that mean "the connection failed, try again":
#: botocore, aiohttp, requests/urllib3, http.client, fsspec and oss2 (``RequestError``).
TRANSIENT_CLASSES = frozenset(
    {
        "EndpointConnectionError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectTimeoutError",
        "HTTPClientError",
        "ResponseStreamingError",
        "IncompleteReadError",
        "ClientConnectionError",
        "ClientPayloadError",
        "ServerDisconnectedError",
        "ServerTimeoutError",
        "ChunkedEncodingError",
        "ProtocolError",
        "NewConnectionError",
        "ReadTimeout",
        "ConnectTimeout",
        "IncompleteRead",
        "RemoteDisconnected",
        "FSTimeoutError",
        "RequestError",
    }
)
#: Error codes of throttling / temporary unavailability (S3 and OSS), whatever the status.
TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "RequestTimeout",
        "ServiceUnavailable",
        "InternalError",
        "ServerBusy",
        "QpsLimitExceeded",
    }
)
#: errno values of a failed connection or a busy remote.
TRANSIENT_ERRNOS = frozenset(
    getattr(errno, n)
    for n in (
        "ECONNRESET",
        "ECONNREFUSED",
        "ECONNABORTED",
        "ETIMEDOUT",
        "EPIPE",
        "EBUSY",
        "EREMOTEIO",
    )
    if hasattr(errno, n)
)
#: Errors that are never transient, whatever caused them.
PERMANENT = (
    FileNotFoundError,
    PermissionError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
)


def _http_status_and_code(exc: BaseException) -> tuple[int | None, str | None]:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return (int(status) if status else None), response.get("Error", {}).get("Code")
    status = getattr(exc, "status", None)  # oss2 OssError, aiohttp ClientResponseError
    if isinstance(status, int) and status > 0:
        code = getattr(exc, "code", None) or (getattr(exc, "details", None) or {}).get("Code")
        return status, code
    return None, None


def is_transient(exc: BaseException) -> bool:
    """True when ``exc`` (or an exception in its cause/context chain) is worth retrying.

    Transient: HTTP 5xx or 429, throttling codes (``SlowDown``, ``Throttling``,
    ``ServerBusy``, ... see :data:`TRANSIENT_CODES`) whatever the status, connection
    reset/refused/aborted and timeouts (``ConnectionError``, ``TimeoutError``, the client
    libraries' connection errors in :data:`TRANSIENT_CLASSES`, oss2's ``RequestError``, an
    ``OSError`` with an errno in :data:`TRANSIENT_ERRNOS`), truncated responses. The chain is
    followed (``__cause__``, else ``__context__``) because s3fs and ossfs re-raise store errors
    as ``OSError(EIO)`` from the original.

    Never transient: ``FileNotFoundError``, ``PermissionError`` and the other "this path is
    wrong" errors of :data:`PERMANENT` (whatever caused them), every other 4xx (404, 403,
    signature and auth errors, ...), and ``BaseException`` that is not an ``Exception``
    (``KeyboardInterrupt``, ``asyncio.CancelledError``).
    """
    if not isinstance(exc, Exception) or isinstance(exc, PERMANENT):
        return False
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, ConnectionError | TimeoutError | asyncio.TimeoutError):
            return True
        if any(c.__name__ in TRANSIENT_CLASSES for c in type(link).__mro__):
            return True
        status, code = _http_status_and_code(link)
        if status is not None or code is not None:
            return (status is not None and (status >= 500 or status == 429)) or (
                code in TRANSIENT_CODES
            )
        if isinstance(link, OSError) and link.errno in TRANSIENT_ERRNOS:
            return True
        link = link.__cause__ or link.__context__
    return False


def retrying(
    *,
    attempts: int,
    delay: Callable[[int], float],
    deadline: float | None = None,
    on_retry: Callable[[BaseException, int, float], None] | None = None,
    give_up: Callable[[BaseException, int, float], NoReturn] | None = None,
    asynchronous: bool = False,
) -> tenacity.BaseRetrying:
    """A tenacity controller that retries :func:`is_transient` errors and nothing else.

    Call it with the operation (``controller(fn, *args)``; ``await`` it when
    ``asynchronous``). The operation must be safe to run again after a failure.

    Args:
        attempts: attempts in all, the first one included (at least 1).
        delay: seconds to sleep after failed attempt number ``n`` (1-based), ``delay(n)``.
        deadline: if given, no new attempt starts once the time since the first attempt plus
            the next sleep would reach this many seconds.
        on_retry: called as ``on_retry(error, n, sleep)`` before each sleep (for logging).
        give_up: called as ``give_up(error, n, elapsed_seconds)`` when a transient error
            outlived the attempts or the deadline; it raises the caller's error. Without it,
            the last error is raised unchanged.
        asynchronous: build a :class:`tenacity.AsyncRetrying` (sleeps with ``asyncio.sleep``).

    Returns:
        The controller (a fresh one per call: its statistics are per operation).

    Raises:
        Through the controller: a non-transient error at once, unchanged; after the last
        attempt, what ``give_up`` raises, else the last transient error unchanged.
    """
    stop = tenacity.stop_after_attempt(max(1, attempts))
    if deadline is not None:
        stop = stop | tenacity.stop_before_delay(deadline)
    options: dict = {}
    if on_retry is not None:
        options["before_sleep"] = lambda state: on_retry(
            state.outcome.exception(), state.attempt_number, state.upcoming_sleep
        )
    if give_up is not None:
        options["retry_error_callback"] = lambda state: give_up(
            state.outcome.exception(), state.attempt_number, state.seconds_since_start or 0.0
        )
    controller = tenacity.AsyncRetrying if asynchronous else tenacity.Retrying
    return controller(
        retry=tenacity.retry_if_exception(is_transient),
        stop=stop,
        wait=lambda state: delay(state.attempt_number),
        reraise=True,
        **options,
    )
