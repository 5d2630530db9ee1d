"""Every access to a user path goes through here: local paths, ``oss://``, ``s3://`` and fsspec URLs.

A path is a local path or an fsspec URL: ``oss://bucket/key`` (ossfs), ``s3://bucket/key``
(s3fs), ``memory://...`` (tests) or any other installed fsspec protocol.

**Writes are atomic.** Local: a temporary sibling is written, fsynced and renamed into
place. Remote: the bytes are staged in a local temporary file and sent with one PUT (a
multipart upload above the client's threshold, which the store makes visible only when
it completes); a failed upload leaves the previous object, never a partial one.
Directories (:func:`replace_dir`) are staged locally and uploaded file by file with a
*marker* file (``meta.json``, ``manifest.json``) removed first and uploaded last, so a
reader who finds the marker finds every file it describes.

**Reads are whole-file.** A remote file is downloaded to a local temporary file (with a
progress bar from :data:`PROGRESS_BYTES` up) and handed out from there.

**Retries.** On a remote (non-local, non-``memory://``) filesystem every whole-file
operation (read, write, exists/info, list, delete) is retried as one unit, with
exponential backoff and full jitter (a tenacity loop), on transient errors only
(:func:`xdpx.retry.is_transient`, the rule the OSS patch :mod:`xdpx.patches.ossfs_retry`
uses too): HTTP 5xx, throttling (429, ``SlowDown``), connection reset/refused/aborted and
timeouts. Missing files,
access denied and other 4xx errors are raised at once. Once the attempts or the time
budget are spent, :class:`xdpx.errors.RemoteIOError` names the stage (see
:func:`stage`), the operation and the URL. The client libraries' own request retries
are switched off so the bounds below are the only ones; knobs (environment):

=========================  =======  ==================================================
``XDPX_IO_RETRIES``        5        retries after the first attempt (0 = no retry)
``XDPX_IO_BACKOFF``        0.5      seconds; retry k sleeps U(0, min(MAX, B * 2**(k-1)))
``XDPX_IO_BACKOFF_MAX``    20       seconds, cap of one sleep
``XDPX_IO_DEADLINE``       300      seconds after which no new attempt starts
``XDPX_IO_TIMEOUT``        60       seconds, connect/read timeout of one S3 request (OSS: oss2's 60)
=========================  =======  ==================================================

(The backoff is "full jitter" from the AWS Architecture Blog, *Exponential Backoff And
Jitter*, 2015.)

**Credentials** are never part of a path, a config or a log line. ``oss://``:
``OSS_ACCESS_KEY_ID``, ``OSS_ACCESS_KEY_SECRET``, optional ``OSS_SESSION_TOKEN``, and
``OSS_ENDPOINT`` (or ``OSS_REGION``, giving ``https://oss-<region>.aliyuncs.com``);
without the keys in the environment, the ossutil configuration file
(``OSSUTIL_CONFIG_FILE``, default ``~/.ossutilconfig``; profile ``OSSUTIL_PROFILE``,
default ``[default]``, or ossutil 1.x's ``[Credentials]``). ``s3://``: botocore's
standard chain (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_PROFILE`` with ``~/.aws/credentials``, instance roles) and ``AWS_ENDPOINT_URL_S3``
/ ``AWS_ENDPOINT_URL`` for S3-compatible stores. They are read when a filesystem is first
needed, passed to it as storage options (one cached instance per protocol and settings)
and masked (``***``) in every error message xdpx raises. A URL with credentials in it
(``s3://KEY:SECRET@bucket``) is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import IO, Any

import fsspec
from tqdm.auto import tqdm

from xdpx.localfs import (  # noqa: F401 - re-exported
    PROGRESS_BYTES,
    _local_tmp as _local_tmp,
    _progress as _progress,
    cache_dir,
    dir_mode,
    file_mode,
    mkdtemp,
    mkstemp,
    umask,
)
from xdpx.remote import (  # noqa: F401 - re-exported
    _FILESYSTEMS as _FILESYSTEMS,
    _LOCK as _LOCK,
    _SECRETS as _SECRETS,
    _STAGE as _STAGE,
    _THREAD as _THREAD,
    RetryPolicy,
    _call as _call,
    _check_url as _check_url,
    _first_line as _first_line,
    _oss_settings as _oss_settings,
    _ossutil_profile as _ossutil_profile,
    _protocols as _protocols,
    _redact as _redact,
    _remote_fs as _remote_fs,
    _s3_settings as _s3_settings,
    _Settings as _Settings,
    _settings as _settings,
    _url as _url,
    fs_of,
    is_local,
    is_remote,
    retry,
    stage,
)
from xdpx.retry import is_transient

__all__ = [
    "fs_of",
    "is_local",
    "is_remote",
    "exists",
    "isdir",
    "isfile",
    "join",
    "dirname",
    "makedirs",
    "open",
    "open_atomic",
    "read_text",
    "write_text",
    "read_bytes",
    "write_bytes",
    "glob",
    "ls",
    "rm",
    "replace_dir",
    "tmp_sibling",
    "size",
    "md5",
    "copy",
    "copytree",
    "move",
    "download_dir",
    "cache_dir",
    "DirMirror",
    "RetryPolicy",
    "stage",
    "retry",
    "is_transient",
]

log = logging.getLogger("xdpx.io")

_open = open  # the builtin, for local files

#: Chunk size of streamed copies and checksums (bytes).
CHUNK = 8 * 1024 * 1024


# ---------------------------------------------------------------- paths
def join(base: str, *parts: str) -> str:
    """Join path parts with ``/`` (works for local paths and URLs)."""
    out = str(base).rstrip("/")
    for p in parts:
        out = f"{out}/{str(p).strip('/')}"
    return out


def dirname(path: str) -> str:
    """The parent of ``path`` (local path or URL); ``"."`` for a bare name."""
    head, sep, _ = str(path).rstrip("/").rpartition("/")
    return head if sep else "."


def _info(path: str) -> dict[str, Any] | None:
    """``fs.info`` of ``path`` (retried), or None when it does not exist."""
    fs, p = fs_of(path)
    if is_local(path):
        return fs.info(p) if fs.exists(p) else None

    def attempt() -> dict[str, Any] | None:
        try:
            return fs.info(p)
        except FileNotFoundError:
            return None

    return _call("stat", path, attempt)


def exists(path: str) -> bool:
    """Whether a file or directory exists at ``path``.

    Raises:
        RemoteIOError: the store kept failing (a remote path is never reported missing
            because of a transient error).
    """
    return _info(path) is not None


def isdir(path: str) -> bool:
    """Whether ``path`` is a directory (a key prefix on object stores)."""
    info = _info(path)
    return info is not None and info.get("type") == "directory"


def isfile(path: str) -> bool:
    """Whether ``path`` is a file (an object on object stores)."""
    info = _info(path)
    return info is not None and info.get("type") == "file"


def makedirs(path: str) -> None:
    """Create a local directory and its parents; a no-op on object stores (no directories)."""
    if is_remote(path):
        fs_of(path)  # validate the URL / settings early
        return
    fs, p = fs_of(path)
    fs.makedirs(p, exist_ok=True)


# ---------------------------------------------------------------- reading
def _download(path: str, local: str, progress: bool | None = None) -> None:
    """Copy the remote file ``path`` to the local file ``local`` (retried as a whole)."""
    fs, p = fs_of(path)

    def attempt() -> None:
        info = fs.info(p)
        if info.get("type") != "file":
            raise IsADirectoryError(f"{path} is a directory, not a file")
        callback = _progress(int(info.get("size") or 0), path.rsplit("/", 1)[-1], progress)
        try:
            fs.get_file(p, local, callback=callback)
        finally:
            callback.close()
        got = os.path.getsize(local)
        if info.get("size") is not None and got != int(info["size"]):
            raise ConnectionResetError(f"short read: {got} of {info['size']} bytes")

    _call("read", path, attempt)


def open(path: str, mode: str = "rb", progress: bool | None = None, **kwargs: Any) -> IO:  # noqa: A001 - mirrors builtins.open
    """Open a path for reading. Use :func:`open_atomic` for writing.

    A remote file is first downloaded whole (retried as a unit) to an anonymous local
    temporary file, which the returned object reads.

    Args:
        path: local path or URL.
        mode: ``"rb"`` or ``"r"`` (text; ``encoding`` defaults to utf-8).
        progress: force the progress bar on/off (default: on from :data:`PROGRESS_BYTES`).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        RemoteIOError: the store kept failing.
        ValueError: a write mode.
    """
    if any(c in mode for c in "wax+"):
        raise ValueError("io.open is for reading; write with io.open_atomic (atomic replace)")
    path = str(path)
    if not is_remote(path):
        if mode == "rb" and not kwargs and "://" not in path:
            return _open(path, "rb")  # the builtin: no Python layer per read
        return fsspec.open(path, mode, **kwargs).open()
    tmp = _local_tmp("xdpx-read-")
    try:
        try:
            _download(path, tmp, progress)
        except FileNotFoundError:
            raise FileNotFoundError(f"{path} not found") from None
        f = _open(tmp, "rb")
    finally:
        os.unlink(tmp)  # the open handle keeps the data (POSIX)
    if "b" in mode:
        return f
    import io as _pyio

    return _pyio.TextIOWrapper(
        f, encoding=kwargs.get("encoding") or "utf-8", newline=kwargs.get("newline")
    )


def read_text(path: str, encoding: str = "utf-8") -> str:
    """The whole file decoded (remote: one retried download)."""
    with open(path, "rb") as f:
        return f.read().decode(encoding)


def read_bytes(path: str) -> bytes:
    """The whole file (remote: one retried download)."""
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------- writing
def _upload(local: str, path: str, progress: bool | None = None) -> None:
    """Send the local file ``local`` to ``path`` in one PUT / completed multipart (retried whole)."""
    fs, p = fs_of(path)
    total = os.path.getsize(local)

    def attempt() -> None:
        callback = _progress(total, path.rsplit("/", 1)[-1], progress)
        try:
            fs.put_file(local, p, callback=callback)
        finally:
            callback.close()

    _call("write", path, attempt)


@contextlib.contextmanager
def open_atomic(
    path: str,
    mode: str = "wb",
    encoding: str | None = None,
    progress: bool | None = None,
    durable: bool = True,
) -> Iterator[IO]:
    """Write ``path`` atomically; on any exception ``path`` is left as it was.

    Local: a temp sibling is written (with the mode of a plain ``open()``:
    :func:`file_mode`), fsynced and renamed into place. Remote (and ``memory://``): the
    bytes go to a local temp file, which is uploaded when the block ends, in one PUT or a
    multipart upload the store completes only at the end (retried as a whole on transient
    errors), so no reader ever sees a partial object.

    Args:
        path: destination (local or fsspec URL); local parent directories are created.
        mode: ``"wb"`` or ``"w"``.
        encoding: text encoding for ``"w"`` (default utf-8).
        progress: force the upload progress bar on/off (default: on from :data:`PROGRESS_BYTES`).
        durable: fsync a local file before the rename; False for scratch files that a
            crash may lose (still never seen half-written).

    Raises:
        RemoteIOError: the upload kept failing (the remote object is unchanged).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"open_atomic supports 'w' and 'wb', got {mode!r}")
    if mode == "w" and encoding is None:
        encoding = "utf-8"
    path = str(path)
    newline = "" if mode == "w" else None
    if is_local(path):
        _, p = fs_of(path)
        parent = os.path.dirname(os.path.abspath(p))
        os.makedirs(parent, exist_ok=True)
        fd, tmp = mkstemp(f".{os.path.basename(p)}.", parent, suffix=".tmp")
        try:
            with os.fdopen(fd, mode, encoding=encoding, newline=newline) as f:
                yield f
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return
    fs_of(path)  # refuse a bad URL before the caller produces the data
    tmp = _local_tmp("xdpx-write-")
    try:
        with _open(tmp, mode, encoding=encoding, newline=newline) as f:
            yield f
        _upload(tmp, path, progress)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_text(path: str, text: str) -> None:
    """Atomically write utf-8 text."""
    with open_atomic(path, "wb") as f:
        f.write(text.encode("utf-8"))


def write_bytes(path: str, data: bytes) -> None:
    """Atomically write bytes."""
    with open_atomic(path, "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- listing / deleting
def glob(pattern: str) -> list[str]:
    """Sorted matches of a glob, returned in the same form (URL or path) as the pattern."""
    fs, p = fs_of(pattern)
    hits = sorted(_call("list", pattern, lambda: fs.glob(p)))
    if is_local(pattern):
        return hits
    return [_url(pattern, h) for h in hits]


def ls(path: str) -> list[str]:
    """Entries directly under a directory (sorted), in the form of ``path`` (URL or local path).

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    fs, p = fs_of(path)
    names = sorted(_call("list", path, lambda: fs.ls(p, detail=False)))
    if is_local(path):
        return names
    return [_url(path, n.rstrip("/")) for n in names]


def _find(path: str) -> list[str]:
    """Relative paths of every file under directory ``path`` (sorted; [] when missing)."""
    fs, p = fs_of(path)
    root = p.strip("/")

    def attempt() -> list[str]:
        try:
            return fs.find(p)
        except FileNotFoundError:
            return []

    files = [f.strip("/") for f in _call("list", path, attempt)]
    return sorted(f[len(root) :].lstrip("/") for f in files if f != root and f.startswith(root))


def rm(path: str, recursive: bool = False) -> None:
    """Remove a file (or a directory tree with ``recursive``); a missing path is not an error."""
    fs, p = fs_of(path)

    def attempt() -> None:
        try:
            fs.rm(p, recursive=recursive)
        except FileNotFoundError:
            pass

    if is_local(path):
        if fs.exists(p):
            fs.rm(p, recursive=recursive)
        return
    _call("delete", path, attempt)


# ---------------------------------------------------------------- directories
def tmp_sibling(final_dir: str) -> str:
    """A fresh temporary directory to write a new version of ``final_dir`` into.

    Local: a hidden sibling (same filesystem, so :func:`replace_dir` renames it).
    Remote: a local staging directory under :func:`cache_dir` (object stores have no
    rename; :func:`replace_dir` uploads it).
    """
    base = str(final_dir).rstrip("/")
    head, _, name = base.rpartition("/")
    tag = uuid.uuid4().hex[:8]
    if not is_local(base):
        return os.path.join(cache_dir("staging"), f"{name}.tmp-{tag}")
    return f"{head}/.{name}.tmp-{tag}" if head else f".{name}.tmp-{tag}"


def replace_dir(tmp_dir: str, final_dir: str, marker: str | None = None) -> None:
    """Move a fully written directory into place, replacing ``final_dir``.

    Local: the old directory is renamed aside, the new one renamed in, the old one
    removed, so a reader sees either the old or the new complete directory.

    Remote (``tmp_dir`` is the local staging directory of :func:`tmp_sibling`): the old
    ``marker`` object is deleted first, every other file uploaded (each atomically),
    ``marker`` uploaded last, then files of the old version that the new one lacks are
    deleted and ``tmp_dir`` is removed. A reader who finds ``marker`` therefore finds
    the complete new version; during the upload (or after a failed one) the directory
    has no marker. Without ``marker`` the files are simply uploaded.

    Args:
        tmp_dir: the complete new directory.
        final_dir: where it goes.
        marker: file name (relative to the directory) that marks it complete, e.g.
            ``meta.json`` (prepared data) or ``manifest.json`` (checkpoints).

    Raises:
        RemoteIOError: an upload or delete kept failing (``final_dir`` then has no marker).
    """
    if is_local(final_dir):
        final_dir = os.path.abspath(final_dir)
        old = None
        if os.path.exists(final_dir):
            old = f"{final_dir}.old-{uuid.uuid4().hex[:8]}"
            os.replace(final_dir, old)
        os.replace(tmp_dir, final_dir)
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return
    if not is_local(tmp_dir):  # a remote staging dir (older callers): copy through here
        local = tmp_sibling(final_dir)
        download_dir(tmp_dir, local)
        rm(tmp_dir, recursive=True)
        tmp_dir = local
    new = sorted(
        os.path.relpath(os.path.join(d, f), tmp_dir).replace(os.sep, "/")
        for d, _, files in os.walk(tmp_dir)
        for f in files
    )
    old = _find(final_dir)
    if marker and marker in old:
        rm(join(final_dir, marker))
    for rel in sorted(new, key=lambda r: r == marker):  # the marker last
        _upload(os.path.join(tmp_dir, rel), join(final_dir, rel))
    stale = [join(final_dir, rel) for rel in old if rel not in set(new)]
    for path in stale:
        rm(path)
    shutil.rmtree(tmp_dir, ignore_errors=True)


def download_dir(src: str, local_dir: str, progress: bool = False) -> int:
    """Download every file under ``src`` into the local directory ``local_dir`` (created).

    Returns:
        The number of files.

    Raises:
        FileNotFoundError: ``src`` is not a directory.
    """
    if not isdir(src):
        raise FileNotFoundError(f"{src} not found (or not a directory)")
    files = _find(src)
    for rel in tqdm(files, desc="download", unit="file", disable=not progress, leave=False):
        dst = os.path.join(local_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if is_remote(src):
            _download(join(src, rel), dst)
        else:
            copy(join(src, rel), dst)
    return len(files)


class DirMirror:
    """Keep a remote directory a copy of a local one by uploading what changed.

    For writers that need a local directory (DVCLive): they write into ``local``, and
    :meth:`push` uploads each file whose size or mtime changed since the last push
    (each atomically, retried). Files are never deleted remotely.

    Args:
        local: the local directory written to.
        remote: the directory (URL) it is mirrored to.
    """

    def __init__(self, local: str, remote: str) -> None:
        self.local, self.remote = local, remote
        self._seen: dict[str, tuple[int, int]] = {}

    def push(self) -> int:
        """Upload new and changed files; returns how many were uploaded.

        Raises:
            RemoteIOError: an upload kept failing.
        """
        sent = 0
        for d, _, files in os.walk(self.local):
            for f in sorted(files):
                path = os.path.join(d, f)
                st = os.stat(path)
                stamp = (st.st_size, st.st_mtime_ns)
                rel = os.path.relpath(path, self.local).replace(os.sep, "/")
                if self._seen.get(rel) == stamp:
                    continue
                _upload(path, join(self.remote, rel))
                self._seen[rel] = stamp
                sent += 1
        return sent


# ---------------------------------------------------------------- sizes, checksums, copies
def _bar(total: int, desc: str, progress: bool) -> tqdm:
    return tqdm(
        total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
        disable=not progress, leave=False,
    )  # fmt: skip


def size(path: str) -> int:
    """Size of a file in bytes, or the total of every file under a directory.

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    info = _info(path)
    if info is None:
        raise FileNotFoundError(f"{path} not found")
    if info.get("type") == "directory":
        fs, p = fs_of(path)
        return int(sum(_call("list", path, lambda: fs.du(p, total=False)).values()))
    return int(info.get("size") or 0)


def md5(path: str, progress: bool = False) -> str:
    """Hex MD5 of a file's bytes, streamed in ``CHUNK`` pieces.

    Raises:
        FileNotFoundError: ``path`` does not exist or is a directory.
    """
    if not isfile(path):
        raise FileNotFoundError(f"{path} not found (or not a file)")
    digest = hashlib.md5()
    with open(path, "rb", progress=progress) as f, _bar(size(path), "md5", progress) as bar:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def copy(src: str, dst: str, progress: bool = False) -> None:
    """Copy one file across filesystems (local <-> URL), atomic at ``dst``.

    Remote ends transfer whole files (retried) with a progress bar when ``progress``.

    Raises:
        FileNotFoundError: ``src`` is missing or a directory (use :func:`copytree`).
    """
    if not isfile(src):
        raise FileNotFoundError(f"{src} not found (or not a file; use copytree for directories)")
    bar_here = progress and not (is_remote(src) or is_remote(dst))  # else the transfer shows one
    with (
        open(src, "rb", progress=progress) as fin,
        open_atomic(dst, "wb", progress=progress) as fout,
    ):
        with _bar(size(src), src.rsplit("/", 1)[-1], bar_here) as bar:
            while chunk := fin.read(CHUNK):
                fout.write(chunk)
                bar.update(len(chunk))


def copytree(src: str, dst: str, progress: bool = False) -> int:
    """Copy every file under directory ``src`` to the same relative path under ``dst``.

    Returns:
        The number of files copied.

    Raises:
        FileNotFoundError: ``src`` is not a directory.
    """
    if not isdir(src):
        raise FileNotFoundError(f"{src} not found (or not a directory)")
    files = _find(src)
    for rel in tqdm(files, desc="copytree", unit="file", disable=not progress, leave=False):
        copy(join(src, rel), join(dst, rel))
    return len(files)


def move(src: str, dst: str, progress: bool = False) -> None:
    """Move a file or directory; a rename on one filesystem, copy + delete across two.

    Raises:
        FileNotFoundError: ``src`` does not exist.
    """
    if not exists(src):
        raise FileNotFoundError(f"{src} not found")
    if is_local(src) and is_local(dst):
        _, p_src = fs_of(src)
        _, p_dst = fs_of(dst)
        os.makedirs(os.path.dirname(os.path.abspath(p_dst)), exist_ok=True)
        shutil.move(p_src, p_dst)
        return
    if isdir(src):
        copytree(src, dst, progress)
    else:
        copy(src, dst, progress)
    rm(src, recursive=True)
