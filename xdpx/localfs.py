"""Local files for :mod:`xdpx.io`: the cache directory (``$XDPX_CACHE``), the modes a plain ``open()``
gives under the process's umask, temporary files and directories beside their destination,
and the progress bar of a transfer. :mod:`xdpx.io` re-exports every name."""

from __future__ import annotations

import os
import tempfile

from fsspec.callbacks import TqdmCallback

#: Transfers from this size up show a progress bar (bytes).
PROGRESS_BYTES = 32 * 1024 * 1024


# ---------------------------------------------------------------- temporary files
def cache_dir(*parts: str) -> str:
    """A local directory (created) under xdpx's cache: ``$XDPX_CACHE`` or ``~/.cache/xdpx``
    (the root :mod:`xdpx.pretrained` uses too)."""
    root = os.environ.get("XDPX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "xdpx")
    path = os.path.join(root, *parts)
    os.makedirs(path, exist_ok=True)
    return path


def umask() -> int:
    """The process umask (e.g. ``0o022``), read without changing it where Linux shows it
    (``/proc/self/status``, kernel >= 4.7); elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file: ``0o666 & ~umask`` (0644
    under umask 0022, 0640 under 0027). Temporary files (``tempfile.mkstemp``) are created
    0600 and keep that mode when renamed into place, so every atomic write resets it."""
    return 0o666 & ~umask()


def dir_mode() -> int:
    """The mode ``os.makedirs`` gives a new directory: ``0o777 & ~umask`` (0755 under 0022)."""
    return 0o777 & ~umask()


def mkstemp(prefix: str, dir: str, suffix: str = "") -> tuple[int, str]:
    """``tempfile.mkstemp`` (exclusive create, unique name) with the mode of a plain
    ``open()`` instead of 0600: the one way xdpx makes a file that is renamed into place.

    Returns:
        ``(fd, path)``; the caller closes ``fd``.
    """
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=dir)
    os.fchmod(fd, file_mode())
    return fd, tmp


def mkdtemp(prefix: str, dir: str | None = None) -> str:
    """``tempfile.mkdtemp`` with the mode of ``os.makedirs`` instead of 0700 (for staging
    directories that are renamed into place or whose files are)."""
    path = tempfile.mkdtemp(prefix=prefix, dir=dir)
    os.chmod(path, dir_mode())
    return path


def _local_tmp(prefix: str) -> str:
    """A new empty local file for staging a transfer; the caller removes it."""
    fd, tmp = mkstemp(prefix, cache_dir("tmp"))
    os.close(fd)
    return tmp


def _progress(total: int, desc: str, progress: bool | None) -> TqdmCallback:
    show = total >= PROGRESS_BYTES if progress is None else progress
    return TqdmCallback(
        tqdm_kwargs={
            "desc": desc,
            "unit": "B",
            "unit_scale": True,
            "unit_divisor": 1024,
            "leave": False,
            "disable": not show,
        }
    )
