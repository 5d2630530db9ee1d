"""STS-B's real labels: regression on the 0-5 scores against the binarised pair classifier.

Both are ``match_ngram`` with the shipped defaults, trained on STS-B's whole train split
(5,749 pairs) and compared on its dev split (1,500 pairs; the test file is not read):

* regression: ``prepro.label_type: score``, ``train.task: regression``, ``major_metric:
  pearson``;
* classifier: the suite's ``stsb`` corpus (label 1 iff score >= 3.5), ``train.task:
  classification``.

For each, on dev: Pearson's and Spearman's correlation with the gold scores (the
classifier's score is its probability of label 1) and the accuracy on the binarised labels
(the regression's prediction thresholded at 3.5). Over ``--seeds`` training seeds (same data),
mean and standard error.

    python bench/stsb_regression.py                # 3 seeds, ~3 minutes on 2 cores
    python bench/stsb_regression.py --json reports/stsb-regression.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


def _dev_scores(raw: Path) -> np.ndarray:
    import csv

    df = pd.read_csv(raw / "dev.tsv", sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False)
    return df["label"].astype(float).to_numpy()


def run(seeds: list[int], threads: int) -> dict:
    """Train both models per seed; their dev numbers and the summary (see the module doc)."""
    from stages import prepro, train
    from studies.corpora import STSB_THRESHOLD, materialize, materialize_stsb_scores
    from xdpx.checkpoint import load_checkpoint
    from xdpx.data import load_split
    from xdpx.inference import as_samples, predict_logits, probs_from_logits
    from xdpx.metrics import regression_metrics

    pairs = {"text_column": "text1", "text2_column": "text2", "control_chars": "strip"}
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="stsb-regression-") as tmp:
        root = Path(tmp)
        materialize_stsb_scores(str(root / "raw-scores"))
        materialize("stsb", str(root / "raw-classes"))
        from xdpx.config import PreproConfig, TrainConfig

        for kind, extra in (("scores", {"label_type": "score"}), ("classes", {})):
            prepro.run(
                PreproConfig(
                    data_source=str(root / f"raw-{kind}"), data_dir=str(root / kind),
                    **pairs, **extra,
                )
            )  # fmt: skip
        gold = _dev_scores(root / "raw-scores")
        binary = (gold >= STSB_THRESHOLD).astype(int)
        dev = load_split(str(root / "classes"), "dev")
        assert np.array_equal(dev.labels, binary) or np.array_equal(dev.labels, 1 - binary)
        for seed in seeds:
            for kind, task in (("scores", "regression"), ("classes", "classification")):
                t0 = time.perf_counter()
                save = root / f"run-{kind}-{seed}"
                metric = {"major_metric": "pearson"} if task == "regression" else {}
                train.run(
                    TrainConfig(
                        data_dir=str(root / kind), save_dir=str(save), model="match_ngram",
                        task=task, seed=seed, threads=threads, **metric,
                    )
                )  # fmt: skip
                seconds = time.perf_counter() - t0
                ckpt = load_checkpoint(f"{save}/<best>")
                split = load_split(str(root / kind), "dev")
                logits = predict_logits(
                    ckpt.model, as_samples(split.input_ids, split.input_ids2), 256, 0
                )
                if task == "regression":
                    score = logits[:, 0]
                    pred = (score >= STSB_THRESHOLD).astype(int)
                else:
                    one = (root / kind / "target_map.txt").read_text().split().index("1")
                    score = probs_from_logits(logits)[:, one]
                    pred = (score >= 0.5).astype(int)
                row = {"seed": seed, "model": task, "seconds": round(seconds, 1)}
                row.update(regression_metrics(gold, score))
                row["accuracy"] = float((pred == binary).mean())
                rows.append(row)
                print(
                    f"seed {seed} {task:>14}: pearson {row['pearson']:.4f} spearman "
                    f"{row['spearman']:.4f} accuracy {row['accuracy']:.4f} ({seconds:.0f} s)",
                    flush=True,
                )
    summary = {}
    for task in ("regression", "classification"):
        mine = [r for r in rows if r["model"] == task]
        summary[task] = {
            k: {
                "mean": statistics.mean(r[k] for r in mine),
                "se": statistics.stdev(r[k] for r in mine) / len(mine) ** 0.5
                if len(mine) > 1
                else None,
            }
            for k in ("pearson", "spearman", "accuracy", "seconds")
        }
    return {"seeds": seeds, "dev_pairs": int(len(gold)), "runs": rows, "summary": summary}


def _cell(stat: dict, digits: int) -> str:
    """``mean ± se`` (the mean alone for one seed)."""
    se = stat["se"]
    return f"{stat['mean']:.{digits}f}" + (f" ± {se:.{digits}f}" if se is not None else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3", help="train.seed values (same data)")
    ap.add_argument("--threads", type=int, default=2, help="train.threads")
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args()
    result = run([int(s) for s in args.seeds.split(",")], args.threads)
    print("\nSTS-B dev (1,500 pairs), match_ngram, mean ± SE over seeds:")
    print("| model | Pearson | Spearman | accuracy (score >= 3.5) | train s |")
    print("|---|---|---|---|---|")
    for task, s in result["summary"].items():
        cells = [_cell(s[k], d) for k, d in (("pearson", 4), ("spearman", 4), ("accuracy", 4), ("seconds", 1))]  # fmt: skip
        print(f"| {task} | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
