"""Training data in memory or read one shard at a time (``train.lazy_load``).

The Trainer asks a :class:`TrainData` for the window of update ``u`` (global sample ids:
the position of a sample among the rows of its split, shards in reading order) and for the
samples and labels of a list of ids. :class:`InMemoryData` holds the split as
``load_split`` gives it; :class:`LazyData` holds at most the shards the current window
touches plus the next one of the epoch, read in a background thread (it hides the latency
of an object store), whatever the corpus size.

Order of an epoch with ``lazy_load`` (:func:`xdpx.batching.shard_epoch_order`): the shards
in an order drawn from ``(seed, epoch)``, and the rows of each shard in an order drawn from
``(seed, epoch, shard)``; every epoch, the first one included (XDPX kept the first epoch
in file order so training could start while prepro still wrote shards; xdpx does not
train on a split that is still being written, so nothing is gained by leaving the first
epoch unshuffled, and raw files sorted by date or label would bias it). A split of one
shard gets exactly the in-memory order, so ``lazy_load`` on and off train the same model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from xdpx import io
from xdpx.batching import (
    MEGABATCH_WINDOWS,
    epoch_order,
    length_grouped,
    shard_epoch_order,
)
from xdpx.data.shards import (
    SplitData,
    flat_column,
    label_array,
    load_split as _load_split,  # open_train_split
    sample_lengths,
    split_flat,
    split_shards,
)

__all__ = ["TrainData", "InMemoryData", "LazyData", "LazySplit", "open_train_split"]


class TrainData:
    """The training split as the Trainer reads it (see the module docstring).

    Attributes:
        n: samples in the split.
    """

    n: int

    def __len__(self) -> int:
        return self.n

    def set_epoch(self, epoch: int) -> None:
        """Select the order of ``epoch`` (1-based)."""
        raise NotImplementedError

    def group_by_length(self, window_size: int) -> None:
        """Order epochs in runs of ``MEGABATCH_WINDOWS`` update windows of ``window_size``
        ids, each sorted by length (``train.group_by_length``).

        Raises:
            NotImplementedError: a split read shard by shard (``lazy_load``) keeps its order.
        """
        raise NotImplementedError("group_by_length needs the split in memory (lazy_load: false)")

    def window(self, pos: int, size: int) -> np.ndarray:
        """``[<= size]`` int64 global ids at positions ``pos .. pos + size`` of the epoch order."""
        raise NotImplementedError

    def samples(self, ids: np.ndarray) -> list[Any]:
        """The samples of ``ids``: id arrays, or ``(input_ids, input_ids2)`` for pairs."""
        raise NotImplementedError

    def labels(self, ids: np.ndarray) -> np.ndarray:
        """``[len(ids)]`` int64 class indices."""
        raise NotImplementedError

    def label_counts(self, num_labels: int) -> np.ndarray:
        """``[num_labels]`` examples per class in the whole split."""
        raise NotImplementedError

    def locate(self, pos: int) -> str:
        """Where position ``pos`` of the current epoch is, for the log."""
        return f"sample {pos} of the epoch"


class InMemoryData(TrainData):
    """The whole split in memory; the epoch order is :func:`xdpx.batching.epoch_order`.

    Args:
        samples: ``n`` samples (``xdpx.inference.as_samples``).
        labels: ``[n]`` class indices (or float32 scores: ``prepro.label_type: score``).
        seed: ``train.seed``.
    """

    def __init__(self, samples: list[Any], labels: np.ndarray, seed: int) -> None:
        labels = np.asarray(labels)
        self._samples = samples
        self._labels = labels.astype(np.float32 if labels.dtype.kind == "f" else np.int64)
        self.n, self.seed = len(samples), seed
        self._order: np.ndarray | None = None
        self._lengths: np.ndarray | None = None
        self._megabatch = 0

    def group_by_length(self, window_size: int) -> None:
        """Order each epoch with :func:`xdpx.batching.length_grouped` in runs of
        ``MEGABATCH_WINDOWS`` update windows of ``window_size`` ids (``train.group_by_length``);
        call before :meth:`set_epoch`."""
        self._lengths = sample_lengths(self._samples)
        self._megabatch = MEGABATCH_WINDOWS * window_size

    def set_epoch(self, epoch: int) -> None:
        order = epoch_order(self.n, self.seed, epoch)
        if self._lengths is not None:
            order = length_grouped(order, self._lengths, self._megabatch)
        self._order = order

    def window(self, pos: int, size: int) -> np.ndarray:
        assert self._order is not None, "set_epoch first"
        return self._order[pos : pos + size]

    def samples(self, ids: np.ndarray) -> list[Any]:
        return [self._samples[i] for i in ids]

    def labels(self, ids: np.ndarray) -> np.ndarray:
        return self._labels[ids]

    def label_counts(self, num_labels: int) -> np.ndarray:
        return np.bincount(self._labels, minlength=num_labels)


@dataclass
class FlatShard:
    """One shard as Arrow lays it out: each column's ids in one flat array plus offsets, so
    reading it makes no per-row Python objects (the read-ahead thread holds the GIL for
    milliseconds, not for one array per row).

    Attributes:
        values / offsets: ``input_ids`` of row ``i`` = ``values[offsets[i]:offsets[i + 1]]``
            (int64; offsets ``[n + 1]``).
        values2 / offsets2: the same for ``input_ids2`` (separately encoded pairs), or None.
        ids: ``[n]`` the ``id`` column; labels: ``[n]`` int64 (-1 = unlabelled).
    """

    values: np.ndarray
    offsets: np.ndarray
    values2: np.ndarray | None
    offsets2: np.ndarray | None
    ids: np.ndarray
    labels: np.ndarray

    @classmethod
    def read(cls, path: str) -> FlatShard:
        """Read one shard file (local or URL).

        Raises:
            FileNotFoundError: no such shard.
        """
        with io.open(path, "rb") as f:
            table = pq.read_table(f)

        values, offsets = flat_column(table.column("input_ids"))
        values2 = offsets2 = None
        if "input_ids2" in table.column_names:
            values2, offsets2 = flat_column(table.column("input_ids2"))
        return cls(
            values, offsets, values2, offsets2,
            table.column("id").to_numpy().astype(np.int64),
            label_array(table.column("label")),
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.labels)

    def sample(self, i: int) -> Any:
        """Row ``i``: its id array (a view), or ``(input_ids, input_ids2)`` for pairs."""
        x = self.values[self.offsets[i] : self.offsets[i + 1]]
        if self.values2 is None or self.offsets2 is None:
            return x
        return x, self.values2[self.offsets2[i] : self.offsets2[i + 1]]

    def split_data(self) -> SplitData:
        """The shard as :class:`SplitData` (one array per row)."""
        pair = self.values2 is not None and self.offsets2 is not None
        return SplitData(
            ids=self.ids,
            input_ids=split_flat(self.values, self.offsets),
            labels=self.labels,
            input_ids2=split_flat(self.values2, self.offsets2) if pair else None,  # type: ignore[arg-type]
        )


class LazySplit:
    """A prepared split read one shard at a time, with a one-shard read-ahead.

    Args:
        data_dir: the prepared data directory (local or URL).
        split: the split name.
        meta: ``data_dir``'s meta.json (:class:`~xdpx.data.meta.PreparedMeta`) when the
            caller has read it (else read here for the shards' rows).

    Raises:
        DataError: the split has no shards.
    """

    def __init__(self, data_dir: str, split: str, meta: Any = None) -> None:
        self.data_dir, self.split = data_dir, split
        shards = split_shards(data_dir, split, meta)
        self.paths = [p for p, _ in shards]
        self.rows = np.array(
            [n if n is not None else _num_rows(p) for p, n in shards], dtype=np.int64
        )
        self.offsets = np.concatenate([[0], np.cumsum(self.rows)])
        self.n = int(self.offsets[-1])
        self._cache: dict[int, Future[FlatShard]] = {}
        self._lock = threading.Lock()
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="xdpx-shard-read")

    def __len__(self) -> int:
        return self.n

    @property
    def num_shards(self) -> int:
        """Shards in the split."""
        return len(self.paths)

    def shard(self, k: int) -> FlatShard:
        """Shard ``k`` (read now unless already read or being read ahead)."""
        return self._future(k).result()

    def read_ahead(self, k: int) -> None:
        """Start reading shard ``k`` in the background."""
        self._future(k)

    def keep(self, shards: set[int]) -> None:
        """Drop every cached shard not in ``shards`` (memory: what is kept)."""
        with self._lock:
            for k in [k for k in self._cache if k not in shards]:
                del self._cache[k]

    def _future(self, k: int) -> Future[FlatShard]:
        with self._lock:
            if k not in self._cache:
                self._cache[k] = self._reader.submit(FlatShard.read, self.paths[k])
            return self._cache[k]

    def iter_shards(self) -> Iterator[SplitData]:
        """Every shard in reading order (each read while the previous one is used)."""
        for k in range(self.num_shards):
            if k + 1 < self.num_shards:
                self.read_ahead(k + 1)
            yield self.shard(k).split_data()
            self.keep({k + 1})
        self.keep(set())

    def close(self) -> None:
        """Drop the cached shards and stop the read-ahead thread."""
        self.keep(set())
        self._reader.shutdown(wait=True)


def _num_rows(path: str) -> int:
    with io.open(path, "rb") as f:
        return pq.ParquetFile(f).metadata.num_rows


class LazyData(TrainData):
    """The training split read shard by shard (``train.lazy_load: true``).

    Args:
        split: the split.
        seed: ``train.seed``.
        label_counts: ``[num_labels]`` examples per class (meta.json), or None to count them
            by reading the split once when asked.
    """

    def __init__(self, split: LazySplit, seed: int, label_counts: list[int] | None = None):
        self.split, self.seed, self.n = split, seed, split.n
        self._label_counts = label_counts
        self.epoch = 0
        self._shard_order = np.arange(split.num_shards)
        self._starts = split.offsets
        self._rows: dict[int, np.ndarray] = {}  # shard -> its row order this epoch

    def set_epoch(self, epoch: int) -> None:
        if epoch == self.epoch:
            return
        self.epoch = epoch
        self._shard_order = shard_epoch_order(self.split.num_shards, self.seed, epoch)
        rows = self.split.rows[self._shard_order]
        self._starts = np.concatenate([[0], np.cumsum(rows)])
        self._rows = {}

    def _row_order(self, shard: int) -> np.ndarray:
        """The order of the rows of ``shard`` this epoch (kept while the shard is in use)."""
        if shard not in self._rows:
            n = int(self.split.rows[shard])
            if self.split.num_shards == 1:  # the in-memory order (module docstring)
                self._rows[shard] = epoch_order(n, self.seed, self.epoch)
            else:
                self._rows[shard] = np.random.default_rng(
                    [self.seed, self.epoch, shard]
                ).permutation(n)
        return self._rows[shard]

    def window(self, pos: int, size: int) -> np.ndarray:
        stop = min(pos + size, self.n)
        j = int(np.searchsorted(self._starts, pos, side="right")) - 1
        parts: list[np.ndarray] = []
        touched: list[int] = []
        while pos < stop:
            shard = int(self._shard_order[j])
            lo, hi = pos - self._starts[j], min(stop, self._starts[j + 1]) - self._starts[j]
            parts.append(self.split.offsets[shard] + self._row_order(shard)[lo:hi])
            touched.append(shard)
            pos = int(self._starts[j] + hi)
            j += 1
        keep = set(touched)
        if j < len(self._shard_order):  # the shard after the last one touched: read ahead
            keep.add(int(self._shard_order[j]))
            self.split.read_ahead(int(self._shard_order[j]))
        self._rows = {k: v for k, v in self._rows.items() if k in keep}
        self.split.keep(keep)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def _gather(self, ids: np.ndarray) -> list[tuple[FlatShard, np.ndarray, np.ndarray]]:
        """``(shard data, positions in ids, rows in the shard)`` per shard that ``ids`` touch."""
        shard = np.searchsorted(self.split.offsets, ids, side="right") - 1
        out = []
        for s in np.unique(shard):
            where = np.flatnonzero(shard == s)
            out.append((self.split.shard(int(s)), where, ids[where] - self.split.offsets[s]))
        return out

    def samples(self, ids: np.ndarray) -> list[Any]:
        out: list[Any] = [None] * len(ids)
        for shard, where, rows in self._gather(ids):
            for k, i in zip(where.tolist(), rows.tolist(), strict=True):
                out[k] = shard.sample(i)
        return out

    def labels(self, ids: np.ndarray) -> np.ndarray:
        out: np.ndarray | None = None
        for data, where, rows in self._gather(ids):
            if out is None:
                out = np.empty(len(ids), dtype=data.labels.dtype)
            out[where] = data.labels[rows]
        return out if out is not None else np.empty(0, dtype=np.int64)

    def label_counts(self, num_labels: int) -> np.ndarray:
        if self._label_counts is None:
            counts = np.zeros(num_labels, dtype=np.int64)
            for data in self.split.iter_shards():
                counts += np.bincount(data.labels[data.labels >= 0], minlength=num_labels)
            self._label_counts = counts.tolist()
        return np.asarray(self._label_counts, dtype=np.int64)

    def locate(self, pos: int) -> str:
        j = int(np.searchsorted(self._starts, pos, side="right")) - 1
        if j >= len(self._shard_order):
            return "the end of the epoch"
        shard = int(self._shard_order[j])
        return f"shard {shard} ({j + 1}th of the epoch), row {pos - self._starts[j]} of it"


def open_train_split(
    data_dir: str, split: str, seed: int, lazy: bool, meta: Any = None
) -> tuple[TrainData, SplitData | None, Iterator[Any] | list[Any]]:
    """The training split as ``stages.train`` and ``xdpx doctor`` read it.

    Args:
        data_dir: prepared data directory; split: its split to train on.
        seed: ``train.seed`` (the epoch orders).
        lazy: ``train.lazy_load``: one shard at a time (:class:`LazyData`), else the whole
            split in memory (:class:`InMemoryData`).
        meta: ``data_dir``'s :class:`~xdpx.data.meta.PreparedMeta` when the caller has read
            it (else read here).

    Returns:
        ``(data, split_data, texts)``: the :class:`TrainData`; the loaded
        :class:`~xdpx.data.shards.SplitData` (None when lazy); every text of the split
        (pairs: both sides), a list, or a one-pass iterator when lazy (for
        ``model.prepare``: ngram_lr's document frequencies).

    Raises:
        DataError: the split has no shards (names the splits that exist).
    """
    from xdpx.data.meta import PreparedMeta

    if meta is None:
        meta = PreparedMeta.read(data_dir)
    if lazy:
        lazy_split = LazySplit(data_dir, split, meta)
        counts = meta.split(split).label_counts
        return LazyData(lazy_split, seed, counts), None, _streamed_texts(lazy_split)
    data = _load_split(data_dir, split, meta)
    samples = (
        list(data.input_ids)
        if data.input_ids2 is None
        else list(zip(data.input_ids, data.input_ids2, strict=True))
    )  # xdpx.inference.as_samples, without importing torch here
    texts = list(data.input_ids) + list(data.input_ids2 or [])
    return InMemoryData(samples, data.labels, seed), data, texts


def _streamed_texts(split: LazySplit) -> Iterator[Any]:
    """Every text of a split, shard by shard (pairs: each shard's first texts, then its
    second texts), for ``model.prepare`` (ngram_lr's document frequencies)."""
    for data in split.iter_shards():
        yield from data.input_ids
        yield from data.input_ids2 or []
