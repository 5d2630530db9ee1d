"""Streaming prepro: raw files -> counts -> Parquet shards, one chunk of rows at a time.

Memory holds a few chunks (``prepro.chunk_rows`` rows each) and one shard being filled,
whatever the corpus size. The work is split so it can be spread out:

* :func:`expand_sources`: the raw files of each split (``data_files`` entries may be
  globs or lists; local or ``oss://`` / ``s3://``), in sorted order;
* :func:`tokenize_file`: one pass over a train file when prepro builds the vocab: each
  text is tokenized once, its tokens counted (for the vocab) and written as ids into the
  file's own list of tokens (``{split}/part-{file:05d}-{k:05d}.parquet`` shards under an
  output directory), then :func:`remap_file` rewrites those shards with the vocab's ids;
* :func:`count_file`: a pass over one train file that counts labels only (the vocab is
  given: ``vocab_file`` or ``hf``; the target map is not);
* :func:`encode_file`: the encoding pass over one file (the other splits, or every split
  with a given vocab), writing the same shards.

``stages.prepro`` runs these file by file with ``prepro.workers`` processes tokenizing
chunks (:func:`ordered_map`: results in input order, so the output does not depend on the
number of workers); the Prefect flow maps them over the files as task runs
(``flows.pipeline``), which a Dask task runner spreads over machines.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from xdpx import io
from xdpx.config import PreproConfig
from xdpx.data.encoder import Encoder, parse_scores
from xdpx.data.overlaps import overlap_hashes
from xdpx.data.readers import MAX_BAD_LINES, MAX_CONTROL_LINES, DataError, iter_examples
from xdpx.data.shards import NO_LABEL, shard_schema
from xdpx.data.tokenizers import TokenBatch, make_tokenizer
from xdpx.data.transliterate import make_transliterator
from xdpx.data.vocab import Vocab
from xdpx.data.workers import (  # noqa: F401 - re-exported
    EncoderSpec,
    _cached as _cached,
    ordered_map,
    worker_pool,
)

__all__ = [
    "EncoderSpec",
    "FileCounts",
    "FileShards",
    "count_file",
    "encode_file",
    "remap_file",
    "tokenize_file",
    "expand_sources",
    "file_shard_name",
    "ordered_map",
    "worker_pool",
]

log = logging.getLogger("xdpx.prepro")


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

    @classmethod
    def of(cls, pieces: list[FileShards]) -> FileCounts:
        """The counts of train files passed by :func:`tokenize_file` (before
        :func:`remap_file`): rows, labels and tokens summed in file order."""
        out = cls(tokens=Counter())
        assert out.tokens is not None
        for p in pieces:
            assert p.tokens is not None and p.token_counts is not None and p.label_names is not None
            out.rows += p.rows
            out.labels.update(dict(zip(p.label_names, p.label_counts, strict=True)))
            out.tokens.update(dict(zip(p.tokens, p.token_counts.tolist(), strict=True)))
        return out


def count_file(path: str, cfg: PreproConfig, allowed_labels: set[str] | None = None) -> FileCounts:
    """A pass over one train file counting its labels (for the target map), when the vocab
    is given (``vocab_file``, ``hf``) and prepro need not tokenize before encoding.

    Args:
        path: the raw file.
        cfg: the prepro section.
        allowed_labels: a fixed target map's labels (``target_map_file``), else None.

    Raises:
        DataError: as :func:`~xdpx.data.readers.iter_examples`.
    """
    out = FileCounts()
    score = cfg.label_type == "score"
    for chunk in iter_examples(path, cfg, True, allowed_labels, cfg.chunk_rows):
        out.rows += len(chunk)
        if score:
            out.labels[SCORE] += len(chunk)
        else:
            out.labels.update(chunk.labels or [])
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
        control_stripped: rows whose control characters were removed (``control_chars:
            strip_warn`` or ``strip``); control_lines: the first of them
            (:attr:`xdpx.data.readers.ReadResult.control_lines`).
        row_hashes, row_labels, row_lines: ``[rows]`` uint64 text hash
            (:func:`xdpx.data.conflicts.text_hashes`), int32 label id and uint32 line of each
            row, for :func:`xdpx.data.conflicts.find_conflicts`; None for an unlabelled file
            (the hashes and lines are those of ``overlap_hashes[:, 0]`` and ``overlap_lines``,
            not copies).
        overlap_hashes, overlap_lines: ``[rows, 2]`` uint64 hashes of each row's text as
            read and normalised (:func:`xdpx.data.overlaps.overlap_hashes`) and ``[rows]``
            uint32 lines, for :func:`xdpx.data.overlaps.find_overlaps` (every file).
        tokens, token_counts, label_names: set by :func:`tokenize_file` until
            :func:`remap_file`: the file's distinct tokens (the shards' ids index it; -1 is
            the unknown token), int64 occurrences of each, and its labels (``label_counts``,
            ``row_labels`` and the shards' labels index them); None otherwise.
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
    control_lines: list[str] = field(default_factory=list)
    row_hashes: np.ndarray | None = None
    row_labels: np.ndarray | None = None
    row_lines: np.ndarray | None = None
    overlap_hashes: np.ndarray | None = None
    overlap_lines: np.ndarray | None = None
    tokens: list[str] | None = None
    token_counts: np.ndarray | None = None
    label_names: list[str] | None = None


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
    overlap: np.ndarray  # uint64 [n, 2] exact and normalised text hashes (overlaps, conflicts)


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
    if encoder.is_hf:
        a, _, full_a, _ = encoder.encode_with_lengths(texts, texts2 if encoder.pair else None)
        (values, offsets), second, full = _flat(a), None, np.asarray(full_a, dtype=np.int32)
    else:
        values, offsets, full = encoder.encode_flat(texts)
        second = encoder.encode_flat(texts2) if texts2 is not None else None
    score = encoder.label_type == "score"
    if labels is None:
        y = np.full(len(texts), np.nan if score else NO_LABEL, np.float32 if score else np.int32)
    else:
        y = encoder.encode_labels(labels).astype(np.float32 if score else np.int32)
    overlap = overlap_hashes(texts, texts2)  # hashed here, in the worker
    return _chunk(values, offsets, full, second, y, encoder.max_len, overlap)


def _conflicts_checked(conflicts: str | None, label_type: str) -> bool:
    """prepro looks for texts under two labels (``prepro.conflicts`` not off; class labels)."""
    return conflicts != "off" and label_type == "class"


def _chunk(
    values: np.ndarray,
    offsets: np.ndarray,
    full: np.ndarray,
    second: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    labels: np.ndarray,
    max_len: int,
    overlap: np.ndarray,
) -> _Encoded:
    """An :class:`_Encoded` chunk and its statistics; ``second`` is the second texts'
    ``(values, offsets, full)``; ``overlap``: the texts' exact and normalised hashes
    (:func:`overlap_hashes`), for the overlaps and the conflicts checks."""
    longest = full if second is None else np.maximum(full, second[2])
    return _Encoded(
        values.astype(np.int32, copy=False),
        offsets.astype(np.int32, copy=False),
        None if second is None else second[0].astype(np.int32, copy=False),
        None if second is None else second[1].astype(np.int32, copy=False),
        labels,
        int(longest.max(initial=0)),
        int((longest > max_len).sum()),
        overlap,
    )


#: The one output (and target map label) of ``prepro.label_type: score``.
SCORE = "score"

#: What :func:`tokenize_file` appends to a shard's path: its shard in Arrow IPC (uncompressed,
#: read back at memory speed), until :func:`remap_file` writes the Parquet shard.
PENDING = ".pending.arrow"


class _ShardWriter:
    """Buffers encoded chunks and writes ``shard_size``-row shards of one raw file
    (``scratch``: as Arrow IPC files at ``<shard path>`` + :data:`PENDING`)."""

    def __init__(
        self,
        out_dir: str,
        split: str,
        file_index: int,
        shard_size: int,
        pair: bool,
        scratch: bool = False,
        score: bool = False,
    ):
        self.scratch = scratch
        self.out_dir, self.split, self.file_index = out_dir, split, file_index
        self.shard_size, self.schema = shard_size, shard_schema(pair, score)
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
            pa.array(enc.labels, type=self.schema.field("label").type),
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
        path = io.join(self.out_dir, self.split, name)
        if self.scratch:  # not fsynced (remap_file writes the shard)
            with io.open_atomic(path + PENDING, "wb", durable=False) as f, pa.ipc.new_file(f, self.schema) as ipc:  # fmt: skip
                ipc.write_table(head)
        else:
            with io.open_atomic(path, "wb") as f:
                pq.write_table(head, f)
        self.written[name] = head.num_rows
        self.pending = [rest] if rest.num_rows else []
        self.buffered = rest.num_rows

    def close(self) -> dict[str, int]:
        """Write the rest (one empty shard for an empty file: its schema is recorded)."""
        if self.buffered or not self.written:
            self._write(self.buffered)
        return self.written


def _pass_file(
    out: FileShards,
    cfg: PreproConfig,
    require_label: bool,
    allowed: set[str] | None,
    writer: _ShardWriter,
    encode: Callable[[Iterable[Any]], Iterator[_Encoded]],
    job: Callable[[Any], Any],
) -> FileShards:
    """Read ``out.source`` chunk by chunk, turn each into a job (``job(chunk)``), encode
    the jobs in order (``encode``) and write them as shards; fill ``out``'s statistics.
    ``label_counts`` covers the label ids seen (callers pad it)."""
    counts = np.zeros(0, dtype=np.int64)
    record = _conflicts_checked(
        cfg.conflicts, cfg.label_type
    )  # the row labels of xdpx.data.conflicts
    labels: list[np.ndarray] = []
    overlaps: list[np.ndarray] = []  # every row's exact and normalised hashes, and its line
    lines: list[np.ndarray] = []

    def jobs() -> Iterator[Any]:
        for chunk in iter_examples(out.source, cfg, require_label, allowed, cfg.chunk_rows):
            out.skipped += chunk.skipped
            out.bad_lines = (out.bad_lines + chunk.bad_lines)[:MAX_BAD_LINES]
            out.control_stripped += chunk.control_stripped
            out.control_lines = (out.control_lines + chunk.control_lines)[:MAX_CONTROL_LINES]
            out.has_labels = chunk.labels is not None
            if len(chunk):
                lines.append(np.asarray(chunk.line_numbers, dtype=np.uint32))
                yield job(chunk)

    with tqdm(desc=f"prepro {out.split} {_name(out.source)}", unit="row") as bar:
        for enc in encode(jobs()):
            writer.add(enc)
            out.rows += len(enc.labels)
            out.max_length_seen = max(out.max_length_seen, enc.max_seen)
            out.truncated += enc.truncated
            if enc.labels.dtype.kind == "f":  # scores: one output, its labelled rows
                seen = np.array([np.isfinite(enc.labels).sum()], dtype=np.int64)
            else:
                seen = np.bincount(enc.labels[enc.labels >= 0])
            if len(seen) > len(counts):
                counts = np.pad(counts, (0, len(seen) - len(counts)))
            counts[: len(seen)] += seen
            if record and out.has_labels:
                labels.append(enc.labels)
            overlaps.append(enc.overlap)
            bar.update(len(enc.labels))
    out.shard_rows = writer.close()
    out.label_counts = counts.tolist()
    out.overlap_hashes = np.concatenate(overlaps) if overlaps else np.zeros((0, 2), np.uint64)
    out.overlap_lines = np.concatenate(lines) if lines else np.zeros(0, np.uint32)
    if record and out.has_labels:  # the conflicts check's rows: views, not copies
        out.row_hashes, out.row_lines = out.overlap_hashes[:, 0], out.overlap_lines
        out.row_labels = np.concatenate(labels) if labels else np.zeros(0, np.int32)
    for msg in out.bad_lines:
        log.warning("skipping bad line %s", msg)
    if out.skipped > len(out.bad_lines):
        log.warning("%s: skipped %d bad lines in all", out.source, out.skipped)
    return out


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
    writer = _ShardWriter(
        out_dir, split, file_index, cfg.shard_size, spec.pair_columns,
        score=cfg.label_type == "score",
    )  # fmt: skip
    _pass_file(
        out, cfg, require_label, set(spec.labels), writer,
        lambda jobs: ordered_map(_encode_chunk, jobs, executor),
        lambda chunk: (spec, chunk.texts, chunk.texts2, chunk.labels),
    )  # fmt: skip
    out.label_counts += [0] * (len(spec.labels) - len(out.label_counts))
    return out


def _tokenize_chunk(
    job: tuple[tuple[str, bool, str | None, int], list[str], list[str] | None],
) -> tuple[TokenBatch, np.ndarray]:
    """Worker: the :class:`TokenBatch` of a chunk's texts followed by its second texts, and
    the texts' exact and normalised hashes (:func:`overlap_hashes`)."""
    (name, lower, translit, max_len), texts, texts2 = job

    def build() -> tuple[Any, Any]:
        return make_tokenizer(name, lower), make_transliterator(translit)

    tokenizer, transliterate = _cached(("tok", name, lower, translit), build)
    both = texts + (texts2 or [])
    batch = tokenizer.tokenize_batch([transliterate(t) for t in both] if transliterate else both, max_len)  # fmt: skip
    return batch, overlap_hashes(texts, texts2)


def tokenize_file(
    path: str,
    file_index: int,
    cfg: PreproConfig,
    tokenizer: str,
    out_dir: str,
    allowed_labels: set[str] | None = None,
    executor: Executor | None = None,
) -> FileShards:
    """The one pass over a train file when prepro builds the vocab: tokenize each text
    once, count its tokens and write its shards with ids into the file's own token list.

    Writes the shards :func:`encode_file` would, as Arrow IPC files
    (``{out_dir}/train/part-{file_index:05d}-*.parquet`` + :data:`PENDING`) whose ids
    index the returned ``tokens`` (``-1``: a text without tokens) and whose labels index
    ``label_names``; :func:`remap_file` writes them as the Parquet shards with the
    vocab's and the target map's ids once every train file is counted
    (:meth:`FileCounts.of`). The tokens' order (first seen in the file) does not reach
    the output.

    Args:
        path: the raw train file; file_index: its position in the split.
        cfg: the prepro section.
        tokenizer: the resolved tokenizer name (``char``, ``word`` or ``whitespace``).
        out_dir: the (temporary) prepared directory.
        allowed_labels: a fixed target map's labels (``target_map_file``), else None.
        executor: a :func:`worker_pool` to tokenize chunks in, or None.

    Raises:
        DataError: as :func:`encode_file`.
    """
    out = FileShards("train", file_index, path)
    score = cfg.label_type == "score"
    writer = _ShardWriter(
        out_dir, "train", file_index, cfg.shard_size, cfg.text2_column is not None, scratch=True,
        score=score,
    )  # fmt: skip
    key = (tokenizer, cfg.lower, cfg.transliterate, cfg.max_len)
    index: dict[str, int] = {}
    label_index: dict[str, int] = {}
    counts = [np.zeros(1024, dtype=np.int64)]  # [token id] occurrences, grown by doubling
    chunks: deque[Any] = deque()

    def job(chunk: Any) -> Any:
        chunks.append(chunk)
        return key, chunk.texts, chunk.texts2

    def encode(jobs: Iterable[Any]) -> Iterator[_Encoded]:
        for batch, overlap in ordered_map(_tokenize_chunk, jobs, executor):
            chunk = chunks.popleft()
            ids = np.fromiter(
                (index.setdefault(t, len(index)) for t in batch.tokens), np.int32, len(batch.tokens)
            )
            if len(index) > len(counts[0]):
                counts[0] = np.pad(counts[0], (0, max(len(index), 2 * len(counts[0])) - len(counts[0])))  # fmt: skip
            counts[0][ids] += batch.counts  # a batch's tokens are distinct
            batch.values = batch.lookup(ids, -1)
            first, second = batch.split(len(chunk)) if chunk.texts2 is not None else (batch, None)
            if score:  # the numbers themselves; one output, "score"
                label_index.setdefault(SCORE, 0)
                labels = parse_scores(chunk.labels)
            else:
                for lab in dict.fromkeys(chunk.labels):  # the chunk's labels, first seen first
                    label_index.setdefault(lab, len(label_index))
                labels = np.fromiter(map(label_index.__getitem__, chunk.labels), np.int32, len(chunk))  # fmt: skip
            yield _chunk(
                first.values, first.offsets, first.full,
                None if second is None else (second.values, second.offsets, second.full),
                labels, cfg.max_len, overlap,
            )  # fmt: skip

    _pass_file(out, cfg, True, allowed_labels, writer, encode, job)
    out.tokens, out.label_names = list(index), list(label_index)
    out.token_counts = counts[0][: len(index)].copy()
    return out


def remap_file(
    piece: FileShards, token_ids: np.ndarray, labels: list[str], out_dir: str
) -> FileShards:
    """Write the shards :func:`tokenize_file` left pending as Parquet, with the vocab's and
    target map's ids (each atomically, its pending file removed): then they equal what
    :func:`encode_file` writes with the final encoder.

    Args:
        piece: :func:`tokenize_file`'s result (updated in place and returned).
        token_ids: int32 ``[len(piece.tokens)]``, the vocab id of each of the file's tokens.
        labels: the target map's labels in class order.
        out_dir: the (temporary) prepared directory holding the shards.

    Raises:
        ValueError: ``piece`` is not a :func:`tokenize_file` result.
    """
    if piece.tokens is None or piece.label_names is None:
        raise ValueError(f"{piece.source}: not a tokenize_file result (already remapped?)")
    ids = np.append(token_ids.astype(np.int32), np.int32(Vocab.unk_id))
    index = {lab: i for i, lab in enumerate(labels)}
    to_label = np.asarray([index[lab] for lab in piece.label_names], dtype=np.int32)
    for name in piece.shard_rows:
        path = io.join(out_dir, piece.split, name)
        with io.open(path + PENDING, "rb") as f:
            table = pa.ipc.open_file(f).read_all()
        for column in ("input_ids", "input_ids2"):
            if column in table.column_names:
                lists = table.column(column).combine_chunks()
                values = ids[lists.values.to_numpy()]
                remapped = pa.ListArray.from_arrays(lists.offsets, pa.array(values))
                table = table.set_column(table.schema.get_field_index(column), column, remapped)
        if not pa.types.is_floating(table.schema.field("label").type):  # scores stay as they are
            label = to_label[table.column("label").to_numpy()]
            table = table.set_column(
                table.schema.get_field_index("label"), "label", pa.array(label)
            )
        with io.open_atomic(path, "wb") as f:
            pq.write_table(table, f)
        io.rm(path + PENDING)
    counts = np.zeros(len(labels), dtype=np.int64)
    counts[to_label] = piece.label_counts
    piece.label_counts = counts.tolist()
    if piece.row_labels is not None:
        piece.row_labels = to_label[piece.row_labels]
    piece.tokens = piece.token_counts = piece.label_names = None
    return piece
