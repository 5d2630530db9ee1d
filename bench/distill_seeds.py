"""A distillation run's student and the n-gram alone over more student seeds, with per-text SE.

One ``xdpx distill`` run trains every student once (``train.seed`` of the student config). A
student a few tenths of a point ahead of the n-gram alone on one seed may be seed noise, so
issue 49's acceptance is a mean over 3 student seeds. This bench takes a finished run (its
``configs_dir``: the resolved step configs; its ``report_dir``: ``decision.json``), retrains
the student's chosen grid point and its reference (the n-gram alone, ``alone-l<L>`` or the
plan's ``baseline``; with a baseline also the student's own model alone, unless ``--no-twin``) with each
``--seeds`` value on the very data the run prepared (``train.run`` of the students step's train config, with ``seed``,
``distill_*`` and ``save_dir`` set), scores both on dev and test (``stages.evaluate``) and
writes, beside the run's own seed, the means, the teacher's dev gain over the n-gram alone
and the share of it the student keeps:

    kept = (mean student dev - mean alone dev) / (teacher dev - mean alone dev)

and the same on test, each difference with its paired standard error (per-text correctness
averaged over the seeds, student minus reference: mean and ``sd / sqrt(n)``), and
with the per-text standard error ``sqrt(p (1 - p) / n)`` of each mean accuracy (one text
set, so the SE of one score; the seeds vary the model, not the texts). The teacher is one
seed (one fine-tune is what a CPU affords; issue 49). Test is reported, never used to choose.

    python bench/distill_seeds.py --configs /work/runs/stsb-nn/configs \\
        --report /work/runs/stsb-nn/report --seeds 2 3 --best-peer-test 0.7679 \\
        --json reports/distill-stsb-pairs/seeds.json             # ~4 min on 2 cores (STS-B)

``--student-set tolerance=100`` trains the new seeds' student (and twin) with those train config
keys, e.g. the full schedule with no early stop (``reports/distill-snownlp-l6-k3-steady``); a
finished run trained otherwise is refused rather than reused.

``--suite-json F --corpus stsb --teacher minilm`` also writes the student's row of the
suite (:func:`studies.suite.student_entry`): ``xdpx suite --merge reports/suite.json --merge F
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

import numpy as np

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


def student_overrides(items: list[str], ap: argparse.ArgumentParser) -> dict[str, Any]:
    """``KEY=VALUE`` items as a dict (values parsed as YAML), each key a train config field.

    Raises (through ``ap.error``, exit 2) on an item without ``=`` or an unknown key.
    """
    import yaml

    from xdpx.config.train import TrainConfig

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--student-set {item!r}: expected KEY=VALUE")
        if key not in TrainConfig.model_fields:
            ap.error(f"--student-set {item!r}: {key!r} is not a train config field")
        out[key] = yaml.safe_load(value)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--configs", required=True, help="The run's configs_dir (students.yaml, decide.yaml).")  # fmt: skip
    ap.add_argument("--report", required=True, help="The run's report_dir (decision.json).")
    ap.add_argument("--seeds", type=int, nargs="+", default=[2, 3], help="Student seeds to add to the run's own.")  # fmt: skip
    ap.add_argument("--best-peer-test", type=float, default=None, help="The best peer's test accuracy (the suite's), for the + 1.0 target.")  # fmt: skip
    ap.add_argument("--no-twin", action="store_true", help="Skip the student's own model on the gold labels (the gold-only twin; what distillation adds): a cascade needs only the student and the n-gram.")  # fmt: skip
    ap.add_argument("--student-set", nargs="+", default=[], metavar="KEY=VALUE", help="Train config keys set for the student's seeds (and its gold-only twin), not the n-gram: e.g. tolerance=100 (no early stop). Values are YAML.")  # fmt: skip
    ap.add_argument("--json", default=None, help="Write the result here.")
    ap.add_argument("--suite-json", default=None, help="Also write the student's row of the suite here (merge it: xdpx suite --merge).")  # fmt: skip
    ap.add_argument("--corpus", default=None, help="The suite corpus of the run (with --suite-json).")  # fmt: skip
    ap.add_argument("--teacher", default="teacher", help="The teacher's name in the which-model table.")  # fmt: skip
    args = ap.parse_args(argv)
    if args.suite_json and not (args.json and args.corpus):
        ap.error("--suite-json needs --json (the seeds report it reads) and --corpus")

    import yaml

    from stages import evaluate, train
    from stages.distill import copies_dir, gold_dir, student_train_file
    from xdpx import io
    from xdpx.distill.plan import kept_share, read_step_config

    student_set = student_overrides(args.student_set, ap)
    students = read_step_config(args.configs, "students")
    decide = read_step_config(args.configs, "decide")
    decision = json.loads(io.read_text(os.path.join(args.report, "decision.json")))
    best = next(r for r in decision["grid"] if r["run"] == decision["student_run"])
    metric = decide.major_metric
    own = best.get("alone", "alone")  # the student's architecture on the gold labels
    reference = decision.get("reference", own)  # what the ship rule compared it with
    arch = {} if best.get("layers") is None else {"hf_config": {**(students.train.hf_config or {}), "num_hidden_layers": best["layers"]}}  # fmt: skip
    # role -> (run name of seed 1, train config, data dir)
    roles: dict[str, tuple[str, Any, str]] = {
        "alone": (reference, *(
            (students.baseline_train, students.baseline_prepro.data_dir)
            if reference == "baseline"
            else (students.train.model_copy(update=arch), gold_dir(students.data_dir))
        )),
        "student": (best["run"], students.train.model_copy(update={
            "distill_from": student_train_file(students, best["copies"]),
            "distill_alpha": best["alpha"], "distill_temperature": best["temperature"], **arch,
        }), copies_dir(students.data_dir, best["copies"])),
    }  # fmt: skip
    if reference != own and not args.no_twin:
        roles["own"] = (own, students.train.model_copy(update=arch), gold_dir(students.data_dir))

    def scored(run: str, data_dir: str) -> Any:
        ev = decide.evaluate.model_copy(
            update={
                "checkpoint": f"{run}/<best>",
                "data_dir": data_dir,
                "splits": ["dev", "test"],
                "metrics_file": os.path.join(run, "seed-metrics.json"),
                "confusion_png": os.path.join(run, "seed-confusion.png"),
                "curve_png": os.path.join(run, "seed-valid_curve.png"),
            }
        )
        return evaluate.run(ev)

    runs: dict[str, dict[str, list[float]]] = {r: {"dev": [], "test": []} for r in roles}
    right: dict[str, dict[str, list[Any]]] = {r: {"dev": [], "test": []} for r in roles}
    out_root = os.path.join(students.save_dir, "seeds")
    start = time.perf_counter()
    for seed in [1, *args.seeds]:
        for role, (name, cfg, data_dir) in roles.items():
            run = os.path.join(students.save_dir, name) if seed == 1 else os.path.join(out_root, f"{name}-seed{seed}")  # fmt: skip
            sets = student_set if role != "alone" and seed != 1 else {}
            if not os.path.exists(os.path.join(run, "best")):  # a rerun reuses finished runs
                train.run(cfg.model_copy(update={"data_dir": data_dir, "save_dir": run, "seed": seed, **sets}))  # fmt: skip
            elif sets:  # ... only if it was trained with the same settings
                saved = yaml.safe_load(io.read_text(os.path.join(run, "params.yaml")))["train"]
                if wrong := {k: saved.get(k) for k, v in sets.items() if saved.get(k) != v}:
                    raise SystemExit(f"{run} was trained with {wrong}, not --student-set {sets}: remove it or use another seed")  # fmt: skip
            r = scored(run, data_dir)
            for split in ("dev", "test"):
                runs[role][split].append(r.metrics[split][metric])
                rows = r.rows[split]
                right[role][split].append(rows["probs"].argmax(1) == rows["labels"])
            print(f"seed {seed} {role} ({name}): dev {r.metrics['dev'][metric]:.4f} test {r.metrics['test'][metric]:.4f}", flush=True)  # fmt: skip
    t_rows = scored(os.path.join(decide.teacher_run), decide.teacher_data).rows
    dev_n = len(right["alone"]["dev"][0])
    test_n = len(right["alone"]["test"][0])
    mean = {f"{n}_{s}": statistics.mean(runs[n][s]) for n in runs for s in ("dev", "test")}
    t_dev, t_test = decision["dev"]["teacher"], decision["test"]["teacher"]
    share = kept_share(t_dev, mean["alone_dev"], mean["student_dev"])

    def paired(a: Any, b: Any) -> dict[str, float]:
        """Mean per-text correctness over the seeds, A minus B, with its paired SE."""
        d = np.mean(a, axis=0) - np.mean(b, axis=0)
        return {"diff": float(d.mean()), "se": float(d.std(ddof=1) / math.sqrt(len(d)))}

    pairs: dict[str, dict[str, float]] = {}
    for split in ("dev", "test"):
        teacher_right = [t_rows[split]["probs"].argmax(1) == t_rows[split]["labels"]]
        pairs[f"student_vs_alone_{split}"] = paired(right["student"][split], right["alone"][split])  # fmt: skip
        pairs[f"teacher_vs_alone_{split}"] = paired(teacher_right, right["alone"][split])
        if "own" in right:
            pairs[f"student_vs_own_{split}"] = paired(right["student"][split], right["own"][split])  # fmt: skip
    result = {
        "student": best["run"],
        "reference": reference,
        "own_alone": own,
        "seeds": [1, *args.seeds],
        "student_set": student_set,
        "teacher_dev": t_dev,
        "teacher_test": t_test,
        "alone": runs["alone"],
        "student_runs": runs["student"],
        **({"own_runs": runs["own"]} if "own" in runs else {}),
        "dev_n": dev_n,
        "test_n": test_n,
        "mean": {
            **mean,
            "teacher_gain": t_dev - mean["alone_dev"],
            "kept_share": share,
            "teacher_test_gain": t_test - mean["alone_test"],
            "test_kept_share": kept_share(t_test, mean["alone_test"], mean["student_test"]),
        },
        "se": {k: per_text_se(v, dev_n if k.endswith("dev") else test_n) for k, v in mean.items()},
        "paired": pairs,
        "best_peer_test": args.best_peer_test,
        "seconds": round(time.perf_counter() - start, 1),
        "how": "train.seed 1 is the xdpx distill run (decision.json); the other seeds retrain the "
        "chosen grid point and its reference (alone, or the plan's baseline) on the same prepared "
        "data (bench/distill_seeds.py); paired: per-text correctness averaged over the seeds, A "
        "minus B, its mean and sd/sqrt(n)",
    }
    se = result["se"]
    print(
        f"alone dev {mean['alone_dev']:.4f} ± {se['alone_dev']:.4f}, student dev "
        f"{mean['student_dev']:.4f} ± {se['student_dev']:.4f}, teacher dev {t_dev:.4f}: kept "
        + (f"{share:.1%}" if share is not None else "n/a (teacher not ahead)")
    )
    tp = pairs["student_vs_alone_test"]
    print(f"test: student - {reference} {tp['diff']:+.4f} ± {tp['se']:.4f} (paired); kept "
          + (f"{result['mean']['test_kept_share']:.1%}" if result["mean"]["test_kept_share"] is not None else "n/a")
          + " of the teacher's test gain")  # fmt: skip
    print(f"student test {mean['student_test']:.4f} ± {se['student_test']:.4f}" + (
        f" vs best peer + 1.0 = {args.best_peer_test + 0.01:.4f}" if args.best_peer_test is not None else ""
    ))  # fmt: skip
    if args.json:
        io.write_text(args.json, json.dumps(result, indent=1) + "\n")
    if args.suite_json:
        from studies.suite import student_entry

        entry = student_entry(args.report, args.teacher, seeds_file=args.json)
        row = {"runs": [], "students": {args.corpus: {f"{args.teacher} student": entry}}}
        io.write_text(args.suite_json, json.dumps(row, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
