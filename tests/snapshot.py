"""A snapshot of a local directory tree, shared by the remote, recording and deployment
tests: the same bytes after a push and a pull (or after a run is recorded) mean the same
snapshot."""

from __future__ import annotations

import hashlib
from pathlib import Path


def files_under(root: str | Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under a local directory (a snapshot)."""
    root = Path(root)
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
