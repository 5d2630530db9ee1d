"""TensorFlow checkpoints (tensor bundles) read and written without TensorFlow, and Google's
BERT layout mapped to and from transformers' ``BertForSequenceClassification``.

**The format** (TensorFlow's ``tensorflow/core/util/tensor_bundle``): a checkpoint prefix
``P`` is two files, ``P.index`` and ``P.data-00000-of-00001`` (more shards: ``-0000k-of-n``).

- ``P.index`` is a LevelDB-format table (``tensorflow/core/lib/io/table_format.txt``; no
  compression): data blocks of sorted key/value entries (each key stored as the length it
  shares with the previous key, the rest of it and the value; restart points every 16
  entries), an index block mapping each data block's last key to its ``BlockHandle``
  (varint offset, varint size), an empty metaindex block, and a 48-byte footer (the two
  handles, padding, the magic ``0xdb4775248b80fb57``). Every block is followed by its type
  byte and the masked CRC32C of block + type.
- The key ``""`` holds a ``BundleHeaderProto`` (``num_shards``, ``endianness``, ``version``);
  every other key is a variable's name, its value a ``BundleEntryProto``: ``dtype``,
  ``shape``, ``shard_id``, ``offset``, ``size`` and ``crc32c``, the masked CRC32C of the
  tensor's bytes in shard ``shard_id`` at ``offset`` (little-endian, C order).
- The masked CRC (``tensorflow/core/lib/hash/crc32c.h``, from LevelDB):
  ``((crc >> 15) | (crc << 17)) + 0xa282ead8`` (mod 2**32).

The protocol buffers are decoded and encoded here from their wire format (varints,
length-delimited fields, fixed32): the few fields of ``tensor_bundle.proto``,
``tensor_shape.proto`` and ``versions.proto`` that bundles use, so neither TensorFlow nor
``protobuf`` is needed. CRC32C is ``google-crc32c``'s.

**Google's BERT layout** (``bert_config.json``, ``vocab.txt``, ``bert_model.ckpt.*``;
google-research/bert's ``modeling.py`` and ``run_classifier.py``): :data:`GOOGLE_TO_HF`
maps its variable names to transformers' (a dense ``kernel`` ``[in, out]`` is the transpose
of a ``Linear`` weight ``[out, in]``; ``gamma``/``beta`` are LayerNorm's weight/bias); the
classifier head ``output_weights [num_labels, hidden]`` / ``output_bias`` is kept when present
(not transposed: ``run_classifier.py`` multiplies with ``transpose_b=True``); the optimizer's
``adam_m``/``adam_v`` slots, ``global_step`` and the pre-training heads (``cls/...``) are
skipped.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from xdpx import io

__all__ = [
    "TFCheckpointError",
    "TensorEntry",
    "checkpoint_prefix",
    "google_to_hf",
    "hf_to_google",
    "is_tf_checkpoint",
    "masked_crc32c",
    "read_bundle",
    "read_entries",
    "write_bundle",
]


class TFCheckpointError(ValueError):
    """A TensorFlow checkpoint that cannot be read: a corrupted byte (naming the variable and
    the file), a format this reader does not know, or a missing file."""


# ----------------------------------------------------------------------------- checksums
_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes) -> int:
    """LevelDB's / TensorFlow's masked CRC32C of ``data`` (``crc32c::Mask``)."""
    import google_crc32c

    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


# ----------------------------------------------------------------------------- protobuf wire
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise TFCheckpointError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, Any]]:
    """``(field number, value)`` of a message: ints (varint, fixed32, fixed64) or bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + n], pos + n
        elif wire == 5:
            value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
        else:
            raise TFCheckpointError(f"protobuf wire type {wire} is not used by tensor bundles")
        yield num, value


def _enc_varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # negative int64s are ten-byte varints
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _enc(num: int, value: int | bytes, fixed32: bool = False) -> bytes:
    if fixed32:
        return _enc_varint(num << 3 | 5) + struct.pack("<I", value)
    if isinstance(value, bytes):
        return _enc_varint(num << 3 | 2) + _enc_varint(len(value)) + value
    return _enc_varint(num << 3) + _enc_varint(value)


# ----------------------------------------------------------------------------- dtypes
#: TensorFlow's ``DataType`` enum (``types.proto``) -> numpy, for the numeric types.
DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"), 2: np.dtype("<f8"), 3: np.dtype("<i4"), 4: np.dtype("u1"),
    5: np.dtype("<i2"), 6: np.dtype("i1"), 9: np.dtype("<i8"), 10: np.dtype("?"),
    17: np.dtype("<u2"), 19: np.dtype("<f2"), 22: np.dtype("<u4"), 23: np.dtype("<u8"),
}  # fmt: skip
_DTYPE_IDS = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class TensorEntry:
    """One variable of a bundle (its ``BundleEntryProto``).

    Attributes:
        name: the variable's name; dtype: numpy dtype; shape: its dimensions;
        shard_id, offset, size: where its bytes are (bytes); crc32c: their masked CRC32C.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    shard_id: int
    offset: int
    size: int
    crc32c: int


def _entry(name: str, value: bytes, index_path: str) -> TensorEntry:
    dtype = shard = offset = size = crc = 0
    shape: list[int] = []
    slices = False
    for num, v in _fields(value):
        if num == 1:
            dtype = v
        elif num == 2:
            for snum, sv in _fields(v):
                if snum == 2:
                    shape.append(next((d for dn, d in _fields(sv) if dn == 1), 0))
        elif num == 3:
            shard = v
        elif num == 4:
            offset = v
        elif num == 5:
            size = v
        elif num == 6:
            crc = v
        elif num == 7:
            slices = True
    if slices:
        raise TFCheckpointError(f"{index_path}: {name} is a partitioned (sliced) variable: not supported")  # fmt: skip
    if dtype not in DTYPES:
        raise TFCheckpointError(f"{index_path}: {name} has TensorFlow dtype {dtype}: not a numeric type this reader knows")  # fmt: skip
    return TensorEntry(name, DTYPES[dtype], tuple(int(d) for d in shape), shard, offset, size, crc)


# ----------------------------------------------------------------------------- the table
_MAGIC = 0xDB4775248B80FB57
_FOOTER = 48


def _block(data: bytes, handle: bytes, path: str) -> bytes:
    """A block's contents from its handle, its trailer's CRC checked."""
    offset, pos = _varint(handle, 0)
    size, _ = _varint(handle, pos)
    block = data[offset : offset + size]
    kind, crc = data[offset + size], struct.unpack_from("<I", data, offset + size + 1)[0]
    if len(block) != size or kind not in (0,):
        raise TFCheckpointError(f"{path}: a block at byte {offset} is {'compressed' if kind else 'truncated'}: not a tensor bundle index this reader knows")  # fmt: skip
    if masked_crc32c(block + bytes([kind])) != crc:
        raise TFCheckpointError(f"{path}: the block at byte {offset} fails its CRC32C: the index is corrupted")  # fmt: skip
    return block


def _block_entries(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    (restarts,) = struct.unpack_from("<I", block, len(block) - 4)
    end = len(block) - 4 - 4 * restarts
    pos, key = 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        vlen, pos = _varint(block, pos)
        key = key[:shared] + block[pos : pos + unshared]
        pos += unshared
        yield key, block[pos : pos + vlen]
        pos += vlen


def _table(path: str) -> Iterator[tuple[bytes, bytes]]:
    data = io.read_bytes(path)
    if len(data) < _FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != _MAGIC:
        raise TFCheckpointError(f"{path}: not a TensorFlow checkpoint index (no table magic at its end)")  # fmt: skip
    footer = data[len(data) - _FOOTER :]
    _, pos = _varint(footer, 0)  # metaindex handle: offset, size
    _, pos = _varint(footer, pos)
    index = _block(data, footer[pos:], path)
    for _, handle in _block_entries(index):
        yield from _block_entries(_block(data, handle, path))


# ----------------------------------------------------------------------------- reading
def checkpoint_prefix(path: str) -> str:
    """The checkpoint prefix of ``path``: the prefix itself (``.../bert_model.ckpt``), its
    ``.index`` file, or a directory holding one ``*.index`` (Google's releases:
    ``bert_model.ckpt.index``; a ``checkpoint`` file naming the latest wins).

    Raises:
        FileNotFoundError: no checkpoint there.
    """
    path = str(path).rstrip("/")
    if path.endswith(".index") and io.exists(path):
        return path[: -len(".index")]
    if io.exists(path + ".index"):
        return path
    if io.isdir(path):
        state = io.join(path, "checkpoint")
        if io.exists(state):
            m = re.search(r'model_checkpoint_path:\s*"([^"]+)"', io.read_text(state))
            if m and io.exists(io.join(path, m.group(1)) + ".index"):
                return io.join(path, m.group(1))
        found = sorted(p for p in io.ls(path) if p.endswith(".index"))
        if len(found) == 1:
            return found[0][: -len(".index")]
        if found:
            raise FileNotFoundError(f"{path}: several checkpoints ({', '.join(os.path.basename(p) for p in found)}): give the prefix")  # fmt: skip
    raise FileNotFoundError(f"{path}: no TensorFlow checkpoint (a PREFIX.index and PREFIX.data-* files)")  # fmt: skip


def is_tf_checkpoint(path: str) -> bool:
    """True when ``path`` is a TensorFlow checkpoint prefix, index or directory holding one."""
    try:
        checkpoint_prefix(path)
    except (FileNotFoundError, OSError):
        return False
    return True


def read_entries(prefix: str) -> tuple[dict[str, TensorEntry], int]:
    """The variables of checkpoint ``prefix`` and its number of shards.

    Raises:
        TFCheckpointError: a corrupted or unknown index; a big-endian bundle.
    """
    index_path = prefix + ".index"
    entries: dict[str, TensorEntry] = {}
    shards = 1
    for key, value in _table(index_path):
        if key == b"":
            fields = dict(_fields(value))
            shards = int(fields.get(1, 1))
            if fields.get(2, 0) != 0:
                raise TFCheckpointError(f"{index_path}: a big-endian bundle: not supported")
            continue
        name = key.decode("utf-8")
        entries[name] = _entry(name, value, index_path)
    return entries, shards


def read_bundle(prefix: str, names: set[str] | None = None) -> dict[str, np.ndarray]:
    """The tensors of checkpoint ``prefix`` (all, or ``names``), each checked against its
    entry's masked CRC32C.

    Args:
        prefix: the checkpoint prefix (:func:`checkpoint_prefix` finds it from a directory).
        names: the variables to read (None: every one).

    Returns:
        name -> array (its dtype and shape as TensorFlow wrote them; a copy, writable).

    Raises:
        TFCheckpointError: a tensor's bytes fail their CRC32C (the message names the variable
            and the data file), are short, or the index is corrupted.
        FileNotFoundError: a data shard is missing.
    """
    entries, shards = read_entries(prefix)
    out: dict[str, np.ndarray] = {}
    data: dict[int, bytes] = {}
    for name, e in sorted(entries.items()):
        if names is not None and name not in names:
            continue
        shard_path = f"{prefix}.data-{e.shard_id:05d}-of-{shards:05d}"
        if e.shard_id not in data:
            if not io.exists(shard_path):
                raise FileNotFoundError(f"{shard_path} not found (checkpoint {prefix})")
            data[e.shard_id] = io.read_bytes(shard_path)
        raw = data[e.shard_id][e.offset : e.offset + e.size]
        expected = int(np.prod(e.shape, dtype=np.int64)) * e.dtype.itemsize
        if len(raw) != e.size or e.size != expected:
            raise TFCheckpointError(f"{shard_path}: {name}: {len(raw)} bytes at offset {e.offset}, its entry says {e.size} (shape {list(e.shape)}, {e.dtype})")  # fmt: skip
        if masked_crc32c(raw) != e.crc32c:
            raise TFCheckpointError(f"{shard_path}: {name}: its {e.size} bytes at offset {e.offset} fail their CRC32C: the file is corrupted")  # fmt: skip
        out[name] = np.frombuffer(raw, dtype=e.dtype).reshape(e.shape).copy()
    return out


# ----------------------------------------------------------------------------- writing
def _block_bytes(entries: list[tuple[bytes, bytes]], restart_interval: int = 16) -> bytes:
    out, restarts, prev = bytearray(), [], b""
    for i, (key, value) in enumerate(entries):
        shared = 0
        if i % restart_interval == 0:
            restarts.append(len(out))
        else:
            while shared < min(len(prev), len(key)) and prev[shared] == key[shared]:
                shared += 1
        out += _enc_varint(shared) + _enc_varint(len(key) - shared) + _enc_varint(len(value))
        out += key[shared:] + value
        prev = key
    restarts = restarts or [0]
    out += b"".join(struct.pack("<I", r) for r in restarts) + struct.pack("<I", len(restarts))
    return bytes(out)


def _with_trailer(block: bytes) -> bytes:
    return block + b"\x00" + struct.pack("<I", masked_crc32c(block + b"\x00"))


def _handle(offset: int, size: int) -> bytes:
    return _enc_varint(offset) + _enc_varint(size)


def write_bundle(prefix: str, tensors: Mapping[str, np.ndarray], block_size: int = 4096) -> None:
    """Write ``tensors`` as a one-shard TensorFlow checkpoint ``prefix`` (``prefix.index`` and
    ``prefix.data-00000-of-00001``), each file atomically, the data file first.

    The layout is TensorFlow's ``BundleWriter``'s: the tensors' bytes (little-endian, C
    order) one after another in name order, each entry with its masked CRC32C, the header
    ``BundleHeaderProto(num_shards=1, endianness=LITTLE, version={producer: 1})``, and the
    index table cut into data blocks of about ``block_size`` bytes.

    Raises:
        TypeError: a tensor's dtype has no TensorFlow ``DataType`` here (strings, objects).
    """
    data = bytearray()
    entries: list[tuple[bytes, bytes]] = [(b"", _enc(1, 1) + _enc(3, _enc(1, 1)))]
    for name in sorted(tensors, key=lambda n: n.encode("utf-8")):
        arr = np.asarray(tensors[name], order="C")  # (np.ascontiguousarray makes a scalar 1-d)
        little = arr.dtype.newbyteorder("<") if arr.dtype.itemsize > 1 else arr.dtype
        tf_type = _DTYPE_IDS.get(little)
        if tf_type is None:
            raise TypeError(f"{name}: dtype {arr.dtype} has no TensorFlow DataType here")
        raw = arr.astype(little, copy=False).tobytes()
        shape = b"".join(_enc(2, _enc(1, int(d))) for d in arr.shape)
        entry = _enc(1, tf_type) + _enc(2, shape) + (_enc(4, len(data)) if data else b"")
        entry += _enc(5, len(raw)) + _enc(6, masked_crc32c(raw), fixed32=True)
        entries.append((name.encode("utf-8"), entry))
        data += raw
    table = bytearray()
    index: list[tuple[bytes, bytes]] = []
    start = 0
    while start < len(entries):
        end, size = start, 0
        while end < len(entries) and (end == start or size < block_size):
            size += len(entries[end][0]) + len(entries[end][1]) + 8
            end += 1
        block = _block_bytes(entries[start:end])
        index.append((entries[end - 1][0], _handle(len(table), len(block))))
        table += _with_trailer(block)
        start = end
    meta = _block_bytes([])
    meta_handle = _handle(len(table), len(meta))
    table += _with_trailer(meta)
    index_block = _block_bytes(index, restart_interval=1)
    index_handle = _handle(len(table), len(index_block))
    table += _with_trailer(index_block)
    footer = meta_handle + index_handle
    table += footer + b"\x00" * (40 - len(footer)) + struct.pack("<Q", _MAGIC)
    io.write_bytes(f"{prefix}.data-00000-of-00001", bytes(data))
    io.write_bytes(f"{prefix}.index", bytes(table))


# ----------------------------------------------------------------------------- BERT names
#: Google BERT variable-name patterns -> transformers BertForSequenceClassification keys and
#: whether the tensor is transposed (a dense kernel).
GOOGLE_TO_HF: list[tuple[str, str, bool]] = [
    (r"bert/embeddings/(word|position|token_type)_embeddings", r"bert.embeddings.\1_embeddings.weight", False),
    (r"bert/embeddings/LayerNorm/gamma", "bert.embeddings.LayerNorm.weight", False),
    (r"bert/embeddings/LayerNorm/beta", "bert.embeddings.LayerNorm.bias", False),
    (r"bert/encoder/layer_(\d+)/attention/self/(query|key|value)/kernel", r"bert.encoder.layer.\1.attention.self.\2.weight", True),
    (r"bert/encoder/layer_(\d+)/attention/self/(query|key|value)/bias", r"bert.encoder.layer.\1.attention.self.\2.bias", False),
    (r"bert/encoder/layer_(\d+)/attention/output/dense/kernel", r"bert.encoder.layer.\1.attention.output.dense.weight", True),
    (r"bert/encoder/layer_(\d+)/attention/output/dense/bias", r"bert.encoder.layer.\1.attention.output.dense.bias", False),
    (r"bert/encoder/layer_(\d+)/attention/output/LayerNorm/gamma", r"bert.encoder.layer.\1.attention.output.LayerNorm.weight", False),
    (r"bert/encoder/layer_(\d+)/attention/output/LayerNorm/beta", r"bert.encoder.layer.\1.attention.output.LayerNorm.bias", False),
    (r"bert/encoder/layer_(\d+)/intermediate/dense/kernel", r"bert.encoder.layer.\1.intermediate.dense.weight", True),
    (r"bert/encoder/layer_(\d+)/intermediate/dense/bias", r"bert.encoder.layer.\1.intermediate.dense.bias", False),
    (r"bert/encoder/layer_(\d+)/output/dense/kernel", r"bert.encoder.layer.\1.output.dense.weight", True),
    (r"bert/encoder/layer_(\d+)/output/dense/bias", r"bert.encoder.layer.\1.output.dense.bias", False),
    (r"bert/encoder/layer_(\d+)/output/LayerNorm/gamma", r"bert.encoder.layer.\1.output.LayerNorm.weight", False),
    (r"bert/encoder/layer_(\d+)/output/LayerNorm/beta", r"bert.encoder.layer.\1.output.LayerNorm.bias", False),
    (r"bert/pooler/dense/kernel", "bert.pooler.dense.weight", True),
    (r"bert/pooler/dense/bias", "bert.pooler.dense.bias", False),
    (r"output_weights", "classifier.weight", False),
    (r"output_bias", "classifier.bias", False),
]  # fmt: skip
#: Variables a fine-tuning does not need: optimizer slots, the step, pre-training heads.
SKIPPED = re.compile(r"(.*/adam_[mv]$|.*_slot_.*|^global_step$|^cls/|^bad_steps$|^good_steps$|^loss_scale$)")  # fmt: skip


def google_to_hf(tensors: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list[str], list[str]]:  # fmt: skip
    """Google BERT variables -> transformers keys (:data:`GOOGLE_TO_HF`; kernels transposed).

    Returns:
        ``(state, skipped, unknown)``: the mapped arrays, the names left out on purpose
        (:data:`SKIPPED`) and the names no rule maps (also left out).
    """
    state: dict[str, np.ndarray] = {}
    skipped, unknown = [], []
    for name, value in tensors.items():
        if SKIPPED.match(name):
            skipped.append(name)
            continue
        for pattern, target, transpose in GOOGLE_TO_HF:
            if re.fullmatch(pattern, name):
                key = re.sub(pattern, target, name)
                state[key] = np.ascontiguousarray(value.T) if transpose else value
                break
        else:
            unknown.append(name)
    return state, sorted(skipped), sorted(unknown)


def hf_to_google(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers BERT keys -> Google's variable names (the inverse of :func:`google_to_hf`;
    keys no rule maps, such as ``bert.embeddings.position_ids``, are left out)."""
    out: dict[str, np.ndarray] = {}
    for key, value in state.items():
        for pattern, target, transpose in GOOGLE_TO_HF:
            back = _invert(pattern, target, key)
            if back is not None:
                out[back] = np.ascontiguousarray(value.T) if transpose else np.asarray(value)
                break
    return out


def _invert(pattern: str, target: str, key: str) -> str | None:
    """The Google name whose :data:`GOOGLE_TO_HF` rule ``(pattern, target)`` gives ``key``."""
    groups = re.findall(r"\((.*?)\)", pattern)
    regex = re.escape(target)
    for k in range(1, len(groups) + 1):
        regex = regex.replace(re.escape(f"\\{k}"), f"({groups[k - 1]})")
    m = re.fullmatch(regex, key)
    if m is None:
        return None
    name = pattern
    for g, value in zip(groups, m.groups(), strict=True):
        name = name.replace(f"({g})", value, 1)
    return name


def read_bert_config(directory: str) -> dict[str, Any]:
    """``bert_config.json`` of a Google BERT directory.

    Raises:
        FileNotFoundError: none there.
    """
    path = io.join(directory, "bert_config.json")
    if not io.exists(path):
        raise FileNotFoundError(f"{path} not found: a Google BERT checkpoint directory holds bert_config.json, vocab.txt and bert_model.ckpt.*")  # fmt: skip
    return json.loads(io.read_text(path))


# ----------------------------------------------------------------------------- in and out
#: ``bert_config.json``'s keys (google-research/bert ``modeling.BertConfig``).
BERT_CONFIG_KEYS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
    "type_vocab_size", "initializer_range",
)  # fmt: skip
#: What :func:`convert_google_bert` writes last into its directory (it marks it complete).
IMPORT_RECORD = "xdpx-tf-import.json"


def _lower_case(source: str, config: Mapping[str, Any], do_lower_case: bool | None) -> bool:
    """``do_lower_case``: the caller's, else ``bert_config.json``'s, else from the release's
    name as Google names them (``cased_L-12_H-768_A-12``: False; ``uncased_...`` or
    ``chinese_...``: True), else True (Google's default in ``tokenization.py``)."""
    if do_lower_case is not None:
        return bool(do_lower_case)
    if "do_lower_case" in config:
        return bool(config["do_lower_case"])
    name = os.path.basename(str(source).rstrip("/")).lower()
    return not ("cased" in name and "uncased" not in name)


def convert_google_bert(source: str, out_dir: str, do_lower_case: bool | None = None) -> dict[str, Any]:  # fmt: skip
    """A Google-format BERT checkpoint as a transformers directory (XDPX's ``export_pt``).

    Reads ``bert_config.json``, ``vocab.txt`` and the checkpoint (:func:`read_bundle`: every
    tensor's CRC32C checked) without TensorFlow, maps the names (:func:`google_to_hf`) and
    writes ``out_dir``: ``config.json`` (``BertForSequenceClassification``, ``num_labels``
    from ``output_weights`` when the checkpoint has a classifier head, else 2),
    ``model.safetensors`` (numpy, float32 as stored), the WordPiece tokenizer built from
    ``vocab.txt`` (``BertTokenizerFast``: ``tokenizer.json`` and its config) and
    :data:`IMPORT_RECORD` last. Written to a temporary sibling and moved into place.

    Args:
        source: the checkpoint directory (Google's release layout), or its prefix or
            ``.index`` file with ``bert_config.json`` and ``vocab.txt`` beside it.
        out_dir: the local directory to write (replaced).
        do_lower_case: the tokenizer's lower-casing (None: :func:`_lower_case`).

    Returns:
        The record: ``source``, ``prefix``, ``tensors`` (read), ``kept`` (mapped), ``skipped``
        (optimizer slots, ``global_step``, pre-training heads), ``head`` (True: the
        checkpoint's classifier kept), ``num_labels``, ``do_lower_case``.

    Raises:
        FileNotFoundError: no checkpoint, ``bert_config.json`` or ``vocab.txt``.
        TFCheckpointError: a corrupted tensor (named); a variable no rule maps; a BERT
            weight missing; a shape that disagrees with ``bert_config.json``.
    """
    from safetensors.numpy import save_file

    prefix = checkpoint_prefix(source)
    directory = source if io.isdir(source) else io.dirname(prefix)
    config = read_bert_config(directory)
    vocab = io.join(directory, "vocab.txt")
    if not io.exists(vocab):
        raise FileNotFoundError(f"{vocab} not found: Google's BERT layout has the WordPiece vocabulary beside bert_config.json")  # fmt: skip
    tensors = read_bundle(prefix)
    state, skipped, unknown = google_to_hf(tensors)
    if unknown:
        raise TFCheckpointError(f"{prefix}: {len(unknown)} variable(s) no BERT name maps, e.g. {unknown[:3]}: not a Google-format BERT checkpoint")  # fmt: skip
    head = "classifier.weight" in state
    num_labels = int(state["classifier.weight"].shape[0]) if head else 2
    _check_shapes(state, config, num_labels, prefix)
    lower = _lower_case(source, config, do_lower_case)
    hf_config = {
        "architectures": ["BertForSequenceClassification"], "model_type": "bert",
        **{k: config[k] for k in BERT_CONFIG_KEYS if k in config},
        "num_labels": num_labels, "pad_token_id": 0,
    }  # fmt: skip
    record = {"source": str(source), "prefix": prefix, "tensors": len(tensors), "kept": len(state), "skipped": skipped, "head": head, "num_labels": num_labels, "do_lower_case": lower}  # fmt: skip
    tmp = io.tmp_sibling(out_dir)
    try:
        os.makedirs(tmp)
        save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(hf_config, f, indent=2)
        _write_tokenizer(io.read_text(vocab), lower, tmp)
        with open(os.path.join(tmp, IMPORT_RECORD), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
        io.replace_dir(tmp, out_dir, marker=IMPORT_RECORD)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def _check_shapes(state: Mapping[str, np.ndarray], config: Mapping[str, Any], num_labels: int, prefix: str) -> None:  # fmt: skip
    """Every BERT weight is there with the shape ``bert_config.json`` gives it."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]  # fmt: skip
    want = {
        "bert.embeddings.word_embeddings.weight": (config["vocab_size"], h),
        "bert.embeddings.position_embeddings.weight": (config["max_position_embeddings"], h),
        "bert.embeddings.token_type_embeddings.weight": (config["type_vocab_size"], h),
        "bert.pooler.dense.weight": (h, h),
    }
    for i in range(layers):
        want[f"bert.encoder.layer.{i}.attention.self.query.weight"] = (h, h)
        want[f"bert.encoder.layer.{i}.intermediate.dense.weight"] = (inter, h)
        want[f"bert.encoder.layer.{i}.output.dense.weight"] = (h, inter)
    if "classifier.weight" in state:
        want["classifier.weight"] = (num_labels, h)
    for key, shape in want.items():
        if key not in state:
            raise TFCheckpointError(f"{prefix}: no variable for {key} (bert_config.json has {layers} layers)")  # fmt: skip
        if tuple(state[key].shape) != tuple(shape):
            raise TFCheckpointError(f"{prefix}: {key} has shape {list(state[key].shape)}, bert_config.json says {list(shape)}")  # fmt: skip


def _write_tokenizer(vocab_text: str, lower: bool, directory: str) -> None:
    """``BertTokenizerFast`` over a WordPiece ``vocab.txt`` (BERT's basic tokenizer:
    Chinese characters split, accents stripped when lower-casing), saved in ``directory``."""
    from transformers import BertTokenizerFast

    from xdpx.pretrained import quiet_transformers

    # Google's tokenization.load_vocab: the id is the line number (a repeated token: its last)
    vocab = {line.strip(): i for i, line in enumerate(vocab_text.splitlines())}
    with quiet_transformers():
        tok = BertTokenizerFast(vocab=vocab, do_lower_case=lower, tokenize_chinese_chars=True)
        tok.save_pretrained(directory)
    with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write(vocab_text)


def export_google_bert(checkpoint: str, out_dir: str) -> dict[str, Any]:
    """An xdpx ``hf_classifier`` checkpoint of a BERT-family model as a Google-format
    TensorFlow checkpoint: ``out_dir/bert_model.ckpt.{index,data-00000-of-00001}`` (the
    weights under Google's names, :func:`hf_to_google`; the classifier as ``output_weights``
    / ``output_bias``), ``bert_config.json``, ``vocab.txt`` (the run's WordPiece vocabulary)
    and ``target_map.txt`` (the labels, in logit order). No torch or TensorFlow needed.

    Args:
        checkpoint: a checkpoint directory or alias (``models/minilm/<best>``).
        out_dir: the directory to write (local or fsspec URL; each file atomic).

    Returns:
        ``{"checkpoint", "prefix", "tensors", "labels"}``.

    Raises:
        FileNotFoundError: not an xdpx checkpoint.
        ValueError: not a BERT-family ``hf_classifier`` (``model_type`` bert), or its
            tokenizer has no WordPiece ``vocab.txt``.
    """
    from xdpx.pretrained import _xdpx_checkpoint, hf_state, resolve_pretrained

    real = _xdpx_checkpoint(checkpoint)
    if real is None:
        raise FileNotFoundError(f"{checkpoint}: not an xdpx checkpoint (config.json, model.safetensors)")  # fmt: skip
    saved = json.loads(io.read_text(io.join(real, "config.json")))
    hf_config = (saved.get("model_config") or {}).get("hf_config") or {}
    if saved.get("model") != "hf_classifier" or hf_config.get("model_type") != "bert":
        raise ValueError(f"{real}: a TF checkpoint in Google's BERT layout needs a BERT-family hf_classifier (got model {saved.get('model')!r}, model_type {hf_config.get('model_type')!r})")  # fmt: skip
    from xdpx.data.meta import PreparedMeta

    meta = PreparedMeta.read(real)
    tokenizer = resolve_pretrained((meta.prepro or {}).get("tokenizer_path") or "")
    vocab = os.path.join(tokenizer, "vocab.txt")
    if not os.path.isfile(vocab):
        raise ValueError(f"{tokenizer}: no WordPiece vocab.txt: Google's BERT layout needs one")
    tensors = hf_to_google(hf_state(real))
    prefix = io.join(out_dir, "bert_model.ckpt")
    write_bundle(prefix, tensors)
    config = {k: hf_config[k] for k in BERT_CONFIG_KEYS if k in hf_config}
    io.write_text(io.join(out_dir, "bert_config.json"), json.dumps(config, indent=2) + "\n")
    with open(vocab, encoding="utf-8") as f:
        io.write_text(io.join(out_dir, "vocab.txt"), f.read())
    labels = list(meta.labels)
    io.write_text(io.join(out_dir, "target_map.txt"), "\n".join(labels) + "\n")
    return {"checkpoint": real, "prefix": prefix, "tensors": len(tensors), "labels": labels}
