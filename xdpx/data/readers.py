"""Read raw tsv / csv / jsonl files into texts, labels and the original rows.

Every malformed line raises :class:`DataError` with ``"{path}:{line}: {reason}"``
(1-based physical line number, the reason names the offending field), unless
``cfg.skip_bad_lines`` is set, in which case it is skipped and counted.
Completely empty lines (nothing but the line break) are ignored everywhere.
A text holding a control character (Unicode Cc: C0 other than tab, CR and LF, DEL, C1) is
handled by ``prepro.control_chars``: ``strip_warn`` (the default) removes them (the lines
counted in ``ReadResult.control_stripped``, the first ones named in ``control_lines`` for
prepro's WARN) but fails on a NUL, the sign of a binary or UTF-16 file; ``strip`` removes
every one, NUL included; ``error`` makes any of them a bad line.
"""

from __future__ import annotations

import csv
import io as _pyio
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from xdpx import io
from xdpx.config import PreproConfig

__all__ = [
    "DataError",
    "ReadResult",
    "TextError",
    "clean_text",
    "read_examples",
    "iter_examples",
    "MAX_BAD_LINES",
]

logger = logging.getLogger(__name__)

#: How many skipped-line reasons :class:`ReadResult` keeps in ``bad_lines``.
MAX_BAD_LINES = 10
#: The control characters (Unicode category Cc) a text may not keep: C0 except the
#: whitespace a text may hold (tab, LF, CR), DEL and C1 (U+0080-U+009F).
CONTROL_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_CONTROL_NAMES = {0: "NUL", 7: "BEL", 8: "BS", 0x0B: "VT", 0x0C: "FF", 0x1B: "ESC", 0x7F: "DEL"}
#: How many stripped lines :class:`ReadResult` names in ``control_lines`` (prepro's WARN).
MAX_CONTROL_LINES = 3


class DataError(ValueError):
    """A problem with input data: missing file, malformed line, unknown label.

    The message names the file and, for a line problem, its 1-based line number
    and the field: ``"data/raw/train.tsv:17: empty text (column 'text')"``.
    """


@dataclass
class ReadResult:
    """The kept examples of one raw file, in file order.

    Attributes:
        rows: original columns of each kept line (column name -> raw string value).
        columns: column names (header, the configured names, or the JSON keys seen).
        texts: ``[n]`` first text of each kept line (whitespace-stripped).
        texts2: ``[n]`` second text for pair tasks (``cfg.text2_column``), else None.
        labels: ``[n]`` label strings (stripped), or None when the file has no label column
            (only possible with ``require_label=False``).
        line_numbers: ``[n]`` 1-based physical line number of each kept example.
        skipped: number of malformed lines skipped (``cfg.skip_bad_lines``).
        control_stripped: kept lines whose control characters were removed
            (``cfg.control_chars: strip_warn`` or ``strip``).
        control_lines: the first :data:`MAX_CONTROL_LINES` of them,
            ``"path:line: U+0012 at character 9 (column 'text')"``.
        bad_lines: the first :data:`MAX_BAD_LINES` skip reasons (``"path:line: reason"``).
    """

    rows: list[dict[str, str]] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    texts2: list[str] | None = None
    labels: list[str] | None = None
    line_numbers: list[int] = field(default_factory=list)
    skipped: int = 0
    bad_lines: list[str] = field(default_factory=list)
    control_stripped: int = 0
    control_lines: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.texts)


class TextError(ValueError):
    """A text that ``prepro.control_chars`` refuses (the message names the character and
    its position), or nothing left once its control characters are removed."""


def clean_text(text: str, mode: str = "strip_warn", where: str = "the text") -> tuple[str, str]:
    """``text`` as prepro keeps it under ``prepro.control_chars = mode``, and what was
    removed (the first control character, its position and ``where``: ``"U+0012 at
    character 9 (column 'text')"``; ``""``: nothing). The server applies the same rule to
    every request's texts, so what trains and what serves see the same text.

    ``strip_warn``: control characters (:data:`CONTROL_CHARS`) removed, but a NUL (the sign
    of a binary or UTF-16 file) refused; ``strip``: every one removed, NUL included;
    ``error``: any of them refused.

    Raises:
        TextError: a refused control character (named with its code point and 1-based
            position), or an empty text once they are removed.
    """
    found = CONTROL_CHARS.search(text)
    if found is None:
        return text, ""
    nul = text.find("\x00") if mode == "strip_warn" else -1
    if mode == "error" or nul >= 0:
        at = found.start() if nul < 0 else nul
        code = ord(text[at])
        name = _CONTROL_NAMES.get(code, "control character")
        fix = (
            "remove it, or set prepro.control_chars=strip_warn (strip it and warn) or strip"
            if nul < 0
            else "a NUL is the sign of a binary or UTF-16 file (re-save it as UTF-8); "
            "prepro.control_chars=strip removes NULs too"
        )
        raise TextError(f"{name} (U+{code:04X}) at character {at + 1} of the text ({where}); " + fix)  # fmt: skip
    cleaned = CONTROL_CHARS.sub("", text).strip()
    if not cleaned:
        raise TextError(f"empty text after removing control characters ({where})")
    code = ord(found.group())
    return cleaned, f"U+{code:04X} at character {found.start() + 1} ({where})"


class _LineError(Exception):
    """Internal: a malformed line; converted to DataError or skipped by the caller."""


class ScoreLabels:
    """The labels a ``prepro.label_type: score`` file may hold: any finite number
    (``float(label)``); used where a target map's label set is used for class labels."""

    def __contains__(self, label: object) -> bool:
        try:
            return math.isfinite(float(label))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return False


class _Collector:
    """Validates one record (column -> value) and appends it to a ReadResult."""

    def __init__(
        self,
        path: str,
        cfg: PreproConfig,
        result: ReadResult,
        has_label: bool,
        require_label: bool,
        allowed_labels: set[str] | None,
        keep_rows: bool = True,
    ) -> None:
        self.path = path
        self.cfg = cfg
        self.has_label = has_label
        self.require_label = require_label
        self.allowed_labels = allowed_labels
        self.keep_rows = keep_rows
        self.start(result)

    def start(self, result: ReadResult) -> None:
        """Append to ``result`` from now on (the next chunk of a streamed read)."""
        self.result = result
        if self.cfg.text2_column:
            result.texts2 = []
        if self.has_label:
            result.labels = []

    def add(self, line: int, record: dict[str, Any], raw: dict[str, str]) -> None:
        """Validate one record (column -> value) and append it (``raw`` kept as the row)."""
        cfg = self.cfg
        get = record.get
        self._accept(
            line,
            get(cfg.text_column) if cfg.text_column else None,
            get(cfg.text2_column) if cfg.text2_column else None,
            get(cfg.label_column) if self.has_label else None,
            raw,
        )

    def add_fields(self, line: int, fields: list[str], at: tuple[int, int, int]) -> None:
        """:meth:`add` of a tsv/csv record with the file's columns, without building a dict:
        ``at`` = the positions of the text, text2 and label columns (-1: none)."""
        text_at, text2_at, label_at = at
        self._accept(
            line,
            fields[text_at],
            fields[text2_at] if text2_at >= 0 else None,
            fields[label_at] if label_at >= 0 else None,
            None,
        )

    def _accept(
        self, line: int, text: Any, text2: Any, label: Any, raw: dict[str, str] | None
    ) -> None:
        cfg = self.cfg
        text, stripped = self._clean(self._text(text, cfg.text_column, "text"), cfg.text_column)
        if cfg.text2_column:
            text2, stripped2 = self._clean(self._text(text2, cfg.text2_column, "text"), cfg.text2_column)  # fmt: skip
            stripped = stripped or stripped2
        if self.has_label:
            if label is None:
                raise _LineError(f"missing label (column {cfg.label_column!r})")
            label = _as_str(label, cfg.label_column).strip()
            if not label:
                raise _LineError(f"empty label (column {cfg.label_column!r})")
            if isinstance(self.allowed_labels, ScoreLabels) and label not in self.allowed_labels:
                raise _LineError(
                    f"label {label!r} (column {cfg.label_column!r}) is not a finite number "
                    "(prepro.label_type=score)"
                )
            if self.allowed_labels is not None and label not in self.allowed_labels:
                known = sorted(self.allowed_labels)
                shown = known if len(known) <= 20 else known[:20] + ["..."]
                raise _LineError(
                    f"label {label!r} (column {cfg.label_column!r}) is not in the target map {shown}"
                )
        r = self.result
        if stripped:
            r.control_stripped += 1
            if len(r.control_lines) < MAX_CONTROL_LINES:
                r.control_lines.append(f"{self.path}:{line}: {stripped}")
        if self.keep_rows:
            assert raw is not None
            r.rows.append(raw)
        r.texts.append(text)
        if r.texts2 is not None:
            r.texts2.append(text2 or "")
        if r.labels is not None:
            r.labels.append(label or "")
        r.line_numbers.append(line)

    def _clean(self, text: str, column: str | None) -> tuple[str, str]:
        """:func:`clean_text` under this reader's ``control_chars``; a refused text is a bad
        line (``_LineError``)."""
        try:
            return clean_text(text, self.cfg.control_chars, f"column {column!r}")
        except TextError as e:
            raise _LineError(str(e)) from None

    @staticmethod
    def _text(value: Any, column: str | None, what: str) -> str:
        if value is None:
            raise _LineError(f"missing {what} (column {column!r})")
        text = _as_str(value, column).strip()
        if not text:
            raise _LineError(f"empty {what} (column {column!r})")
        return text


def _as_str(value: Any, column: str | None) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        raise _LineError(f"column {column!r} must be a string, got {type(value).__name__}")
    return str(value)


def _open_lines(path: str) -> Iterator[str]:
    """Yield the lines of a utf-8 file (BOM dropped) with their line endings kept."""
    with io.open(path, "rb") as raw:
        text = _pyio.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
        try:
            yield from text
        except UnicodeDecodeError as e:
            raise DataError(f"{path}: not valid UTF-8 ({e})") from None


def _strip_eol(line: str) -> str:
    return line.rstrip("\r\n")


def _check_header(path: str, header: list[str], cfg: PreproConfig, require_label: bool) -> bool:
    """Validate a header row; return whether it has the label column.

    Raises:
        DataError: duplicate column, or a configured column missing from the header.
    """
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise DataError(f"{path}:1: duplicate column {name!r} in header {header}")
        seen.add(name)
    needed = [("text_column", cfg.text_column)]
    if cfg.text2_column:
        needed.append(("text2_column", cfg.text2_column))
    if require_label:
        needed.append(("label_column", cfg.label_column))
    for key, col in needed:
        if col not in seen:
            raise DataError(
                f"{path}:1: header has no column {col!r} (prepro.{key}); columns found: {header}"
            )
    return cfg.label_column in seen


def _default_columns(cfg: PreproConfig, with_label: bool) -> list[str]:
    cols = [cfg.text_column] + ([cfg.text2_column] if cfg.text2_column else [])
    return cols + [cfg.label_column] if with_label else cols


def _delimited_records(
    lines: Iterator[str], cfg: PreproConfig
) -> Iterator[tuple[int, list[str] | None, str]]:
    """Yield ``(line, fields, error)`` for each non-empty tsv/csv record of ``lines`` (the
    file's lines, :func:`_open_lines`; a tsv record takes exactly one of them).

    ``fields`` is None when the record could not be parsed (``error`` says why).
    """
    if cfg.format == "tsv":
        for i, line in enumerate(lines, start=1):
            line = _strip_eol(line)
            if line:
                yield i, line.split("\t"), ""
        return
    # csv: records may span lines (quoted newlines); report the record's first line.
    reader = csv.reader(lines)
    last = 0
    while True:
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            start, last = last + 1, reader.line_num
            yield start, None, f"malformed csv ({e})"
            continue
        start, last = last + 1, reader.line_num
        if fields:
            yield start, fields, ""


class _Chunks:
    """The chunk being filled by a streamed read: the collector appends to ``current``,
    malformed lines are counted in it (or raised), and the reader yields it when full."""

    def __init__(self, path: str, cfg: PreproConfig, chunk_rows: int, keep_rows: bool) -> None:
        self.path, self.cfg, self.chunk_rows, self.keep_rows = path, cfg, chunk_rows, keep_rows
        self.current = ReadResult()
        self.collector: _Collector | None = None
        self.columns: list[str] = []

    def collector_for(
        self, has_label: bool, require_label: bool, allowed_labels: set[str] | None
    ) -> _Collector:
        self.collector = _Collector(
            self.path, self.cfg, self.current, has_label, require_label, allowed_labels,
            self.keep_rows,
        )  # fmt: skip
        return self.collector

    def on_bad(self, line: int, reason: str) -> None:
        msg = f"{self.path}:{line}: {reason}"
        if not self.cfg.skip_bad_lines:
            raise DataError(msg)
        self.current.skipped += 1
        self.current.bad_lines.append(msg)

    def full(self) -> bool:
        return len(self.current) >= self.chunk_rows

    def take(self) -> ReadResult:
        """The filled chunk (with ``columns``); the collector goes on in a fresh one."""
        chunk, self.current = self.current, ReadResult()
        chunk.columns = list(self.columns)
        if self.collector is not None:
            self.collector.start(self.current)
        return chunk


def _read_delimited(
    path: str,
    cfg: PreproConfig,
    require_label: bool,
    allowed_labels: set[str] | None,
    out: _Chunks,
) -> Iterator[ReadResult]:
    kind = "tab-separated" if cfg.format == "tsv" else "comma-separated"
    records = _delimited_records(_open_lines(path), cfg)
    collector: _Collector | None = None
    columns: list[str] | None = None
    if cfg.header:
        first = next(records, None)
        if first is None:
            raise DataError(f"{path}: empty file, expected a header row (prepro.header=true)")
        _, header, error = first
        if header is None:
            raise DataError(f"{path}:1: bad header row: {error}")
        header = [h.strip() for h in header]
        has_label = _check_header(path, header, cfg, require_label)
        columns = out.columns = header
        collector = out.collector_for(has_label, require_label, allowed_labels)
    if cfg.format == "tsv" and columns is not None and collector is not None:
        yield from _read_tsv_rest(records, columns, collector, out)
        return
    for line, fields, error in records:
        try:
            if fields is None:
                raise _LineError(error)
            if columns is None:  # no header: text[,text2][,label]; the first line decides
                n_text = 2 if cfg.text2_column else 1
                allowed = (n_text + 1,) if require_label else (n_text, n_text + 1)
                if len(fields) not in allowed:
                    want = " or ".join(str(n) for n in allowed)
                    raise _LineError(
                        f"expected {want} {kind} columns "
                        f"({', '.join(_default_columns(cfg, True))}), got {len(fields)}"
                    )
                columns = out.columns = _default_columns(cfg, len(fields) == n_text + 1)
                collector = out.collector_for(
                    len(fields) == n_text + 1, require_label, allowed_labels
                )
            assert collector is not None
            _add_fields(collector, line, fields, columns, kind, None)
        except _LineError as e:
            out.on_bad(line, str(e))
        if out.full():
            yield out.take()
    out.columns = list(columns or _default_columns(cfg, require_label))


def _add_fields(
    collector: _Collector,
    line: int,
    fields: list[str],
    columns: list[str],
    kind: str,
    at: tuple[int, int, int] | None,
) -> None:
    """Check a tsv/csv record's column count and add it: by position
    (:meth:`_Collector.add_fields`) when ``at`` is given and the rows are not kept, else
    as a dict."""
    if len(fields) != len(columns):
        raise _LineError(
            f"expected {len(columns)} {kind} columns ({', '.join(columns)}), got {len(fields)}"
        )
    if at is None or collector.keep_rows:
        record = dict(zip(columns, fields, strict=True))
        collector.add(line, record, record)
    else:
        collector.add_fields(line, fields, at)


def _read_tsv_rest(
    records: Iterator[tuple[int, list[str] | None, str]],
    columns: list[str],
    collector: _Collector,
    out: _Chunks,
) -> Iterator[ReadResult]:
    """The rest of :func:`_read_delimited` for a tsv file with a header: the same checks
    and messages (:func:`_add_fields`), the fields passed by position. A row of one text
    and a label that passes every check (the usual row) is appended here, without a call
    per field."""
    cfg = collector.cfg
    at = (
        columns.index(cfg.text_column),
        columns.index(cfg.text2_column) if cfg.text2_column else -1,
        columns.index(cfg.label_column) if collector.has_label else -1,
    )
    text_at, _, label_at = at
    n = len(columns)
    plain = at[1] < 0 and label_at >= 0 and not out.keep_rows  # text + label: the short way
    allowed, control, chunk_rows = collector.allowed_labels, CONTROL_CHARS.search, out.chunk_rows
    r = out.current
    for line, fields, _ in records:
        assert fields is not None  # a tsv line always splits
        if plain and len(fields) == n:
            text, label = fields[text_at].strip(), fields[label_at].strip()
            if text and label and (allowed is None or label in allowed) and not control(text):
                r.texts.append(text)
                r.labels.append(label)  # type: ignore[union-attr]
                r.line_numbers.append(line)
                if len(r.texts) >= chunk_rows:
                    yield out.take()
                    r = out.current
                continue
        try:
            _add_fields(collector, line, fields, columns, "tab-separated", at)
        except _LineError as e:
            out.on_bad(line, str(e))
        if len(out.current.texts) >= chunk_rows:
            yield out.take()
            r = out.current
    out.columns = list(columns)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_lone_surrogates(obj: dict[str, Any], keys: Iterable[str | None]) -> None:
    """Raise :class:`_LineError` for a string of ``obj`` under ``keys`` holding a lone
    surrogate (JSON's ``"\\ud800"`` without its pair): not a character, it cannot be
    tokenized or written as UTF-8."""
    for key in keys:
        value = obj.get(key) if key else None
        found = _SURROGATE.search(value) if isinstance(value, str) else None
        if found:
            raise _LineError(
                f"lone surrogate U+{ord(found.group()):04X} at character {found.start() + 1} "
                f"(key {key!r}): not valid Unicode; fix the \\u escape"
            )


def _read_jsonl(
    path: str,
    cfg: PreproConfig,
    require_label: bool,
    allowed_labels: set[str] | None,
    out: _Chunks,
) -> Iterator[ReadResult]:
    collector: _Collector | None = None
    columns: dict[str, None] = {}
    for line, text in enumerate(_open_lines(path), start=1):
        text = _strip_eol(text)
        if not text.strip():
            continue
        try:
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                raise _LineError(f"invalid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise _LineError(f"expected a JSON object, got {type(obj).__name__}")
            for key in (cfg.text_column, cfg.text2_column):
                if key and key not in obj:
                    raise _LineError(f"missing key {key!r}; keys found: {list(obj)}")
            if "\\ud" in text.lower():  # a \uD800-\uDFFF escape may leave a lone surrogate
                _no_lone_surrogates(obj, (cfg.text_column, cfg.text2_column, cfg.label_column))
            if collector is None:  # the first object decides whether labels are present
                has_label = require_label or cfg.label_column in obj
                collector = out.collector_for(has_label, require_label, allowed_labels)
            if collector.has_label and cfg.label_column not in obj:
                raise _LineError(f"missing key {cfg.label_column!r}; keys found: {list(obj)}")
            raw = {
                k: v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
                for k, v in obj.items()
            }
            collector.add(line, obj, raw)
            columns.update(dict.fromkeys(obj))
            out.columns = list(columns)
        except _LineError as e:
            out.on_bad(line, str(e))
        if out.full():
            yield out.take()
    out.columns = list(columns) or _default_columns(cfg, require_label)


def iter_examples(
    path: str,
    cfg: PreproConfig,
    require_label: bool = True,
    allowed_labels: set[str] | None = None,
    chunk_rows: int = 10_000,
    keep_rows: bool = False,
) -> Iterator[ReadResult]:
    """Read one raw file as a stream of chunks of at most ``chunk_rows`` kept examples.

    Memory holds one chunk, whatever the file size. Each chunk is a :class:`ReadResult`
    with the lines kept since the previous one (``line_numbers`` are the file's), the
    lines skipped among them (``skipped``, and every skip reason in ``bad_lines``) and
    the file's ``columns`` so far; the last chunk may be empty (it carries the final
    ``columns`` and trailing skips). Concatenating the chunks gives
    :func:`read_examples`' result (which keeps only the first :data:`MAX_BAD_LINES`
    reasons).

    Args:
        path, cfg, require_label, allowed_labels: as :func:`read_examples`.
        chunk_rows: kept examples per chunk (>= 1).
        keep_rows: keep each line's original columns in ``rows`` (predict writes them
            back out); off by default to save memory.

    Raises:
        DataError: as :func:`read_examples`, at the line where it happens (the chunks
            before it have been yielded).
    """
    if not io.isfile(path):
        raise DataError(f"{path}: file not found")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if cfg.label_type == "score":  # every label must be a number, whatever else is allowed
        allowed_labels = ScoreLabels()  # type: ignore[assignment]
    out = _Chunks(path, cfg, chunk_rows, keep_rows)
    read = _read_jsonl if cfg.format == "jsonl" else _read_delimited
    yield from read(path, cfg, require_label, allowed_labels, out)
    last = out.take()
    if last.texts2 is None and cfg.text2_column:
        last.texts2 = []
    if last.labels is None and require_label:
        last.labels = []
    yield last


def concat_results(chunks: Iterable[ReadResult]) -> ReadResult:
    """One :class:`ReadResult` from consecutive chunks of a file (:func:`iter_examples`);
    ``bad_lines`` keeps the first :data:`MAX_BAD_LINES` reasons."""
    result = ReadResult()
    for chunk in chunks:
        result.rows.extend(chunk.rows)
        result.columns = chunk.columns
        result.texts.extend(chunk.texts)
        if chunk.texts2 is not None:
            result.texts2 = result.texts2 or []
            result.texts2.extend(chunk.texts2)
        if chunk.labels is not None:
            result.labels = result.labels or []
            result.labels.extend(chunk.labels)
        result.line_numbers.extend(chunk.line_numbers)
        result.skipped += chunk.skipped
        result.control_stripped += chunk.control_stripped
        result.control_lines = (result.control_lines + chunk.control_lines)[:MAX_CONTROL_LINES]
        room = MAX_BAD_LINES - len(result.bad_lines)
        result.bad_lines.extend(chunk.bad_lines[: max(room, 0)])
    return result


def read_examples(
    path: str,
    cfg: PreproConfig,
    require_label: bool = True,
    allowed_labels: set[str] | None = None,
) -> ReadResult:
    """Read one raw file in ``cfg.format`` (tsv, csv or jsonl) into memory.

    tsv is split on tabs with no quoting (texts may contain ``"``); csv uses the
    standard csv quoting; jsonl has one JSON object per line with the keys
    ``cfg.text_column`` / ``cfg.text2_column`` / ``cfg.label_column``. Without
    ``cfg.header`` the tsv/csv columns are ``text[, text2], label``. For files larger
    than memory use :func:`iter_examples` (the same reader, chunk by chunk).

    Args:
        path: local path or fsspec URL of the file (utf-8, optional BOM).
        cfg: the prepro section (format, header, column names, skip_bad_lines).
        require_label: every line must have a non-empty label. With False the label
            column is optional: when the file has one (header column, first JSON object's
            key, or the first line's column count without header) every line must fill
            it; otherwise ``labels`` is None.
        allowed_labels: when given, a label outside this set is a malformed line.

    Returns:
        The kept examples (see :class:`ReadResult`).

    Raises:
        DataError: missing file, not utf-8, empty file or header without a configured
            column (always fatal); a malformed line (``"path:line: reason"``) unless
            ``cfg.skip_bad_lines``.
    """
    chunks = iter_examples(path, cfg, require_label, allowed_labels, 1 << 62, keep_rows=True)
    result = concat_results(chunks)
    for msg in result.bad_lines:
        logger.warning("skipping bad line %s", msg)
    if result.skipped > len(result.bad_lines):
        logger.warning("%s: skipped %d bad lines in all", path, result.skipped)
    return result
