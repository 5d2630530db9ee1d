"""Logistic regression over hashed n-grams, trained end to end in PyTorch.

The strongest cheap text classifier on small corpora is still a linear model over
n-gram features (Wang & Manning 2012; Joulin et al. 2017, "Bag of Tricks"), and what
makes scikit-learn's TF-IDF + logistic regression hard to beat is its weighting:
sublinear tf, idf from the training set, L2-normalised rows (Salton & Buckley 1988;
``sklearn.feature_extraction.text.TfidfTransformer``). This module is that model in the
shape of every other xdpx model: ``input_ids -> logits``, with the features computed
inside the graph, so it trains with the shared Trainer and exports to ONNX with
``input_ids`` alone.

Features of a text (each hashed into one table of ``ngram_buckets`` rows):

* token n-grams of the orders ``ngram_orders``: character n-grams when prepro's
  tokenizer is ``char`` (Chinese), word n-grams when it is ``word``;
* with word tokens, the character n-grams of each word (orders ``char_ngram_orders``,
  the word wrapped in ``<`` ``>`` as in fastText, Bojanowski et al. 2017, and in
  scikit-learn's ``char_wb`` analyzer): a sub-word table ``[vocab_size,
  SUBWORD_WIDTH]`` built from the vocabulary by :meth:`NgramLR.prepare`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xdpx.data.meta import PreparedMeta
from xdpx.data.vocab import Vocab, is_char_token
from xdpx.inference import pad_batch
from xdpx.models.contract import ModelContract

# Multipliers for position k of an n-gram window (distinct primes below _MODULUS):
# h = order salt + sum_k ids[i+k] * P_k (< 2^50 for ids < 2^17), then
# bucket = ((h mod _MODULUS) * _MIX mod _MODULUS) mod buckets. Reduced straight modulo a
# power-of-two bucket count, h keeps its linear structure (998_244_353 = 119 * 2^23 + 1 is 1
# modulo 2^22, so "abc" and "cba" shared a bucket); multiplying by _MIX modulo the prime
# (a bijection: no new collision) spreads n-grams that differ by small id offsets, so what
# collides modulo buckets is as rare as for a random hash (tests/test_ngram.py).
_PRIMES = (1, 1_000_003, 998_244_353, 1_000_000_007, 1_234_567_891)
_MODULUS = 2_147_483_629  # the largest prime below 2^31
_MIX = 1_103_515_245  # glibc's LCG multiplier; products stay below 2^62
# Added per order so that the same ids in different orders land in different buckets.
_ORDER_SALT = 7_919
#: Sub-word features kept per vocabulary word (the first ones by position; a word of up to
#: 12 characters has all of its 2..5-grams within 46).
SUBWORD_WIDTH = 48

Weighting = Literal["binary", "tfidf"]
Norm = Literal["joint", "union"]
PairCosine = Literal["per_kind", "joint"]


def char_ngrams(word: str, orders: Sequence[int]) -> list[str]:
    """Character n-grams of ``<word>`` (fastText's boundary markers), by start position,
    each start's orders ascending; an n-gram as long as ``<word>`` itself is skipped.

    >>> char_ngrams("ab", [2, 3])
    ['<a', '<ab', 'ab', 'ab>', 'b>']
    """
    w = f"<{word}>"
    out = []
    for i in range(len(w)):
        for n in orders:
            if i + n <= len(w) and n < len(w):
                out.append(w[i : i + n])
    return out


def _run_totals(rows: torch.Tensor, *values: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Runs of equal ids in rows sorted per text, with static shapes (ONNX export).

    Args:
        rows: ``[batch, slots]`` int64, sorted along dim 1.
        values: ``[batch, slots]`` float32 tensors to total over each run.

    Returns:
        ``(first, *totals)``: ``first`` ``[batch, slots]`` bool marks each run's first slot;
        each total holds, at every slot, the sum of its values over that slot's run.
    """
    first = torch.cat(
        [torch.ones_like(rows[:, :1], dtype=torch.bool), rows[:, 1:] != rows[:, :-1]], dim=1
    )
    run = torch.cumsum(first.to(torch.int64), dim=1) - 1  # index of each slot's run
    totals = [torch.gather(torch.zeros_like(v).scatter_add(1, run, v), 1, run) for v in values]
    return (first, *totals)


#: Multipliers of a character n-gram's symbols (orders up to 8; distinct primes < 2^31).
_CHAR_PRIMES = (*_PRIMES, 1_000_000_009, 1_000_000_021, 1_000_000_033)
#: Added to a character n-gram's hash, so that it never shares a salt with a token n-gram.
_CHAR_SALT = 104_729
#: Symbols of a word's boundaries in its character n-grams (fastText's ``<`` and ``>``); a
#: character ``c`` is ``ord(c) + 3``.
_START, _END, _CHAR0 = 1, 2, 3


def char_windows(word: str, orders: Sequence[int]) -> list[tuple[int, ...]]:
    """:func:`char_ngrams` of ``word`` as symbol tuples (``<`` = 1, ``>`` = 2, a character
    ``ord(c) + 3``), in the same order: what :func:`char_buckets` hashes.

    >>> char_windows("ab", [2])
    [(1, 100), (100, 101), (101, 2)]
    """
    w = [_START, *(ord(c) + _CHAR0 for c in word), _END]
    return [tuple(w[i : i + n]) for i in range(len(w)) for n in orders if i + n <= len(w) and n < len(w)]  # fmt: skip


def char_buckets(symbols: Sequence[torch.Tensor], buckets: int) -> torch.Tensor:
    """Bucket (``1..buckets``) of character n-grams given as their ``n`` symbol tensors
    (each ``[...]`` int64, see :func:`char_windows`): the token n-gram hash of ``_PRIMES``'s
    comment with its own multipliers and salt. The same function builds the sub-word table
    from the vocabulary and hashes an unknown word's spelled characters inside the graph
    (``prepro.oov: spell``), so both give a character n-gram the same row.
    """
    n = len(symbols)
    h = symbols[0] * _CHAR_PRIMES[0] + (n * _ORDER_SALT + _CHAR_SALT)
    for k in range(1, n):
        h = h + symbols[k] * _CHAR_PRIMES[k]
    h = torch.remainder(torch.remainder(h, _MODULUS) * _MIX, _MODULUS)
    return torch.remainder(h, buckets) + 1


class NgramLR(ModelContract):
    """Hashed n-gram features, weighted and L2-normalised per text, then linear.

    Every feature (see the module docstring) is hashed into one of ``ngram_buckets``
    buckets; :meth:`prepare` keeps the buckets seen in at least ``ngram_min_df`` training
    texts and gives each a row of the ``[num_features + 1, num_labels]`` weight table (row 0
    = dropped: padding, unseen or rare features), like the vocabulary of scikit-learn's
    vectorizers, so the table holds only what training can move.

    ``ngram_weighting="binary"``: each distinct feature has value 1. ``"tfidf"``: value
    ``(1 + ln tf) * idf`` with the smooth idf ``ln((1 + n) / (1 + df)) + 1`` of the ``n``
    training texts (``TfidfVectorizer(sublinear_tf=True)``). Either way the row is divided
    by its L2 norm, then ``logits = W^T x + b`` with W zero-initialised (logistic
    regression). Windows that touch padding are ignored, so logits do not depend on padding.

    Training and eager inference flatten the batch to the real tokens (no padding work);
    the ONNX export traces an equivalent padded computation (same logits within 1e-5).

    Args:
        vocab_size: number of token ids (rows of the sub-word table).
        num_labels: output classes.
        ngram_orders: token n-gram orders, each in 1..5.
        ngram_buckets: hash buckets.
        pad_id: padding token id.
        char_ngram_orders: orders of the character n-grams of each word (word tokens;
            empty = none), each in 1..8.
        ngram_weighting: ``"binary"`` or ``"tfidf"``.
        ngram_min_df: features seen in fewer training texts are dropped.
        ngram_norm: ``"joint"``: one L2 norm over all features of a text; ``"union"``: the
            token n-grams and the sub-words (two kinds, with word tokens) each of unit norm
            (a text's row has norm sqrt(2)), as scikit-learn's ``FeatureUnion`` of a word and
            a ``char_wb`` ``TfidfVectorizer`` gives them: the few word n-grams of a text
            weigh as much as its many character n-grams. Without sub-words both are one.
        ngram_dropout: while training, each feature of a text is dropped with this
            probability (the others scaled by ``1 / (1 - p)``): dropout on the inputs of a
            linear model, an adaptive L2 penalty that is strongest on rare features (Wager,
            Wang & Liang 2013, "Dropout Training as Adaptive Regularization").
        num_features: rows of the weight table but row 0 (set by :meth:`prepare` and saved
            in config.json); None = every bucket its own row (before ``prepare``).
        oov_chars: the data spells unknown words (``prepro.oov: spell``: ``[UNK]`` then one
            ``##c`` token per character): the character n-grams of such a run are hashed in
            the graph like the sub-word table's (:func:`char_buckets`), so a word unseen in
            training keeps the sub-word features it shares with the words that were (a name
            in both texts of a pair, a misspelling, an inflection). Needs sub-words; set by
            :meth:`resolve_config` from ``meta.json`` (False in checkpoints saved before).

    Raises:
        ValueError: an order out of range, or an unknown weighting.
    """

    #: ``train.learning_rate: null`` means this (the demo's setting, chosen on dev).
    default_learning_rate = 1e-2
    #: ``train.loss: auto`` means this: the linear SVM's loss (docs/benchmark-suite.md).
    default_loss = "squared_hinge"
    fits_on_data = True  # prepare(): the sub-word and idf tables from the training texts
    #: tables whose gradients are sparse under ``train.optimizer: lazy_adamw``
    #: (``xdpx.train.optim.build_optimizer`` sets :attr:`sparse_grad`)
    sparse_grad_tables: tuple[str, ...] = ("weight",)
    #: embedding bags emit sparse gradients (only the rows a batch touches)
    sparse_grad = False
    #: ``prepro.oov: spell`` data is read (``oov_chars``); other models refuse it
    #: (``xdpx.models.check_model_fits_data``: they would see untrained ``##c`` vectors)
    reads_spelled_oov = True

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        ngram_orders: Sequence[int] = (1, 2, 3, 4),
        ngram_buckets: int = 4_194_304,
        pad_id: int = 0,
        char_ngram_orders: Sequence[int] = (),
        ngram_weighting: Weighting = "binary",
        ngram_min_df: int = 1,
        num_features: int | None = None,
        ngram_norm: Norm = "joint",
        ngram_dropout: float = 0.0,
        oov_chars: bool = False,
    ) -> None:
        super().__init__()
        if not ngram_orders or min(ngram_orders) < 1 or max(ngram_orders) > len(_PRIMES):
            raise ValueError(
                f"ngram_orders must lie in 1..{len(_PRIMES)}, got {list(ngram_orders)}"
            )
        if char_ngram_orders and (min(char_ngram_orders) < 1 or max(char_ngram_orders) > 8):
            raise ValueError(f"char_ngram_orders must lie in 1..8, got {list(char_ngram_orders)}")
        if ngram_weighting not in ("binary", "tfidf"):
            raise ValueError(
                f"ngram_weighting must be 'binary' or 'tfidf', got {ngram_weighting!r}"
            )
        if not 0.0 <= ngram_dropout < 1.0:
            raise ValueError(f"ngram_dropout must lie in [0, 1), got {ngram_dropout}")
        if ngram_norm not in ("joint", "union"):
            raise ValueError(f"ngram_norm must be 'joint' or 'union', got {ngram_norm!r}")
        self.vocab_size = vocab_size
        self.num_labels = num_labels
        self.orders = sorted(set(ngram_orders))
        self.char_orders = sorted(set(char_ngram_orders))
        self.buckets = ngram_buckets
        self.pad_id = pad_id
        self.weighting = ngram_weighting
        self.min_df = ngram_min_df
        self.norm = ngram_norm
        self.feature_dropout = ngram_dropout
        #: normalised groups per text: 2 (token n-grams, sub-words) with ngram_norm union
        #: and sub-words, else 1
        self.kinds = 2 if ngram_norm == "union" and self.char_orders else 1
        self.min_len = 1
        # training with sparse_grad: text (token bytes) -> (rows, values), see train_features
        self._memo: dict[bytes, tuple[torch.Tensor, torch.Tensor]] = {}
        self._memo_bytes = 0
        rows = ngram_buckets if num_features is None else num_features
        self.num_features = rows
        # bucket (0 = none, 1..buckets) -> row of the weight table (0 = dropped)
        self.register_buffer("feature_rows", torch.arange(ngram_buckets + 1, dtype=torch.int32))
        self.register_buffer("idf", torch.ones(rows + 1))
        self.idf[0] = 0.0
        self._build_tables(rows)
        self.bias = nn.Parameter(torch.zeros(num_labels))
        if self.char_orders:
            self.register_buffer(
                "subwords", torch.zeros(vocab_size, SUBWORD_WIDTH, dtype=torch.int32)
            )
        else:
            self.subwords = None
        self.oov_chars = bool(oov_chars and self.char_orders)
        if self.oov_chars:  # token id -> its character's symbol (ord + 3) for ##c tokens, else 0
            self.register_buffer("char_symbol", torch.zeros(vocab_size, dtype=torch.int64))

    def _build_tables(self, rows: int) -> None:
        """(Re)create the weight table(s): ``[rows + 1, num_labels]``, zero (logistic
        regression starts at zero)."""
        self.weight = nn.Embedding(rows + 1, self.num_labels, padding_idx=0)
        nn.init.zeros_(self.weight.weight)

    @classmethod
    def resolve_config(cls, cfg: dict[str, Any], meta: PreparedMeta | None) -> dict[str, Any]:
        """Fill the ``None`` (auto) orders from prepro's tokenizer (``meta.tokenizer``), and
        ``oov_chars`` from ``meta.prepro.oov`` (word tokens spelled when unknown).

        Character tokens (``char``; ``hf`` pieces alike): token 1..4-grams and no sub-word
        n-grams, the demo's settings. Word tokens (``word``, ``whitespace``): word 1..2-grams
        (scikit-learn's usual ``ngram_range=(1, 2)``) and character 2..5-grams inside words.

        Args:
            cfg: constructor arguments (``ngram_orders``/``char_ngram_orders`` may be None).
            meta: prepro's ``meta.json`` (None: unknown tokenizer, character defaults).

        Returns:
            A copy of ``cfg`` with lists in place of None.
        """
        words = meta is not None and meta.tokenizer in ("word", "whitespace")
        out = dict(cfg)
        if out.get("ngram_orders") is None:
            out["ngram_orders"] = [1, 2] if words else [1, 2, 3, 4]
        if out.get("char_ngram_orders") is None:
            out["char_ngram_orders"] = [2, 3, 4, 5] if words else []
        spelled = meta is not None and meta.spells_oov
        out.setdefault("oov_chars", bool(spelled and out["char_ngram_orders"]))
        return out

    # ----------------------------------------------------------------- features
    def _window_buckets(self, ids: torch.Tensor, n: int) -> torch.Tensor:
        """Bucket (``1..ngram_buckets``) of every window of ``n`` consecutive ids along the
        last dim: ``[..., length]`` int64 -> ``[..., length - n + 1]`` (the hash in the
        comment of ``_PRIMES``). Traces for ONNX with ``length`` symbolic."""
        h = torch.zeros_like(ids[..., n - 1 :]) + n * _ORDER_SALT
        for k in range(n):
            end = k - n + 1  # window start k; a negative end keeps the length symbolic
            h = h + (ids[..., k:end] if end < 0 else ids[..., k:]) * _PRIMES[k]
        h = torch.remainder(torch.remainder(h, _MODULUS) * _MIX, _MODULUS)
        return torch.remainder(h, self.buckets) + 1

    def ngram_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Bucket of every token n-gram window, 0 where a window touches padding.

        Args:
            input_ids: ``[batch, seq_len]`` int64.

        Returns:
            ``[batch, sum_n (seq_len - n + 1)]`` int64 buckets in ``0..ngram_buckets``.
        """
        valid = input_ids != self.pad_id
        parts = []
        for n in self.orders:
            ok = valid[:, n - 1 :]
            for k in range(n - 1):  # every token of the window is real
                ok = ok & valid[:, k : k - n + 1]
            ids = self._window_buckets(input_ids, n)
            parts.append(torch.where(ok, ids, torch.zeros_like(ids)))
        return torch.cat(parts, dim=1)

    def feature_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Buckets of all features of each text, padded: token n-grams, then the character
        n-grams of every token (0 = none; repeats are kept: they are the term frequencies).

        Args:
            input_ids: ``[batch, seq_len]`` int64.

        Returns:
            ``[batch, num_slots]`` int64 in ``0..ngram_buckets``.
        """
        return self._padded_feature_ids(input_ids)[0]

    def _padded_feature_ids(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`feature_ids` and the kind of each slot (``[batch, num_slots]`` int64: 0 =
        token n-gram, 1 = sub-word)."""
        ids = self.ngram_ids(input_ids)
        if self.subwords is None:
            return ids, torch.zeros_like(ids)
        subs = [self.subwords[input_ids].to(torch.int64).flatten(1)]  # [batch, seq_len * WIDTH]
        if self.oov_chars:  # a right-padding slot closes a word spelled up to the row's end
            ext = F.pad(input_ids, (0, 1), value=self.pad_id)
            subs += [b for _, b in self._spelled_buckets(ext, torch.zeros_like(ext))]
        sub = torch.cat(subs, dim=1)
        kind = torch.cat([torch.zeros_like(ids), torch.ones_like(sub)], dim=1)
        return torch.cat([ids, sub], dim=1), kind

    def _spelled_buckets(
        self, ids: torch.Tensor, text: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Character n-grams of the spelled unknown words (``oov_chars``): per order ``n`` of
        ``char_ngram_orders``, ``(text, bucket)`` of each window of ``n`` slots along the last
        dim (``[..., length - n + 1]``), bucket 0 where the window is not one.

        A spelled word is ``[UNK]`` (its ``<``), its ``##c`` tokens, then any token that is no
        ``##c`` of the same text (its ``>``: the caller leaves one slot after the last text).
        A window is an n-gram of ``<word>`` but the whole of it, as :func:`char_ngrams`: it
        starts on the ``[UNK]`` or a character, its inner slots are characters of the same
        text, and it ends on a character or on the ``>``; 1-grams are the characters alone.

        Args:
            ids: ``[..., length]`` int64 token ids.
            text: ``[..., length]`` int64: the text of each slot (windows stay in one).
        """
        symbol = self.char_symbol[ids]
        is_char, is_unk = symbol > 0, ids == Vocab.unk_id
        out = []
        for n in self.char_orders:

            def at(x: torch.Tensor, k: int, n: int = n) -> torch.Tensor:
                end = k - n + 1  # a negative end keeps the length symbolic (ONNX)
                return x[..., k:end] if end < 0 else x[..., k:]

            start = at(text, 0)
            if n == 1:
                ok, symbols = at(is_char, 0), [at(symbol, 0)]
            else:
                ok = at(is_char, 0) | at(is_unk, 0)
                symbols = [torch.where(at(is_char, 0), at(symbol, 0), _START)]
                for k in range(1, n - 1):
                    ok = ok & at(is_char, k) & (at(text, k) == start)
                    symbols.append(at(symbol, k))
                last = at(is_char, n - 1) & (at(text, n - 1) == start)
                symbols.append(torch.where(last, at(symbol, n - 1), _END))
                ok = ok & ~(at(is_unk, 0) & ~last)  # <word> whole
            bucket = char_buckets(symbols, self.buckets)
            out.append((start, torch.where(ok, bucket, torch.zeros_like(bucket))))
        return out

    def _flat_feature_ids(
        self, input_ids: torch.Tensor, groups: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`feature_ids` without the padding: ``(text_index, bucket)``, both 1-D int64,
        grouped by kind (each token order, then the sub-words), each kind in token order;
        bucket 0 (none) marks an n-gram window that spans two texts.

        The n-grams are hashed on the batch's real tokens laid end to end (``[tokens]``, a
        third of ``[batch, seq_len]`` on the demo's test texts), a window counted when its
        first and last tokens belong to the same text: the same buckets as
        :meth:`ngram_ids` (rows are right-padded), for less work. Traces for ONNX
        (``seq_len`` and the token count stay symbolic). With ``groups``, the first tensor is
        the normalisation group ``text_index * kinds + kind`` instead (see ``ngram_norm``).
        """
        flat = input_ids.reshape(-1)
        where = torch.nonzero(flat != self.pad_id).squeeze(1)  # [tokens]
        tokens = flat[where]
        text = torch.div(where, input_ids.shape[1], rounding_mode="floor")
        texts, ids = [], []
        for n in self.orders:
            start = text[: 1 - n] if n > 1 else text
            ids.append(torch.where(start == text[n - 1 :], self._window_buckets(tokens, n), 0))
            texts.append(start)
        if self.subwords is not None:
            sub = self.subwords[tokens].to(torch.int64)  # [tokens, SUBWORD_WIDTH]
            keep = torch.nonzero(sub.reshape(-1)).squeeze(1)
            texts.append(text[torch.div(keep, SUBWORD_WIDTH, rounding_mode="floor")])
            ids.append(sub.reshape(-1)[keep])
        if self.oov_chars:  # one padding slot after the last text closes its last word
            ext = torch.cat([tokens, torch.full_like(tokens[:1], self.pad_id)])
            for start, bucket in self._spelled_buckets(
                ext, torch.cat([text, torch.full_like(text[:1], -1)])
            ):
                texts.append(start)
                ids.append(bucket)
        if groups and self.kinds > 1:  # token n-grams: group 2 * text; sub-words: + 1
            orders = len(self.orders)
            texts = [t * self.kinds for t in texts[:orders]] + [t * self.kinds + 1 for t in texts[orders:]]  # fmt: skip
        return torch.cat(texts), torch.cat(ids)

    def _values(self, rows: torch.Tensor, tf: torch.Tensor) -> torch.Tensor:
        """Unnormalised value of a feature in a text from its row and term frequency."""
        if self.weighting == "binary":
            return (rows != 0).to(torch.float32)
        return (1.0 + torch.log(tf.clamp(min=1.0))) * self.idf[rows]

    def features(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The sparse feature rows of a batch: each text's distinct kept features and values.

        Args:
            input_ids: ``[batch, seq_len]`` int64.

        Returns:
            ``(text, slots, values)``, each ``[nnz]``, sorted by text then slot: the text
            index, the feature's slot and its value, each text's values of unit L2 norm (the
            row of a TF-IDF matrix; with ``ngram_norm`` union, of each kind). The slot is the
            weight-table row (1..num_features) plus ``kind * (num_features + 1)`` (kind 1 =
            sub-words, only with ``ngram_norm`` union), so that a row that both kinds hit
            stays two features; :meth:`table_rows` maps slots to rows.
        """
        group, buckets = self._flat_feature_ids(input_ids, groups=True)
        rows = self.feature_rows[buckets].to(torch.int64)
        kept = rows != 0
        width = self.num_features + 1
        # one key per (group, row): sorted, the repeats of a feature in a group are adjacent
        key, _ = torch.sort(group[kept] * width + rows[kept])
        key, tf = torch.unique_consecutive(key, return_counts=True)
        group, rows = key // width, key % width
        values = self._values(rows, tf.to(torch.float32))
        norm = torch.zeros(len(input_ids) * self.kinds).index_add_(0, group, values.square())
        values = values / norm.sqrt().clamp(min=1e-12)[group]
        if self.kinds == 1:
            return group, rows, values
        return group // self.kinds, rows + (group % self.kinds) * width, values

    def table_rows(self, slots: torch.Tensor) -> torch.Tensor:
        """Weight-table rows (``0..num_features``) of the feature slots of :meth:`features`."""
        return slots if self.kinds == 1 else torch.remainder(slots, self.num_features + 1)

    #: :meth:`train_features` keeps at most this many bytes of feature rows.
    memo_max_bytes = 1 << 30

    def train_features(
        self, input_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`features`, remembered per text while training with sparse gradients.

        A text's features depend on its tokens and on the tables :meth:`prepare` built, which
        do not change during training; so each distinct text is hashed once, and later
        epochs look its ``(rows, values)`` up by its token bytes (the same numbers as
        :meth:`features` computes for it). At most :attr:`memo_max_bytes` are kept (then
        new texts are computed each time); :meth:`prepare` forgets them. Outside training
        with ``sparse_grad``, or on CUDA, this is :meth:`features`.

        Args:
            input_ids: ``[batch, seq_len]`` int64, right-padded.

        Returns:
            As :meth:`features`.
        """
        if not (self.training and self.sparse_grad) or input_ids.is_cuda:
            return self.features(input_ids)
        lengths = (input_ids != self.pad_id).sum(dim=1).tolist()
        ids = input_ids.numpy()
        keys = [ids[i, :n].tobytes() for i, n in enumerate(lengths)]
        missing = [i for i, k in enumerate(keys) if k not in self._memo]
        fresh: dict[bytes, tuple[torch.Tensor, torch.Tensor]] = {}
        if missing:
            text, rows, values = self.features(input_ids[missing])
            counts = torch.bincount(text, minlength=len(missing)).tolist()
            for i, r, v in zip(missing, rows.split(counts), values.split(counts), strict=True):
                fresh[keys[i]] = (r, v)
                if self._memo_bytes < self.memo_max_bytes:
                    self._memo[keys[i]] = (r, v)
                    self._memo_bytes += 12 * len(r)
        parts = [self._memo.get(k) or fresh[k] for k in keys]
        counts = torch.tensor([len(r) for r, _ in parts])
        text = torch.repeat_interleave(torch.arange(len(keys)), counts)
        return text, torch.cat([r for r, _ in parts]), torch.cat([v for _, v in parts])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, seq_len]`` int64. Returns: logits ``[batch, num_labels]``."""
        if torch.onnx.is_in_onnx_export():
            return self._forward_padded(input_ids)
        text, rows, values = self.train_features(input_ids)
        values = self._drop(values)
        per_text = torch.bincount(text, minlength=len(input_ids))
        offsets = torch.cumsum(per_text, 0) - per_text
        out = F.embedding_bag(
            self.table_rows(rows), self.weight.weight, offsets, mode="sum",
            per_sample_weights=values, sparse=self.sparse_grad,
        )  # fmt: skip
        return out + self.bias

    def _drop(self, values: torch.Tensor) -> torch.Tensor:
        """``ngram_dropout`` of feature values ``[nnz]`` while training; else ``values``."""
        if not (self.training and self.feature_dropout > 0):
            return values
        return F.dropout(values, self.feature_dropout, training=True)

    def flat_keyed_features(
        self, input_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`features` in ops that trace (the ONNX graphs' path): the batch's kept
        features as one sorted 1-D key ``group * (num_features + 1) + row``, each with a
        value at the first of its repeats and 0 at the others (no ``unique``).

        Args:
            input_ids: ``[batch, seq_len]`` int64, right-padded.

        Returns:
            ``(key, group, rows, values)``, each ``[n]``: ``group`` is ``text * kinds + kind``
            (:meth:`_flat_feature_ids`), ``rows`` the weight-table row (1..num_features), the
            values of each group of unit L2 norm as :meth:`features`'s.
        """
        group, buckets = self._flat_feature_ids(input_ids, groups=True)
        rows = self.feature_rows[buckets]  # int32, 0 = dropped
        kept = torch.nonzero(rows).squeeze(1)
        width = self.num_features + 1
        key, _ = torch.sort(group[kept] * width + rows[kept].to(torch.int64))
        first, tf = _run_totals(key.unsqueeze(0), torch.ones_like(key, dtype=torch.float32)[None])
        group = torch.div(key, width, rounding_mode="floor")
        rows = key - group * width
        values = torch.where(first[0], self._values(rows, tf[0]), torch.zeros_like(tf[0]))
        groups = torch.zeros(input_ids.shape[0] * self.kinds, dtype=torch.float32)
        norm = groups.scatter_add(0, group, values.square()).sqrt().clamp(min=1e-12)
        return key, group, rows, values / norm[group]

    def _forward_padded(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The same logits, for the ONNX export: :meth:`features` in ops that trace.

        The n-grams are hashed on the real tokens only (:meth:`_flat_feature_ids`, as in
        training), only the kept features of the batch are sorted (one 1-D sort of
        ``text * (F + 1) + row``, not every slot of ``[batch, num_slots]`` with the padding),
        and the weights and idf are gathered for those only: the sort (ONNX ``TopK``) is a
        third of onnxruntime's time at batch 64. Per-class 1-D scatter-adds avoid a
        broadcast ``[n, C]`` scatter, which onnxruntime runs slowly (docs/serving.md).
        """
        _, group, rows, values = self.flat_keyed_features(input_ids)
        text = group if self.kinds == 1 else torch.div(group, self.kinds, rounding_mode="floor")
        zeros = torch.zeros(input_ids.shape[0], dtype=torch.float32)
        weight = self.weight(rows)  # [n, num_labels]
        per_class = [zeros.scatter_add(0, text, weight[:, c] * values) for c in range(self.num_labels)]  # fmt: skip
        return torch.stack(per_class, dim=1) + self.bias

    # -------------------------------------------------------------- preparation
    def prepare(
        self,
        vocab_tokens: Sequence[str] | None = None,
        train_input_ids: Iterable[np.ndarray] | None = None,
        batch_size: int = 256,
    ) -> dict[str, Any]:
        """Build the tables from the training data, before training: the sub-word table
        (from the vocabulary), the bucket -> row map (buckets seen in at least ``min_df``
        training texts) and the idf of each row; the weight table is re-created with one row
        per kept feature (``num_features``, to be saved in config.json).

        Args:
            vocab_tokens: token strings in id order (``vocab.txt``); ``[PAD]``, ``[UNK]``
                and other ``[...]`` specials get no sub-words. Needed with
                ``char_ngram_orders``.
            train_input_ids: the training texts as int64 id arrays.
            batch_size: texts per batch when counting document frequencies.

        Returns:
            Facts for the log: ``num_features``, ``train_texts``, and with sub-words
            ``subword_words`` and ``subword_truncated`` (words with more than
            ``SUBWORD_WIDTH`` character n-grams: the rest are not used).

        Raises:
            ValueError: the vocabulary size differs from ``vocab_size``, or an input is
                missing.
        """
        facts: dict[str, Any] = {}
        if self.subwords is not None:
            if vocab_tokens is None:
                raise ValueError("char_ngram_orders need the vocabulary (vocab_tokens)")
            if len(vocab_tokens) != self.vocab_size:
                raise ValueError(
                    f"vocabulary has {len(vocab_tokens)} tokens, the model vocab_size="
                    f"{self.vocab_size}"
                )
            table = torch.zeros(self.vocab_size, SUBWORD_WIDTH, dtype=torch.int32)
            truncated = words = 0
            # per order: the (row, slot) of each n-gram in the table and its symbols
            cells: dict[int, tuple[list[int], list[int], list[tuple[int, ...]]]] = {
                n: ([], [], []) for n in self.char_orders
            }
            for i, token in enumerate(vocab_tokens):
                if i == self.pad_id or (token.startswith("[") and token.endswith("]")):
                    continue
                if is_char_token(token):  # a spelled character (prepro.oov: spell)
                    if self.oov_chars:
                        self.char_symbol[i] = ord(token[-1]) + _CHAR0
                    continue
                grams = char_windows(token, self.char_orders)
                for k, g in enumerate(grams[:SUBWORD_WIDTH]):
                    rows, slots, symbols = cells[len(g)]
                    rows.append(i)
                    slots.append(k)
                    symbols.append(g)
                words += 1
                truncated += len(grams) > SUBWORD_WIDTH
            for rows, slots, symbols in cells.values():
                if rows:
                    columns = list(torch.tensor(symbols, dtype=torch.int64).T)
                    table[rows, slots] = char_buckets(columns, self.buckets).to(torch.int32)
            self.subwords.copy_(table)
            facts.update(subword_words=words, subword_truncated=truncated)
        if train_input_ids is None:
            raise ValueError("prepare needs the training texts (train_input_ids)")
        identity = torch.arange(self.buckets + 1, dtype=torch.int32)
        self.feature_rows = identity  # count buckets, not rows
        df = torch.zeros(self.buckets + 1, dtype=torch.int64)
        n = 0
        batch: list[np.ndarray] = []

        def count() -> None:
            with torch.no_grad():
                padded = pad_batch(batch, self.pad_id, self.min_len)
                text, buckets = self._flat_feature_ids(padded)
                key = torch.unique(text * (self.buckets + 1) + buckets)
            df.add_(torch.bincount(key % (self.buckets + 1), minlength=self.buckets + 1))
            batch.clear()

        for x in train_input_ids:
            batch.append(np.asarray(x, dtype=np.int64))
            n += 1
            if len(batch) == batch_size:
                count()
        if batch:
            count()
        df[0] = 0
        kept = df >= max(self.min_df, 1)
        rows = torch.zeros(self.buckets + 1, dtype=torch.int32)
        rows[kept] = torch.arange(1, int(kept.sum()) + 1, dtype=torch.int32)
        self.feature_rows = rows
        self._memo, self._memo_bytes = {}, 0
        self.num_features = int(kept.sum())
        idf = torch.zeros(self.num_features + 1)
        idf[1:] = (torch.log((1.0 + n) / (1.0 + df[kept].to(torch.float64))) + 1.0).to(
            torch.float32
        )
        self.idf = idf
        device = self.bias.device
        self._build_tables(self.num_features)
        self.to(device)
        facts.update(num_features=self.num_features, train_texts=n)
        return facts

    def saved_config_updates(self) -> dict[str, Any]:
        """Constructor arguments that :meth:`prepare` changed (merged into config.json)."""
        return {"num_features": self.num_features}

    def extra_repr(self) -> str:
        return (
            f"orders={self.orders}, char_orders={self.char_orders}, buckets={self.buckets}, "
            f"num_features={self.num_features}, weighting={self.weighting!r}, "
            f"min_df={self.min_df}, norm={self.norm!r}, dropout={self.feature_dropout}"
        )
