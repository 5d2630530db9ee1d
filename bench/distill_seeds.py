"""A distillation run's student and the n-gram alone over more student seeds, with per-text SE.

One ``xdpx distill`` run trains every student once (``train.seed`` of the student config). A
student a few tenths of a point ahead of the n-gram alone on one seed may be seed noise, so
issue 49's acceptance is a mean over 3 student seeds. This bench takes a finished run (its
``configs_dir``: the resolved step configs; its ``report_dir``: ``decision.json``), retrains
the student's chosen grid point and the n-gram alone with each ``--seeds`` value on the very
data the run prepared (``train.run`` of the students step's train config, with ``seed``,
``distill_*`` and ``save_dir`` set), scores both on dev and test (``stages.evaluate``) and
writes, beside the run's own seed, the means, the teacher's dev gain over the n-gram alone
and the share of it the student keeps:

    kept = (mean student dev - mean alone dev) / (teacher dev - mean alone dev)

with the per-text standard error ``sqrt(p (1 - p) / n)`` of each mean accuracy (one text
set, so the SE of one score; the seeds vary the model, not the texts). The teacher is one
seed (one fine-tune is what a CPU affords; issue 49). Test is reported, never used to choose.

    python bench/distill_seeds.py --configs /work/runs/stsb-nn/configs \\
        --report /work/runs/stsb-nn/report --seeds 2 3 --best-peer-test 0.7679 \\
        --json reports/distill-stsb-pairs/seeds.json             # ~4 min on 2 cores (STS-B)

``--suite-json F --corpus stsb --teacher minilm`` also writes the student's row of the
suite (:func:`flows.suite.student_entry`): ``xdpx suite --merge reports/suite.json --merge F
--json reports/suite.json`` adds it to the which-model table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def per_text_se(p: float, n: int) -> float:
    """Standard error of an accuracy ``p`` on ``n`` texts: ``sqrt(p (1 - p) / n)``."""
    return math.sqrt(p * (1 - p) / n) if n else float("nan")


def _split_rows(data_dir: str, split: str) -> int:
    from xdpx.data.lazy import LazySplit

    split_ = LazySplit(data_dir, split)
    try:
        return len(split_)
    finally:
        split_.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--configs", required=True, help="The run's configs_dir (students.yaml, decide.yaml).")  # fmt: skip
    ap.add_argument("--report", required=True, help="The run's report_dir (decision.json).")
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3], help="Student seeds to add to the run's own.")  # fmt: skip
    ap.add_argument("--best-peer-test", type=float, default=None, help="The best peer's test accuracy (the suite's), for the + 1.0 target.")  # fmt: skip
    ap.add_argument("--json", default=None, help="Write the result here.")
    ap.add_argument("--suite-json", default=None, help="Also write the student's row of the suite here (merge it: xdpx suite --merge).")  # fmt: skip
    ap.add_argument("--corpus", default=None, help="The suite corpus of the run (with --suite-json).")  # fmt: skip
    ap.add_argument("--teacher", default="teacher", help="The teacher's name in the which-model table.")  # fmt: skip
    args = ap.parse_args(argv)
    if args.suite_json and not (args.json and args.corpus):
        ap.error("--suite-json needs --json (the seeds report it reads) and --corpus")

    from stages import evaluate, train
    from stages.distill import copies_dir, gold_dir, student_train_file
    from xdpx import io
    from xdpx.distillation import kept_share, read_step_config

    students = read_step_config(args.configs, "students")
    decide = read_step_config(args.configs, "decide")
    decision = json.loads(io.read_text(os.path.join(args.report, "decision.json")))
    best = next(r for r in decision["grid"] if r["run"] == decision["student_run"])
    scores = {
        n: {s: decision[s][n] for s in ("dev", "test")} for n in ("teacher", "alone", "student")
    }
    runs: dict[str, dict[str, list[float]]] = {
        name: {"dev": [scores[name]["dev"]], "test": [scores[name]["test"]]}
        for name in ("alone", "student")
    }
    data = {"alone": gold_dir(students.data_dir), "student": copies_dir(students.data_dir, best["copies"])}  # fmt: skip
    extra = {
        "alone": {},
        "student": {
            "distill_from": student_train_file(students, best["copies"]),
            "distill_alpha": best["alpha"],
            "distill_temperature": best["temperature"],
        },
    }
    out_root = os.path.join(students.save_dir, "seeds")
    start = time.perf_counter()
    for seed in args.seeds:
        for name in ("alone", "student"):
            run = os.path.join(out_root, f"{name}-seed{seed}")
            cfg = students.train.model_copy(update={"data_dir": data[name], "save_dir": run, "seed": seed, **extra[name]})  # fmt: skip
            if not os.path.exists(os.path.join(run, "best")):  # a rerun reuses finished runs
                train.run(cfg)
            ev = decide.evaluate.model_copy(
                update={
                    "checkpoint": f"{run}/<best>",
                    "data_dir": data[name],
                    "splits": ["dev", "test"],
                    "metrics_file": os.path.join(run, "metrics.json"),
                    "confusion_png": os.path.join(run, "confusion.png"),
                    "curve_png": os.path.join(run, "valid_curve.png"),
                }
            )
            m = evaluate.run(ev).metrics
            metric = decide.major_metric
            runs[name]["dev"].append(m["dev"][metric])
            runs[name]["test"].append(m["test"][metric])
            print(f"seed {seed} {name}: dev {m['dev'][metric]:.4f} test {m['test'][metric]:.4f}", flush=True)  # fmt: skip
    dev_n = _split_rows(data["alone"], "dev")
    test_n = _split_rows(data["alone"], "test")
    mean = {f"{n}_{s}": statistics.mean(runs[n][s]) for n in runs for s in ("dev", "test")}
    t_dev = scores["teacher"]["dev"]
    share = kept_share(t_dev, mean["alone_dev"], mean["student_dev"])
    result = {
        "student": best["run"],
        "seeds": [1, *args.seeds],
        "teacher_dev": t_dev,
        "teacher_test": scores["teacher"]["test"],
        "alone": runs["alone"],
        "student_runs": runs["student"],
        "dev_n": dev_n,
        "test_n": test_n,
        "mean": {**mean, "teacher_gain": t_dev - mean["alone_dev"], "kept_share": share},
        "se": {k: per_text_se(v, dev_n if k.endswith("dev") else test_n) for k, v in mean.items()},
        "best_peer_test": args.best_peer_test,
        "seconds": round(time.perf_counter() - start, 1),
        "how": "train.seed 1 is the xdpx distill run (decision.json); the other seeds retrain the "
        "chosen grid point and the n-gram alone on the same prepared data (bench/distill_seeds.py)",
    }
    se = result["se"]
    print(
        f"alone dev {mean['alone_dev']:.4f} ± {se['alone_dev']:.4f}, student dev "
        f"{mean['student_dev']:.4f} ± {se['student_dev']:.4f}, teacher dev {t_dev:.4f}: kept "
        + (f"{share:.1%}" if share is not None else "n/a (teacher not ahead)")
    )
    print(f"student test {mean['student_test']:.4f} ± {se['student_test']:.4f}" + (
        f" vs best peer + 1.0 = {args.best_peer_test + 0.01:.4f}" if args.best_peer_test is not None else ""
    ))  # fmt: skip
    if args.json:
        io.write_text(args.json, json.dumps(result, indent=1) + "\n")
    if args.suite_json:
        from flows.suite import student_entry

        entry = student_entry(args.report, args.teacher, seeds_file=args.json)
        row = {"runs": [], "students": {args.corpus: {f"{args.teacher} student": entry}}}
        io.write_text(args.suite_json, json.dumps(row, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
