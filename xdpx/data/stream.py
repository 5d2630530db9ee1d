"""Streaming prepro: raw files -> counts -> Parquet shards, one chunk of rows at a time.

Memory holds a few chunks (``prepro.chunk_rows`` rows each) and one shard being filled,
whatever the corpus size. The work is split so it can be spread out:

* :func:`expand_sources`: the raw files of each split (``data_files`` entries may be
  globs or lists; local or ``oss://`` / ``s3://``), in sorted order;
* :func:`count_file`: the counting pass over one train file (labels for the target map,
  tokens for the vocab);
* :func:`encode_file`: the encoding pass over one file, writing
  ``{split}/part-{file:05d}-{k:05d}.parquet`` shards under an output directory.

``stages.prepro`` runs these file by file with ``prepro.workers`` processes tokenizing
chunks (:func:`ordered_map`: results in input order, so the output does not depend on the
number of workers); the Prefect flow maps them over the files as task runs
(``flows.pipeline``), which a Dask task runner spreads over machines.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from multiprocessing import get_context
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from xdpx import io
from xdpx.config import PreproConfig
from xdpx.data.conflicts import text_hashes
from xdpx.data.encoder import Encoder
from xdpx.data.readers import MAX_BAD_LINES, DataError, iter_examples
from xdpx.data.shards import NO_LABEL, shard_schema
from xdpx.data.tokenizers import HFTokenizer, make_tokenizer
from xdpx.data.transliterate import make_transliterator
from xdpx.data.vocab import TargetMap, Vocab

__all__ = [
    "EncoderSpec",
    "FileCounts",
    "FileShards",
    "count_file",
    "encode_file",
    "expand_sources",
    "file_shard_name",
    "ordered_map",
    "worker_pool",
]

log = logging.getLogger("xdpx.prepro")

T = TypeVar("T")
R = TypeVar("R")

_GLOB_CHARS = "*?["


def expand_sources(cfg: PreproConfig) -> dict[str, list[str]]:
    """The raw files of each split of ``cfg.data_files``, under ``cfg.data_source``.

    An entry is a file name, a glob (``train-*.tsv``) or a list of them; each glob's
    matches are sorted and the files of a split are read in the order given.

    Raises:
        FileNotFoundError: a file is missing or a glob matches nothing (names
            ``prepro.data_files.<split>`` and the path).
        DataError: the same file is listed twice in a split.
    """
    out: dict[str, list[str]] = {}
    for split, entry in cfg.data_files.items():
        files: list[str] = []
        for name in [entry] if isinstance(entry, str) else entry:
            path = io.join(cfg.data_source, name)
            if any(c in name for c in _GLOB_CHARS):
                hits = [h for h in io.glob(path) if io.isfile(h)]
                if not hits:
                    raise FileNotFoundError(f"prepro.data_files.{split}: {path} matches no file")
                files.extend(hits)
            elif not io.exists(path):
                raise FileNotFoundError(f"prepro.data_files.{split}: {path} not found")
            else:
                files.append(path)
        twice = sorted({f for f in files if files.count(f) > 1})
        if twice:
            raise DataError(f"prepro.data_files.{split}: listed more than once: {twice}")
        out[split] = files
    return out


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


def file_shard_name(file_index: int, k: int) -> str:
    """Shard ``k`` of the split's raw file number ``file_index``: ``part-00003-00001.parquet``."""
    return f"part-{file_index:05d}-{k:05d}.parquet"


# ------------------------------------------------------------------------ workers
def worker_pool(workers: int) -> Executor | None:
    """A pool of ``workers`` processes (``spawn``: no inherited threads or locks; started
    at the first job), or None for ``workers == 1`` (everything runs in this process).
    One pool serves both passes: each worker builds a tokenizer / encoder once per spec."""
    if workers <= 1:
        return None
    return ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], executor: Executor | None, ahead: int = 0
) -> Iterator[R]:
    """``map(fn, items)`` on ``executor``: results in the order of ``items``, at most
    ``ahead`` (default: twice the pool's workers) submitted and not yet taken, so memory
    stays bounded however long ``items`` is. Without an executor, a plain ``map``."""
    if executor is None:
        yield from map(fn, items)
        return
    ahead = ahead or 2 * getattr(executor, "_max_workers", 2)
    pending: deque[Any] = deque()
    for item in items:
        pending.append(executor.submit(fn, item))
        if len(pending) >= ahead:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


@dataclass(frozen=True, eq=False)
class EncoderSpec:
    """What a worker process needs to rebuild prepro's :class:`Encoder` (picklable).

    Attributes:
        prepro: the prepro section as a dict (tokenizer options, max_len, transliterate).
        tokenizer: the resolved tokenizer name (not ``auto``).
        vocab: token strings in id order (None for ``hf``).
        labels: the target map's labels in class order.
    """

    prepro: dict[str, Any]
    tokenizer: str
    vocab: list[str] | None
    labels: list[str]

    @property
    def pair_columns(self) -> bool:
        """The shards have ``input_ids2`` (pairs encoded separately, not ``hf``)."""
        return self.prepro.get("text2_column") is not None and self.tokenizer != "hf"

    @cached_property
    def key(self) -> str:
        """A digest of the spec: a worker builds the encoder once per key."""
        text = json.dumps([self.prepro, self.tokenizer, self.vocab, self.labels])
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    def build(self) -> Encoder:
        """The :class:`Encoder` this spec describes.

        Raises:
            ValueError: the hf tokenizer cannot be loaded from ``tokenizer_path``.
        """
        cfg = PreproConfig.model_validate(self.prepro)
        tok = make_tokenizer(self.tokenizer, cfg.lower, cfg.tokenizer_path)
        vocab = None if isinstance(tok, HFTokenizer) else Vocab(self.vocab or [])
        return Encoder(
            tok,
            TargetMap(self.labels),
            cfg.max_len,
            vocab,
            pair=cfg.text2_column is not None,
            transliterate=cfg.transliterate,
        )


_CACHE: dict[Any, Any] = {}  # per process: the tokenizer of the counting pass, the encoder


def _cached(key: Any, build: Callable[[], T]) -> T:
    if key not in _CACHE:
        _CACHE[key] = build()
    return _CACHE[key]


# ------------------------------------------------------------------ counting pass
@dataclass
class FileCounts:
    """The counting pass over train files (mergeable with ``+``).

    Skipped lines are counted by the encoding pass (:class:`FileShards`), which reads
    every file.

    Attributes:
        rows: examples kept.
        labels: label string -> examples.
        tokens: token -> occurrences (texts and second texts), or None when the vocab
            is not built from the data (``vocab_file``, ``hf``).
    """

    rows: int = 0
    labels: Counter[str] = field(default_factory=Counter)
    tokens: Counter[str] | None = None

    def __add__(self, other: FileCounts) -> FileCounts:
        tokens = None
        if self.tokens is not None or other.tokens is not None:
            tokens = Counter(self.tokens or {})
            tokens.update(other.tokens or {})
        return FileCounts(self.rows + other.rows, self.labels + other.labels, tokens)


def _count_tokens(job: tuple[tuple[str, bool, str | None, str | None], list[str]]) -> Counter:
    """Worker: token counts of a chunk of texts, tokenized as prepro's Encoder does."""
    (name, lower, path, translit), texts = job

    def build() -> tuple[Any, Any]:
        return make_tokenizer(name, lower, path), make_transliterator(translit)

    tokenizer, transliterate = _cached(("tok", name, lower, path, translit), build)
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(tokenizer.tokenize(transliterate(text) if transliterate else text))
    return counts


def count_file(
    path: str,
    cfg: PreproConfig,
    tokenizer: str | None,
    allowed_labels: set[str] | None = None,
    executor: Executor | None = None,
) -> FileCounts:
    """The counting pass over one train file: labels, and tokens with ``tokenizer``.

    Args:
        path: the raw file.
        cfg: the prepro section.
        tokenizer: resolved tokenizer name whose tokens to count, or None (labels only).
        allowed_labels: a fixed target map's labels (``target_map_file``), else None.
        executor: a :func:`worker_pool` to tokenize chunks in, or None.

    Raises:
        DataError: as :func:`~xdpx.data.readers.iter_examples`.
    """
    out = FileCounts(tokens=Counter() if tokenizer else None)
    key = (tokenizer, cfg.lower, cfg.tokenizer_path, cfg.transliterate)

    def jobs() -> Iterator[tuple[Any, list[str]]]:
        for chunk in iter_examples(path, cfg, True, allowed_labels, cfg.chunk_rows):
            out.rows += len(chunk)
            out.labels.update(chunk.labels or [])
            yield key, chunk.texts + (chunk.texts2 or [])

    if tokenizer is None:
        for _ in jobs():
            pass
        return out
    assert out.tokens is not None
    with tqdm(desc=f"vocab {_name(path)}", unit="row", leave=False) as bar:
        for counts in ordered_map(_count_tokens, jobs(), executor):
            out.tokens.update(counts)
            bar.update(out.rows - bar.n)
    return out


# ------------------------------------------------------------------ encoding pass
@dataclass
class FileShards:
    """What :func:`encode_file` wrote for one raw file.

    Attributes:
        split / file_index / source: the split, the file's position in it, its path.
        rows: examples kept; skipped: malformed lines skipped (``skip_bad_lines``);
        bad_lines: the first :data:`~xdpx.data.readers.MAX_BAD_LINES` skip reasons.
        shard_rows: shard file name (under ``{split}/``) -> rows, in order.
        max_length_seen: the longest sequence before truncation.
        truncated: rows where a sequence was cut to ``max_len``.
        label_counts: ``[num_labels]`` examples per class (unlabelled rows not counted).
        has_labels: the file has a label column.
        control_stripped: rows whose control characters were removed (``control_chars: strip``).
        row_hashes, row_labels, row_lines: ``[rows]`` uint64 text hash
            (:func:`xdpx.data.conflicts.text_hashes`), int32 label id and int64 line of each
            row, for :func:`xdpx.data.conflicts.find_conflicts`; None for an unlabelled file.
    """

    split: str
    file_index: int
    source: str
    rows: int = 0
    skipped: int = 0
    bad_lines: list[str] = field(default_factory=list)
    shard_rows: dict[str, int] = field(default_factory=dict)
    max_length_seen: int = 0
    truncated: int = 0
    label_counts: list[int] = field(default_factory=list)
    has_labels: bool = True
    control_stripped: int = 0
    row_hashes: np.ndarray | None = None
    row_labels: np.ndarray | None = None
    row_lines: np.ndarray | None = None


@dataclass
class _Encoded:
    """A chunk encoded by a worker: flat id arrays (Arrow list layout) and statistics."""

    values: np.ndarray  # int32, all input_ids concatenated
    offsets: np.ndarray  # int32 [n + 1]
    values2: np.ndarray | None
    offsets2: np.ndarray | None
    labels: np.ndarray  # int32 [n], NO_LABEL where unlabelled
    max_seen: int
    truncated: int
    hashes: np.ndarray | None = None  # uint64 [n] text hashes of a labelled chunk (conflicts)


def _flat(seqs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int32, count=len(seqs))
    offsets = np.zeros(len(seqs) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(seqs).astype(np.int32) if seqs else np.zeros(0, np.int32)
    return values, offsets


def _encode_chunk(
    job: tuple[EncoderSpec, list[str], list[str] | None, list[str] | None],
) -> _Encoded:
    """Worker: encode one chunk (the encoder is built once per spec and process)."""
    spec, texts, texts2, labels = job
    encoder: Encoder = _cached(("encoder", spec.key), spec.build)
    a, b, full, full2 = encoder.encode_with_lengths(texts, texts2 if encoder.pair else None)
    longest = list(full)
    if b is not None and full2 is not None:
        longest = [max(x, y) for x, y in zip(full, full2, strict=True)]
    values, offsets = _flat(a)
    values2, offsets2 = _flat(b) if b is not None else (None, None)
    y = (
        np.full(len(a), NO_LABEL, dtype=np.int32)
        if labels is None
        else encoder.encode_labels(labels).astype(np.int32)
    )
    truncated = sum(n > encoder.max_len for n in longest)
    hashes = None  # hashed here, in the worker, when prepro.conflicts looks for them
    if labels is not None and spec.prepro.get("conflicts") != "off":
        hashes = text_hashes(texts, texts2)
    return _Encoded(values, offsets, values2, offsets2, y, max(longest, default=0), truncated, hashes)  # fmt: skip


class _ShardWriter:
    """Buffers encoded chunks and writes ``shard_size``-row shards of one raw file."""

    def __init__(self, out_dir: str, split: str, file_index: int, shard_size: int, pair: bool):
        self.out_dir, self.split, self.file_index = out_dir, split, file_index
        self.shard_size, self.schema = shard_size, shard_schema(pair)
        self.pending: list[pa.Table] = []
        self.buffered = 0
        self.next_id = 0
        self.written: dict[str, int] = {}

    def add(self, enc: _Encoded) -> None:
        n = len(enc.labels)
        ids = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        self.next_id += n
        cols = [
            pa.array(ids, type=pa.int64()),
            pa.ListArray.from_arrays(pa.array(enc.offsets), pa.array(enc.values)),
            pa.array(np.diff(enc.offsets).astype(np.int32), type=pa.int32()),
            pa.array(enc.labels, type=pa.int32()),
        ]
        if enc.values2 is not None and enc.offsets2 is not None:
            cols += [
                pa.ListArray.from_arrays(pa.array(enc.offsets2), pa.array(enc.values2)),
                pa.array(np.diff(enc.offsets2).astype(np.int32), type=pa.int32()),
            ]
        self.pending.append(pa.Table.from_arrays(cols, schema=self.schema))
        self.buffered += n
        while self.buffered >= self.shard_size:
            self._write(self.shard_size)

    def _write(self, rows: int) -> None:
        table = pa.concat_tables(self.pending) if self.pending else self.schema.empty_table()
        head, rest = table.slice(0, rows), table.slice(rows)
        name = file_shard_name(self.file_index, len(self.written))
        with io.open_atomic(io.join(self.out_dir, self.split, name), "wb") as f:
            pq.write_table(head, f)
        self.written[name] = head.num_rows
        self.pending = [rest] if rest.num_rows else []
        self.buffered = rest.num_rows

    def close(self) -> dict[str, int]:
        """Write the rest (one empty shard for an empty file: its schema is recorded)."""
        if self.buffered or not self.written:
            self._write(self.buffered)
        return self.written


def encode_file(
    path: str,
    split: str,
    file_index: int,
    spec: EncoderSpec,
    cfg: PreproConfig,
    out_dir: str,
    require_label: bool,
    executor: Executor | None = None,
) -> FileShards:
    """Encode one raw file into ``{out_dir}/{split}/part-{file_index:05d}-*.parquet``.

    Shards hold ``cfg.shard_size`` rows (the last one the rest); the ``id`` column is the
    row's index among the kept rows of this file. The output is the same with or without
    ``executor`` (chunks are encoded in input order).

    Args:
        path: the raw file; split / file_index: where its shards go.
        spec: the encoder (rebuilt in each worker).
        cfg: the prepro section (reader options, ``shard_size``, ``chunk_rows``).
        out_dir: the (temporary) prepared directory.
        require_label: every row needs a label (train).
        executor: a :func:`worker_pool`, or None.

    Raises:
        DataError: a malformed line (``path:line: reason``) unless ``skip_bad_lines``, a
            label outside the target map, a missing or unreadable file.
    """
    out = FileShards(split, file_index, path)
    allowed = set(spec.labels)
    writer = _ShardWriter(out_dir, split, file_index, cfg.shard_size, spec.pair_columns)
    counts = np.zeros(len(spec.labels), dtype=np.int64)
    record = cfg.conflicts != "off"  # the row records of xdpx.data.conflicts
    hashes: list[np.ndarray] = []
    lines: list[np.ndarray] = []
    labels: list[np.ndarray] = []

    def jobs() -> Iterator[tuple[Any, ...]]:
        for chunk in iter_examples(path, cfg, require_label, allowed, cfg.chunk_rows):
            out.skipped += chunk.skipped
            out.bad_lines = (out.bad_lines + chunk.bad_lines)[:MAX_BAD_LINES]
            out.control_stripped += chunk.control_stripped
            out.has_labels = chunk.labels is not None
            if len(chunk):
                if record and out.has_labels:
                    lines.append(np.asarray(chunk.line_numbers, dtype=np.int64))
                yield spec, chunk.texts, chunk.texts2, chunk.labels

    with tqdm(desc=f"prepro {split} {_name(path)}", unit="row") as bar:
        for enc in ordered_map(_encode_chunk, jobs(), executor):
            writer.add(enc)
            out.rows += len(enc.labels)
            out.max_length_seen = max(out.max_length_seen, enc.max_seen)
            out.truncated += enc.truncated
            labelled = enc.labels[enc.labels >= 0]
            counts += np.bincount(labelled, minlength=len(counts))[: len(counts)]
            if enc.hashes is not None:
                hashes.append(enc.hashes)
                labels.append(enc.labels)
            bar.update(len(enc.labels))
    out.shard_rows = writer.close()
    out.label_counts = counts.tolist()
    if record and out.has_labels:
        out.row_hashes = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
        out.row_lines = np.concatenate(lines) if lines else np.zeros(0, np.int64)
        out.row_labels = np.concatenate(labels) if labels else np.zeros(0, np.int32)
    for msg in out.bad_lines:
        log.warning("skipping bad line %s", msg)
    if out.skipped > len(out.bad_lines):
        log.warning("%s: skipped %d bad lines in all", path, out.skipped)
    return out
