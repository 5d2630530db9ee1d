"""Every transformer student of a finished ``xdpx distill`` run, exported and put behind its
n-gram baseline as a cascade; one JSON of what each keeps of the teacher's test gain.

A student of L layers costs about L/6 of the 6-layer teacher per text; a cascade
(``xdpx ensemble --cascade``, docs/serving.md) runs the n-gram on every text and the
student only on the least confident share of them, so a cascade of the n-gram and a student
costs the n-gram plus that share of the student. This bench takes the run's ``configs_dir``
and ``report_dir`` (``decision.json``; with ``seeds.json`` of ``bench/distill_seeds.py``
beside it, its seeds too) and, for the teacher, the baseline (the plan's ``baseline``, the
n-gram a student must beat) and every grid run:

1. ``<run>/export`` of its best checkpoint, fp32 and int8 (``bench/ensemble_suite.export``);
2. for every student run (train.seed 1: the grid; the seeds' ``<save_dir>/seeds/<run>-seed<K>``
   with their own ``baseline-seed<K>``), the cascade ``baseline -> student`` of the int8
   exports into ``<report_dir>/cascades/cascade-<run>`` deferring at most ``--max-defer`` of dev,
   its threshold chosen on dev (``xdpx.ensemble.choose_threshold``), and the same of the
   teacher (``cascade-teacher``, seed 1): dev and test accuracy, deferred shares, paired
   comparisons (``bench/ensemble_suite.cascade_summary``, kept as
   ``<report_dir>/cascades/cascade-<run>.json``: a rerun with the same ``--max-defer``
   reuses it, and any rerun the exports);
3. per student and cascade, the share of the teacher's test gain over the baseline it keeps
   (``xdpx.distill.plan.kept_share``; the teacher's test as ``decision.json`` has it, fp32,
   the n-gram's as its int8 export scores it), with its mean over the seeds where there are
   seeds.

Test is reported, never used to choose. Run on the machine the distill run trained on::

    python bench/student_cascades.py --configs data/distill-stsb/configs \\
        --report reports/distill-stsb-augsbert --max-defer 0.2 --threads 8

(writes ``<report>/cascades.json``; ``--json`` elsewhere). ``bench/serve_students.py`` then
serves the exports and cascades side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.ensemble_suite import cascade_summary, export  # noqa: E402
from xdpx import io  # noqa: E402


def log(msg: str) -> None:
    print(f"[student_cascades {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--configs", required=True, help="The run's configs_dir (students.yaml).")
    ap.add_argument("--report", required=True, help="The run's report_dir (decision.json, seeds.json).")  # fmt: skip
    ap.add_argument("--max-defer", type=float, default=0.2, help="The cascade's speed budget: the largest share of dev sent to the student (default 0.2).")  # fmt: skip
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime threads of the exports' checks and the cascades")  # fmt: skip
    ap.add_argument("--json", default=None, help="Write the result here (default <report>/cascades.json).")  # fmt: skip
    args = ap.parse_args(argv)

    from xdpx.distill.plan import kept_share, read_step_config

    students = read_step_config(args.configs, "students")
    decide = read_step_config(args.configs, "decide")
    decision = json.loads(io.read_text(os.path.join(args.report, "decision.json")))
    if not decide.baseline:
        raise SystemExit(f"{args.configs}: the plan has no baseline; a cascade needs the n-gram it names")  # fmt: skip
    seeds_file = os.path.join(args.report, "seeds.json")
    seeds = json.loads(io.read_text(seeds_file)) if os.path.exists(seeds_file) else None
    raw = students.prepro.data_source  # the plan's raw: train.tsv, dev.tsv, test.tsv
    save = students.save_dir
    t_dev, t_test = decision["dev"]["teacher"], decision["test"]["teacher"]
    start = time.perf_counter()

    teacher_export = export(decide.teacher_run, args.threads)
    # student run -> (its baseline's run): seed 1 is the grid, the seeds retrain both
    pairs: dict[str, tuple[str, str]] = {
        r["run"]: (os.path.join(save, r["run"]), os.path.join(save, "baseline")) for r in decision["grid"]
    }  # fmt: skip
    seed_runs = [seeds["student"]] if seeds else []  # the chosen student, seed 1 first
    for k in seeds["seeds"][1:] if seeds else []:
        seed_runs.append(name := f"{seeds['student']}-seed{k}")
        pairs[name] = (os.path.join(save, "seeds", name), os.path.join(save, "seeds", f"baseline-seed{k}"))  # fmt: skip
    out: dict[str, Any] = {"max_defer": args.max_defer, "teacher": {"dev": t_dev, "test": t_test}, "runs": {}}  # fmt: skip
    cascades_dir = os.path.join(args.report, "cascades")
    for name, (run, base) in [("teacher", (decide.teacher_run, os.path.join(save, "baseline"))), *pairs.items()]:  # fmt: skip
        summary = os.path.join(cascades_dir, f"cascade-{name}.json")  # a rerun reuses it
        c = json.loads(io.read_text(summary)) if os.path.exists(summary) else None
        if c is None or c["max_defer"] != args.max_defer:  # built with another budget: again
            members = [export(base, args.threads), teacher_export if name == "teacher" else export(run, args.threads)]  # fmt: skip
            log(f"cascade {base} -> {run}")
            c = cascade_summary(members, "", raw, args.max_defer, args.threads, ["ngram", name], os.path.join(cascades_dir, f"cascade-{name}"))  # fmt: skip
            io.write_text(summary, json.dumps(c, indent=1) + "\n")
        ngram = c["members_int8"]["ngram"]
        alone = c["members_int8"][name]
        out["runs"][name] = {
            "run": run,
            "baseline": base,
            "student_int8": alone,
            "ngram_int8": ngram,
            "cascade": c,
            "student_test_kept": kept_share(t_test, ngram["test"], alone["test"]),
            "cascade_test_kept": kept_share(t_test, ngram["test"], c["accuracy"]["test"]),
        }
        log(f"{name}: alone test {alone['test']:.4f}, cascade test {c['accuracy']['test']:.4f}, n-gram {ngram['test']:.4f}, deferred test {c['deferred']['test']:.3f}")  # fmt: skip
    if seeds:

        def over_seeds(get: Any) -> dict[str, float]:
            """``{split: mean over seed_runs of get(run entry)[split]}``."""
            return {s: statistics.mean(get(out["runs"][r])[s] for r in seed_runs) for s in ("dev", "test")}  # fmt: skip

        mean: dict[str, Any] = {
            "student_int8": over_seeds(lambda r: r["student_int8"]),
            "ngram_int8": over_seeds(lambda r: r["ngram_int8"]),
            "cascade": over_seeds(lambda r: r["cascade"]["accuracy"]),
            "deferred": over_seeds(lambda r: r["cascade"]["deferred"]),
        }
        mean["cascade_test_kept"] = kept_share(t_test, mean["ngram_int8"]["test"], mean["cascade"]["test"])  # fmt: skip
        mean["student_test_kept"] = kept_share(t_test, mean["ngram_int8"]["test"], mean["student_int8"]["test"])  # fmt: skip
        out["seeds"] = {"runs": seed_runs, "mean": mean}
    out["seconds"] = round(time.perf_counter() - start, 1)
    out["how"] = (
        "bench/student_cascades.py: int8 exports of the distill run's teacher, baseline and students; "
        "cascade = the baseline n-gram answers alone where its top probability reaches the threshold "
        f"chosen on dev (at most {args.max_defer:g} of dev deferred), the dev-weighted average of both the rest; "
        "kept = (test - n-gram int8 test) / (teacher fp32 test - n-gram int8 test)"
    )
    io.write_text(args.json or os.path.join(args.report, "cascades.json"), json.dumps(out, indent=1) + "\n")  # fmt: skip
    return out


if __name__ == "__main__":
    main()
