"""Tokenizers: ``char``, ``word`` and ``whitespace`` (token strings, looked up in a Vocab)
and ``hf``; :func:`detect_tokenizer` resolves ``PreproConfig.tokenizer: auto``.

The keys of :data:`TOKENIZERS` are the values of ``PreproConfig.tokenizer`` but ``auto``,
which prepro resolves to ``char`` or ``word`` from the training texts before anything is
encoded (the resolved name is what ``meta.json`` records).
"""

from __future__ import annotations

import copy
import math
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "TokenBatch",
    "CharTokenizer",
    "WordTokenizer",
    "WhitespaceTokenizer",
    "HFTokenizer",
    "TOKENIZERS",
    "TRUNCATIONS",
    "head_tail_split",
    "AUTO_CHAR_THRESHOLD",
    "detect_tokenizer",
    "make_tokenizer",
]


@dataclass
class TokenBatch:
    """Texts tokenized together: the batch's distinct tokens, and each text as ids into them.

    Prepro counts ``counts`` for the vocab and keeps ``values`` until the vocab is known
    (then :meth:`lookup` turns them into vocab ids), so every text is tokenized once.

    Attributes:
        tokens: the distinct tokens of the batch; local id ``i`` is ``tokens[i]``.
        counts: int64 ``[len(tokens)]``: occurrences of each token in the whole texts
            (before truncation), what :meth:`xdpx.data.Vocab.build` counts.
        values: int32 ``[offsets[-1]]``: each text's first ``max_len`` local ids,
            concatenated; a text without tokens holds one ``-1`` (the unknown token).
        offsets: int32 ``[n + 1]``: text ``i`` is ``values[offsets[i]:offsets[i + 1]]``.
        full: int32 ``[n]``: each text's tokens before truncation.
    """

    tokens: list[str]
    counts: np.ndarray
    values: np.ndarray
    offsets: np.ndarray
    full: np.ndarray

    @classmethod
    def from_ids(
        cls,
        tokens: list[str],
        flat: np.ndarray,
        full: np.ndarray,
        max_len: int,
        counts: np.ndarray | None = None,
    ) -> TokenBatch:
        """The batch of texts whose local ids, untruncated, are ``flat`` (text after text;
        text ``i`` has ``full[i]`` of them), cut to ``max_len`` per text; ``counts`` is
        ``np.bincount(flat)`` when the caller has it.

        Raises:
            ValueError: ``max_len < 1``.
        """
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        flat = flat.astype(np.int32, copy=False)
        full = full.astype(np.int32, copy=False)
        if counts is None:
            counts = np.bincount(flat, minlength=len(tokens))
        counts = counts.astype(np.int64, copy=False)
        starts = np.zeros(len(full) + 1, dtype=np.int64)
        np.cumsum(full, out=starts[1:])
        if not len(full) or (full.min() >= 1 and full.max() <= max_len):
            return cls(tokens, counts, flat, starts.astype(np.int32), full)
        lengths = np.clip(full, 1, max_len)
        offsets = np.zeros(len(full) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        rank = np.arange(len(flat), dtype=np.int64) - np.repeat(starts[:-1], full)
        keep = rank < max_len
        values = np.full(int(offsets[-1]), -1, dtype=np.int32)
        values[np.repeat(offsets[:-1], full)[keep] + rank[keep]] = flat[keep]
        return cls(tokens, counts, values, offsets.astype(np.int32), full)

    def lookup(self, ids: np.ndarray, unk_id: int) -> np.ndarray:
        """``values`` as ids of another table: ``ids[i]`` is the id of ``tokens[i]``.

        Returns:
            ``[len(values)]`` of ``ids``' dtype, ``-1`` placeholders as ``unk_id``.
        """
        table = np.append(ids, np.asarray(unk_id, dtype=ids.dtype))
        return table[self.values]

    def split(self, n: int) -> tuple[TokenBatch, TokenBatch]:
        """The first ``n`` texts and the rest (sharing ``tokens`` and the whole ``counts``)."""
        cut = int(self.offsets[n])
        first = TokenBatch(self.tokens, self.counts, self.values[:cut], self.offsets[: n + 1], self.full[:n])  # fmt: skip
        rest = TokenBatch(self.tokens, self.counts, self.values[cut:], self.offsets[n:] - cut, self.full[n:])  # fmt: skip
        return first, rest


def tokenize_batch(tokenizer: Any, texts: Sequence[str], max_len: int) -> TokenBatch:
    """:class:`TokenBatch` of ``texts`` with any tokenizer that has ``tokenize(text)``:
    one ``tokenize`` call per text, the ids in first-seen order.

    Raises:
        ValueError: ``max_len < 1``.
    """
    index: dict[str, int] = {}
    flat: list[int] = []
    full = np.zeros(len(texts), dtype=np.int32)
    for i, text in enumerate(texts):
        tokens = tokenizer.tokenize(text)
        full[i] = len(tokens)
        flat.extend([index.setdefault(t, len(index)) for t in tokens])
    return TokenBatch.from_ids(list(index), np.asarray(flat, dtype=np.int32), full, max_len)


_UNSEEN, _SEP, _SPACE = -3, -2, -1  # _UNSEEN the smallest: ids.min() finds it


class CharTokenizer:
    """Each non-whitespace character is a token (the default for Chinese text).

    Args:
        lower: lower-case the text before splitting.
    """

    name = "char"

    def __init__(self, lower: bool = True) -> None:
        self.lower = lower
        self._table: np.ndarray | None = None  # code point -> id in _chars, _SPACE, _SEP, _UNSEEN
        self._chars: list[str] = []

    def tokenize(self, text: str) -> list[str]:
        """``"Ab c"`` -> ``["a", "b", "c"]`` (with ``lower``); whitespace is dropped."""
        if self.lower:
            text = text.lower()
        return [c for c in text if not c.isspace()]

    def tokenize_batch(self, texts: Sequence[str], max_len: int) -> TokenBatch:
        """:class:`TokenBatch` of ``texts``, equal to :meth:`tokenize` of each, without a
        Python step per character: the texts are joined by NUL, lower-cased at once (which
        equals lower-casing each: NUL is neither cased nor case-ignorable, so Greek final
        sigma is decided as at a text's end) and read as UTF-32 code points, which a table
        of this instance maps to token ids (``str.isspace`` is asked once per new code
        point). Texts holding NUL go :func:`tokenize_batch`'s way.

        Raises:
            ValueError: ``max_len < 1``.
        """
        joined = "\x00".join(texts)
        if len(texts) and joined.count("\x00") != len(texts) - 1:
            return tokenize_batch(self, texts, max_len)
        if self.lower:
            joined = joined.lower()
        points = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        if self._table is None:
            self._table = np.full(0x110000, _UNSEEN, dtype=np.int32)
            self._table[0] = _SEP
        ids = self._table[points]
        if len(ids) and ids.min() == _UNSEEN:
            for cp in np.unique(points[ids == _UNSEEN]).tolist():
                ch = chr(cp)
                self._table[cp] = _SPACE if ch.isspace() else len(self._chars)
                if not ch.isspace():
                    self._chars.append(ch)
            ids = self._table[points]
        seps = np.flatnonzero(ids == _SEP)
        full = np.diff(seps, prepend=-1, append=len(ids)).astype(np.int32) - 1
        spaces = np.flatnonzero(ids == _SPACE)
        if len(spaces):
            full -= np.bincount(np.searchsorted(seps, spaces), minlength=len(full)).astype(np.int32)
        ids = ids[ids >= 0]
        present = np.bincount(ids, minlength=len(self._chars))
        used = np.flatnonzero(present)
        local = np.zeros(len(self._chars), dtype=np.int32)
        local[used] = np.arange(len(used), dtype=np.int32)
        tokens = [self._chars[i] for i in used.tolist()]
        return TokenBatch.from_ids(tokens, local[ids], full[: len(texts)], max_len, present[used])


class WordTokenizer:
    """Words and punctuation as tokens, by BERT's BasicTokenizer rules (the default for
    languages written with spaces).

    Built from the Hugging Face ``tokenizers`` parts that implement those rules: NFC, then
    ``BertNormalizer`` (control characters dropped, whitespace unified, every CJK
    ideograph its own token, lower-casing with ``lower``; accents are *kept*, so
    ``"Grüße"`` stays ``"grüße"``), then ``BertPreTokenizer`` (split on whitespace, and
    every punctuation character, Unicode category ``P*`` or ASCII ``!"#$%&'()*+,-./:;<=>?@
    [\\]^_`{|}~``, is a token of its own), then each symbol (``So``, e.g. an emoji, with
    its modifiers ``Sk``) is isolated as well. So ``"movies."`` is ``["movies", "."]``, a
    URL splits at its punctuation (``https``, ``:``, ``/``, ``/``, ``example``, ``.``,
    ``com``), and numbers split at ``.`` and ``,`` (``3.14`` -> ``3``, ``.``, ``14``), as
    in BERT.

    Args:
        lower: lower-case the text before splitting.
    """

    name = "word"

    def __init__(self, lower: bool = True) -> None:
        from tokenizers import Regex, normalizers, pre_tokenizers

        self.lower = lower
        self._normalizer = normalizers.Sequence(
            [
                normalizers.NFC(),
                normalizers.BertNormalizer(
                    clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=lower
                ),
            ]
        )
        self._pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.BertPreTokenizer(),
                pre_tokenizers.Split(Regex(r"\p{So}\p{Sk}*"), behavior="isolated"),
            ]
        )

    def tokenize(self, text: str) -> list[str]:
        """``"Great movies, it's 5/5!"`` -> ``["great", "movies", ",", "it", "'", "s", "5",
        "/", "5", "!"]`` (with ``lower``)."""
        normalized = self._normalizer.normalize_str(text)
        return [piece for piece, _ in self._pre_tokenizer.pre_tokenize_str(normalized)]

    def tokenize_batch(self, texts: Sequence[str], max_len: int) -> TokenBatch:
        """:class:`TokenBatch` of ``texts`` (:func:`tokenize_batch`: one :meth:`tokenize` each)."""
        return tokenize_batch(self, texts, max_len)

    def __getstate__(self) -> dict[str, Any]:  # the Rust parts are rebuilt, not pickled
        return {"lower": self.lower}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["lower"])


class WhitespaceTokenizer:
    """Tokens are the maximal runs of non-whitespace characters (``str.split()``).

    Args:
        lower: lower-case the text before splitting.
    """

    name = "whitespace"

    def __init__(self, lower: bool = True) -> None:
        self.lower = lower

    def tokenize(self, text: str) -> list[str]:
        """``"Good  movie!"`` -> ``["good", "movie!"]`` (with ``lower``)."""
        if self.lower:
            text = text.lower()
        return text.split()

    def tokenize_batch(self, texts: Sequence[str], max_len: int) -> TokenBatch:
        """:class:`TokenBatch` of ``texts`` (:func:`tokenize_batch`: one :meth:`tokenize` each)."""
        return tokenize_batch(self, texts, max_len)


class HFTokenizer:
    """A local Hugging Face *fast* tokenizer; produces ids (special tokens included) directly.

    Lower-casing is left to the tokenizer's own normalizer (``PreproConfig.lower`` does
    not apply). Nothing is downloaded: the directory must hold ``tokenizer.json`` etc.

    Args:
        path: local directory loadable by ``AutoTokenizer.from_pretrained``.
        lower: ignored (kept for a uniform constructor).

    Raises:
        ValueError: ``path`` is not a local directory, cannot be loaded, or is not a
            fast tokenizer, or the tokenizer has no pad token.
    """

    name = "hf"

    def __init__(self, path: str, lower: bool = True) -> None:
        from transformers import AutoTokenizer

        from xdpx.pretrained import quiet_transformers, resolve_pretrained

        del lower
        try:
            local = resolve_pretrained(path)
        except FileNotFoundError as e:
            raise ValueError(f"tokenizer_path {path!r}: {e}") from None
        try:
            with quiet_transformers():  # no "sequence longer than model_max_length" noise
                tok = AutoTokenizer.from_pretrained(local, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - any load failure is a config problem
            raise ValueError(f"tokenizer_path {path!r}: cannot load a tokenizer ({e})") from None
        if not getattr(tok, "is_fast", False):
            raise ValueError(
                f"tokenizer_path {path!r}: not a fast tokenizer (needs tokenizer.json)"
            )
        if tok.pad_token_id is None:
            raise ValueError(f"tokenizer_path {path!r}: the tokenizer has no pad token")
        self.path = path
        self.tok: Any = tok
        self._backends: dict[int | None, Any] = {}  # max_len -> private Rust tokenizer copy

    @property
    def pad_id(self) -> int:
        return int(self.tok.pad_token_id)

    @property
    def sep_id(self) -> int | None:
        """The separator id (``[SEP]``) placed between the texts of a pair, if any."""
        sep = self.tok.sep_token_id
        return int(sep) if sep is not None else None

    @property
    def unk_id(self) -> int:
        """The unknown-token id, or the pad id when the tokenizer has none."""
        unk = self.tok.unk_token_id
        return int(unk) if unk is not None else self.pad_id

    @property
    def vocab_size(self) -> int:
        """Number of ids (1 + the largest id, added tokens included)."""
        return max(self.tok.get_vocab().values()) + 1

    def vocab_tokens(self) -> list[str]:
        """Tokens in id order (``[unused<i>]`` for unassigned ids; newlines escaped)."""
        out = [f"[unused{i}]" for i in range(self.vocab_size)]
        for token, i in self.tok.get_vocab().items():
            out[i] = token.replace("\n", "\\n").replace("\r", "\\r")
        return out

    def tokenize(self, text: str) -> list[str]:
        """Token strings (without special tokens)."""
        return list(self.tok.tokenize(text))

    def encode(self, text: str, text2: str | None = None, max_len: int | None = None) -> list[int]:
        """Ids with special tokens; a pair goes through the text-pair API (one sequence).

        Args:
            text: first text.
            text2: second text of a pair, or None.
            max_len: truncate to this many ids (``longest_first`` for pairs); None = no limit.
        """
        kwargs: dict[str, Any] = {"add_special_tokens": True}
        if max_len is not None:
            kwargs.update(
                truncation="longest_first" if text2 is not None else True, max_length=max_len
            )
        return list(self.tok(text, text2, **kwargs)["input_ids"])

    def _backend(self, max_len: int | None) -> Any:
        """A private copy of the Rust ``tokenizers.Tokenizer``: no padding, truncation to
        ``max_len`` (``longest_first``, the tokenizer's ``truncation_side``) or none.

        A copy, because ``transformers`` re-configures the shared backend on every call.
        """
        if max_len not in self._backends:
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(self.tok.backend_tokenizer.to_str())
            backend.no_padding()
            if max_len is None:
                backend.no_truncation()
            else:
                backend.enable_truncation(
                    max_len, stride=0, strategy="longest_first", direction=self.tok.truncation_side
                )
            backend.encode_special_tokens = bool(getattr(self.tok, "split_special_tokens", False))
            self._backends[max_len] = backend
        return self._backends[max_len]

    def encode_batch(
        self,
        texts: Sequence[str],
        texts2: Sequence[str] | None = None,
        max_len: int | None = None,
        truncation: str = "head",
    ) -> tuple[list[list[int]], list[int]]:
        """Ids of many texts (or joint pairs) and their lengths before truncation.

        The ids equal those of the batched call ``tok(texts, texts2, truncation=...,
        max_length=max_len)`` (and of :meth:`encode` text by text, except that a
        single ``__call__`` treats an empty second text as no pair). Each text is
        tokenized once, by one ``tokenizers`` ``encode_batch`` call (Rust, parallel
        over texts) without special tokens; ``Tokenizer.post_process`` then adds the
        special tokens, truncating only the sequences longer than ``max_len``: the
        steps ``tokenizers`` runs inside a call (``encode_single_sequence`` per text,
        then ``post_process``). So the untruncated length comes for free instead of
        from a second, untruncated tokenization.

        Args:
            texts: ``[n]`` first texts.
            texts2: ``[n]`` second texts of pairs, or None.
            max_len: truncate each sequence to this many ids (``longest_first`` for
                pairs); None = no limit.
            truncation: ``prepro.truncation`` for a single text over ``max_len``: ``head``
                keeps its first tokens; ``head_tail`` keeps the first ``ceil(budget / 4)``
                and the last ``budget - ceil(budget / 4)`` tokens, ``budget`` = ``max_len``
                minus the special tokens (:func:`head_tail_split`; Sun et al. 2019). Pairs
                are cut ``longest_first`` either way.

        Returns:
            ``(ids, full_lengths)``: ``n`` id lists (special tokens included) and ``n``
            lengths in ids before truncation.

        Raises:
            ValueError: ``texts2`` has a different length than ``texts``, or an unknown
                ``truncation``.
        """
        if texts2 is not None and len(texts2) != len(texts):
            raise ValueError(f"texts ({len(texts)}) and texts2 ({len(texts2)}) differ in length")
        if truncation not in TRUNCATIONS:
            raise ValueError(f"truncation must be one of {TRUNCATIONS}, got {truncation!r}")
        raw = self._backend(None)
        first = raw.encode_batch(list(texts), add_special_tokens=False)
        second = (
            raw.encode_batch(list(texts2), add_special_tokens=False)
            if texts2 is not None
            else [None] * len(first)
        )
        n_special = raw.num_special_tokens_to_add(texts2 is not None)
        limit = math.inf if max_len is None else max_len
        cut = raw if max_len is None else self._backend(max_len)
        ids: list[list[int]] = []
        full: list[int] = []
        split = None
        if truncation == "head_tail" and max_len is not None and texts2 is None:
            split = head_tail_split(max_len - n_special)
        for a, b in zip(first, second, strict=True):
            n = len(a) + (len(b) if b is not None else 0) + n_special
            full.append(n)
            if n > limit and split is not None:
                ids.append(raw.post_process(_head_tail(a, *split)).ids)
            else:
                ids.append((cut if n > limit else raw).post_process(a, b).ids)
        return ids, full


#: ``prepro.truncation``'s values (:meth:`HFTokenizer.encode_batch`).
TRUNCATIONS = ("head", "head_tail")


def head_tail_split(budget: int) -> tuple[int, int] | None:
    """``(head, tail)`` tokens kept of a text by ``truncation: head_tail`` when ``budget``
    tokens (``max_len`` minus the special tokens) are left for it: ``head = ceil(budget /
    4)``, ``tail = budget - head``. Sun et al. 2019, "How to Fine-Tune BERT for Text
    Classification?" (sec. 5.3.1) keep the first 128 and the last 382 tokens of BERT's 510:
    ``head_tail_split(510) == (128, 382)``; max_len 128 with 2 special tokens: (32, 94).
    None when ``budget < 2`` (no room for both ends: the head alone is kept)."""
    if budget < 2:
        return None
    head = -(-budget // 4)
    return head, budget - head


def _head_tail(encoding: Any, head: int, tail: int) -> Any:
    """A ``tokenizers.Encoding`` (no special tokens) cut to its first ``head`` and last
    ``tail`` tokens, in order."""
    from tokenizers import Encoding

    first, last = copy.deepcopy(encoding), copy.deepcopy(encoding)
    first.truncate(head, direction="right")
    last.truncate(tail, direction="left")
    return Encoding.merge([first, last], growing_offsets=False)


#: ``PreproConfig.tokenizer`` name -> tokenizer class (``auto`` resolves to char or word).
TOKENIZERS: dict[str, type] = {
    "char": CharTokenizer,
    "word": WordTokenizer,
    "whitespace": WhitespaceTokenizer,
    "hf": HFTokenizer,
}

#: ``auto`` picks ``char`` when more than this fraction of the letters is in a script
#: written without spaces between words.
AUTO_CHAR_THRESHOLD = 0.3

#: Unicode name prefixes of the scripts written without spaces between words: Chinese
#: (``CJK UNIFIED IDEOGRAPH``, ``CJK COMPATIBILITY IDEOGRAPH``), Japanese kana, Thai, Lao,
#: Khmer, Myanmar, Tibetan. Hangul is not among them: Korean puts spaces between words.
_NO_SPACE_SCRIPTS = (
    "CJK ",
    "HIRAGANA",
    "KATAKANA",
    "THAI",
    "LAO",
    "KHMER",
    "MYANMAR",
    "TIBETAN",
)


def is_no_space_letter(ch: str) -> bool:
    """True for a letter of a script written without spaces between words
    (:data:`_NO_SPACE_SCRIPTS`, by Unicode character name)."""
    return (
        ch.isalpha()
        and ord(ch) >= 0x0E00
        and unicodedata.name(ch, "").startswith(_NO_SPACE_SCRIPTS)
    )


def detect_tokenizer(texts: Iterable[str], max_chars: int = 1_000_000) -> tuple[str, float]:
    """Choose ``char`` or ``word`` for ``PreproConfig.tokenizer: auto``.

    Counts the letters (``str.isalpha``) of ``texts`` and the share of them written in a
    script without spaces between words (Chinese ideographs, kana, Thai, Lao, Khmer,
    Myanmar, Tibetan: by Unicode character name). Above :data:`AUTO_CHAR_THRESHOLD`
    (0.3) every character is a token (``char``, as XDPX did for Chinese); otherwise words
    (``word``). A mixed Chinese/English corpus with 30% or more Chinese letters counts as
    Chinese, since splitting it at spaces would leave whole Chinese sentences as tokens.

    Args:
        texts: the training texts (only the first ``max_chars`` characters are read).
        max_chars: characters to inspect.

    Returns:
        ``(name, fraction)``: ``"char"`` or ``"word"`` and the no-space-script share of
        the letters seen (0.0 when there are no letters; then ``word``).
    """
    chars: Counter[str] = Counter()
    seen = 0
    for text in texts:
        chars.update(text)
        seen += len(text)
        if seen >= max_chars:
            break
    letters = no_space = 0
    for ch, n in chars.items():  # each distinct character looked up once
        if ch.isalpha():
            letters += n
            no_space += n * is_no_space_letter(ch)
    fraction = no_space / letters if letters else 0.0
    return ("char" if fraction > AUTO_CHAR_THRESHOLD else "word"), fraction


def make_tokenizer(
    name: str, lower: bool = True, path: str | None = None
) -> CharTokenizer | WordTokenizer | WhitespaceTokenizer | HFTokenizer:
    """Instantiate a tokenizer by its config name (``auto`` must be resolved first:
    :func:`detect_tokenizer`).

    Raises:
        ValueError: unknown name (``auto`` included), or ``hf`` without a usable ``path``.
    """
    if name == "auto":
        raise ValueError("tokenizer=auto must be resolved with detect_tokenizer(texts) first")
    if name not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}; choose one of {sorted(TOKENIZERS)}")
    if name == "hf":
        if not path:
            raise ValueError("tokenizer=hf needs tokenizer_path (a local tokenizer directory)")
        return HFTokenizer(path, lower)
    return TOKENIZERS[name](lower)
