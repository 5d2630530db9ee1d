"""Does continual MLM pretraining on the corpus's own texts help fine-tuning? (docs/pretraining-and-cv.md)

1. prepro (``--finetune`` params: MiniLM's tokenizer, pinyin) of the whole corpus, and of a
   labelled subset: the first ``--subset`` rows of the train split;
2. ``task: mlm`` training (``--pretrain`` params) of the shipped MiniLM on the *train* texts
   (dev for early stopping; the test texts are never seen): the preset's schedule (1 epoch),
   or ``--mlm-updates`` updates;
3. held-out MLM loss/perplexity of the original and the adapted model on dev and test, with
   the same masks (``xdpx.train.mlm.evaluate_mlm``);
4. fine-tuning on the subset from the original MiniLM and from the adapted one, same
   schedule, for each of ``--seeds``: dev and test accuracy of each run's best (by dev)
   checkpoint, and the per-seed difference, mean +/- standard error over seeds.

Usage:
    python bench/pretrain_adapt.py --json reports/pretrain.json      # ~25 min on 2 cores
    python bench/pretrain_adapt.py --mlm-updates 300 --reuse-original reports/pretrain.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stages.registry import STAGES  # noqa: E402
from xdpx import io  # noqa: E402
from xdpx.config import Params, load_params  # noqa: E402
from xdpx.data import load_split  # noqa: E402
from xdpx.rundir import RunDir  # noqa: E402
from xdpx.train.mlm import evaluate_mlm  # noqa: E402


def subset_raw(src_dir: str, dst_dir: str, rows: int) -> None:
    """The first ``rows`` data lines of ``src_dir``'s train.tsv (header kept), dev/test whole."""
    os.makedirs(dst_dir, exist_ok=True)
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
        with open(os.path.join(src_dir, name), encoding="utf-8") as f:
            lines = f.readlines()
        keep = lines[: rows + 1] if name == "train.tsv" else lines
        with open(os.path.join(dst_dir, name), "w", encoding="utf-8") as f:
            f.writelines(keep)


def mlm_metrics(
    pretrained: str, data_dir: str, params: Params, splits: tuple[str, ...]
) -> dict[str, dict[str, float]]:
    """MLM metrics of ``pretrained`` (a from_pretrained dir or pkg: path) per split."""
    import torch

    from xdpx.models import HFMaskedLM
    from xdpx.train.mlm import masker_for as _masker

    cfg = params.train.model_copy(update={"data_dir": data_dir})
    masker = _masker(cfg)
    torch.manual_seed(0)  # the original's MLM head is new: the same random head every run
    model = HFMaskedLM(vocab_size=len(masker.tokens), num_labels=2, pretrained_model=pretrained)
    out = {}
    for split in splits:
        data = load_split(data_dir, split)
        out[split] = evaluate_mlm(model, [list(data.input_ids)], masker, 64, 0, torch.device("cpu"))
    return out


def finetune(params: Params, data_dir: str, init: str, seed: int, work: str) -> dict[str, Any]:
    """Fine-tune ``init`` on ``data_dir`` with ``seed``; dev/test accuracy of the best checkpoint."""
    start = time.perf_counter()
    save_dir = io.join(work, "model")
    STAGES["train"].run(
        params.train.model_copy(
            update={
                "data_dir": data_dir,
                "save_dir": save_dir,
                "overwrite": True,
                "seed": seed,
                "pretrained_model": init,
            }
        )
    )
    evaluated = STAGES["evaluate"].run(
        params.evaluate.model_copy(
            update={
                "checkpoint": RunDir(save_dir).best_alias,
                "data_dir": data_dir,
                "splits": ["dev", "test"],
                "metrics_file": io.join(work, "metrics.json"),
                "confusion_png": io.join(work, "confusion.png"),
                "curve_png": io.join(work, "valid_curve.png"),
            }
        )
    )
    m = evaluated.metrics
    return {
        "dev": m["dev"]["accuracy"],
        "test": m["test"]["accuracy"],
        "seconds": round(time.perf_counter() - start, 1),
    }


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (sample std / sqrt(n); 0 for one value)."""
    a = np.asarray(values, dtype=np.float64)
    se = float(a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1 else 0.0
    return float(a.mean()), se


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--pretrain", default="params/pretrain-minilm.yaml")
    ap.add_argument("--finetune", default="params/bert-minilm.yaml")
    ap.add_argument("--raw", default="data/raw", help="fetch's output (make demo)")
    ap.add_argument("--work", default="/tmp/xdpx-pretrain-adapt")
    ap.add_argument("--subset", type=int, default=1000, help="labelled train rows for fine-tuning")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument(
        "--mlm-updates", type=int, default=None, help="MLM updates (default: the preset's 1 epoch)"
    )
    ap.add_argument("--ft-epochs", type=int, default=2)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--pretrain-set", nargs="*", default=[], metavar="KEY=VALUE",
        help="overrides of the MLM run, e.g. train.head_learning_rate=1e-3",
    )  # fmt: skip
    ap.add_argument(
        "--finetune-set", nargs="*", default=[], metavar="KEY=VALUE",
        help="overrides of every fine-tuning run (both arms)",
    )  # fmt: skip
    ap.add_argument(
        "--reuse-original", default=None, metavar="JSON",
        help="take the original arm's runs from an earlier --json of the same fine-tuning "
        "setup (they are bit-identical on one machine) instead of training them again",
    )  # fmt: skip
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    common = [f"prepro.max_len={args.max_len}", f"train.threads={args.threads}"]
    full, sub = io.join(args.work, "prepared"), io.join(args.work, "prepared-subset")
    ft_params = load_params(
        args.finetune,
        [
            *common,
            f"train.max_epoch={args.ft_epochs}",
            f"prepro.data_dir={sub}",
            f"train.data_dir={sub}",
            *args.finetune_set,
        ],
    )
    pt_params = load_params(
        args.pretrain,
        [
            *common,
            f"prepro.data_dir={full}",
            f"train.data_dir={full}",
            *([f"train.max_update={args.mlm_updates}"] if args.mlm_updates else []),
            *args.pretrain_set,
        ],
    )
    t0 = time.perf_counter()
    if not os.path.exists(os.path.join(full, "meta.json")):
        STAGES["prepro"].run(pt_params.prepro.model_copy(update={"data_source": args.raw}))
    raw_sub = io.join(args.work, "raw-subset")
    if not os.path.exists(os.path.join(sub, "meta.json")):
        subset_raw(args.raw, raw_sub, args.subset)
        STAGES["prepro"].run(ft_params.prepro.model_copy(update={"data_source": raw_sub}))
    mlm_dir = io.join(args.work, "mlm")
    trained = STAGES["train"].run(
        pt_params.train.model_copy(update={"save_dir": mlm_dir, "overwrite": True})
    )
    adapted = RunDir(mlm_dir).pretrained
    original = ft_params.train.pretrained_model
    ppl = {
        "original": mlm_metrics(original, full, pt_params, ("dev", "test")),
        "adapted": mlm_metrics(adapted, full, pt_params, ("dev", "test")),
    }
    print(json.dumps(ppl, indent=2))
    runs: dict[str, list[dict[str, Any]]] = {"original": [], "adapted": []}
    reused: dict[int, dict[str, Any]] = {}
    if args.reuse_original:
        earlier = json.loads(io.read_text(args.reuse_original))
        reused = {r["seed"]: r for r in earlier["finetune"]["original"]}
    for seed in args.seeds:
        if seed in reused:
            runs["original"].append(reused[seed])
        for name, init in (("original", original), ("adapted", adapted)):
            if name == "original" and seed in reused:
                continue
            r = finetune(ft_params, sub, init, seed, io.join(args.work, f"ft-{name}-{seed}"))
            runs[name].append({"seed": seed, **r})
            print(name, seed, r, flush=True)
    summary: dict[str, Any] = {}
    for split in ("dev", "test"):
        diffs = [
            a[split] - o[split] for a, o in zip(runs["adapted"], runs["original"], strict=True)
        ]
        summary[split] = {
            "original": mean_se([r[split] for r in runs["original"]]),
            "adapted": mean_se([r[split] for r in runs["adapted"]]),
            "difference": mean_se(diffs),
            "wins": sum(d > 0 for d in diffs),
        }
    result = {
        "config": vars(args),
        "mlm_updates_done": trained.num_updates,
        "mlm_best_valid": trained.best_valid,
        "perplexity": ppl,
        "finetune": runs,
        "summary": summary,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print("\nfine-tuning accuracy, mean +/- SE over seeds", args.seeds)
    for split, s in summary.items():
        (mo, so), (ma, sa), (md, sd) = s["original"], s["adapted"], s["difference"]
        print(
            f"  {split}: original {100 * mo:.2f} +/- {100 * so:.2f}, adapted {100 * ma:.2f} +/- "
            f"{100 * sa:.2f}, difference {100 * md:+.2f} +/- {100 * sd:.2f} "
            f"({s['wins']}/{len(args.seeds)} seeds)"
        )
    for name, by_split in ppl.items():
        print(
            f"  MLM perplexity {name}: "
            + ", ".join(f"{k} {v['perplexity']:.1f}" for k, v in by_split.items())
        )
    if args.json:
        io.write_text(args.json, json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
