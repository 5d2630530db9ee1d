"""Token vocabulary and label (target) map; both saved as one entry per line, line i = id i."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from xdpx import io
from xdpx.data.readers import DataError

__all__ = [
    "PAD",
    "UNK",
    "CHAR_PREFIX",
    "Vocab",
    "TargetMap",
    "read_tokens",
    "is_char_token",
    "spells_oov",
]

PAD = "[PAD]"
UNK = "[UNK]"
#: Prefix of a character token (``##c``): how ``prepro.oov: spell`` writes an unknown word's
#: characters, after ``[UNK]`` (BERT's WordPiece marks a word's continuation pieces alike).
CHAR_PREFIX = "##"


def read_tokens(path: str) -> list[str]:
    """The lines of a vocab.txt as written (line i = id i), without :meth:`Vocab.load`'s
    ``[PAD]``/``[UNK]`` prepending: a transformers tokenizer's vocabulary (prepro with
    ``tokenizer: hf``) keeps its own ids.

    Raises:
        DataError: missing file, empty line or duplicate token (with ``path:line``).
    """
    return _read_lines(path, "vocab")


def _read_lines(path: str, what: str) -> list[str]:
    """Non-empty-file lines (``\\n``-separated; a trailing empty line is ignored).

    Raises:
        DataError: missing file, an empty line in the middle, or a duplicate entry.
    """
    if not io.isfile(path):
        raise DataError(f"{path}: {what} file not found")
    lines = io.read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    seen: dict[str, int] = {}
    out: list[str] = []
    for i, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if line.startswith("\ufeff") and i == 1:
            line = line[1:]
        if not line:
            raise DataError(f"{path}:{i}: empty {what} entry")
        if line in seen:
            raise DataError(
                f"{path}:{i}: duplicate {what} entry {line!r} (first on line {seen[line]})"
            )
        seen[line] = i
        out.append(line)
    return out


def _write_lines(path: str, items: Sequence[str]) -> None:
    io.write_text(path, "".join(f"{t}\n" for t in items))


def spells_oov(oov: str, tokenizer: str) -> bool:
    """Whether prepro writes a word outside the vocab as ``[UNK]`` + ``##c`` tokens:
    ``prepro.oov: spell`` with word tokens (``word``, ``whitespace``); characters and hf
    pieces are never spelled."""
    return oov == "spell" and tokenizer in ("word", "whitespace")


def is_char_token(token: str) -> bool:
    """``##c``: the token of one character ``c`` (:meth:`Vocab.with_chars`)."""
    return len(token) == len(CHAR_PREFIX) + 1 and token.startswith(CHAR_PREFIX)


class Vocab:
    """Token <-> id map with ``[PAD]`` = 0 and ``[UNK]`` = 1.

    Args:
        tokens: tokens in id order; must start with ``[PAD]``, ``[UNK]`` and be unique.

    Raises:
        ValueError: the specials are not at ids 0 and 1, or a token repeats.
    """

    pad_id = 0
    unk_id = 1

    def __init__(self, tokens: Sequence[str]) -> None:
        tokens = list(tokens)
        if tokens[:2] != [PAD, UNK]:
            raise ValueError(f"a Vocab must start with {PAD!r}, {UNK!r}; got {tokens[:2]}")
        self.tokens: list[str] = tokens
        self._index: dict[str, int] = {t: i for i, t in enumerate(tokens)}
        if len(self._index) != len(tokens):
            dup = next(t for t, c in Counter(tokens).items() if c > 1)
            raise ValueError(f"duplicate token {dup!r} in vocab")

    @classmethod
    def build(cls, counts: Mapping[str, int], threshold: int = 1, nwords: int = -1) -> Vocab:
        """Build from token counts (usually of the train split).

        Tokens seen at least ``threshold`` times are kept, most frequent first, ties
        by token (code-point order), so the result is deterministic.

        Args:
            counts: token -> count.
            threshold: minimum count to keep a token.
            nwords: maximum size *including* ``[PAD]``/``[UNK]``; -1 = no limit.

        Raises:
            ValueError: ``nwords`` is not -1 and smaller than 2.
        """
        if nwords != -1 and nwords < 2:
            raise ValueError(f"nwords must be -1 or >= 2 (room for {PAD}, {UNK}), got {nwords}")
        kept = sorted(
            ((t, c) for t, c in counts.items() if c >= threshold and t not in (PAD, UNK)),
            key=lambda tc: (-tc[1], tc[0]),
        )
        tokens = [PAD, UNK] + [t for t, _ in kept]
        if nwords != -1:
            tokens = tokens[:nwords]
        return cls(tokens)

    def with_chars(self) -> Vocab:
        """This vocab plus a character token ``##c`` for each character of its tokens that
        lacks one, most frequent over the tokens first (ties by code point), appended: the
        ids of the tokens already there do not change. :meth:`spell` writes unknown words
        with them."""
        counts: Counter[str] = Counter()
        for t in self.tokens[2:]:
            if not is_char_token(t):
                counts.update(t)
        new = [CHAR_PREFIX + c for c, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        return Vocab(self.tokens + [t for t in new if t not in self._index])

    def spell(self, token: str) -> list[int]:
        """Ids of a token spelled out: ``[UNK]``, then the ``##c`` id of each of its
        characters that has one (``prepro.oov: spell``); a token in the vocab is its id."""
        if token in self._index:
            return [self._index[token]]
        index = self._index
        return [self.unk_id] + [i for c in token if (i := index.get(CHAR_PREFIX + c)) is not None]

    @classmethod
    def from_token_lists(
        cls, token_lists: Iterable[Sequence[str]], threshold: int = 1, nwords: int = -1
    ) -> Vocab:
        """:meth:`build` from an iterable of token sequences."""
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        return cls.build(counts, threshold, nwords)

    @classmethod
    def load(cls, path: str) -> Vocab:
        """Load one token per line (line i = id i).

        A file that does not start with ``[PAD]``, ``[UNK]`` (a user's predefined vocab)
        gets them prepended, shifting its ids by 2 (specials found later are moved up).

        Raises:
            DataError: missing file, empty line or duplicate token (with ``path:line``).
        """
        tokens = _read_lines(path, "vocab")
        if tokens[:2] != [PAD, UNK]:
            tokens = [PAD, UNK] + [t for t in tokens if t not in (PAD, UNK)]
        return cls(tokens)

    def save(self, path: str) -> None:
        """Write one token per line (atomically, any fsspec path)."""
        _write_lines(path, self.tokens)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Token ids; unknown tokens map to ``unk_id``."""
        index, unk = self._index, self.unk_id
        return [index.get(t, unk) for t in tokens]

    def index(self, token: str) -> int:
        """Id of ``token`` (``unk_id`` if absent)."""
        return self._index.get(token, self.unk_id)

    def __len__(self) -> int:
        return len(self.tokens)

    def __contains__(self, token: object) -> bool:
        return token in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and self.tokens == other.tokens

    def __repr__(self) -> str:
        return f"Vocab(size={len(self)})"


class TargetMap:
    """Label string <-> class index.

    Args:
        labels: labels in index order (unique, non-empty).

    Raises:
        ValueError: empty list, empty or duplicate label.
    """

    def __init__(self, labels: Sequence[str]) -> None:
        labels = list(labels)
        if not labels:
            raise ValueError("a TargetMap needs at least one label")
        if any(not lab for lab in labels):
            raise ValueError("empty label in target map")
        self.labels: list[str] = labels
        self._index = {lab: i for i, lab in enumerate(labels)}
        if len(self._index) != len(labels):
            dup = next(t for t, c in Counter(labels).items() if c > 1)
            raise ValueError(f"duplicate label {dup!r} in target map")

    @classmethod
    def build(cls, labels: Iterable[str], special_targets: Sequence[str] = ()) -> TargetMap:
        """``special_targets`` first (as given), then the other labels by count desc, name asc.

        Raises:
            ValueError: no labels at all, or a repeated special target.
        """
        counts = Counter(labels)
        rest = sorted(
            ((lab, c) for lab, c in counts.items() if lab not in set(special_targets)),
            key=lambda lc: (-lc[1], lc[0]),
        )
        return cls(list(special_targets) + [lab for lab, _ in rest])

    @classmethod
    def load(cls, path: str) -> TargetMap:
        """Load one label per line (line i = index i).

        Raises:
            DataError: missing/empty file, empty line or duplicate label (``path:line``).
        """
        labels = _read_lines(path, "target map")
        if not labels:
            raise DataError(f"{path}: empty target map")
        return cls(labels)

    def save(self, path: str) -> None:
        """Write one label per line (atomically, any fsspec path)."""
        _write_lines(path, self.labels)

    def index(self, label: str) -> int:
        """Class index of ``label``.

        Raises:
            KeyError: unknown label.
        """
        try:
            return self._index[label]
        except KeyError:
            raise KeyError(f"label {label!r} is not in the target map {self.labels}") from None

    def encode(self, labels: Iterable[str]) -> list[int]:
        """Class indices of ``labels`` (KeyError on an unknown one)."""
        return [self.index(lab) for lab in labels]

    def __len__(self) -> int:
        return len(self.labels)

    def __contains__(self, label: object) -> bool:
        return label in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TargetMap) and self.labels == other.labels

    def __repr__(self) -> str:
        return f"TargetMap({self.labels})"
