"""Stage ``prepro``: raw files -> vocab, target map and Parquet shards of token ids.

Outputs under ``prepro.data_dir`` (written to a temporary sibling and swapped in at the
end, so a failure leaves the previous directory intact and nothing partial):

* ``vocab.txt`` - one token per line, line i = id i (``[PAD]`` = 0, ``[UNK]`` = 1; for
  ``tokenizer=hf`` the tokenizer's vocab in id order, informational);
* ``target_map.txt`` - one label per line, line i = class index i;
* ``meta.json`` - tokenizer, sizes, labels, per-split counts and the prepro config;
* ``{split}/part-*.parquet`` - see :mod:`xdpx.data.shards`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel

from xdpx import io, preflight
from xdpx.config import ConfigError, PreproConfig
from xdpx.data import (
    META_FILE,
    TARGET_MAP_FILE,
    VOCAB_FILE,
    DataError,
    HFTokenizer,
    PreparedMeta,
    TargetMap,
    Vocab,
    detect_tokenizer,
    make_tokenizer,
)
from xdpx.data.conflicts import drop_rows, find_conflicts
from xdpx.data.overlaps import find_overlaps, worth_warning
from xdpx.data.readers import MAX_BAD_LINES, MAX_CONTROL_LINES, iter_examples
from xdpx.data.stream import (
    EncoderSpec,
    FileCounts,
    FileShards,
    count_file,
    encode_file,
    expand_sources,
    remap_file,
    tokenize_file,
    worker_pool,
)
from xdpx.data.transliterate import make_transliterator
from xdpx.data.vocab import spells_oov
from xdpx.stage import stage_main

log = logging.getLogger("xdpx.prepro")


class PreproResult(BaseModel):
    """What prepro wrote.

    Attributes:
        data_dir: the output directory.
        vocab_size: number of token ids.
        num_labels: number of classes.
        rows: split -> examples kept.
        skipped: split -> malformed lines skipped.
        paths: ``vocab``, ``target_map``, ``meta`` -> file path; ``shards/<split>`` -> shard paths.
    """

    data_dir: str
    vocab_size: int
    num_labels: int
    rows: dict[str, int]
    skipped: dict[str, int]
    paths: dict[str, Any]


def resolve_tokenizer(cfg: PreproConfig, train_files: list[str]) -> tuple[str, float | None]:
    """The tokenizer name to use: ``cfg.tokenizer``, or for ``auto`` the choice of
    :func:`xdpx.data.detect_tokenizer` on the (transliterated) first training texts (it
    reads the first million characters; the files are streamed, not loaded).

    Returns:
        ``(name, fraction)``: ``fraction`` is the share of letters in scripts written
        without spaces (None unless ``auto``).
    """
    if cfg.tokenizer != "auto":
        return cfg.tokenizer, None
    transliterate = make_transliterator(cfg.transliterate)

    def texts() -> Iterator[str]:
        for path in train_files:
            for chunk in iter_examples(path, cfg, True, None, cfg.chunk_rows):
                for t in chunk.texts + (chunk.texts2 or []):
                    yield transliterate(t) if transliterate else t

    name, fraction = detect_tokenizer(texts())
    log.info(
        "tokenizer=auto: %s (%.1f%% of the train letters are in scripts without spaces)",
        name,
        100 * fraction,
    )
    return name, fraction


def needs_counts(cfg: PreproConfig, tokenizer: str) -> str | None:
    """The tokenizer whose tokens prepro counts for the vocab, tokenizing the train files
    once (:class:`TokenizeJob`); None: the vocab is given or is the hf tokenizer's."""
    return None if cfg.vocab_file or tokenizer == "hf" else tokenizer


def build_spec(
    cfg: PreproConfig, tokenizer: str, counts: FileCounts | None
) -> tuple[EncoderSpec, list[str]]:
    """The encoder of this run (as an :class:`EncoderSpec`) and the vocab.txt lines.

    Args:
        cfg: the prepro section.
        tokenizer: the resolved tokenizer name.
        counts: the counting pass over the train files (:func:`count_file`, summed), or
            None when both the target map and the vocab are given.

    Raises:
        DataError: no usable train examples, or a bad vocab / target-map file.
        ConfigError: the hf tokenizer cannot be loaded.
    """
    if counts is not None and not counts.rows:
        raise DataError(f"{_train_files(cfg)}: no usable examples in the train split")
    if cfg.target_map_file:
        target_map = TargetMap.load(cfg.target_map_file)
    else:
        assert counts is not None
        target_map = TargetMap.build(counts.labels.elements(), cfg.special_targets)
    vocab_lines: list[str] | None
    if tokenizer == "hf":
        try:
            tok = make_tokenizer("hf", cfg.lower, cfg.tokenizer_path)
        except ValueError as e:
            raise ConfigError(f"prepro.tokenizer={cfg.tokenizer}: {e}") from None
        assert isinstance(tok, HFTokenizer)
        vocab_lines, spec_vocab = tok.vocab_tokens(), None
    else:
        if cfg.vocab_file:
            vocab = Vocab.load(cfg.vocab_file)
        else:
            assert counts is not None and counts.tokens is not None
            vocab = Vocab.build(counts.tokens, cfg.threshold, cfg.nwords)
            if spells_oov(cfg.oov, tokenizer):
                vocab = vocab.with_chars()
        vocab_lines = spec_vocab = list(vocab.tokens)
    spec = EncoderSpec(cfg.model_dump(mode="json"), tokenizer, spec_vocab, list(target_map.labels))
    return spec, vocab_lines


def _train_files(cfg: PreproConfig) -> str:
    """The train entry of ``data_files`` under ``data_source``, for messages."""
    entry = cfg.data_files["train"]
    names = [entry] if isinstance(entry, str) else entry
    return ", ".join(io.join(cfg.data_source, n) for n in names)


def split_meta(cfg: PreproConfig, pieces: list[FileShards]) -> dict[str, Any]:
    """The ``meta.json`` entry of one split from its files' :class:`FileShards` (in order)."""
    rows = sum(p.rows for p in pieces)
    sources = [p.source for p in pieces]
    bad: list[str] = [m for p in pieces for m in p.bad_lines][:MAX_BAD_LINES]
    labels = [sum(c) for c in zip(*(p.label_counts for p in pieces), strict=True)]
    has_labels = all(p.has_labels for p in pieces)
    meta = {
        "rows": rows,
        "skipped": sum(p.skipped for p in pieces),
        "source": sources[0] if len(sources) == 1 else sources,
        "max_length_seen": max(p.max_length_seen for p in pieces),
        "truncated": sum(p.truncated for p in pieces),
        "has_labels": has_labels,
        "shards": sum(len(p.shard_rows) for p in pieces),
        "bad_lines": bad,
        "shard_rows": {k: v for p in pieces for k, v in p.shard_rows.items()},
        "label_counts": labels if has_labels else None,
        "control_stripped": sum(p.control_stripped for p in pieces),
    }
    if meta["control_stripped"]:
        _report_control(cfg, pieces[0].split, meta["control_stripped"], pieces)
    log.info(
        "%s: %d rows from %d file(s), %d skipped, %d truncated to max_len=%d (longest %d)",
        pieces[0].split, rows, len(pieces), meta["skipped"], meta["truncated"], cfg.max_len,
        meta["max_length_seen"],
    )  # fmt: skip
    return meta


def _report_control(cfg: PreproConfig, split: str, rows: int, pieces: list[FileShards]) -> None:
    """Log the rows of ``split`` whose control characters were removed: one WARN naming the
    first lines with ``control_chars: strip_warn``, an INFO with ``strip``."""
    first = [m for p in pieces for m in p.control_lines][:MAX_CONTROL_LINES]
    more = f" (first: {'; '.join(first)})" if first else ""
    if cfg.control_chars == "strip_warn":
        log.warning(
            "%s: removed control characters from %d row(s)%s; prepro.control_chars=strip_warn "
            "(set strip to remove them silently, error to stop on them)",
            split, rows, more,
        )  # fmt: skip
    else:
        log.info("%s: removed control characters from %d row(s)%s", split, rows, more)


def write_prepared(
    cfg: PreproConfig,
    tmp: str,
    spec: EncoderSpec,
    vocab_lines: list[str],
    pieces: list[FileShards],
    tokenizer_auto: float | None,
) -> PreproResult:
    """Write vocab.txt, target_map.txt and meta.json into ``tmp`` (which holds the shards
    of ``pieces``) and swap it in as ``cfg.data_dir``.

    Raises:
        DataError: the train split has no usable examples.
    """
    final = cfg.data_dir.rstrip("/")
    conflicts = resolve_conflicts(cfg, tmp, pieces, spec.labels)
    overlaps = report_overlaps(pieces)
    by_split: dict[str, list[FileShards]] = {}
    for p in pieces:  # the mapper returns them in job order: split by split, files in order
        by_split.setdefault(p.split, []).append(p)
    splits_meta = {split: split_meta(cfg, ps) for split, ps in by_split.items()}
    if not splits_meta["train"]["rows"]:
        raise DataError(f"{_train_files(cfg)}: no usable examples in the train split")
    missing, train_only = labels_missing(splits_meta, spec.labels)
    encoder = spec.build()
    io.write_text(io.join(tmp, VOCAB_FILE), "".join(f"{t}\n" for t in vocab_lines))
    encoder.target_map.save(io.join(tmp, TARGET_MAP_FILE))
    PreparedMeta(
        tokenizer=spec.tokenizer,
        tokenizer_auto=(
            None
            if tokenizer_auto is None
            else {"chosen": spec.tokenizer, "no_space_script_fraction": tokenizer_auto}
        ),
        lower=cfg.lower,
        max_len=cfg.max_len,
        vocab_size=encoder.vocab_size,
        num_labels=encoder.num_labels,
        labels=encoder.labels,
        pad_id=encoder.pad_id,
        unk_id=encoder.unk_id,
        sep_id=getattr(encoder.tokenizer, "sep_id", None),
        pair=encoder.pair_encoding == "separate",
        pair_encoding=encoder.pair_encoding,
        splits=splits_meta,
        conflicts=conflicts,
        overlaps=overlaps,
        labels_missing=missing,
        train_only_labels=train_only,
        prepro=cfg.model_dump(mode="json"),
    ).write(tmp)
    io.replace_dir(tmp, final, marker=META_FILE)
    return PreproResult(
        data_dir=final,
        vocab_size=encoder.vocab_size,
        num_labels=encoder.num_labels,
        rows={s: m["rows"] for s, m in splits_meta.items()},
        skipped={s: m["skipped"] for s, m in splits_meta.items()},
        paths={
            "vocab": io.join(final, VOCAB_FILE),
            "target_map": io.join(final, TARGET_MAP_FILE),
            "meta": io.join(final, META_FILE),
            "shards": {
                s: [io.join(final, s, name) for name in m["shard_rows"]]
                for s, m in splits_meta.items()
            },
        },
    )


def resolve_conflicts(
    cfg: PreproConfig, tmp: str, pieces: list[FileShards], labels: list[str]
) -> dict[str, Any] | None:
    """Find texts under two labels (:func:`xdpx.data.conflicts.find_conflicts`) and apply
    ``cfg.conflicts``: ``keep`` warns, ``drop`` rewrites the shards without them (in ``tmp``,
    before anything is swapped in), ``error`` raises.

    Returns:
        the ``meta.json`` ``conflicts`` entry; None when no split has labels or with
        ``conflicts: off`` (no row was recorded).

    Raises:
        DataError: ``conflicts: error`` and a conflict, naming the first file:line pairs.
    """
    if not any(p.row_hashes is not None for p in pieces):
        return None
    found = find_conflicts(pieces, labels)
    if found.texts:
        scope = ", ".join(
            [f"{n} within {s}" for s, n in found.within.items() if n]
            + [f"{n} in train and {s}" for s, n in found.across.items() if n]
        )
        shown = "; ".join(found.examples)
        if cfg.conflicts == "error":
            raise DataError(
                f"{found.texts} text(s) under two labels ({scope}), e.g. {shown}; fix the labels, "
                "or set prepro.conflicts=drop (remove them) or keep"
            )
        action = "dropped from every split" if cfg.conflicts == "drop" else "kept (prepro.conflicts=keep)"  # fmt: skip
        log.warning("%d text(s) under two labels (%s), %s; e.g. %s", found.texts, scope, action, shown)  # fmt: skip
        if cfg.conflicts == "drop":
            for i, mask in found.drop.items():
                drop_rows(tmp, pieces[i], mask)
    return found.report(cfg.conflicts)


def report_overlaps(pieces: list[FileShards]) -> dict[str, dict[str, Any]]:
    """Texts shared by every pair of splits (:func:`xdpx.data.overlaps.find_overlaps`, after
    ``conflicts: drop``), each pair worth a look (:func:`~xdpx.data.overlaps.worth_warning`:
    a text shared as read, or near-duplicates in 1% of the smaller split) logged as one WARN
    naming the two splits, their files when they hold the same texts, the counts and the
    first file:line pairs. The rows' records are released.

    Returns:
        the ``meta.json`` ``overlaps`` entry.
    """
    found = find_overlaps(pieces)
    sources: dict[str, list[str]] = {}
    rows: dict[str, int] = {}
    for p in pieces:
        sources.setdefault(p.split, []).append(p.source)
        rows[p.split] = rows.get(p.split, 0) + p.rows
        p.overlap_hashes = p.overlap_lines = None
    for entry in found.values():
        if not worth_warning(entry):
            continue
        a, b = entry["splits"]
        what = (
            f"hold the same texts ({', '.join(sources[a])} and {', '.join(sources[b])}): "
            f"{entry['exact']} shared"
            if entry["identical"]
            else f"share {entry['exact']} text(s)"
        )
        log.warning(
            "%s and %s %s and %d near-duplicate(s) (case, whitespace, punctuation) in "
            "%d of %d %s rows and %d of %d %s rows; e.g. %s; a model selected or scored on "
            "texts it has seen is flattered: deduplicate across splits",
            a, b, what, entry["near"], entry["rows"][a], rows[a], a, entry["rows"][b],
            rows[b], b, "; ".join(entry["examples"]),
        )  # fmt: skip
    return found


def labels_missing(
    splits_meta: dict[str, dict[str, Any]], labels: list[str]
) -> tuple[dict[str, list[str]], list[str]]:
    """Labels with train examples that another labelled split lacks.

    Returns:
        ``(split -> its missing labels, labels missing from every other labelled split)``;
        each split's list is logged as a WARN (such a class is never scored there).
    """
    train = splits_meta["train"]["label_counts"] or []
    others = {
        s: m["label_counts"]
        for s, m in splits_meta.items()
        if s != "train" and m["has_labels"] and m["label_counts"] is not None
    }
    missing = {}
    for split, counts in others.items():
        gone = [labels[i] for i, (a, b) in enumerate(zip(train, counts, strict=True)) if a and not b]  # fmt: skip
        if gone:
            missing[split] = gone
            log.warning("%s has no example of label(s) %s seen in train", split, gone)
    train_only = [
        labels[i] for i, a in enumerate(train) if a and others and not any(c[i] for c in others.values())
    ]  # fmt: skip
    if train_only:
        log.warning("label(s) %s occur in train only: no dev or test example", train_only)
    return missing, train_only


@contextlib.contextmanager
def building(cfg: PreproConfig) -> Iterator[str]:
    """A fresh temporary sibling of ``cfg.data_dir`` to write into; removed on failure
    (the previous ``data_dir`` stays intact)."""
    tmp = io.tmp_sibling(cfg.data_dir.rstrip("/"))
    try:
        io.makedirs(tmp)
        yield tmp
    except BaseException:
        with contextlib.suppress(Exception):  # keep the original error
            io.rm(tmp, recursive=True)
        raise


class _FileJob:
    """A per-file job; ``label`` (``<verb> <file>``) names its task run in the flow."""

    verb: ClassVar[str]
    path: str

    @property
    def label(self) -> str:
        """``<verb> <file>`` (task run names)."""
        return f"{self.verb} {self.path.rsplit('/', 1)[-1]}"


@dataclass(frozen=True)
class CountJob(_FileJob):
    """A pass over one train file counting its labels (:func:`xdpx.data.stream.count_file`)."""

    verb: ClassVar[str] = "count"
    path: str
    cfg: PreproConfig
    allowed_labels: frozenset[str] | None


@dataclass(frozen=True)
class TokenizeJob(_FileJob):
    """The one pass over a train file when the vocab is built from the data
    (:func:`xdpx.data.stream.tokenize_file`)."""

    verb: ClassVar[str] = "tokenize"
    path: str
    file_index: int
    cfg: PreproConfig
    tokenizer: str
    out_dir: str
    allowed_labels: frozenset[str] | None


@dataclass(frozen=True, eq=False)
class RemapJob(_FileJob):
    """A tokenized train file's shards rewritten with the vocab's ids
    (:func:`xdpx.data.stream.remap_file`)."""

    verb: ClassVar[str] = "remap"
    piece: FileShards
    token_ids: Any  # np.ndarray int32 [len(piece.tokens)]
    labels: list[str]
    out_dir: str

    @property
    def path(self) -> str:  # type: ignore[override]
        """The raw file."""
        return self.piece.source


@dataclass(frozen=True)
class EncodeJob(_FileJob):
    """The encoding pass over one raw file (:func:`xdpx.data.stream.encode_file`)."""

    verb: ClassVar[str] = "encode"
    path: str
    split: str
    file_index: int
    spec: EncoderSpec
    cfg: PreproConfig
    out_dir: str

    @property
    def label(self) -> str:
        """``encode <split> <file>`` (task run names)."""
        return f"encode {self.split} {self.path.rsplit('/', 1)[-1]}"


#: ``mapper(jobs) -> results`` in the order of ``jobs``: how the per-file work is run.
Mapper = Callable[[list[Any]], list[Any]]


Job = CountJob | TokenizeJob | RemapJob | EncodeJob


def do_job(job: Job, pool: Any = None) -> FileCounts | FileShards:
    """Run one per-file job (in this process, chunks tokenized in ``pool`` if given)."""
    allowed = getattr(job, "allowed_labels", None)
    allowed = set(allowed) if allowed is not None else None
    if isinstance(job, CountJob):
        return count_file(job.path, job.cfg, allowed)
    if isinstance(job, TokenizeJob):
        return tokenize_file(job.path, job.file_index, job.cfg, job.tokenizer, job.out_dir, allowed, pool)  # fmt: skip
    if isinstance(job, RemapJob):
        return remap_file(job.piece, job.token_ids, job.labels, job.out_dir)
    return encode_file(
        job.path, job.split, job.file_index, job.spec, job.cfg, job.out_dir,
        job.split == "train", pool,
    )  # fmt: skip


@io.stage("prepro")
def run(cfg: PreproConfig, mapper: Mapper | None = None) -> PreproResult:
    """Prepare every split of ``cfg.data_files``; see the module docstring for the outputs.

    Streams, a chunk of ``chunk_rows`` rows at a time (:mod:`xdpx.data.stream`), so memory
    does not grow with the corpus. When the vocab is built from the data, each train file
    is read and tokenized once (:class:`TokenizeJob`: its tokens counted, its shards
    written with ids into the file's own token list), then the vocab and target map are
    built from the counts, the train shards' ids rewritten (:class:`RemapJob`) and the
    other splits encoded (:class:`EncodeJob`). With a given vocab (``vocab_file``,
    ``hf``), a pass over the train files counts the labels (:class:`CountJob`, unless
    ``target_map_file``) and every file is encoded.

    Args:
        cfg: the prepro section.
        mapper: runs the per-file jobs (:class:`CountJob`, :class:`TokenizeJob`,
            :class:`RemapJob`, :class:`EncodeJob`) and returns their results in order; default :func:`local_map` over a pool of
            ``cfg.workers`` processes. The Prefect flow passes one that maps them as task
            runs.

    Raises:
        DataError: a missing file, a malformed line (``file:line: reason``) unless
            ``cfg.skip_bad_lines``, a label outside ``cfg.target_map_file``, a bad vocab or
            target-map file, or an empty train split.
        ConfigError: the hf tokenizer cannot be loaded.
    """
    if mapper is None:
        pool = worker_pool(cfg.workers)
        with pool if pool is not None else contextlib.nullcontext():
            return _run(cfg, lambda jobs: local_map(jobs, pool, cfg.workers))
    return _run(cfg, mapper)


def local_map(jobs: list[Any], pool: Any, workers: int) -> list[Any]:
    """The default mapper. With a pool: whole files in the worker processes when the files
    split evenly enough (at least ``workers`` of them, none more than ``1/workers`` of the
    bytes: then this process only waits), else the files one by one with each file's
    chunks tokenized in the pool (this process reads them). Without: one by one, here."""
    if pool is None or not jobs:
        return [do_job(job) for job in jobs]
    sizes = [io.size(job.path) for job in jobs]
    if len(jobs) >= workers and max(sizes) * workers <= sum(sizes):
        return list(pool.map(do_job, jobs))
    return [do_job(job, pool) for job in jobs]


def _run(cfg: PreproConfig, mapper: Mapper) -> PreproResult:
    cfg = preflight.check_prepro(cfg)
    sources = expand_sources(cfg)
    tokenizer, fraction = resolve_tokenizer(cfg, sources["train"])
    fixed = frozenset(TargetMap.load(cfg.target_map_file).labels) if cfg.target_map_file else None
    if needs_counts(cfg, tokenizer) is None:  # the vocab is given: count labels, encode
        counts = None
        if not cfg.target_map_file:
            counts = sum(mapper([CountJob(p, cfg, fixed) for p in sources["train"]]), FileCounts())
        spec, vocab_lines = build_spec(cfg, tokenizer, counts)
        log.info("vocab: %d ids; labels: %s", len(vocab_lines), spec.labels)
        with building(cfg) as tmp:
            encode = [
                EncodeJob(path, split, i, spec, cfg, tmp)
                for split, files in sources.items()
                for i, path in enumerate(files)
            ]
            return write_prepared(cfg, tmp, spec, vocab_lines, mapper(encode), fraction)
    with building(cfg) as tmp:  # tokenize the train files once, count, remap their ids
        train = mapper(
            [TokenizeJob(p, i, cfg, tokenizer, tmp, fixed) for i, p in enumerate(sources["train"])]
        )
        spec, vocab_lines = build_spec(cfg, tokenizer, FileCounts.of(train))
        log.info("vocab: %d ids; labels: %s", len(vocab_lines), spec.labels)
        vocab = Vocab(vocab_lines)
        jobs: list[Job] = [
            RemapJob(
                train[i],
                np.asarray(vocab.encode(train[i].tokens or []), np.int32),
                spec.labels,
                tmp,
            )  # fmt: skip
            if split == "train"
            else EncodeJob(path, split, i, spec, cfg, tmp)
            for split, files in sources.items()
            for i, path in enumerate(files)
        ]
        return write_prepared(cfg, tmp, spec, vocab_lines, mapper(jobs), fraction)


def main(argv: list[str] | None = None) -> PreproResult:
    """``python -m stages.prepro [--params params.yaml] [prepro.key=value ...]``."""
    return stage_main(
        "prepro",
        run,
        lambda r: (
            f"prepared {r.rows} rows (skipped {r.skipped}) -> {r.data_dir} "
            f"(vocab_size={r.vocab_size}, num_labels={r.num_labels})"
        ),
        argv,
        preflight.check_prepro,
    )


if __name__ == "__main__":
    main()
