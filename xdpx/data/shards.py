"""Parquet shards of token ids: ``{data_dir}/{split}/part-00000-00000.parquet``, ...

prepro writes ``part-{file:05d}-{k:05d}.parquet``: shard ``k`` of the split's raw file
number ``file`` (:mod:`xdpx.data.stream`), and records each shard's rows in meta.json
(``shard_rows``, the reading order). Columns: ``id`` int64 (0-based index of the example
among the kept rows of its source file), ``input_ids`` list<int32>, ``length`` int32, ``label``
int32 (-1 = unlabelled; ``prepro.label_type: score``: float32, NaN = unlabelled) and, for
pair tasks encoded separately, ``input_ids2`` list<int32> and ``length2`` int32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from xdpx import io
from xdpx.data.readers import DataError

__all__ = [
    "SplitData",
    "shard_path",
    "shard_schema",
    "write_split",
    "load_split",
    "read_shard",
    "split_shards",
    "list_splits",
    "label_array",
    "NO_LABEL",
]

#: ``label`` value of an example without a label.
NO_LABEL = -1

_IDS = pa.list_(pa.int32())


def shard_path(data_dir: str, split: str, index: int) -> str:
    """``{data_dir}/{split}/part-{index:05d}.parquet``."""
    return io.join(data_dir, split, f"part-{index:05d}.parquet")


@dataclass
class SplitData:
    """One split loaded into memory.

    Attributes:
        ids: ``[n]`` int64 sample ids (0-based row index in the source file's kept rows).
        input_ids: ``n`` int64 arrays of variable length (``<= max_len``).
        labels: ``[n]`` int64 class indices, -1 where unlabelled; float32 scores (NaN where
            unlabelled) for ``prepro.label_type: score``.
        input_ids2: second-text ids of a separately encoded pair task, else None.
    """

    ids: np.ndarray
    input_ids: list[np.ndarray]
    labels: np.ndarray
    input_ids2: list[np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        """``[n]`` int64 length of each ``input_ids`` row."""
        return np.array([len(x) for x in self.input_ids], dtype=np.int64)

    @property
    def has_labels(self) -> bool:
        """True when every example has a label."""
        if self.labels.dtype.kind == "f":  # scores: NaN where unlabelled
            return bool(len(self.labels)) and bool(np.isfinite(self.labels).all())
        return bool(len(self.labels)) and bool((self.labels >= 0).all())


def sample_lengths(samples: list) -> np.ndarray:
    """``[n]`` int64 tokens per sample: an id array's length, a pair's two lengths summed."""
    return np.array(
        [sum(map(len, s)) if isinstance(s, tuple) else len(s) for s in samples], dtype=np.int64
    )


def _list_array(seqs: Sequence[Sequence[int]]) -> pa.Array:
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int32, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = (
        np.concatenate([np.asarray(s, dtype=np.int32) for s in seqs])
        if len(seqs)
        else np.zeros(0, dtype=np.int32)
    )
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=pa.int32()))


def shard_schema(pair: bool, score: bool = False) -> pa.Schema:
    """The Arrow schema of a shard (``pair``: with ``input_ids2`` / ``length2``; ``score``:
    a float32 label, ``prepro.label_type: score``)."""
    fields = [
        ("id", pa.int64()),
        ("input_ids", _IDS),
        ("length", pa.int32()),
        ("label", pa.float32() if score else pa.int32()),
    ]
    if pair:
        fields += [("input_ids2", _IDS), ("length2", pa.int32())]
    return pa.schema(fields)


def write_split(
    data_dir: str,
    split: str,
    ids: Sequence[int] | np.ndarray,
    input_ids: Sequence[Sequence[int]],
    labels: Sequence[int] | np.ndarray | None,
    input_ids2: Sequence[Sequence[int]] | None = None,
    shard_size: int = 50_000,
) -> list[str]:
    """Write one split as Parquet shards of ``shard_size`` rows, each atomically.

    An empty split still gets one (empty) shard, so its schema is recorded.

    Args:
        data_dir: output directory (local or fsspec URL).
        split: split name (sub-directory).
        ids: ``[n]`` sample ids.
        input_ids: ``n`` id sequences.
        labels: ``[n]`` class indices, or None for an unlabelled split (stored as -1).
        input_ids2: ``n`` second-text id sequences for separately encoded pairs.
        shard_size: rows per shard (>= 1).

    Returns:
        The written shard paths, in order.

    Raises:
        ValueError: mismatched lengths or ``shard_size < 1``.
    """
    n = len(input_ids)
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    if len(ids) != n or (labels is not None and len(labels) != n):
        raise ValueError("ids, input_ids and labels must have the same length")
    if input_ids2 is not None and len(input_ids2) != n:
        raise ValueError("input_ids2 must have the same length as input_ids")
    ids_arr = np.asarray(ids, dtype=np.int64)
    label_arr = (
        np.full(n, NO_LABEL, dtype=np.int32)
        if labels is None
        else np.asarray(labels, dtype=np.int32)
    )
    schema = shard_schema(input_ids2 is not None)
    paths: list[str] = []
    for k, start in enumerate(range(0, max(n, 1), shard_size)):
        stop = min(start + shard_size, n)
        seqs = input_ids[start:stop]
        cols = [
            pa.array(ids_arr[start:stop], type=pa.int64()),
            _list_array(seqs),
            pa.array(np.array([len(s) for s in seqs], dtype=np.int32), type=pa.int32()),
            pa.array(label_arr[start:stop], type=pa.int32()),
        ]
        if input_ids2 is not None:
            seqs2 = input_ids2[start:stop]
            cols += [
                _list_array(seqs2),
                pa.array(np.array([len(s) for s in seqs2], dtype=np.int32), type=pa.int32()),
            ]
        table = pa.Table.from_arrays(cols, schema=schema)
        path = shard_path(data_dir, split, k)
        with io.open_atomic(path, "wb") as f:
            pq.write_table(table, f)
        paths.append(path)
    return paths


def list_splits(data_dir: str) -> list[str]:
    """Names of the splits that have shards under ``data_dir`` (sorted)."""
    hits = io.glob(io.join(data_dir, "*", "part-*.parquet"))
    return sorted({h.rstrip("/").rsplit("/", 2)[-2] for h in hits})


def flat_column(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A list<int32> column as Arrow lays it out: ``(values, offsets)``, row ``i`` =
    ``values[offsets[i]:offsets[i + 1]]`` (int64; offsets ``[n + 1]``)."""
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    offsets = arr.offsets.to_numpy().astype(np.int64)
    return arr.values.to_numpy(zero_copy_only=False).astype(np.int64), offsets


def split_flat(values: np.ndarray, offsets: np.ndarray) -> list[np.ndarray]:
    """One array (a view of ``values``) per row of a :func:`flat_column` layout."""
    if len(offsets) < 2:
        return []
    return np.split(values[offsets[0] : offsets[-1]], offsets[1:-1] - offsets[0])


def _to_arrays(col: pa.ChunkedArray) -> list[np.ndarray]:
    return split_flat(*flat_column(col))


def split_shards(data_dir: str, split: str, meta: Any = None) -> list[tuple[str, int | None]]:
    """The shards of ``split`` in reading order, each with its row count: from meta.json's
    ``shard_rows`` (prepro records them), else listed (rows None: data prepared before).
    ``meta``: ``data_dir``'s :class:`~xdpx.data.meta.PreparedMeta` when the caller has read it.

    Raises:
        DataError: the split has no shards (names the splits that exist).
    """
    from xdpx.data.meta import PreparedMeta

    if meta is None and io.exists(PreparedMeta.path_in(data_dir)):
        meta = PreparedMeta.read(data_dir)
    entry = meta.splits.get(split) if meta is not None else None
    if entry is not None and entry.shard_rows is not None:
        return [(io.join(data_dir, split, name), n) for name, n in entry.shard_rows.items()]
    paths = io.glob(io.join(data_dir, split, "part-*.parquet"))
    if not paths:
        raise DataError(
            f"{data_dir}: no prepared split {split!r} (found: {list_splits(data_dir) or 'none'})"
        )
    return [(p, None) for p in paths]


def read_shard(path: str) -> SplitData:
    """One shard file in memory (``id`` as written: the row's index in its raw file)."""
    with io.open(path, "rb") as f:
        return _split_data(pq.read_table(f))


def label_array(column: pa.ChunkedArray) -> np.ndarray:
    """int64 class indices, or float32 scores (a float label column)."""
    if pa.types.is_floating(column.type):
        return column.to_numpy().astype(np.float32)
    return column.to_numpy().astype(np.int64)


def _split_data(table: pa.Table) -> SplitData:
    pair = "input_ids2" in table.column_names
    return SplitData(
        ids=table.column("id").to_numpy().astype(np.int64),
        input_ids=_to_arrays(table.column("input_ids")),
        labels=label_array(table.column("label")),
        input_ids2=_to_arrays(table.column("input_ids2")) if pair else None,
    )


def load_split(data_dir: str, split: str, meta: Any = None) -> SplitData:
    """Read all shards of ``split`` (in order) into memory (``meta``: as :func:`split_shards`).

    Raises:
        DataError: the split has no shards (names the splits that exist).
    """
    tables = []
    for path, _ in split_shards(data_dir, split, meta):
        with io.open(path, "rb") as f:
            tables.append(pq.read_table(f))
    return _split_data(pa.concat_tables(tables))
