"""A snapshot of a local directory tree, shared by the remote, recording and deployment
tests: the same bytes after a push and a pull (or after a run is recorded) mean the same
snapshot."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path


def files_under(root: str | Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under a local directory (a snapshot)."""
    root = Path(root)
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def modes_under(root: str | Path) -> tuple[dict[str, int], dict[str, int]]:
    """The permission bits of every file and every directory under ``root`` (``root``
    itself included as ``"."``), as ``(files, dirs)``: relative path -> mode."""
    files, dirs = {}, {}
    for d, _, names in os.walk(root):
        dirs[os.path.relpath(d, root)] = stat.S_IMODE(os.stat(d).st_mode)
        for n in names:
            path = os.path.join(d, n)
            files[os.path.relpath(path, root)] = stat.S_IMODE(os.stat(path).st_mode)
    return files, dirs
