"""The vectors of the static-embedding student (:mod:`xdpx.models.static`, model2vec's recipe):
each vocabulary piece through a (teacher's) encoder as ``[CLS] piece [SEP]``, reduced by PCA and
weighted by Zipf or SIF frequency weights, saved once and cached."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import re
from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch import nn

log = logging.getLogger("xdpx.models.static")
Weighting = Literal["zipf", "sif", "none"]
Pool = Literal["mean", "token"]

#: Special pieces of BERT and XLM-R vocabularies: no vector, skipped by the mean.
SPECIAL_TOKENS = frozenset(
    {"[PAD]", "[CLS]", "[SEP]", "[MASK]", "<pad>", "<s>", "</s>", "<mask>", "<cls>", "<sep>"}
)


#: Model2Vec's ``token_remove_pattern``: BERT's unassigned ids (prepro writes ``[unused<i>]``
#: for every id a tokenizer leaves unassigned, too).
UNUSED = re.compile(r"\[unused\d+\]")


#: The SIF coefficient of ``weighting: zipf`` (Model2Vec's ``sif_coefficient`` default).
ZIPF_A = 1e-4


#: The SIF coefficient of ``weighting: sif`` (Arora et al. 2017: 1e-3 to 1e-4 work well).
SIF_A = 1e-3


#: Bumped when the computation changes, so cached vectors of an older one are not reused.
VECTORS_VERSION = 1


_CLS = ("[CLS]", "<s>", "<cls>")


_SEP = ("[SEP]", "</s>", "<sep>")


# --------------------------------------------------------------------------- the vectors
def load_encoder(source: str) -> tuple[nn.Module, list[str] | None, str]:
    """The transformers encoder named by ``source``, in eval mode on the CPU.

    Args:
        source: an xdpx checkpoint of ``hf_classifier``/``hf_mlm`` (a directory with
            ``config.json`` naming the model, or ``<run>/<best>``): its transformer body; or a
            pretrained directory / ``pkg:<module>/<dir>`` / URL (:mod:`xdpx.pretrained`),
            loaded with ``AutoModel``.

    Returns:
        ``(encoder, vocab_tokens, fingerprint)``: the base model (``last_hidden_state``), the
        tokens of its vocabulary in id order (the checkpoint's ``vocab.txt``, the pretrained
        tokenizer's; None when there is none) and a string that changes when its weights do.

    Raises:
        FileNotFoundError: ``source`` does not exist.
        ValueError: the checkpoint's model is not a transformer.
    """
    from xdpx import io

    ckpt_dir = _checkpoint_dir(source)
    if ckpt_dir is not None:
        from xdpx.checkpoint import load_checkpoint
        from xdpx.data import VOCAB_FILE
        from xdpx.data.vocab import read_tokens

        ckpt = load_checkpoint(ckpt_dir)
        hf = getattr(ckpt.model, "hf", None)
        if hf is None:
            raise ValueError(
                f"static_encoder {source!r} is a {ckpt.name} checkpoint; it needs a transformer "
                "(an hf_classifier/hf_mlm checkpoint or a pretrained directory)"
            )
        vocab_path = io.join(ckpt.path, VOCAB_FILE)
        tokens = read_tokens(vocab_path) if io.exists(vocab_path) else None
        manifest = io.join(ckpt.path, "manifest.json")
        weights = io.read_bytes(manifest if io.exists(manifest) else io.join(ckpt.path, "model.safetensors"))  # fmt: skip
        return hf.base_model.eval(), tokens, "ckpt:" + hashlib.sha256(weights).hexdigest()
    from transformers import AutoModel

    from xdpx.pretrained import quiet_transformers, resolve_pretrained

    local = resolve_pretrained(source)
    with quiet_transformers():
        model = AutoModel.from_pretrained(local, local_files_only=True)
    tokens = None
    try:
        from xdpx.data.tokenizers import HFTokenizer

        tokens = HFTokenizer(local).vocab_tokens()
    except ValueError:  # weights without tokenizer files: the vocabulary is not checked
        pass
    files = sorted(n for n in os.listdir(local) if n.endswith((".safetensors", ".bin", ".json")))
    stats = [(n, os.stat(os.path.join(local, n)).st_size, os.stat(os.path.join(local, n)).st_mtime_ns) for n in files]  # fmt: skip
    return model.eval(), tokens, "dir:" + json.dumps([local, stats])


def _checkpoint_dir(source: str) -> str | None:
    """``source`` resolved as an xdpx checkpoint (its config.json names an xdpx model), or
    None when it is not one."""
    from xdpx import io
    from xdpx.checkpoint import CheckpointError, resolve_checkpoint
    from xdpx.pretrained import BUILT_SOURCES, PKG_PREFIX

    if source in BUILT_SOURCES or source.startswith(PKG_PREFIX):
        return None
    try:
        path = resolve_checkpoint(source)
        config = json.loads(io.read_text(io.join(path, "config.json")))
    except (CheckpointError, OSError, ValueError):
        return None
    return path if isinstance(config, dict) and "model_config" in config else None


@torch.no_grad()
def encode_pieces(
    encoder: nn.Module,
    token_ids: Sequence[int],
    cls_id: int | None,
    sep_id: int | None,
    batch_size: int = 512,
    pool: Pool = "mean",
    progress: bool = True,
) -> np.ndarray:
    """Each piece alone through ``encoder``: ``[CLS] t [SEP]`` (without the specials that are
    None), the mean of its last hidden states over those positions (``pool="mean"``) or at
    the piece's own position (``"token"``).

    Args:
        encoder: a transformers base model (``last_hidden_state``), eval mode.
        token_ids: the pieces, ``[n]``.
        cls_id, sep_id: the specials around each piece (None: left out).
        batch_size: pieces per forward pass.
        pool: see above.
        progress: a tqdm bar on stderr.

    Returns:
        ``[n, hidden]`` float32.
    """
    from tqdm.auto import tqdm

    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64)).view(-1, 1)
    columns = [torch.full_like(ids, cls_id)] if cls_id is not None else []
    at = len(columns)
    columns.append(ids)
    if sep_id is not None:
        columns.append(torch.full_like(ids, sep_id))
    inputs = torch.cat(columns, dim=1)
    device = next(encoder.parameters()).device
    takes_types = "token_type_ids" in inspect.signature(encoder.forward).parameters
    out = []
    for start in tqdm(
        range(0, len(inputs), batch_size), desc="static vectors", unit="batch",
        disable=not progress, mininterval=5.0,
    ):  # fmt: skip
        x = inputs[start : start + batch_size].to(device)
        kwargs = {"input_ids": x, "attention_mask": torch.ones_like(x)}
        if takes_types:
            kwargs["token_type_ids"] = torch.zeros_like(x)
        hidden = encoder(**kwargs).last_hidden_state.float()
        out.append((hidden.mean(dim=1) if pool == "mean" else hidden[:, at]).cpu())
    if not out:
        return np.zeros((0, _hidden_size(encoder)), dtype=np.float32)
    return torch.cat(out).numpy().astype(np.float32)


def _hidden_size(encoder: nn.Module) -> int:
    return int(getattr(getattr(encoder, "config", None), "hidden_size", 0))


def pca_reduce(x: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """PCA of the rows of ``x`` to ``min(dim, x.shape[1], x.shape[0])`` components
    (``sklearn.decomposition.PCA``, centred, ``svd_solver="full"``).

    Returns:
        ``([n, d] float32 projections, [d] explained variance ratios, decreasing)``.
    """
    from sklearn.decomposition import PCA

    d = min(dim, x.shape[1], x.shape[0])
    if d < dim:
        log.warning("static_dim %d > %d (pieces x encoder width): %d dimensions", dim, d, d)
    pca = PCA(n_components=d, svd_solver="full")
    y = pca.fit_transform(x.astype(np.float64))
    return y.astype(np.float32), pca.explained_variance_ratio_.astype(np.float64)


def piece_weights(
    weighting: Weighting,
    token_ids: Sequence[int],
    vocab_size: int,
    counts: np.ndarray | None = None,
) -> np.ndarray:
    """The frequency weight of each piece (the module docstring's formulas).

    Args:
        weighting: ``zipf`` (SIF over Zipf-law probabilities from the id as the rank, a =
            :data:`ZIPF_A`), ``sif`` (SIF over ``counts``, a = :data:`SIF_A`) or ``none``.
        token_ids: ``[n]`` the pieces.
        vocab_size: ``V``, the ids the Zipf normaliser runs over.
        counts: ``[vocab_size]`` piece counts of the training texts (``sif``).

    Returns:
        ``[n]`` float64 in (0, 1].

    Raises:
        ValueError: an unknown weighting, or ``sif`` without counts.
    """
    ids = np.asarray(token_ids, dtype=np.int64)
    if weighting == "none":
        return np.ones(len(ids))
    if weighting == "zipf":
        norm = np.sum(1.0 / np.arange(2, vocab_size + 2, dtype=np.float64))
        p = (1.0 / (ids + 2.0)) / norm
        return ZIPF_A / (ZIPF_A + p)
    if weighting == "sif":
        if counts is None:
            raise ValueError("weighting=sif needs the training texts' piece counts")
        counts = np.asarray(counts, dtype=np.float64)
        p = counts[ids] / max(counts.sum(), 1.0)
        return SIF_A / (SIF_A + p)
    raise ValueError(f"weighting must be 'zipf', 'sif' or 'none', got {weighting!r}")


def static_vectors(
    encoder: str | nn.Module,
    vocab_size: int,
    token_ids: Sequence[int] | None = None,
    dim: int = 256,
    batch_size: int = 512,
    weighting: Weighting = "zipf",
    counts: np.ndarray | None = None,
    cls_id: int | None = None,
    sep_id: int | None = None,
    pool: Pool = "mean",
    out_file: str | None = None,
    progress: bool = True,
) -> np.ndarray:
    """The static vector of every piece: encoder pass, PCA, weighting (module docstring).

    Args:
        encoder: a source :func:`load_encoder` takes, or a loaded transformers base model.
        vocab_size: rows of the result (the vocabulary's ids).
        token_ids: the pieces to compute (the PCA is fitted on them); None = every id below
            ``vocab_size`` but ``cls_id``/``sep_id``. The other rows are zero.
        dim: PCA components (cut to the encoder's width / the number of pieces).
        batch_size: pieces per forward pass.
        weighting: ``zipf``, ``sif`` (needs ``counts``) or ``none``.
        counts: ``[vocab_size]`` piece counts of a corpus (``sif``).
        cls_id, sep_id: the specials around each piece; None = the encoder's tokenizer's
            ``cls_token_id``/``sep_token_id`` (a checkpoint: its vocab.txt's ``[CLS]``/``<s>``,
            ``[SEP]``/``</s>``), absent when it has none.
        pool: ``mean`` over ``[CLS] t [SEP]`` or ``token`` (t's own position).
        out_file: also write the computed rows there (:func:`save_vectors`).
        progress: a tqdm bar.

    Returns:
        ``[vocab_size, d]`` float32.
    """
    tokens = None
    if isinstance(encoder, str):
        encoder, tokens, _ = load_encoder(encoder)
    if cls_id is None and tokens is not None:
        cls_id = _find(tokens, _CLS)
    if sep_id is None and tokens is not None:
        sep_id = _find(tokens, _SEP)
    if token_ids is None:
        token_ids = [i for i in range(vocab_size) if i not in (cls_id, sep_id)]
    ids = np.asarray(token_ids, dtype=np.int64)
    raw = encode_pieces(encoder, ids, cls_id, sep_id, batch_size, pool, progress)
    vectors, _ = pca_reduce(raw, dim)
    vectors *= piece_weights(weighting, ids, vocab_size, counts)[:, None].astype(np.float32)
    if out_file is not None:
        save_vectors(out_file, ids, vectors)
    dense = np.zeros((vocab_size, vectors.shape[1]), dtype=np.float32)
    dense[ids] = vectors
    return dense


def _find(tokens: Sequence[str], names: Sequence[str]) -> int | None:
    for name in names:
        if name in tokens:
            return tokens.index(name)
    return None


def save_vectors(
    path: str, token_ids: np.ndarray, vectors: np.ndarray, meta: dict[str, str] | None = None
) -> None:
    """Write piece vectors as safetensors (atomically, any fsspec path): ``ids`` ``[n]``
    int64 and ``vectors`` ``[n, d]`` float32 (``train.static_vectors`` reads this)."""
    from safetensors.numpy import save

    from xdpx import io

    tensors = {
        "ids": np.ascontiguousarray(token_ids, dtype=np.int64),
        "vectors": np.ascontiguousarray(vectors, dtype=np.float32),
    }
    io.write_bytes(path, save(tensors, metadata=meta))


def load_vectors(path: str) -> tuple[np.ndarray, np.ndarray]:
    """``(ids [n] int64, vectors [n, d] float32)`` of a :func:`save_vectors` file; a file with
    ``vectors`` alone (``[vocab_size, d]``, a vector per id) gives the ids of its non-zero rows.

    Raises:
        FileNotFoundError: no such file. ValueError: no ``vectors`` tensor, or ``ids`` that
        do not match it.
    """
    from safetensors.numpy import load

    from xdpx import io

    if not io.exists(path):
        raise FileNotFoundError(f"static_vectors {path} not found")
    tensors = load(io.read_bytes(path))
    if "vectors" not in tensors:
        raise ValueError(f"{path}: no 'vectors' tensor (found {sorted(tensors)})")
    vectors = tensors["vectors"].astype(np.float32)
    if "ids" in tensors:
        ids = tensors["ids"].astype(np.int64)
    else:
        ids = np.flatnonzero(np.abs(vectors).sum(1) > 0)
        vectors = vectors[ids]
    if vectors.ndim != 2 or len(ids) != len(vectors):
        raise ValueError(f"{path}: ids {ids.shape} do not match vectors {vectors.shape}")
    return ids, vectors
