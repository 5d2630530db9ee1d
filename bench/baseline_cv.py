"""xdpx vs the classical baseline over several random splits of the corpus.

One split's test set (1,736 reviews) has a standard error of ~0.8 points, so a
difference of a few test examples between xdpx and ``bench/baseline.py`` on
the demo split says little. This script repeats the whole comparison on
``--seeds`` independent splits (``fetch.seed``; same ratios, same corpus):
for each, the stages fetch -> prepro -> train -> evaluate (``stages.registry.STAGES``,
called as functions) with the params (``params.yaml`` plus ``key=value``
overrides), and ``run_baseline`` on the same split (C picked on that split's
dev). It prints each split's dev/test accuracies and the mean test
difference (xdpx - baseline) with its standard error over splits and a
Student-t 95% interval (the splits are independent draws; the paired
difference removes the split's difficulty).

Usage::

    python bench/baseline_cv.py [--seeds 1 2 3 4 5] [--params params.yaml]
                                [--work-dir DIR] [--json FILE] [section.key=value ...]

The work dir (a temp dir by default) holds every split's data, model and
metrics; each split takes about as long as the demo's train stage.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:  # run as a script: bench.baseline (and xdpx without `pip install -e .`)
    sys.path.insert(0, _ROOT)

from bench.baseline import run_baseline  # noqa: E402
from flows.suite import summarize  # noqa: E402  (mean paired difference, SE, t interval)
from stages.registry import STAGES  # noqa: E402
from xdpx import io  # noqa: E402
from xdpx.config import Params, load_params  # noqa: E402
from xdpx.rundir import RunDir  # noqa: E402

__all__ = ["run_split", "summarize", "main"]


def run_split(params: Params, seed: int, work_dir: str) -> dict[str, Any]:
    """Fetch split ``seed`` into ``work_dir``, run xdpx and the baseline on it.

    Args:
        params: resolved params; their paths are replaced by ones under ``work_dir``.
        seed: ``fetch.seed`` of this split.
        work_dir: directory for this split's raw/prepared data, model and metrics.

    Returns:
        ``{"seed", "xdpx": {"dev", "test"}, "baseline": {"dev", "test", "C"},
        "difference", "n_test", "seconds"}``; accuracies are fractions in [0, 1].
    """
    start = time.perf_counter()
    raw, prepared = io.join(work_dir, "raw"), io.join(work_dir, "prepared")
    model = io.join(work_dir, "model")
    STAGES["fetch"].run(params.fetch.model_copy(update={"seed": seed, "out_dir": raw}))
    STAGES["prepro"].run(
        params.prepro.model_copy(update={"data_source": raw, "data_dir": prepared})
    )
    STAGES["train"].run(
        params.train.model_copy(
            update={
                "data_dir": prepared,
                "save_dir": model,
                "overwrite": True,
                "auto_suffix": False,
            }
        )
    )
    evaluated = STAGES["evaluate"].run(
        params.evaluate.model_copy(
            update={
                "checkpoint": RunDir(model).best_alias,
                "data_dir": prepared,
                "splits": ["dev", "test"],
                "metrics_file": io.join(work_dir, "metrics.json"),
                "confusion_png": io.join(work_dir, "confusion.png"),
                # set too: model_copy runs no validator, so it would keep the default's path
                "curve_png": io.join(work_dir, "valid_curve.png"),
            }
        )
    )
    ours = evaluated.metrics
    base = run_baseline(raw)
    result = {
        "seed": seed,
        "xdpx": {s: ours[s]["accuracy"] for s in ("dev", "test")},
        "baseline": {
            "dev": base["dev_accuracy_best"],
            "test": base["test_accuracy"],
            "C": base["C"],
        },
        "n_test": base["n"]["test"],
    }
    result["difference"] = result["xdpx"]["test"] - result["baseline"]["test"]
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line entry; see the module docstring."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n", 1)[0],
        epilog="Other section.key=value arguments override the params file, e.g. "
        "train.max_epoch=10. Each split runs fetch, prepro, train and evaluate (1-3 min "
        "on 2 cores for the default model) and the baseline.",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[1, 2, 3, 4, 5],
        metavar="SEED",
        help="fetch.seed of each split (default 1 2 3 4 5; 1 is the demo's split)",
    )
    parser.add_argument("--params", default="params.yaml", help="params file (default params.yaml)")
    parser.add_argument("--work-dir", help="keep each split's data and model here (default: temp)")
    parser.add_argument("--json", dest="json_out", help="write per-split results and the summary")
    args, overrides = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    params = load_params(args.params, overrides)
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="xdpx-cv-") as tmp:
        root = args.work_dir or tmp
        splits = []
        for seed in args.seeds:
            r = run_split(params, seed, io.join(root, f"seed-{seed}"))
            splits.append(r)
            print(
                f"seed {seed}: xdpx dev {r['xdpx']['dev']:.4f} test {r['xdpx']['test']:.4f} | "
                f"baseline (C={r['baseline']['C']:g}) dev {r['baseline']['dev']:.4f} "
                f"test {r['baseline']['test']:.4f} | difference {r['difference']:+.4f} "
                f"({r['seconds']:.0f} s)",
                flush=True,
            )
    summary = summarize(splits)
    line = (
        f"{summary['k']} splits: test accuracy xdpx {summary['mean_xdpx']:.4f}, "
        f"baseline {summary['mean_baseline']:.4f}; mean difference {summary['mean_difference']:+.4f}"
    )
    if summary["se"] is not None:
        lo, hi = summary["ci95"]
        line += f" (SE {summary['se']:.4f}, 95% CI [{lo:+.4f}, {hi:+.4f}])"
    print(line + f"; xdpx ahead on {summary['wins']}/{summary['k']}, tied on {summary['ties']}")
    result = {"params": args.params, "overrides": overrides, "splits": splits, "summary": summary}
    if args.json_out:
        io.write_text(args.json_out, json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
