"""Raw text -> token ids, exactly as prepro encoded the training data.

Prepro encodes every split through :class:`Encoder`, and predict / serve rebuild the same
Encoder with :meth:`Encoder.from_dir` from the three files prepro writes (and a checkpoint
copies): ``meta.json``, ``vocab.txt``, ``target_map.txt``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xdpx import io
from xdpx.data.meta import META_FILE, PreparedMeta
from xdpx.data.readers import DataError
from xdpx.data.tokenizers import (
    CharTokenizer,
    HFTokenizer,
    TokenBatch,
    WhitespaceTokenizer,
    WordTokenizer,
    make_tokenizer,
)
from xdpx.data.transliterate import make_transliterator
from xdpx.data.vocab import TargetMap, Vocab

__all__ = [
    "Encoder",
    "parse_scores",
    "META_FILE",
    "VOCAB_FILE",
    "TARGET_MAP_FILE",
    "ENCODER_FILES",
]

VOCAB_FILE = "vocab.txt"
TARGET_MAP_FILE = "target_map.txt"
#: The files a directory needs for :meth:`Encoder.from_dir` (copy them into a checkpoint).
ENCODER_FILES = (META_FILE, VOCAB_FILE, TARGET_MAP_FILE)


def parse_scores(labels: Sequence[str]) -> np.ndarray:
    """``[n]`` float32 of score labels (``prepro.label_type: score``; the reader has checked
    that each is a finite number).

    Raises:
        ValueError: a label that is not a number.
    """
    return np.asarray([float(x) for x in labels], dtype=np.float32)


class Encoder:
    """Transliterate (optional), tokenize, lower-case (char/word/whitespace), look up ids, truncate
    to ``max_len``.

    Every sequence has at least one id: an empty result becomes ``[unk_id]``.

    Pair tasks: with ``char``/``word``/``whitespace`` each text is encoded on its own
    (``pair_encoding == "separate"``: ``input_ids`` and ``input_ids2``, each ``<= max_len``);
    with ``hf`` the two texts go through the tokenizer's text-pair API into one sequence
    (``pair_encoding == "joint"``: ``input_ids`` only, ``<= max_len`` in total).

    Args:
        tokenizer: a :data:`~xdpx.data.tokenizers.TOKENIZERS` instance.
        target_map: the labels.
        max_len: maximum ids per sequence.
        vocab: token vocabulary (required for char/word/whitespace, ignored for hf).
        pair: the task has a second text.
        meta: the ``meta.json`` this encoder was built from (informational; None when
            prepro builds it).
        transliterate: applied to every text before tokenizing
            (:mod:`xdpx.data.transliterate`: ``"pinyin"``), or None.
        label_type: ``prepro.label_type``: ``class`` (labels -> class indices through the
            target map) or ``score`` (labels -> float32 numbers).
        spell_oov: ``prepro.oov: spell`` with word tokens: a token outside the vocab
            becomes ``[UNK]`` followed by the ``##c`` ids of its characters
            (:meth:`~xdpx.data.vocab.Vocab.spell`), ``max_len`` counting ids; else ``[UNK]``.
        truncation: ``prepro.truncation``: ``head`` (the first ``max_len`` ids) or, hf only,
            ``head_tail`` (the first quarter and the last three quarters of a single text's
            budget: :meth:`~xdpx.data.tokenizers.HFTokenizer.encode_batch`).

    Raises:
        ValueError: ``vocab`` missing for a char/word/whitespace tokenizer, ``max_len < 1``,
            an unknown ``transliterate``, or ``head_tail`` with a char/word/whitespace
            tokenizer.
    """

    def __init__(
        self,
        tokenizer: CharTokenizer | WordTokenizer | WhitespaceTokenizer | HFTokenizer,
        target_map: TargetMap,
        max_len: int,
        vocab: Vocab | None = None,
        pair: bool = False,
        meta: PreparedMeta | None = None,
        transliterate: str | None = None,
        label_type: str = "class",
        spell_oov: bool = False,
        truncation: str = "head",
    ) -> None:
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        self.is_hf = isinstance(tokenizer, HFTokenizer)
        if truncation != "head" and not self.is_hf:
            raise ValueError(
                f"truncation={truncation!r} is implemented for tokenizer=hf only, "
                f"not {tokenizer.name!r}"
            )
        self.truncation = truncation
        if not self.is_hf and vocab is None:
            raise ValueError(f"tokenizer {tokenizer.name!r} needs a vocab")
        self.tokenizer = tokenizer
        self.vocab = None if self.is_hf else vocab
        self.target_map = target_map
        self.max_len = max_len
        self.pair = pair
        self.meta = meta
        self.transliterate = transliterate
        self._transliterate = make_transliterator(transliterate)
        self.label_type = label_type
        self.spell_oov = spell_oov and not self.is_hf

    # ----------------------------------------------------------------- properties
    @property
    def pair_encoding(self) -> str | None:
        """None (single text), ``"separate"`` (input_ids + input_ids2) or ``"joint"`` (hf)."""
        if not self.pair:
            return None
        return "joint" if self.is_hf else "separate"

    @property
    def labels(self) -> list[str]:
        """Label strings in class-index order."""
        return list(self.target_map.labels)

    @property
    def num_labels(self) -> int:
        return len(self.target_map)

    @property
    def vocab_size(self) -> int:
        """Number of token ids (embedding rows)."""
        if self.is_hf:
            assert isinstance(self.tokenizer, HFTokenizer)
            return self.tokenizer.vocab_size
        assert self.vocab is not None
        return len(self.vocab)

    @property
    def pad_id(self) -> int:
        if self.is_hf:
            assert isinstance(self.tokenizer, HFTokenizer)
            return self.tokenizer.pad_id
        return Vocab.pad_id

    @property
    def unk_id(self) -> int:
        if self.is_hf:
            assert isinstance(self.tokenizer, HFTokenizer)
            return self.tokenizer.unk_id
        return Vocab.unk_id

    # ------------------------------------------------------------------- encoding
    def prepare(self, texts: Sequence[str]) -> list[str]:
        """``texts`` as the tokenizer sees them: transliterated when ``transliterate`` is set."""
        fn = self._transliterate
        return list(texts) if fn is None else [fn(t) for t in texts]

    def tokenize(self, text: str) -> list[str]:
        """Token strings of one text (before id lookup and truncation)."""
        return self.tokenizer.tokenize(self.prepare([text])[0])

    def encode_one(self, text: str, text2: str | None = None) -> tuple[np.ndarray, int]:
        """Ids of one text (or one joint hf pair) and its length before truncation.

        Returns:
            ``(ids, full_length)``: ``ids`` int64 ``[<= max_len]`` (at least 1 id);
            ``full_length`` is the number of ids before truncation.
        """
        if self.is_hf:
            out, lengths = self._encode_hf([text], None if text2 is None else [text2])
            return out[0], lengths[0]
        if text2 is not None:
            raise ValueError("joint pair encoding needs tokenizer=hf; encode texts separately")
        values, _, full = self.encode_flat([text])
        return values, int(full[0])

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ids of many texts, concatenated (char/word/whitespace; the Arrow list layout).

        The texts are tokenized as a batch (:meth:`tokenize_batch` of the tokenizer: for
        ``char`` without a Python step per character) and each distinct token is looked
        up in the vocab once.

        Returns:
            ``(values, offsets, full)``: ``values`` int64, text ``i`` is
            ``values[offsets[i]:offsets[i + 1]]`` (``1 .. max_len`` ids); ``offsets`` int32
            ``[n + 1]``; ``full`` int32 ``[n]`` the lengths before truncation.

        Raises:
            ValueError: an hf encoder (use :meth:`encode_with_lengths`).
        """
        if self.is_hf:
            raise ValueError("encode_flat is for char/word/whitespace encoders")
        assert self.vocab is not None
        batch = self.tokenizer.tokenize_batch(self.prepare(texts), self.max_len)  # type: ignore[union-attr]
        if self.spell_oov:
            return self._spelled(batch)
        ids = np.asarray(self.vocab.encode(batch.tokens), dtype=np.int64)
        return batch.lookup(ids, self.unk_id), batch.offsets, batch.full

    def _spelled(self, batch: TokenBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`encode_flat`'s result with each unknown token spelled out, then cut to
        ``max_len`` ids per text. ``full`` counts the spelled ids of the tokens the batch kept
        (at most ``max_len`` per text) plus one per token cut before: exact when nothing was
        cut, and above ``max_len`` exactly when the text was truncated (0 for an empty text,
        as without spelling)."""
        assert self.vocab is not None
        pieces = [self.vocab.spell(t) for t in batch.tokens] + [[self.unk_id]]  # -1: empty
        sizes = np.asarray([len(p) for p in pieces], dtype=np.int64)
        table = np.asarray([i for p in pieces for i in p], dtype=np.int64)
        first = np.cumsum(sizes) - sizes
        local = np.where(batch.values < 0, len(pieces) - 1, batch.values)
        n = sizes[local]  # ids per kept token
        ends = np.cumsum(n)
        flat = table[np.repeat(first[local] - (ends - n), n) + np.arange(int(ends[-1]) if len(n) else 0)]  # fmt: skip
        kept = np.diff(batch.offsets)
        text = np.repeat(np.arange(len(kept)), kept)
        lengths = np.bincount(text, weights=n, minlength=len(kept)).astype(np.int64)
        words = batch.full.astype(np.int64)  # 0: an empty text, held as one [UNK]
        full = np.where(words == 0, 0, lengths + np.maximum(words - kept, 0))
        starts = np.zeros(len(kept) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        cut = np.minimum(lengths, self.max_len)
        offsets = np.zeros(len(kept) + 1, dtype=np.int64)
        np.cumsum(cut, out=offsets[1:])
        rank = np.arange(len(flat)) - np.repeat(starts[:-1], lengths)
        values = flat[rank < self.max_len]
        return values, offsets.astype(np.int32), full.astype(np.int32)

    def _encode_split(self, texts: Sequence[str]) -> tuple[list[np.ndarray], list[int]]:
        """:meth:`encode_flat` as one array per text, and the lengths as ints."""
        values, offsets, full = self.encode_flat(texts)
        return np.split(values, offsets[1:-1]) if len(texts) else [], full.tolist()

    def encode(self, texts: Sequence[str], texts2: Sequence[str] | None = None) -> list[np.ndarray]:
        """Encode a batch of texts into ``input_ids``.

        Args:
            texts: ``[n]`` raw texts.
            texts2: ``[n]`` second texts; only for ``pair_encoding == "joint"`` (hf).
                For separately encoded pairs use :meth:`encode_inputs`.

        Returns:
            ``n`` int64 arrays of length ``1 .. max_len``.

        Raises:
            ValueError: ``texts2`` given for a char/word/whitespace encoder, or length mismatch.
        """
        if texts2 is not None:
            if not self.is_hf:
                raise ValueError(
                    "this encoder encodes pairs separately; use encode_inputs(texts, texts2)"
                )
            if len(texts2) != len(texts):
                raise ValueError(
                    f"texts ({len(texts)}) and texts2 ({len(texts2)}) differ in length"
                )
            return self._encode_hf(texts, texts2)[0]
        if self.is_hf:
            return self._encode_hf(texts)[0]
        return self._encode_split(texts)[0]

    def _encode_hf(
        self, texts: Sequence[str], texts2: Sequence[str] | None = None
    ) -> tuple[list[np.ndarray], list[int]]:
        """hf: one batched tokenizer call (:meth:`HFTokenizer.encode_batch`), truncated to
        ``max_len`` (``truncation``) with the special tokens kept; returns ``(ids,
        full_lengths)``."""
        assert isinstance(self.tokenizer, HFTokenizer)
        texts2 = None if texts2 is None else self.prepare(texts2)
        ids, full = self.tokenizer.encode_batch(
            self.prepare(texts), texts2, max_len=self.max_len, truncation=self.truncation
        )
        unk = [self.unk_id]
        return [np.asarray(x or unk, dtype=np.int64) for x in ids], full

    def encode_inputs(
        self, texts: Sequence[str], texts2: Sequence[str] | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
        """Encode a batch into the model inputs exactly as stored in the shards.

        Args:
            texts: ``[n]`` raw texts.
            texts2: ``[n]`` second texts of a pair task (required when ``pair``).

        Returns:
            ``(input_ids, input_ids2)``: ``input_ids2`` is None unless
            ``pair_encoding == "separate"``.

        Raises:
            ValueError: ``texts2`` missing for a pair encoder / given for a single-text one,
                or the lengths differ.
        """
        ids, ids2, _, _ = self.encode_with_lengths(texts, texts2)
        return ids, ids2

    def encode_with_lengths(
        self, texts: Sequence[str], texts2: Sequence[str] | None = None
    ) -> tuple[list[np.ndarray], list[np.ndarray] | None, list[int], list[int] | None]:
        """:meth:`encode_inputs` plus the untruncated lengths (for prepro statistics).

        Returns:
            ``(input_ids, input_ids2, full_lengths, full_lengths2)``.
        """
        if self.pair and texts2 is None:
            raise ValueError("this is a pair encoder: texts2 is required")
        if not self.pair and texts2 is not None:
            raise ValueError("this encoder is for single texts: texts2 must be None")
        if texts2 is not None and len(texts2) != len(texts):
            raise ValueError(f"texts ({len(texts)}) and texts2 ({len(texts2)}) differ in length")
        if self.is_hf:  # one sequence per row, joint for pairs
            ids, full = self._encode_hf(texts, texts2)
            return ids, None, full, None
        ids, full = self._encode_split(texts)
        if texts2 is None:
            return ids, None, full, None
        ids2, full2 = self._encode_split(texts2)
        return ids, ids2, full, full2

    def encode_labels(self, labels: Sequence[str]) -> np.ndarray:
        """``[n]`` int64 class indices, or with ``label_type`` score ``[n]`` float32 scores.

        Raises:
            KeyError: a label not in the target map (class).
            ValueError: a label that is not a number (score; the reader checks it first).
        """
        if self.label_type == "score":
            return parse_scores(labels)
        return np.asarray(self.target_map.encode(labels), dtype=np.int64)

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_dir(cls, path: str, meta: PreparedMeta | None = None) -> Encoder:
        """Rebuild the encoder from ``meta.json``, ``vocab.txt`` and ``target_map.txt``.

        Args:
            path: the prepared data dir, or a checkpoint dir holding copies of the three
                files (local or fsspec URL). For ``hf`` the tokenizer is loaded from
                ``meta.prepro["tokenizer_path"]``.
            meta: ``path``'s meta.json when the caller has read it (else read here).

        Raises:
            DataError: a file is missing or inconsistent with ``meta.json``.
            ValueError: the hf tokenizer cannot be loaded.
        """
        try:
            meta = meta if meta is not None else PreparedMeta.read(path)
        except FileNotFoundError:
            raise DataError(
                f"{PreparedMeta.path_in(path)}: not found "
                f"(is {path!r} a prepared data/checkpoint dir?)"
            ) from None
        target_map = TargetMap.load(io.join(path, TARGET_MAP_FILE))
        if len(target_map) != meta.num_labels:
            raise DataError(
                f"{io.join(path, TARGET_MAP_FILE)}: {len(target_map)} labels, "
                f"{META_FILE} says num_labels={meta.num_labels}"
            )
        pair = bool(meta.prepro.get("text2_column"))
        transliterate = meta.prepro.get("transliterate")
        vocab = None
        if meta.tokenizer == "hf":
            tokenizer = make_tokenizer("hf", meta.lower, meta.prepro.get("tokenizer_path"))
        else:
            vocab = Vocab.load(io.join(path, VOCAB_FILE))
            tokenizer = make_tokenizer(meta.tokenizer, meta.lower)
        enc = cls(
            tokenizer,
            target_map,
            meta.max_len,
            vocab,
            pair=pair,
            meta=meta,
            transliterate=transliterate,
            label_type=meta.prepro.get("label_type", "class"),
            spell_oov=meta.spells_oov,
            truncation=meta.prepro.get("truncation", "head"),  # data prepared before it: head
        )
        if enc.vocab_size != meta.vocab_size:
            raise DataError(
                f"{path}: vocab has {enc.vocab_size} ids, {META_FILE} says "
                f"vocab_size={meta.vocab_size}"
            )
        return enc

    def __repr__(self) -> str:
        return (
            f"Encoder(tokenizer={self.tokenizer.name!r}, max_len={self.max_len}, "
            f"vocab_size={self.vocab_size}, num_labels={self.num_labels}, pair={self.pair}, "
            f"transliterate={self.transliterate!r}, truncation={self.truncation!r})"
        )
