"""``static_embed``: a static-embedding student, one vector per vocabulary piece distilled from a
transformer encoder (Tulkens & van Dongen 2024, Model2Vec), mean-pooled into a linear head.

**The vectors** (:func:`static_vectors`; written as safetensors, :func:`save_vectors`):

1. each piece id ``t`` of the encoder's vocabulary goes alone through the encoder as
   ``[CLS] t [SEP]`` (XLM-R vocabularies: ``<s> t </s>``), in batches, under
   ``torch.no_grad``; its vector is the mean of the encoder's last hidden states over the
   three positions. The two specials are kept in the mean on purpose: it is what Model2Vec
   does for sub-word pieces (``create_output_embeddings_from_model``: the mean over the whole
   3-position output; it puts ``[SEP]`` first and ``[CLS]`` last, which it found slightly
   better, where we keep the order every other input of the encoder has), and the outputs
   at ``[CLS]``/``[SEP]`` are themselves functions of the piece (``pool="token"`` takes the
   piece's own position alone);
2. PCA to ``dim`` components (``sklearn.decomposition.PCA``, centred, ``svd_solver="full"``;
   ``dim`` is cut to the encoder's width or the number of pieces when it is larger, as
   Model2Vec does), fitted on the pieces computed;
3. each piece's row multiplied by a frequency weight (``weighting``):

   * ``zipf`` (Model2Vec's default since 0.4): SIF with the probabilities estimated from the
     piece's rank by Zipf's law, the id taken as the rank (sentencepiece and BPE vocabularies
     are sorted by frequency): ``p(r) = (1 / (r + 2)) / sum_{j<V} 1 / (j + 2)`` over the
     ``V`` ids of the vocabulary, weight ``a / (a + p(r))`` with ``a = 1e-4``
     (``model2vec.distill.distillation._post_process_embeddings``, ``sif_coefficient``);
   * ``sif``: smooth inverse frequency (Arora, Liang & Ma 2017, "A Simple but Tough-to-Beat
     Baseline for Sentence Embeddings"), ``a / (a + p(w))`` with ``p(w)`` the piece's share
     of the training texts' pieces (specials not counted) and ``a = 1e-3``; an unseen piece
     gets weight 1;
   * ``none``: 1.

Which pieces get a vector: every id of the vocabulary but the specials (``[PAD]``, ``[CLS]``,
``[SEP]``, ``[MASK]``, ``<s>``, ``</s>``, ``<pad>``, ...) and ``[unused<i>]`` (Model2Vec's
``token_remove_pattern``) with ``static_tokens: all``; with ``train``, only the pieces the
training texts use (a 250,002-piece multilingual vocabulary takes ~10 minutes on one CPU
core; the built-in corpus uses ~7,000). A piece without a vector is skipped by the mean,
like a special.

**The model** (:class:`StaticEmbedding`): ``input_ids [batch, seq_len]`` (the teacher
tokenizer's ids: prepro with ``tokenizer: hf`` and the encoder's ``tokenizer_path``) ->
the mean of the piece vectors over the positions that have one (not padding, not a special)
-> optional LayerNorm -> dropout -> linear -> ``logits [batch, num_labels]``. For pairs
encoded jointly (``[CLS] a [SEP] b [SEP]``, prepro's ``pair_encoding: joint``) each segment is
pooled alone (:func:`xdpx.models.hf.pair_token_type_ids`) and the head reads
``[u, v, |u - v|, u * v]`` (Conneau et al. 2017, InferSent). The vectors are trained with
the head, or frozen (``freeze_embeddings``). A piece's vector is one row of a compact table
(``num_vectors + 1`` rows, row 0 = no vector) found through an int32 id -> row map, so a
250k-piece vocabulary of which the corpus uses 7,000 costs 7,000 rows. The ONNX graph is two
Gathers, a MatMul of the ``[batch, 1, seq_len]`` keep-mask with the ``[batch, seq_len, dim]``
vectors, a division and the head's Gemm.

**Where the vectors come from at training time**: :meth:`StaticEmbedding.prepare` (called by
:func:`xdpx.models.build_for_training` like ``ngram_lr``'s) loads ``static_vectors`` (a file
of :func:`save_vectors`) or computes them from ``static_encoder`` (a pretrained directory,
``pkg:<module>/<dir>``, or an ``hf_classifier`` checkpoint, e.g. the distillation teacher's
``<run>/<best>``), cached in ``$XDPX_CACHE/static`` under a key of the encoder's files, the
pieces, ``dim`` and the weighting; with neither, the vectors start at random (a bag of
trainable embeddings). ``config.json`` then holds ``static_vectors: null``,
``static_encoder: null`` and the fitted sizes: the vectors live in the checkpoint's weights.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xdpx.models.contract import ModelContract
from xdpx.models.hf import pair_token_type_ids
from xdpx.models.static_vectors import (  # noqa: F401 - re-exported
    _CLS as _CLS,
    _SEP as _SEP,
    SIF_A,
    SPECIAL_TOKENS,
    UNUSED,
    VECTORS_VERSION,
    ZIPF_A,
    Pool,
    Weighting,
    _checkpoint_dir as _checkpoint_dir,
    _find as _find,
    _hidden_size as _hidden_size,
    encode_pieces,
    load_encoder,
    load_vectors,
    pca_reduce,
    piece_weights,
    save_vectors,
    static_vectors,
)

log = logging.getLogger("xdpx.models.static")

__all__ = [
    "SPECIAL_TOKENS",
    "StaticEmbedding",
    "PieceEmbedding",
    "encode_pieces",
    "load_encoder",
    "load_vectors",
    "pca_reduce",
    "piece_weights",
    "save_vectors",
    "static_vectors",
]

Tokens = Literal["all", "train"]


# ------------------------------------------------------------------------------ the model
class PieceEmbedding(nn.Embedding):
    """The piece vectors: ``rows`` (int32 ``[vocab_size]``, id -> row, 0 = no vector) and a
    ``[num_vectors + 1, dim]`` table whose row 0 stays zero. Called with the input ids (what
    FreeLB's hook checks, :mod:`xdpx.train.adversarial`), it returns ``[..., dim]``."""

    def __init__(self, vocab_size: int, num_vectors: int, dim: int) -> None:
        super().__init__(num_vectors + 1, dim, padding_idx=0)
        self.register_buffer("rows", torch.zeros(vocab_size, dtype=torch.int32))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = self.rows[input_ids].to(torch.int64)
        return F.embedding(rows, self.weight, self.padding_idx)

    def kept(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[...]`` bool: the positions whose piece has a vector."""
        return self.rows[input_ids] != 0


class StaticEmbedding(ModelContract):
    """Mean of static piece vectors -> optional LayerNorm -> dropout -> linear (module docstring).

    Args:
        vocab_size: the tokenizer's ids (prepro meta).
        num_labels: output classes.
        pad_id: padding id (never pooled).
        sep_id: the separator, for jointly encoded pairs.
        pair: the data are pairs encoded jointly: each segment pooled alone, the head reads
            ``[u, v, |u - v|, u * v]`` (ignored without ``sep_id``).
        static_vectors: a :func:`save_vectors` file (:meth:`prepare` loads it).
        static_encoder: the encoder :meth:`prepare` computes the vectors from
            (:func:`load_encoder`'s sources), when ``static_vectors`` is None.
        static_dim: PCA dimensions (the width of the table; :meth:`prepare` may cut it to the
            encoder's width, or take a ``static_vectors`` file's).
        static_weighting: ``zipf``, ``sif`` or ``none`` (:func:`piece_weights`).
        static_tokens: ``all`` (every piece of the vocabulary) or ``train`` (the pieces of the
            training texts) get a vector.
        static_layer_norm: a LayerNorm (elementwise affine) on each pooled vector.
        freeze_embeddings: keep the piece vectors fixed (train the head only).
        dropout: dropout on the head's input.
        num_vectors: rows of the table but row 0 (set by :meth:`prepare`, saved in
            config.json); None = every id its own row (before ``prepare``).

    Raises:
        ValueError: ``static_dim`` < 1.
    """

    #: ``train.learning_rate: null`` means this: AdamW on a linear head over mean vectors
    #: and the vectors themselves (fastText's setting is SGD at 0.1; Adam's steps are per
    #: weight).
    default_learning_rate = 1e-2
    #: :func:`xdpx.models.build_for_training` hands ``prepare`` vocab.txt as written (the
    #: tokenizer's own ids), not :meth:`xdpx.data.vocab.Vocab.load`'s shifted ``[PAD]``/``[UNK]``.
    vocab_as_written = True
    fits_on_data = True  # prepare(): the piece vectors and weights from the training texts

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        pad_id: int = 0,
        sep_id: int | None = None,
        pair: bool = False,
        static_vectors: str | None = None,
        static_encoder: str | None = None,
        static_dim: int = 256,
        static_weighting: Weighting = "zipf",
        static_tokens: Tokens = "all",
        static_layer_norm: bool = False,
        freeze_embeddings: bool = False,
        dropout: float = 0.0,
        num_vectors: int | None = None,
    ) -> None:
        super().__init__()
        if static_dim < 1:
            raise ValueError(f"static_dim must be >= 1, got {static_dim}")
        self.vocab_size = vocab_size
        self.num_labels = num_labels
        self.pad_id = pad_id
        self.sep_id = sep_id
        self.pair = bool(pair) and sep_id is not None
        self.static_vectors = static_vectors
        self.static_encoder = static_encoder
        self.weighting = static_weighting
        self.tokens = static_tokens
        self.layer_norm = static_layer_norm
        self.freeze = freeze_embeddings
        self.dropout_p = dropout
        self.min_len = 1
        # padding is masked out: a text's logits do not depend on its batch-mates' lengths
        self.length_sorted_inference = True
        if num_vectors is None:  # every id its own row, padding none
            self._build(vocab_size, static_dim)
            rows = torch.arange(1, vocab_size + 1, dtype=torch.int32)
            rows[pad_id] = 0
            self.embedding.rows.copy_(rows)
        else:
            self._build(num_vectors, static_dim)

    def _build(self, num_vectors: int, dim: int) -> None:
        """(Re)create the table (N(0, 1) rows, row 0 zero), the LayerNorm and the head."""
        self.num_vectors = num_vectors
        self.dim = dim
        self.embedding = PieceEmbedding(self.vocab_size, num_vectors, dim)
        self.embedding.weight.requires_grad_(not self.freeze)
        self.LayerNorm = nn.LayerNorm(dim) if self.layer_norm else None
        self.dropout = nn.Dropout(self.dropout_p)
        self.classifier = nn.Linear(dim * (4 if self.pair else 1), self.num_labels)

    def get_input_embeddings(self) -> PieceEmbedding:
        """The piece vectors (FreeLB perturbs their output; ``xdpx.train.adversarial``)."""
        return self.embedding

    def pool(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[batch, S, dim]``: the mean vector of each text (S = 1), or of each segment of a
        jointly encoded pair (S = 2), over the positions with a vector; zero when none."""
        vectors = self.embedding(input_ids)  # [B, T, D]
        keep = self.embedding.kept(input_ids).to(vectors.dtype)  # [B, T]
        if self.pair:
            second = pair_token_type_ids(input_ids, self.sep_id, self.pad_id).to(vectors.dtype)
            weights = torch.stack([keep * (1 - second), keep * second], dim=1)  # [B, 2, T]
        else:
            weights = keep.unsqueeze(1)  # [B, 1, T]
        sums = torch.bmm(weights, vectors)  # [B, S, D]
        return sums / weights.sum(dim=2, keepdim=True).clamp(min=1.0)

    def features(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The head's input: ``[batch, dim]``, or ``[batch, 4 dim]`` for pairs."""
        pooled = self.pool(input_ids)
        if self.LayerNorm is not None:
            pooled = self.LayerNorm(pooled)
        if not self.pair:
            return pooled[:, 0]
        u, v = pooled[:, 0], pooled[:, 1]
        return torch.cat([u, v, (u - v).abs(), u * v], dim=1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, seq_len]`` int64. Returns: logits ``[batch, num_labels]``."""
        return self.classifier(self.dropout(self.features(input_ids)))

    # -------------------------------------------------------------- preparation
    def prepare(
        self,
        vocab_tokens: Sequence[str] | None = None,
        train_input_ids: Iterable[np.ndarray] | None = None,
        batch_size: int = 512,
        progress: bool = True,
    ) -> dict[str, Any]:
        """Fill the table before training: load ``static_vectors``, or compute the vectors
        from ``static_encoder`` (cached), or draw them at random; the pieces without one
        (specials, padding, ``[unused<i>]``, with ``static_tokens: train`` the pieces the
        training texts do not use) map to row 0 and are skipped by the mean.

        Args:
            vocab_tokens: the data's vocab.txt as written (line i = id i).
            train_input_ids: the training texts as id arrays (piece counts: ``sif``, ``train``).
            batch_size: pieces per encoder pass.
            progress: a tqdm bar while computing.

        Returns:
            Facts for the log: ``source`` (``vectors``, ``encoder``, ``cache`` or ``random``),
            ``num_vectors``, ``static_dim``, ``explained_variance`` (computed vectors), ...

        Raises:
            ValueError: the vocabulary has another size than ``vocab_size``, the encoder's
                vocabulary differs from the data's, a vectors file has ids outside it.
        """
        if vocab_tokens is None:
            raise ValueError("static_embed.prepare needs the vocabulary (vocab.txt)")
        tokens = list(vocab_tokens)
        if len(tokens) != self.vocab_size:
            raise ValueError(
                f"vocabulary has {len(tokens)} tokens, the model vocab_size={self.vocab_size}"
            )
        arrays = [np.asarray(x, dtype=np.int64) for x in (train_input_ids or ())]
        texts = len(arrays)
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        counts = np.bincount(flat, minlength=self.vocab_size)[: self.vocab_size]
        no_vector = {self.pad_id} | {i for i, t in enumerate(tokens) if t in SPECIAL_TOKENS or UNUSED.fullmatch(t)}  # fmt: skip
        counts[list(no_vector)] = 0
        candidates = np.array([i for i in range(self.vocab_size) if i not in no_vector], dtype=np.int64)  # fmt: skip
        if self.tokens == "train":
            candidates = candidates[counts[candidates] > 0]
        facts: dict[str, Any] = {"train_texts": texts}
        if self.static_vectors:
            ids, vectors = load_vectors(self.static_vectors)
            if len(ids) and (ids.min() < 0 or ids.max() >= self.vocab_size):
                raise ValueError(f"{self.static_vectors}: ids outside the vocabulary 0..{self.vocab_size - 1}")  # fmt: skip
            keep = ~np.isin(ids, list(no_vector))
            ids, vectors = ids[keep], vectors[keep]
            facts["source"] = f"vectors {self.static_vectors}"
        elif self.static_encoder:
            ids, vectors, more = self._from_encoder(tokens, candidates, counts, batch_size, progress)  # fmt: skip
            facts.update(more)
        else:
            ids = candidates
            vectors = torch.randn(len(ids), self.dim).numpy()
            facts["source"] = "random"
        rows = np.zeros(self.vocab_size, dtype=np.int32)
        rows[ids] = np.arange(1, len(ids) + 1, dtype=np.int32)
        device = self.classifier.weight.device
        self._build(len(ids), int(vectors.shape[1]))
        with torch.no_grad():
            self.embedding.rows.copy_(torch.from_numpy(rows))
            self.embedding.weight[1:] = torch.from_numpy(np.ascontiguousarray(vectors))
        self.to(device)
        facts.update(num_vectors=self.num_vectors, static_dim=self.dim)
        return facts

    def _from_encoder(
        self,
        tokens: list[str],
        ids: np.ndarray,
        counts: np.ndarray,
        batch_size: int,
        progress: bool,
    ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """The vectors of ``ids`` from ``static_encoder``, through the cache."""
        from xdpx import io

        encoder, encoder_tokens, fingerprint = load_encoder(self.static_encoder)
        rows = encoder.get_input_embeddings().num_embeddings
        if self.vocab_size > rows:
            raise ValueError(
                f"the data use {self.vocab_size} token ids but static_encoder "
                f"{self.static_encoder} has {rows} embedding rows: prepro must use its tokenizer "
                f"(prepro.tokenizer=hf, prepro.tokenizer_path=<its tokenizer>)"
            )
        if encoder_tokens is not None:
            differ = [i for i, (a, b) in enumerate(zip(tokens, encoder_tokens, strict=False)) if a != b]  # fmt: skip
            if differ:
                i = differ[0]
                raise ValueError(
                    f"static_encoder {self.static_encoder}'s vocabulary differs from the data's "
                    f"at {len(differ)} ids (id {i}: {encoder_tokens[i]!r} vs {tokens[i]!r}): "
                    "prepare the data with its tokenizer (prepro.tokenizer=hf, "
                    "prepro.tokenizer_path=<its tokenizer>)"
                )
        cls_id, sep_id = _find(tokens, _CLS), _find(tokens, _SEP)
        key = {
            "version": VECTORS_VERSION, "encoder": fingerprint, "dim": self.dim,
            "weighting": self.weighting, "cls": cls_id, "sep": sep_id,
            "vocab_size": self.vocab_size,
            "ids": hashlib.sha256(ids.tobytes()).hexdigest(),
            "counts": hashlib.sha256(counts.tobytes()).hexdigest() if self.weighting == "sif" else None,  # fmt: skip
        }  # fmt: skip
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        cached = os.path.join(io.cache_dir("static"), f"{digest}.safetensors")
        if os.path.exists(cached):
            got_ids, vectors = load_vectors(cached)
            if np.array_equal(got_ids, ids):
                log.info("static vectors of %s from the cache %s", self.static_encoder, cached)
                return ids, vectors, {"source": f"cache {cached}", "encoder": self.static_encoder}
        log.info(
            "static vectors: %d pieces through %s ([CLS] t [SEP], mean), PCA to %d, %s weights",
            len(ids), self.static_encoder, self.dim, self.weighting,
        )  # fmt: skip
        raw = encode_pieces(encoder, ids, cls_id, sep_id, batch_size, "mean", progress)
        vectors, ratio = pca_reduce(raw, self.dim)
        vectors *= piece_weights(self.weighting, ids, self.vocab_size, counts)[:, None].astype(np.float32)  # fmt: skip
        meta = {"key": json.dumps(key, sort_keys=True), "encoder": str(self.static_encoder)}
        tmp = f"{cached}.tmp-{os.getpid()}"
        save_vectors(tmp, ids, vectors, meta)
        os.replace(tmp, cached)
        facts = {
            "source": "encoder", "encoder": self.static_encoder, "cache": cached,
            "explained_variance": round(float(ratio.sum()), 4),
        }  # fmt: skip
        return ids, vectors, facts

    def saved_config_updates(self) -> dict[str, Any]:
        """Constructor arguments that :meth:`prepare` changed (merged into config.json)."""
        return {"num_vectors": self.num_vectors, "static_dim": self.dim}

    def saved_config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this model without the encoder or the vectors
        file: the vectors are in the weights."""
        return {
            "vocab_size": self.vocab_size,
            "num_labels": self.num_labels,
            "pad_id": self.pad_id,
            "sep_id": self.sep_id,
            "pair": self.pair,
            "static_vectors": None,
            "static_encoder": None,
            "static_dim": self.dim,
            "static_weighting": self.weighting,
            "static_tokens": self.tokens,
            "static_layer_norm": self.layer_norm,
            "freeze_embeddings": self.freeze,
            "dropout": self.dropout_p,
            "num_vectors": self.num_vectors,
        }

    def extra_repr(self) -> str:
        return (
            f"vocab_size={self.vocab_size}, num_vectors={self.num_vectors}, dim={self.dim}, "
            f"pair={self.pair}, frozen={self.freeze}"
        )
