"""Data layer: raw-file readers, tokenizers, vocab / target map, Parquet shards, Encoder.

Prepro and inference share :class:`Encoder`, so predict/serve encode raw text exactly as
the training data was encoded.
"""

from xdpx.data.encoder import ENCODER_FILES, META_FILE, TARGET_MAP_FILE, VOCAB_FILE, Encoder
from xdpx.data.meta import PreparedMeta, SplitMeta
from xdpx.data.readers import DataError, ReadResult, read_examples
from xdpx.data.shards import NO_LABEL, SplitData, list_splits, load_split, shard_path, write_split
from xdpx.data.tokenizers import (
    TOKENIZERS,
    CharTokenizer,
    HFTokenizer,
    WhitespaceTokenizer,
    WordTokenizer,
    detect_tokenizer,
    make_tokenizer,
)
from xdpx.data.vocab import PAD, UNK, TargetMap, Vocab

__all__ = [
    "PreparedMeta",
    "SplitMeta",
    "DataError",
    "ReadResult",
    "read_examples",
    "CharTokenizer",
    "WordTokenizer",
    "WhitespaceTokenizer",
    "HFTokenizer",
    "detect_tokenizer",
    "TOKENIZERS",
    "make_tokenizer",
    "PAD",
    "UNK",
    "Vocab",
    "TargetMap",
    "NO_LABEL",
    "SplitData",
    "shard_path",
    "write_split",
    "load_split",
    "list_splits",
    "Encoder",
    "META_FILE",
    "VOCAB_FILE",
    "TARGET_MAP_FILE",
    "ENCODER_FILES",
]
