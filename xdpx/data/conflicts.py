"""One text under two labels: found across the prepared splits, reported, dropped or refused.

``encode_file`` keeps, for every labelled row it writes, a 64-bit hash of its text (both
texts of a pair), its label id and its line (:func:`text_hashes`); 20 bytes a row, not the
texts. :func:`find_conflicts` then finds the texts that carry two labels inside one split,
or in train and another split (the same text in dev with another label than in train:
early stopping would then pick by a dev score that punishes learning train), and
:func:`drop_rows` rewrites the shards without them (``prepro.conflicts: drop``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from xdpx import io

__all__ = ["Conflicts", "text_hashes", "find_conflicts", "drop_rows", "MAX_EXAMPLES"]

#: How many conflicting texts are shown (file:line of each label) in the log and meta.json.
MAX_EXAMPLES = 5


def text_hashes(texts: Sequence[str], texts2: Sequence[str] | None = None) -> np.ndarray:
    """``[n]`` uint64: the first 8 bytes of BLAKE2b of each text as read (stripped, before
    lowercasing or tokenizing), a pair's two texts joined by a tab (which no text holds)."""
    rows = texts if texts2 is None else [f"{a}\t{b}" for a, b in zip(texts, texts2, strict=True)]
    blake2b = hashlib.blake2b
    digests = b"".join([blake2b(t.encode("utf-8"), digest_size=8).digest() for t in rows])
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


@dataclass
class Conflicts:
    """What :func:`find_conflicts` found.

    Attributes:
        texts: distinct texts under two or more labels (within a split or train vs another).
        within: split -> texts with two or more labels inside that split.
        across: split (not train) -> its texts whose label there is not one train gives them.
        rows: split -> rows holding a conflicting text (what ``drop`` removes).
        examples: up to :data:`MAX_EXAMPLES` texts, each ``"train.tsv:12 (neg) vs dev.tsv:3 (pos)"``.
        drop: ``[piece index] -> bool[rows]`` rows holding a conflicting text.
    """

    texts: int = 0
    within: dict[str, int] = field(default_factory=dict)
    across: dict[str, int] = field(default_factory=dict)
    rows: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    drop: dict[int, np.ndarray] = field(default_factory=dict)

    def report(self, action: str) -> dict[str, Any]:
        """The ``meta.json`` entry (``conflicts``)."""
        return {
            "action": action,
            "texts": self.texts,
            "within": self.within,
            "across_train": self.across,
            "rows": self.rows,
            "examples": self.examples,
        }


def _member(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """``np.isin(values, pool)`` by binary search in the sorted ``pool``: no hash table of
    ``values`` (numpy's ``isin`` builds one of both arrays, 2 s and ~100 MB for 1.4 M
    rows against a few thousand)."""
    if not len(pool) or not len(values):
        return np.zeros(len(values), dtype=bool)
    pool = np.sort(pool)
    at = np.minimum(np.searchsorted(pool, values), len(pool) - 1)
    return pool[at] == values


def _conflicting(hashes: list[np.ndarray], labels: list[np.ndarray]) -> np.ndarray:
    """The sorted hashes that occur with two or more distinct labels among the rows of
    ``hashes`` / ``labels`` (one pair of arrays per file). Memory: one sorted copy of all
    the hashes, then only the rows of a hash seen twice, sorted with their labels."""
    seen = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
    seen.sort()
    twice = seen[1:][seen[1:] == seen[:-1]]
    del seen
    if not len(twice):
        return np.zeros(0, np.uint64)
    rows = [_member(h, twice) for h in hashes]
    h = np.concatenate([h[r] for h, r in zip(hashes, rows, strict=True)])
    y = np.concatenate([y[r] for y, r in zip(labels, rows, strict=True)])
    order = np.lexsort((y, h))  # by hash, then label
    h, y = h[order], y[order]
    first = np.ones(len(h), dtype=bool)  # the first row of each distinct (hash, label)
    first[1:] = (h[1:] != h[:-1]) | (y[1:] != y[:-1])
    distinct = h[first]
    return np.unique(distinct[1:][distinct[1:] == distinct[:-1]])


def find_conflicts(pieces: Sequence[Any], labels: Sequence[str]) -> Conflicts:
    """Texts under two labels among ``pieces`` (``FileShards`` with ``row_hashes``,
    ``row_labels``, ``row_lines``; unlabelled pieces have None and are left out).

    Args:
        pieces: every file's ``FileShards``, in the prepared order.
        labels: the target map's labels (label id -> name), for the examples.
    """
    out = Conflicts()
    by_split: dict[str, list[int]] = {}
    for i, p in enumerate(pieces):
        if p.row_hashes is not None:
            by_split.setdefault(p.split, []).append(i)

    def rows(idx: list[int], attr: str) -> list[np.ndarray]:
        return [getattr(pieces[i], attr) for i in idx]

    def cat(idx: list[int], attr: str) -> np.ndarray:
        return np.concatenate(rows(idx, attr))

    bad: list[np.ndarray] = []
    for split, idx in by_split.items():
        within = _conflicting(rows(idx, "row_hashes"), rows(idx, "row_labels"))
        out.within[split] = len(within)
        bad.append(within)
    if "train" in by_split:
        for split, idx in by_split.items():
            if split == "train":
                continue
            h, lab = cat(idx, "row_hashes"), cat(idx, "row_labels")
            known: set[tuple[int, int]] = set()  # (hash, label) of the train rows h holds
            for i in by_split["train"]:  # file by file: no copy of all train rows
                th, tl = pieces[i].row_hashes, pieces[i].row_labels
                in_h = _member(th, h)
                known.update(zip(th[in_h].tolist(), tl[in_h].tolist(), strict=True))
            shared = _member(h, np.fromiter((x for x, _ in known), np.uint64, len(known)))
            other = {x for x, y in zip(h[shared].tolist(), lab[shared].tolist(), strict=True) if (x, y) not in known}  # fmt: skip
            out.across[split] = len(other)
            bad.append(np.array(sorted(other), dtype=np.uint64))
    conflicting = np.unique(np.concatenate(bad)) if bad else np.zeros(0, np.uint64)
    out.texts = len(conflicting)
    if not out.texts:
        return out
    seen: dict[int, dict[int, str]] = {}  # text -> label id -> its first file:line
    for split, idx in by_split.items():
        out.rows[split] = 0
        for i in idx:
            p = pieces[i]
            mask = _member(p.row_hashes, conflicting)
            out.rows[split] += int(mask.sum())
            if mask.any():
                out.drop[i] = mask
            for k in np.flatnonzero(mask):
                h, y = int(p.row_hashes[k]), int(p.row_labels[k])
                if h not in seen and len(seen) >= MAX_EXAMPLES:
                    continue
                seen.setdefault(h, {}).setdefault(y, f"{p.source}:{int(p.row_lines[k])} ({labels[y]})")  # fmt: skip
    out.examples = [" vs ".join(where.values()) for where in seen.values()]
    return out


def drop_rows(out_dir: str, piece: Any, mask: np.ndarray) -> None:
    """Rewrite ``piece``'s shards under ``out_dir/{split}/`` without the rows of ``mask``
    (``[rows]`` bool, True = drop), renumbering ``id`` (the row's index among the file's
    kept rows) and updating ``piece``'s ``rows``, ``shard_rows``, ``label_counts`` and row
    records (those of :mod:`xdpx.data.overlaps` too) in place. Each shard is replaced
    atomically."""
    keep = ~mask
    start, next_id = 0, 0
    for name, n in list(piece.shard_rows.items()):
        path = io.join(out_dir, piece.split, name)
        part = keep[start : start + n]
        start += n
        with io.open(path, "rb") as f:
            table = pq.read_table(f)
        table = table.filter(part)
        ids = np.arange(next_id, next_id + table.num_rows, dtype=np.int64)
        next_id += table.num_rows
        table = table.set_column(0, "id", pa.array(ids))
        with io.open_atomic(path, "wb") as f:
            pq.write_table(table, f)
        piece.shard_rows[name] = table.num_rows
    piece.rows = int(keep.sum())
    dropped = piece.row_labels[mask]
    counts = np.asarray(piece.label_counts, dtype=np.int64)
    counts -= np.bincount(dropped, minlength=len(counts))[: len(counts)]
    piece.label_counts = counts.tolist()
    piece.row_hashes, piece.row_labels, piece.row_lines = (
        piece.row_hashes[keep],
        piece.row_labels[keep],
        piece.row_lines[keep],
    )
    if getattr(piece, "overlap_hashes", None) is not None:
        piece.overlap_hashes, piece.overlap_lines = (
            piece.overlap_hashes[keep],
            piece.overlap_lines[keep],
        )
