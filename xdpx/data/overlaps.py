"""Texts shared by two splits: exact matches and normalised near-duplicates.

A text in both dev and test (or train and test ...) flatters the score of the split it is
scored on: the model was selected, or trained, on it. prepro looks for such texts between
every pair of splits without holding them: for every row it keeps two 64-bit hashes
(:func:`overlap_hashes`: the text as read, and the text normalised by :func:`normalise`:
case folded, punctuation dropped, whitespace collapsed) and its line, 20 bytes a row.
:func:`find_overlaps` then counts, for each pair of splits, the distinct texts they share
(``exact``), the further texts that match once normalised (``near``), the rows involved,
whether the two splits hold the same texts (``identical``: the same file under two names,
say) and a few examples as ``file:line`` pairs; it is recorded in ``meta.json``
(``overlaps``) and a pair worth a look (:func:`worth_warning`) is logged as a WARN.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from itertools import combinations
from typing import Any

import numpy as np

from xdpx.data.conflicts import _member, text_hashes

__all__ = [
    "MAX_EXAMPLES",
    "NEAR_SHARE",
    "find_overlaps",
    "normalise",
    "overlap_hashes",
    "pair_key",
    "worth_warning",
]

#: How many shared texts a pair shows as ``file:line`` pairs in the log and meta.json.
MAX_EXAMPLES = 3
#: Near-duplicates alone are worth a WARN from this share of the smaller split's distinct
#: texts: short generic texts recur independently in any corpus (the demo's reviews share 5
#: or 6 normalised texts such as 谢谢 or 漂亮 between train and dev or test, 0.35% of dev at
#: most), while a re-cased or re-punctuated copy of a split shares them all.
NEAR_SHARE = 0.01

_NOT_WORD = re.compile(r"[\W_]+")


def normalise(text: str) -> str:
    """``text`` case-folded, with punctuation and symbols (any run of non-word characters)
    turned into one space, and whitespace collapsed: ``"Hello,  World!"`` -> ``"hello world"``.
    """
    return " ".join(_NOT_WORD.sub(" ", text.casefold()).split())


def overlap_hashes(texts: Sequence[str], texts2: Sequence[str] | None = None) -> np.ndarray:
    """``[n, 2]`` uint64 of each row: the hash of the text as read
    (:func:`xdpx.data.conflicts.text_hashes`, a pair's two texts joined by a tab) and the
    hash of its :func:`normalise` form (for a text that normalises to nothing, e.g. only
    punctuation, its exact hash: it matches only itself)."""
    exact = text_hashes(texts, texts2)
    if texts2 is None:
        forms = [normalise(t) for t in texts]
        empty = [not f for f in forms]
    else:
        pairs = [(normalise(a), normalise(b)) for a, b in zip(texts, texts2, strict=True)]
        forms = [f"{a}\t{b}" for a, b in pairs]
        empty = [not (a or b) for a, b in pairs]
    blake2b = hashlib.blake2b
    digests = b"".join([blake2b(f.encode("utf-8"), digest_size=8).digest() for f in forms])
    near = np.frombuffer(digests, dtype="<u8").astype(np.uint64)
    near = np.where(np.asarray(empty, dtype=bool), exact, near) if len(forms) else near
    return np.stack([exact, near], axis=1) if len(forms) else np.zeros((0, 2), np.uint64)


def pair_key(a: str, b: str) -> str:
    """The name of a pair of splits in meta.json and the doctor: ``"dev~test"``."""
    return f"{a}~{b}"


def worth_warning(entry: dict[str, Any]) -> bool:
    """Whether an ``overlaps`` entry deserves a WARN: a text shared exactly, or
    near-duplicates in at least :data:`NEAR_SHARE` of the smaller split's distinct texts."""
    smaller = min(entry["distinct"].values(), default=0)
    return entry["exact"] > 0 or (smaller > 0 and entry["near"] >= NEAR_SHARE * smaller)


def _first_rows(
    pieces: Sequence[Any], column: int, wanted: np.ndarray, limit: int
) -> dict[int, str]:
    """``hash -> "file:line"`` of the first row (in file order) of up to ``limit`` distinct
    hashes of ``wanted`` in column ``column`` of the pieces' ``overlap_hashes``."""
    found: dict[int, str] = {}
    for p in pieces:
        if len(found) >= limit:
            break
        col = p.overlap_hashes[:, column]
        for k in np.flatnonzero(_member(col, wanted)):
            h = int(col[k])
            if h not in found:
                found[h] = f"{p.source}:{int(p.overlap_lines[k])}"
                if len(found) >= limit:
                    break
    return found


def _shared_rows(piece: Any, exact: np.ndarray, near: np.ndarray) -> int:
    """Rows of ``piece`` whose text is one of ``exact`` as read or ``near`` normalised."""
    h = piece.overlap_hashes
    return int((_member(h[:, 0], exact) | _member(h[:, 1], near)).sum())


def find_overlaps(pieces: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """The texts every pair of splits shares, from the pieces' row hashes.

    Args:
        pieces: every file's ``FileShards`` (``split``, ``source``, ``overlap_hashes``
            ``[rows, 2]`` uint64, ``overlap_lines`` ``[rows]``), in the prepared order.

    Returns:
        ``{"a~b": {...}}`` for every pair of splits, in split order (:func:`pair_key`):
        ``splits`` ``[a, b]``; ``exact``: distinct texts in both, as read; ``near``: further
        distinct normalised texts in both (case, whitespace, punctuation); ``rows``: split
        -> its rows holding a shared text (exact or near); ``distinct``: split -> its
        distinct texts; ``identical``: both hold the same distinct texts (the same file
        twice, or a reordering); ``examples``: up to :data:`MAX_EXAMPLES` shared texts as
        ``"a.tsv:3 = b.tsv:9"`` (exact) or ``"a.tsv:3 ~ b.tsv:9"`` (near). Memory: a
        sorted copy of one split's hashes at a time, besides the rows' records.
    """
    by_split: dict[str, list[Any]] = {}
    for p in pieces:
        if p.overlap_hashes is not None:
            by_split.setdefault(p.split, []).append(p)

    def unique(split: str, column: int) -> np.ndarray:
        parts = [p.overlap_hashes[:, column] for p in by_split[split]]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)

    out: dict[str, dict[str, Any]] = {}
    for a, b in combinations(by_split, 2):
        ea, eb = unique(a, 0), unique(b, 0)
        exact = ea[_member(ea, eb)]
        na, nb = unique(a, 1), unique(b, 1)
        shared_norm = na[_member(na, nb)]
        # the normalised forms of the exact matches are not near-duplicates of their own
        exact_forms = [
            p.overlap_hashes[_member(p.overlap_hashes[:, 0], exact), 1] for p in by_split[a]
        ]
        exact_forms_u = np.unique(np.concatenate(exact_forms)) if exact_forms else exact[:0]
        near = shared_norm[~_member(shared_norm, exact_forms_u)]
        rows = {s: sum(_shared_rows(p, exact, near) for p in by_split[s]) for s in (a, b)}
        examples = []
        for column, shared, sign in ((0, exact, "="), (1, near, "~")):
            room = MAX_EXAMPLES - len(examples)
            if room <= 0 or not len(shared):
                continue
            first_a = _first_rows(by_split[a], column, shared, room)
            picked = np.fromiter(first_a, np.uint64, len(first_a))
            first_b = _first_rows(by_split[b], column, picked, len(picked))
            examples += [f"{first_a[h]} {sign} {first_b[h]}" for h in first_a if h in first_b]
        out[pair_key(a, b)] = {
            "splits": [a, b],
            "exact": len(exact),
            "near": len(near),
            "rows": rows,
            "distinct": {a: len(ea), b: len(eb)},
            "identical": bool(len(ea) and len(ea) == len(eb) == len(exact)),
            "examples": examples,
        }
    return out
