"""Where a path lives and how remote IO is made reliable, for :mod:`xdpx.io`: filesystems by
URL (local, ``s3://``, ``oss://``, ``memory://``) with credentials from the environment or
an ossutil profile (never in messages: :func:`_redact`), retries of transient errors
(:class:`RetryPolicy`, :func:`retry`) and the stage name that prefixes remote IO errors
(:func:`stage`). :mod:`xdpx.io` re-exports every name."""

from __future__ import annotations

import configparser
import contextlib
import contextvars
import hashlib
import logging
import os
import random
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import fsspec
from fsspec.core import split_protocol, url_to_fs

from xdpx.errors import RemoteIOError
from xdpx.retry import retrying

log = logging.getLogger("xdpx.io")
_FILESYSTEMS: dict[tuple[str, str], fsspec.AbstractFileSystem] = {}
_SECRETS: set[str] = set()

T = TypeVar("T")


#: Protocols that take credentials from the environment / a profile file.
CREDENTIAL_PROTOCOLS = ("s3", "oss")


# ---------------------------------------------------------------- stage name (for errors)
_STAGE: contextvars.ContextVar[str | None] = contextvars.ContextVar("xdpx_stage", default=None)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    """Name the stage running inside this block (or decorated function) in remote IO errors.

    ``@io.stage("train")`` on a stage's ``run`` makes every :class:`RemoteIOError`
    raised under it start with ``train: ``.
    """
    token = _STAGE.set(name)
    try:
        yield
    finally:
        _STAGE.reset(token)


# ---------------------------------------------------------------- retries
@dataclass(frozen=True)
class RetryPolicy:
    """Bounds of the retries of one remote operation (see the module docstring).

    Attributes:
        retries: retries after the first attempt.
        backoff: base of the exponential backoff (seconds).
        backoff_max: cap of one sleep (seconds).
        deadline: no attempt starts later than this after the first one (seconds).
        timeout: connect/read timeout of one S3 request (seconds), given to botocore.
    """

    retries: int = 5
    backoff: float = 0.5
    backoff_max: float = 20.0
    deadline: float = 300.0
    timeout: float = 60.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The policy from ``XDPX_IO_*`` environment variables (defaults above).

        Raises:
            ValueError: a variable is not a number or is negative (names it).
        """
        values: dict[str, Any] = {}
        for name, key, kind in (
            ("XDPX_IO_RETRIES", "retries", int),
            ("XDPX_IO_BACKOFF", "backoff", float),
            ("XDPX_IO_BACKOFF_MAX", "backoff_max", float),
            ("XDPX_IO_DEADLINE", "deadline", float),
            ("XDPX_IO_TIMEOUT", "timeout", float),
        ):
            raw = os.environ.get(name)
            if raw is None or raw == "":
                continue
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r}: expected a {kind.__name__}") from None
            if value < 0:
                raise ValueError(f"{name}={raw!r}: must be >= 0")
            values[key] = value
        return cls(**values)

    def delay(self, retry: int) -> float:
        """Seconds to sleep before retry number ``retry`` (1-based): full jitter."""
        return random.uniform(0.0, min(self.backoff_max, self.backoff * 2 ** (retry - 1)))


def retry(op: str, url: str, fn: Callable[[], T], policy: RetryPolicy | None = None) -> T:
    """Run ``fn()`` (one whole, idempotent operation on ``url``), retrying transient errors.

    What is retried is :func:`xdpx.retry.is_transient` (HTTP 5xx and 429, throttling codes
    such as ``SlowDown``, connection resets/refusals and timeouts), the same rule as the OSS
    patch's. The loop is tenacity's (:func:`xdpx.retry.retrying`): at most
    ``policy.retries`` retries, the sleep before retry k drawn by :meth:`RetryPolicy.delay`,
    and no retry that would start past ``policy.deadline``; each retry is logged at INFO.

    Args:
        op: what ``fn`` does, for messages (``"read"``, ``"write"``, ``"list"``, ...).
        url: the path it works on (named in the error).
        fn: the operation; it must be safe to run again after a failure.
        policy: bounds; default :meth:`RetryPolicy.from_env` (``XDPX_IO_*``, see the module
            docstring for names and defaults).

    Returns:
        What ``fn`` returns.

    Raises:
        RemoteIOError: a transient error persisted through every attempt or past the
            deadline; the message names the stage (if known), ``op``, ``url``, the attempts
            and the last error (credentials masked).
        Exception: a non-transient error from ``fn``, unchanged.
    """
    policy = policy or RetryPolicy.from_env()

    def on_retry(error: BaseException, attempt: int, sleep: float) -> None:
        log.info(
            "%s %s: %s; retry %d/%d in %.2f s",
            op,
            url,
            _redact(f"{type(error).__name__}: {_first_line(error)}"),
            attempt,
            policy.retries,
            sleep,
        )

    def give_up(error: BaseException, attempt: int, elapsed: float) -> NoReturn:
        where = _STAGE.get()
        message = _redact(
            f"{where + ': ' if where else ''}{op} {url} failed after {attempt} "
            f"attempt{'s' if attempt > 1 else ''} in {elapsed:.1f} s: "
            f"{type(error).__name__}: {_first_line(error)}"
        )
        err = RemoteIOError(message)
        err.url, err.operation, err.stage = url, op, where
        raise err from None

    controller = retrying(
        attempts=policy.retries + 1,
        delay=policy.delay,
        deadline=policy.deadline,
        on_retry=on_retry,
        give_up=give_up,
    )
    return controller(fn)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or repr(exc)
    return text.splitlines()[0][:500]


# ---------------------------------------------------------------- credentials
@dataclass(frozen=True)
class _Settings:
    """Storage options of one protocol; ``repr`` shows no value (credentials inside)."""

    protocol: str
    options: dict[str, Any] = field(repr=False, compare=False)
    secrets: tuple[str, ...] = field(repr=False, compare=False)
    fingerprint: str = field(repr=False)


_LOCK = threading.Lock()


_THREAD = threading.local()


def _redact(text: str) -> str:
    """``text`` with every credential value xdpx has seen (env, profile) replaced by ``***``."""
    values = set(_SECRETS)
    for name in (
        "OSS_ACCESS_KEY_ID",
        "OSS_ACCESS_KEY_SECRET",
        "OSS_SESSION_TOKEN",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ):
        if os.environ.get(name):
            values.add(os.environ[name])
    for value in sorted(values, key=len, reverse=True):
        if len(value) >= 4:
            text = text.replace(value, "***")
    return text


def _ossutil_profile() -> dict[str, str]:
    """Settings of the ossutil profile in use; keys normalised (``accesskeyid``, ``endpoint``, ...).

    File: ``OSSUTIL_CONFIG_FILE`` or ``~/.ossutilconfig`` (INI). Section: ``OSSUTIL_PROFILE``
    (``[profile NAME]`` or ``[NAME]``), else ``[default]``, else ossutil 1.x's ``[Credentials]``.
    Key names are case-insensitive and may use ``-``/``_`` (``access-key-id``, ``accessKeyID``).

    Raises:
        ValueError: the file cannot be parsed, or the requested profile is missing.
    """
    path = os.path.expanduser(os.environ.get("OSSUTIL_CONFIG_FILE") or "~/.ossutilconfig")
    if not os.path.isfile(path):
        return {}
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except configparser.Error as e:
        raise ValueError(f"{path}: not a valid ossutil config file ({type(e).__name__})") from None
    sections = {s.lower(): s for s in parser.sections()}
    wanted = os.environ.get("OSSUTIL_PROFILE")
    names = (
        [f"profile {wanted}", wanted] if wanted else ["default", "profile default", "credentials"]
    )
    for name in names:
        if name and name.lower() in sections:
            items = parser[sections[name.lower()]]
            return {
                k.replace("-", "").replace("_", "").lower(): v.strip() for k, v in items.items()
            }
    if wanted:
        raise ValueError(f"{path}: no profile {wanted!r} (OSSUTIL_PROFILE)")
    return {}


def _oss_settings() -> tuple[dict[str, Any], tuple[str, ...]]:
    env = os.environ
    complete = env.get("OSS_ACCESS_KEY_ID") and env.get("OSS_ACCESS_KEY_SECRET")
    complete = complete and (env.get("OSS_ENDPOINT") or env.get("OSS_REGION"))
    profile = {} if complete else _ossutil_profile()  # the environment wins, value by value
    key = env.get("OSS_ACCESS_KEY_ID") or profile.get("accesskeyid")
    secret = env.get("OSS_ACCESS_KEY_SECRET") or profile.get("accesskeysecret")
    token = (
        env.get("OSS_SESSION_TOKEN")
        or env.get("OSS_SECURITY_TOKEN")
        or profile.get("ststoken")
        or profile.get("sessiontoken")
    )
    endpoint = env.get("OSS_ENDPOINT") or profile.get("endpoint")
    region = env.get("OSS_REGION") or profile.get("region")
    if not endpoint and region:
        endpoint = f"https://oss-{region}.aliyuncs.com"
    if not endpoint:
        raise ValueError(
            "oss:// paths need an endpoint: set OSS_ENDPOINT (e.g. https://oss-cn-hangzhou.aliyuncs.com) "
            "or OSS_REGION, or endpoint= in ~/.ossutilconfig"
        )
    options: dict[str, Any] = {"endpoint": endpoint}
    if key and secret:
        options.update(key=key, secret=secret)
        if token:
            options["token"] = token
    return options, tuple(v for v in (key, secret, token) if v)


def _s3_settings(timeout: float) -> tuple[dict[str, Any], tuple[str, ...]]:
    env = os.environ
    options: dict[str, Any] = {
        "config_kwargs": {
            "retries": {"total_max_attempts": 1},  # xdpx.io retries whole operations
            "connect_timeout": timeout,
            "read_timeout": timeout,
        }
    }
    key, secret, token = (
        env.get("AWS_ACCESS_KEY_ID"),
        env.get("AWS_SECRET_ACCESS_KEY"),
        env.get("AWS_SESSION_TOKEN"),
    )
    if key and secret:
        options.update(key=key, secret=secret)
        if token:
            options["token"] = token
    elif env.get("AWS_PROFILE"):
        options["profile"] = env["AWS_PROFILE"]
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint_url"] = endpoint
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        options["client_kwargs"] = {"region_name": region}
    return options, tuple(v for v in (key, secret, token) if v)


def _settings(protocol: str) -> _Settings:
    timeout = RetryPolicy.from_env().timeout
    if protocol == "oss":
        options, secrets = _oss_settings()
    else:
        options, secrets = _s3_settings(timeout)
    digest = hashlib.sha256(repr(sorted(options.items())).encode()).hexdigest()
    return _Settings(protocol, options, secrets, digest)


def _remote_fs(protocol: str) -> fsspec.AbstractFileSystem:
    """The cached filesystem of ``protocol`` (``s3`` or ``oss``) for the current settings.

    s3fs runs without a listings cache (another writer's objects show at once). ossfs
    needs its listings cache internally, so it gets one instance per thread whose cache
    :func:`_call` clears before every attempt.
    """
    settings = _settings(protocol)
    if protocol == "oss":  # one per thread (freed with it): ossfs's listing cache is not shared
        cache = _THREAD.__dict__.setdefault("filesystems", {})
    else:
        cache = _FILESYSTEMS
    with _LOCK:
        fs = cache.get((protocol, settings.fingerprint))
        if fs is None:
            _SECRETS.update(settings.secrets)
            cls = fsspec.get_filesystem_class(protocol)
            if protocol == "s3":
                fs = cls(**settings.options, skip_instance_cache=True, use_listings_cache=False)
                fs.retries = 1  # s3fs's own retry loop; xdpx.io retries whole operations
            else:
                fs = cls(**settings.options, skip_instance_cache=True)
            cache[(protocol, settings.fingerprint)] = fs
    return fs


def _check_url(path: str) -> None:
    protocol, rest = split_protocol(path)
    if protocol in CREDENTIAL_PROTOCOLS or protocol == "s3a":
        netloc = rest.split("/", 1)[0]
        if "@" in netloc:
            raise ValueError(
                f"{protocol}://***@{netloc.rsplit('@', 1)[1]}/...: credentials in a URL are refused "
                "(they would end up in params dumps and logs); set them in the environment or "
                "a profile file (see docs/remote-storage.md, 'Remote paths')"
            )


def fs_of(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem of ``path`` and the path inside it.

    ``oss://`` and ``s3://`` get the cached, credentialed filesystem of this module
    (see the module docstring); other URLs go through ``fsspec.core.url_to_fs``.

    Raises:
        ValueError: a URL with credentials in it, or ``oss://`` without an endpoint.
    """
    path = str(path)
    protocol, _ = split_protocol(path)
    if protocol in ("s3", "s3a", "oss"):
        _check_url(path)
        fs = _remote_fs("oss" if protocol == "oss" else "s3")
        return fs, fs._strip_protocol(path)
    return url_to_fs(path)


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    return fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)


def is_local(path: str) -> bool:
    """True for plain paths and ``file://`` URLs."""
    protocol, _ = split_protocol(str(path))
    return protocol in (None, "file", "local")


def is_remote(path: str) -> bool:
    """True for object-store URLs (anything but local paths and ``memory://``): retried IO."""
    protocol, _ = split_protocol(str(path))
    return protocol not in (None, "file", "local", "memory")


def _call(op: str, path: str, fn: Callable[[], T]) -> T:
    """``fn()``, retried when ``path`` is remote; local and ``memory://`` IO is not retried.

    Each remote attempt starts with the filesystem's listing cache cleared, so it sees
    the store as it is now (other writers, earlier failed attempts).
    """
    if not is_remote(path):
        return fn()
    fs, _ = fs_of(path)

    def attempt() -> T:
        fs.invalidate_cache()
        return fn()

    return retry(op, str(path), attempt)


def _url(path: str, name: str) -> str:
    """``name`` (a path inside the filesystem of ``path``) in the form of ``path``."""
    protocol, _ = split_protocol(str(path))
    if protocol is None:
        return name
    name = str(name)
    if name.startswith(f"{protocol}://"):
        return name
    return f"{protocol}://{name.lstrip('/')}"
