"""Stage ``prepro``: raw files -> vocab, target map and Parquet shards of token ids.

Outputs under ``prepro.data_dir`` (written to a temporary sibling and swapped in at the
end, so a failure leaves the previous directory intact and nothing partial):

* ``vocab.txt`` - one token per line, line i = id i (``[PAD]`` = 0, ``[UNK]`` = 1; for
  ``tokenizer=hf`` the tokenizer's vocab in id order, informational);
* ``target_map.txt`` - one label per line, line i = class index i;
* ``meta.json`` - tokenizer, sizes, labels, per-split counts and the prepro config;
* ``{split}/part-*.parquet`` - see :mod:`xdpx.data.shards`.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from typing import Any

import numpy as np
from pydantic import BaseModel
from tqdm import tqdm

from xdpx import io, preflight
from xdpx.config import ConfigError, PreproConfig
from xdpx.data import (
    META_FILE,
    TARGET_MAP_FILE,
    VOCAB_FILE,
    DataError,
    Encoder,
    HFTokenizer,
    PreparedMeta,
    ReadResult,
    TargetMap,
    Vocab,
    detect_tokenizer,
    make_tokenizer,
    read_examples,
    write_split,
)
from xdpx.data.transliterate import make_transliterator
from xdpx.stage import stage_main

log = logging.getLogger("xdpx.prepro")

#: Rows encoded per progress-bar update.
_CHUNK = 2000


class PreproResult(BaseModel):
    """What prepro wrote.

    Attributes:
        data_dir: the output directory.
        vocab_size: number of token ids.
        num_labels: number of classes.
        rows: split -> examples kept.
        skipped: split -> malformed lines skipped.
        paths: ``vocab``, ``target_map``, ``meta`` -> file path; ``shards/<split>`` -> shard paths.
    """

    data_dir: str
    vocab_size: int
    num_labels: int
    rows: dict[str, int]
    skipped: dict[str, int]
    paths: dict[str, Any]


def _read_splits(cfg: PreproConfig) -> tuple[dict[str, ReadResult], TargetMap]:
    """Read train first (its labels define the target map), then the other splits."""
    sources = {split: io.join(cfg.data_source, name) for split, name in cfg.data_files.items()}
    fixed = TargetMap.load(cfg.target_map_file) if cfg.target_map_file else None
    allowed = set(fixed.labels) if fixed else None
    results: dict[str, ReadResult] = {}
    results["train"] = read_examples(
        sources["train"], cfg, require_label=True, allowed_labels=allowed
    )
    train = results["train"]
    if not train.texts:
        raise DataError(f"{sources['train']}: no usable examples in the train split")
    assert train.labels is not None
    target_map = fixed or TargetMap.build(train.labels, cfg.special_targets)
    for split, path in sources.items():
        if split != "train":
            results[split] = read_examples(
                path, cfg, require_label=False, allowed_labels=set(target_map.labels)
            )
    for split, r in results.items():
        log.info("%s: %d rows read from %s, %d skipped", split, len(r), sources[split], r.skipped)
    return results, target_map


def resolve_tokenizer(cfg: PreproConfig, train: ReadResult) -> tuple[str, float | None]:
    """The tokenizer name to use: ``cfg.tokenizer``, or for ``auto`` the choice of
    :func:`xdpx.data.detect_tokenizer` on the (transliterated) training texts.

    Returns:
        ``(name, fraction)``: ``fraction`` is the share of letters in scripts written
        without spaces (None unless ``auto``).
    """
    if cfg.tokenizer != "auto":
        return cfg.tokenizer, None
    transliterate = make_transliterator(cfg.transliterate)
    texts = train.texts + (train.texts2 or [])
    name, fraction = detect_tokenizer(transliterate(t) if transliterate else t for t in texts)
    log.info(
        "tokenizer=auto: %s (%.1f%% of the train letters are in scripts without spaces)",
        name,
        100 * fraction,
    )
    return name, fraction


def _build_encoder(
    cfg: PreproConfig, train: ReadResult, target_map: TargetMap, tokenizer_name: str
) -> tuple[Encoder, list[str]]:
    """The Encoder of this run and the vocab.txt lines (tokens in id order)."""
    pair = cfg.text2_column is not None
    try:
        tokenizer = make_tokenizer(tokenizer_name, cfg.lower, cfg.tokenizer_path)
    except ValueError as e:
        raise ConfigError(f"prepro.tokenizer={cfg.tokenizer}: {e}") from None
    if isinstance(tokenizer, HFTokenizer):
        encoder = Encoder(
            tokenizer, target_map, cfg.max_len, pair=pair, transliterate=cfg.transliterate
        )
        return encoder, tokenizer.vocab_tokens()
    if cfg.vocab_file:
        vocab = Vocab.load(cfg.vocab_file)
    else:
        transliterate = make_transliterator(cfg.transliterate)  # as the Encoder does
        counts: Counter[str] = Counter()
        for text in tqdm(
            train.texts + (train.texts2 or []), desc="vocab", unit="text", leave=False
        ):
            counts.update(tokenizer.tokenize(transliterate(text) if transliterate else text))
        vocab = Vocab.build(counts, cfg.threshold, cfg.nwords)
    encoder = Encoder(
        tokenizer, target_map, cfg.max_len, vocab, pair=pair, transliterate=cfg.transliterate
    )
    return encoder, vocab.tokens


def _encode_split(
    encoder: Encoder, split: str, data: ReadResult
) -> tuple[list[np.ndarray], list[np.ndarray] | None, int, int]:
    """Encode one split in chunks (with a progress bar).

    Returns:
        ``(input_ids, input_ids2, max_length_seen, truncated)``; lengths are before
        truncation, ``truncated`` counts rows where any sequence exceeded ``max_len``.
    """
    ids: list[np.ndarray] = []
    ids2: list[np.ndarray] | None = [] if encoder.pair_encoding == "separate" else None
    max_seen, truncated = 0, 0
    with tqdm(total=len(data.texts), desc=f"prepro {split}", unit="row") as bar:
        for start in range(0, len(data.texts), _CHUNK):
            stop = start + _CHUNK
            texts2 = data.texts2[start:stop] if encoder.pair else None
            a, b, full, full2 = encoder.encode_with_lengths(data.texts[start:stop], texts2)
            ids.extend(a)
            longest = list(full)
            if ids2 is not None and b is not None and full2 is not None:
                ids2.extend(b)
                longest = [max(x, y) for x, y in zip(full, full2, strict=True)]
            max_seen = max([max_seen, *longest])
            truncated += sum(n > encoder.max_len for n in longest)
            bar.update(len(a))
    return ids, ids2, max_seen, truncated


@io.stage("prepro")
def run(cfg: PreproConfig) -> PreproResult:
    """Prepare every split of ``cfg.data_files``; see the module docstring for the outputs.

    Raises:
        DataError: a missing file, a malformed line (``file:line: reason``) unless
            ``cfg.skip_bad_lines``, a label outside ``cfg.target_map_file``, a bad vocab or
            target-map file, or an empty train split.
        ConfigError: the hf tokenizer cannot be loaded.
    """
    cfg = preflight.check_prepro(cfg)
    results, target_map = _read_splits(cfg)
    tokenizer_name, no_space_fraction = resolve_tokenizer(cfg, results["train"])
    encoder, vocab_lines = _build_encoder(cfg, results["train"], target_map, tokenizer_name)
    log.info("vocab: %d ids; labels: %s", encoder.vocab_size, target_map.labels)

    final = cfg.data_dir.rstrip("/")
    tmp = io.tmp_sibling(final)
    splits_meta: dict[str, dict[str, Any]] = {}
    shard_paths: dict[str, list[str]] = {}
    try:
        io.makedirs(tmp)
        io.write_text(io.join(tmp, VOCAB_FILE), "".join(f"{t}\n" for t in vocab_lines))
        target_map.save(io.join(tmp, TARGET_MAP_FILE))
        for split, data in results.items():
            ids, ids2, max_seen, truncated = _encode_split(encoder, split, data)
            labels = encoder.encode_labels(data.labels) if data.labels is not None else None
            written = write_split(
                tmp, split, np.arange(len(ids)), ids, labels, ids2, shard_size=cfg.shard_size
            )
            shard_paths[split] = [p.replace(tmp, final, 1) for p in written]
            splits_meta[split] = {
                "rows": len(ids),
                "skipped": data.skipped,
                "source": io.join(cfg.data_source, cfg.data_files[split]),
                "max_length_seen": int(max_seen),
                "truncated": int(truncated),
                "has_labels": data.labels is not None,
                "shards": len(written),
                "bad_lines": data.bad_lines,
            }
            log.info(
                "%s: %d rows, %d skipped, %d truncated to max_len=%d (longest %d)",
                split,
                len(ids),
                data.skipped,
                truncated,
                cfg.max_len,
                max_seen,
            )
        PreparedMeta(
            tokenizer=tokenizer_name,
            tokenizer_auto=(
                None
                if no_space_fraction is None
                else {"chosen": tokenizer_name, "no_space_script_fraction": no_space_fraction}
            ),
            lower=cfg.lower,
            max_len=cfg.max_len,
            vocab_size=encoder.vocab_size,
            num_labels=encoder.num_labels,
            labels=encoder.labels,
            pad_id=encoder.pad_id,
            unk_id=encoder.unk_id,
            sep_id=getattr(encoder.tokenizer, "sep_id", None),
            pair=encoder.pair_encoding == "separate",
            pair_encoding=encoder.pair_encoding,
            splits=splits_meta,
            prepro=cfg.model_dump(mode="json"),
        ).write(tmp)
        io.replace_dir(tmp, final, marker=META_FILE)
    except BaseException:
        with contextlib.suppress(Exception):  # keep the original error
            io.rm(tmp, recursive=True)
        raise
    return PreproResult(
        data_dir=final,
        vocab_size=encoder.vocab_size,
        num_labels=encoder.num_labels,
        rows={s: m["rows"] for s, m in splits_meta.items()},
        skipped={s: m["skipped"] for s, m in splits_meta.items()},
        paths={
            "vocab": io.join(final, VOCAB_FILE),
            "target_map": io.join(final, TARGET_MAP_FILE),
            "meta": io.join(final, META_FILE),
            "shards": shard_paths,
        },
    )


def main(argv: list[str] | None = None) -> PreproResult:
    """``python -m stages.prepro [--params params.yaml] [prepro.key=value ...]``."""
    return stage_main(
        "prepro",
        run,
        lambda r: (
            f"prepared {r.rows} rows (skipped {r.skipped}) -> {r.data_dir} "
            f"(vocab_size={r.vocab_size}, num_labels={r.num_labels})"
        ),
        argv,
        preflight.check_prepro,
    )


if __name__ == "__main__":
    main()
