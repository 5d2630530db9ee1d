"""Every access to a user path goes through here: fsspec URLs and atomic writes.

A path is a local path or any fsspec URL (``memory://``, ``s3://``, ``oss://``
once the matching filesystem package is installed). Writes are atomic: data
goes to a temporary sibling first and is moved into place only when complete,
so a crash never leaves a half-written output under the final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from typing import IO, Any

import fsspec
from fsspec.core import url_to_fs
from tqdm.auto import tqdm

__all__ = [
    "fs_of",
    "is_local",
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
    "size",
    "md5",
    "copy",
    "copytree",
    "move",
]

_open = open  # the builtin, for local temp files


def fs_of(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem of ``path`` and the path inside it."""
    return url_to_fs(str(path))


def is_local(path: str) -> bool:
    """True for plain paths and ``file://`` URLs."""
    fs, _ = fs_of(path)
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


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


def exists(path: str) -> bool:
    fs, p = fs_of(path)
    return fs.exists(p)


def isdir(path: str) -> bool:
    fs, p = fs_of(path)
    return fs.isdir(p)


def isfile(path: str) -> bool:
    fs, p = fs_of(path)
    return fs.isfile(p)


def makedirs(path: str) -> None:
    fs, p = fs_of(path)
    fs.makedirs(p, exist_ok=True)


def open(path: str, mode: str = "rb", **kwargs: Any) -> IO:  # noqa: A001 - mirrors builtins.open
    """Open a path for reading. Use :func:`open_atomic` for writing."""
    if any(c in mode for c in "wax+"):
        raise ValueError("io.open is for reading; write with io.open_atomic (atomic replace)")
    return fsspec.open(str(path), mode, **kwargs).open()


@contextlib.contextmanager
def open_atomic(path: str, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Write ``path`` atomically: a temp sibling is written, then moved into place.

    On any exception the temp file is removed and ``path`` is left as it was.

    Args:
        path: destination (local or fsspec URL); parent directories are created.
        mode: ``"wb"`` or ``"w"``.
        encoding: text encoding for ``"w"`` (default utf-8).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"open_atomic supports 'w' and 'wb', got {mode!r}")
    if mode == "w" and encoding is None:
        encoding = "utf-8"
    fs, p = fs_of(path)
    parent = p.rsplit("/", 1)[0] if "/" in p else ""
    if is_local(path):
        parent = os.path.dirname(os.path.abspath(p))
        os.makedirs(parent, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", suffix=".tmp", dir=parent)
        try:
            with os.fdopen(fd, mode, encoding=encoding, newline="" if mode == "w" else None) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{parent}/.{p.rsplit('/', 1)[-1]}.{uuid.uuid4().hex}.tmp" if parent else f".{p}.tmp"
    try:
        with fs.open(tmp, mode, encoding=encoding) if mode == "w" else fs.open(tmp, mode) as f:
            yield f
        fs.mv(tmp, p)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.rm(tmp)
        raise


def read_text(path: str, encoding: str = "utf-8") -> str:
    with open(path, "rb") as f:
        return f.read().decode(encoding)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write_text(path: str, text: str) -> None:
    """Atomically write utf-8 text."""
    with open_atomic(path, "wb") as f:
        f.write(text.encode("utf-8"))


def write_bytes(path: str, data: bytes) -> None:
    """Atomically write bytes."""
    with open_atomic(path, "wb") as f:
        f.write(data)


def glob(pattern: str) -> list[str]:
    """Sorted matches of a glob, returned in the same form (URL or path) as the pattern."""
    fs, p = fs_of(pattern)
    hits = sorted(fs.glob(p))
    if is_local(pattern):
        return hits
    proto = str(pattern).split("://", 1)[0]
    return [f"{proto}://{h.lstrip('/')}" if not h.startswith(f"{proto}://") else h for h in hits]


def ls(path: str) -> list[str]:
    fs, p = fs_of(path)
    return sorted(fs.ls(p, detail=False))


def rm(path: str, recursive: bool = False) -> None:
    fs, p = fs_of(path)
    if fs.exists(p):
        fs.rm(p, recursive=recursive)


def replace_dir(tmp_dir: str, final_dir: str) -> None:
    """Move a fully written directory into place, replacing ``final_dir``.

    Local: the old directory is renamed aside, the new one renamed in, the old
    one removed, so a reader sees either the old or the new complete directory.
    Remote: files are moved (object stores have no directory rename).
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
    fs, dst = fs_of(final_dir)
    _, src = fs_of(tmp_dir)
    if fs.exists(dst):
        fs.rm(dst, recursive=True)
    fs.mv(src, dst, recursive=True)


def tmp_sibling(final_dir: str) -> str:
    """A fresh temporary directory name next to ``final_dir`` (same filesystem)."""
    base = str(final_dir).rstrip("/")
    head, _, name = base.rpartition("/")
    return (
        f"{head}/.{name}.tmp-{uuid.uuid4().hex[:8]}"
        if head
        else f".{name}.tmp-{uuid.uuid4().hex[:8]}"
    )


#: Chunk size of streamed copies and checksums (bytes).
CHUNK = 8 * 1024 * 1024


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
    fs, p = fs_of(path)
    if not fs.exists(p):
        raise FileNotFoundError(f"{path} not found")
    if fs.isdir(p):
        return int(sum(fs.du(p, total=False).values()))
    return int(fs.size(p))


def md5(path: str, progress: bool = False) -> str:
    """Hex MD5 of a file's bytes, streamed in ``CHUNK`` pieces.

    Raises:
        FileNotFoundError: ``path`` does not exist or is a directory.
    """
    if not isfile(path):
        raise FileNotFoundError(f"{path} not found (or not a file)")
    digest = hashlib.md5()
    with open(path, "rb") as f, _bar(size(path), "md5", progress) as bar:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def copy(src: str, dst: str, progress: bool = False) -> None:
    """Copy one file across filesystems (local <-> URL), streamed, atomic at ``dst``.

    Raises:
        FileNotFoundError: ``src`` is missing or a directory (use :func:`copytree`).
    """
    if not isfile(src):
        raise FileNotFoundError(f"{src} not found (or not a file; use copytree for directories)")
    with open(src, "rb") as fin, open_atomic(dst, "wb") as fout:
        with _bar(size(src), src.rsplit("/", 1)[-1], progress) as bar:
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
    fs, root = fs_of(src)
    root = root.rstrip("/")
    files = sorted(fs.find(root))
    for f in tqdm(files, desc="copytree", unit="file", disable=not progress, leave=False):
        rel = f[len(root) :].lstrip("/")
        copy(join(src, rel), join(dst, rel))
    return len(files)


def move(src: str, dst: str, progress: bool = False) -> None:
    """Move a file or directory; a rename on one filesystem, copy + delete across two.

    Raises:
        FileNotFoundError: ``src`` does not exist.
    """
    if not exists(src):
        raise FileNotFoundError(f"{src} not found")
    fs_src, p_src = fs_of(src)
    fs_dst, p_dst = fs_of(dst)
    if type(fs_src) is type(fs_dst) and is_local(src):
        os.makedirs(os.path.dirname(os.path.abspath(p_dst)), exist_ok=True)
        shutil.move(p_src, p_dst)
        return
    if isdir(src):
        copytree(src, dst, progress)
    else:
        copy(src, dst, progress)
    rm(src, recursive=True)
