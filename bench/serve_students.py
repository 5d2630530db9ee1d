"""Several exported models of one corpus served side by side by ``xdpx serve --http``:
req/s, p50 and p99 latency at ``--concurrency`` clients, and dev accuracy from the served answers.

For each ``--model NAME=PATH[:int8]`` (e.g. the n-gram default, a static-embedding
student, L-layer transformer students in fp32 and int8, the teacher in int8) the script

1. finds or makes its ONNX export (:func:`ensure_export`, any model family): ``PATH`` is an
   export directory (``model.onnx`` + ``report.json``, and ``model.int8.onnx`` for
   ``:int8``), a run directory (its ``<best>`` checkpoint) or a checkpoint directory. A
   checkpoint without an export is exported by the ``export`` stage with
   ``export.quantize=int8`` into ``<run>/export`` (parity samples and the int8 accuracy from
   the dev split of its prepared data, ``meta.json``'s ``prepro.data_dir``); an export there
   of another checkpoint is left alone and the new one goes to ``<run>/export-<checkpoint>``.
   An ensemble directory (``xdpx ensemble``) is served as it is, its members' graphs;
2. starts one server per model, each in its own process on 127.0.0.1 (``xdpx serve EXPORT
   --http --backend onnx``, ``--int8`` for ``:int8``), all up at once;
3. sends every text of ``--texts`` (default: the first model's raw dev file,
   ``prepro.data_source`` / ``data_files.dev`` of its ``meta.json``; pair tasks: its
   ``text_column`` and ``text2_column``, posted as ``{"pairs": [[text, text2]]}``) to each
   server, 64 per request, and scores the returned labels against the file's labels
   (accuracy, its per-text standard error, and the share of texts labelled as the
   reference labels them);
4. drives each server with the same texts, one per request, from ``--concurrency``
   keep-alive clients (``bench/serve_load.py``'s client), ``--repeats`` times in an order
   that alternates (A B C D, then D C B A, ...), so a slow minute of a shared machine hits
   every model;
5. prints and writes (``--json``) each model's median run (req/s, p50 and p99 ms, texts per
   model call, server CPU ms per request) and its ratios to ``--reference`` (default: the
   last model) measured in the same run: the median of the paired per-repeat ratios, with
   their range.

Clients and servers share this machine's cores; numbers are for this machine only.

Examples::

    python bench/serve_students.py --model ngram=models/default \\
        --model l2=models/distill/l2 --model l2-int8=models/distill/l2:int8 \\
        --model teacher=models/e5:int8 --json reports/serve_students.json
    python bench/serve_students.py --model ngram=models/default --model e5=models/e5/export:int8 \\
        --requests 300 --repeats 1 --limit 400                                   # a quick look
    python bench/serve_students.py --model a=models/a --model b=models/b --reference a \\
        --concurrency 8 --threads 1 --server-args='--max-wait-ms 2'
    python bench/serve_students.py --model a=models/a --instances 1 --threads 2    # one call at a time
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shlex
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.serve_encoder import cpu_seconds  # noqa: E402
from bench.serve_load import drive, free_port, measure, median_row, start_process  # noqa: E402

ONNX, INT8, REPORT = "model.onnx", "model.int8.onnx", "report.json"
#: texts per request of the accuracy pass (the server's answers do not depend on the batch)
SCORE_BATCH = 64


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------- the models
@dataclass
class ModelSpec:
    """One ``--model NAME=PATH[:int8]``."""

    name: str
    path: str
    int8: bool = False

    @property
    def variant(self) -> str:
        return "int8" if self.int8 else "fp32"


def parse_model(text: str) -> ModelSpec:
    """``NAME=PATH`` or ``NAME=PATH:int8`` (only a final ``:int8`` is the variant, so URLs
    such as ``oss://...`` keep their colon).

    Raises:
        argparse.ArgumentTypeError: no ``=``, or an empty name or path.
    """
    name, sep, rest = text.partition("=")
    int8 = rest.endswith(":int8")
    path = rest[: -len(":int8")] if int8 else rest
    if not sep or not name.strip() or not path.strip():
        raise argparse.ArgumentTypeError(f"--model {text!r}: expected NAME=PATH or NAME=PATH:int8")
    return ModelSpec(name.strip(), path.strip().rstrip("/"), int8)


def _is_export(d: Path) -> bool:
    return (d / ONNX).is_file() and (d / REPORT).is_file()


def _is_checkpoint(d: Path) -> bool:
    return (d / "model.safetensors").is_file() and (d / "config.json").is_file()


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def ensure_export(path: str, int8: bool = True) -> Path:
    """The export directory of ``path`` (any model family the ``export`` stage exports),
    with ``model.int8.onnx`` too when ``int8``.

    ``path`` is an export directory (used as it is), a run directory (its ``<best>``) or
    a checkpoint directory. A checkpoint is exported into ``<run>/export`` (``<run>``: the
    checkpoint's parent) unless an export there already is of this checkpoint
    (``report.json``'s ``checkpoint``); an export of another checkpoint stays, and this one
    goes to ``<run>/export-<checkpoint name>``. The export stage runs with
    ``export.quantize=int8`` (both graphs, whatever ``int8`` asks, so one export serves
    both variants), parity samples and the int8 accuracy from the dev split of the
    checkpoint's prepared data (``meta.json``'s ``prepro.data_dir``). An export directory
    without the int8 graph that ``:int8`` needs is re-exported in place from its
    ``report.json``'s checkpoint.

    Raises:
        SystemExit: no export, checkpoint or run at ``path``; an int8 graph is needed and
            the export's checkpoint is gone.
    """
    from xdpx.checkpoint import CheckpointError, resolve_checkpoint

    p = Path(path)
    if (p / "ensemble.json").is_file():  # xdpx ensemble's directory: its members' exports
        return p
    if _is_export(p):
        if not int8 or (p / INT8).is_file():
            return p
        ckpt = json.loads((p / REPORT).read_text())["checkpoint"]
        if not _is_checkpoint(Path(ckpt)):
            raise SystemExit(f"{p}: no {INT8}, and its checkpoint {ckpt} is gone: export it with export.quantize=int8")  # fmt: skip
        return _export(ckpt, p)
    try:
        ckpt = resolve_checkpoint(str(p) if _is_checkpoint(p) else f"{p}/<best>")
    except CheckpointError as e:
        raise SystemExit(f"{path}: not an export dir (model.onnx + report.json), a run or a checkpoint ({e})") from None  # fmt: skip
    run = Path(ckpt).parent
    for out in (run / "export", run / f"export-{Path(ckpt).name}"):
        if not _is_export(out):
            return _export(ckpt, out)
        if _same_path(json.loads((out / REPORT).read_text())["checkpoint"], ckpt):
            if int8 and not (out / INT8).is_file():
                return _export(ckpt, out)
            log(f"export: reusing {out} (of {ckpt})")
            return out
    return _export(ckpt, run / f"export-{Path(ckpt).name}")  # both hold other exports: redo


def graph_facts(export_dir: Path, int8: bool) -> dict[str, Any]:
    """``{"kind", "onnx_mb"}`` of an export (its ``report.json``'s model and the graph's size),
    or of an ensemble directory (``ensemble``, its members' graphs together)."""
    spec = export_dir / "ensemble.json"
    if spec.is_file():
        members = json.loads(spec.read_text())["members"]
        size = sum(
            (export_dir / m["dir"] / m.get("onnx_file", ONNX)).stat().st_size for m in members
        )
        return {"kind": "ensemble", "onnx_mb": size / 2**20}
    report = json.loads((export_dir / REPORT).read_text())
    return {"kind": report.get("model"), "onnx_mb": (export_dir / (INT8 if int8 else ONNX)).stat().st_size / 2**20}  # fmt: skip


def _export(ckpt: str, out: Path) -> Path:
    """The ``export`` stage on ``ckpt`` into ``out`` (fp32 + int8)."""
    from stages import export
    from xdpx.config import ExportConfig
    from xdpx.data import PreparedMeta

    data = PreparedMeta.read(ckpt).prepro["data_dir"]
    log(f"export: {ckpt} -> {out} (fp32 + int8; parity samples and int8 accuracy from {data}, dev)")  # fmt: skip
    cfg = ExportConfig(checkpoint=ckpt, data_dir=data, split="dev", out_dir=str(out), quantize="int8", latency_runs=3, num_samples=64)  # fmt: skip
    export.run(cfg)
    return out


# ------------------------------------------------------------------------- the texts
def read_texts(path: str | None, export_dir: Path) -> tuple[str, list[Any], list[str]]:
    """``(file, inputs, labels)``: ``inputs`` are texts, or ``(text, text2)`` tuples for a
    pair model; ``labels`` the file's (``""`` where a row has none). Read as prepro reads
    (``xdpx.data.read_examples`` with the model's prepro section: format, columns); the
    default file is the model's raw dev split (``prepro.data_source`` / ``data_files.dev``,
    every file of a glob or list)."""
    from xdpx.config import PreproConfig
    from xdpx.data import PreparedMeta, read_examples
    from xdpx.data.stream import expand_sources

    if (export_dir / "ensemble.json").is_file():  # an ensemble reads as its member 0
        export_dir = export_dir / json.loads((export_dir / "ensemble.json").read_text())["members"][0]["dir"]  # fmt: skip
    prepro = PreproConfig(**PreparedMeta.read(str(export_dir)).prepro)
    if path:
        files = [path]
    else:
        if "dev" not in prepro.data_files:
            raise SystemExit(f"{export_dir}: prepro.data_files has no dev split; pass --texts")
        files = expand_sources(prepro.model_copy(update={"data_files": {"train": prepro.data_files["dev"]}}))["train"]  # fmt: skip
    inputs: list[Any] = []
    labels: list[str] = []
    for f in files:
        data = read_examples(f, prepro, require_label=False)
        inputs += list(zip(data.texts, data.texts2, strict=True)) if data.texts2 is not None else list(data.texts)  # fmt: skip
        labels += data.labels if data.labels is not None else [""] * len(data.texts)
    return ", ".join(files), inputs, labels


def body(items: list[Any]) -> dict[str, Any]:
    """The ``POST /predict`` body of texts or ``(text, text2)`` pairs."""
    if items and isinstance(items[0], tuple):
        return {"pairs": [list(t) for t in items]}
    return {"texts": items}


def served_labels(port: int, items: list[Any]) -> list[str]:
    """The server's labels for every item, :data:`SCORE_BATCH` per request."""
    out: list[str] = []
    with httpx.Client(timeout=600) as client:
        for i in range(0, len(items), SCORE_BATCH):
            r = client.post(f"http://127.0.0.1:{port}/predict", json=body(items[i : i + SCORE_BATCH]))  # fmt: skip
            r.raise_for_status()
            out += r.json()["labels"]
    return out


def accuracy(pred: list[str], gold: list[str], reference: list[str]) -> dict[str, Any]:
    """Accuracy of ``pred`` on the rows with a label (its per-text SE ``sqrt(p(1-p)/n)``)
    and the share of all rows where ``pred`` equals ``reference``'s labels."""
    keep = [i for i, g in enumerate(gold) if g]
    right = sum(pred[i] == gold[i] for i in keep)
    acc = right / len(keep) if keep else float("nan")
    se = math.sqrt(acc * (1 - acc) / len(keep)) if keep else float("nan")
    agree = sum(a == b for a, b in zip(pred, reference, strict=True)) / max(len(pred), 1)
    return {"accuracy": acc, "accuracy_se": se, "labelled": len(keep), "agreement_with_reference": agree}  # fmt: skip


# ------------------------------------------------------------------------- the run
def timed(port: int, pid: int, items: list[Any], concurrency: int, requests: int, name: str) -> dict:  # fmt: skip
    """:func:`bench.serve_load.measure` (pairs posted as pairs: its ``text_body``) plus the server's CPU
    milliseconds per request (``cpu_ms_per_request``, from ``/proc``: less sensitive than
    req/s to other work on a shared machine; None where there is no ``/proc``)."""
    before = cpu_seconds(pid)
    row = measure(port, items, concurrency, requests, name)
    after = cpu_seconds(pid)
    row["cpu_ms_per_request"] = None if before is None or after is None else 1000 * (after - before) / requests  # fmt: skip
    return row


def ratios(rows: list[dict], ref_rows: list[dict], key: str) -> list[float]:
    """Sorted per-repeat ratios ``row[key] / ref_row[key]`` (repeat by repeat)."""
    return sorted(a[key] / b[key] for a, b in zip(rows, ref_rows, strict=True))


def summarise(specs: list[ModelSpec], raw: dict[str, list[dict]], reference: str) -> dict[str, dict]:  # fmt: skip
    """Each model's median run and its paired ratios to ``reference``."""
    keys = ("throughput_rps", "p50_ms", "p99_ms", "mean_batch", "cpu_ms_per_request", "codes")
    out = {}
    for s in specs:
        m = median_row(raw[s.name])
        row: dict[str, Any] = {k: m.get(k) for k in keys}
        for key, short in (("throughput_rps", "rps"), ("p50_ms", "p50"), ("p99_ms", "p99")):
            r = ratios(raw[s.name], raw[reference], key)
            row[f"{short}_ratio_vs_reference"] = statistics.median(r)
            row[f"{short}_ratios_vs_reference"] = r
        out[s.name] = row
    return out


def print_table(specs: list[ModelSpec], results: dict[str, dict], reference: str, repeats: int) -> None:  # fmt: skip
    w = max(len(s.name) for s in specs + [ModelSpec("model", "")])
    print(f"\nmedian of {repeats}; ratios: paired per repeat vs {reference}, median (range)")
    print(f"{'model':{w}s} | variant | req/s    | p50 ms   | p99 ms   | texts/call | CPU ms/req | req/s vs ref       | p99 vs ref | dev accuracy")  # fmt: skip
    for s in specs:
        r = results[s.name]
        rr = r["rps_ratios_vs_reference"]
        cpu = "–" if r["cpu_ms_per_request"] is None else f"{r['cpu_ms_per_request']:.2f}"
        acc = f"{r['accuracy']:.4f} ± {r['accuracy_se']:.4f}"
        print(
            f"{s.name:{w}s} | {s.variant:7s} | {r['throughput_rps']:8.1f} | {r['p50_ms']:8.2f} | {r['p99_ms']:8.2f} | "
            f"{r['mean_batch']:10.1f} | {cpu:>10s} | {r['rps_ratio_vs_reference']:6.2f} ({rr[0]:.2f}-{rr[-1]:.2f}) | "
            f"{r['p99_ratio_vs_reference']:10.2f} | {acc} (n={r['labelled']})"
        )  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--model", type=parse_model, action="append", required=True, metavar="NAME=PATH[:int8]", help="a model to serve (repeat): an export dir, a run dir or a checkpoint; :int8 serves model.int8.onnx")  # fmt: skip
    parser.add_argument("--reference", help="the model the ratios are to (default: the last --model)")  # fmt: skip
    parser.add_argument("--texts", help="TSV of texts with labels (default: the first model's raw dev file)")  # fmt: skip
    parser.add_argument("--limit", type=int, help="use the first N texts only (a quick look)")
    parser.add_argument("--concurrency", type=int, default=64, help="clients (default 64)")
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per model")
    parser.add_argument("--threads", type=int, help="onnxruntime threads of each model instance of every server (default: the server's, the cores / --instances)")  # fmt: skip
    parser.add_argument("--instances", type=int, help="the servers' --instances, model calls in flight at once (default: the server's, 2)")  # fmt: skip
    parser.add_argument("--max-batch-size", type=int, default=64, help="the servers' --max-batch-size")  # fmt: skip
    parser.add_argument("--server-args", default="", help="more options for every server, e.g. '--max-wait-ms 2'")  # fmt: skip
    parser.add_argument("--json", help="write the results here (e.g. reports/serve_students.json)")  # fmt: skip
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    specs: list[ModelSpec] = args.model
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        parser.error(f"--model names must differ: {names}")
    reference = args.reference or names[-1]
    if reference not in names:
        parser.error(f"--reference {reference!r} is not a --model name ({', '.join(names)})")

    exports: dict[str, Path] = {}
    for s in specs:
        exports[s.name] = ensure_export(s.path, s.int8)
    texts_path, items, gold = read_texts(args.texts, exports[specs[0].name])
    items, gold = items[: args.limit], gold[: args.limit]
    pair = bool(items) and isinstance(items[0], tuple)
    if not items:
        raise SystemExit(f"{texts_path}: no texts")
    log(f"{len(specs)} models; {len(items)} {'pairs' if pair else 'texts'} from {texts_path}; {args.requests} requests x {args.repeats} repeats at concurrency {args.concurrency}")  # fmt: skip

    common = ["--backend", "onnx", "--max-queue", "100000"]
    common += ["--threads", str(args.threads)] if args.threads else []
    common += ["--instances", str(args.instances)] if args.instances else []
    common += ["--max-batch-size", str(args.max_batch_size), *shlex.split(args.server_args)]
    servers: dict[str, tuple[int, Any]] = {}
    labels: dict[str, list[str]] = {}
    raw: dict[str, list[dict]] = {s.name: [] for s in specs}
    try:
        with ThreadPoolExecutor(len(specs)) as pool:  # all load at once
            starting = {}
            for s in specs:
                port = free_port()
                cmd = [sys.executable, "-m", "xdpx.cli", "serve", str(exports[s.name]), "--http", "--port", str(port), *common]  # fmt: skip
                if s.int8:
                    cmd.append("--int8")
                log(f"starting {s.name} ({s.variant}, {exports[s.name]}) on :{port}")
                starting[s.name] = (port, pool.submit(start_process, cmd, port, timeout_s=300))
            for name, (port, future) in starting.items():
                with contextlib.suppress(Exception):  # raised below, once all are in
                    servers[name] = (port, future.result())
            for future in (f for _, f in starting.values()):
                future.result()
        log("all servers ready")
        for s in specs:
            port = servers[s.name][0]
            labels[s.name] = served_labels(port, items)  # also the warm-up
            asyncio.run(drive(port, items, min(4, args.concurrency), 32))
        order = list(specs)
        total, done = args.repeats * len(specs), 0
        for r in range(args.repeats):
            for s in order if r % 2 == 0 else order[::-1]:
                done += 1
                log(f"[{done}/{total}] repeat {r + 1}, {s.name} ({s.variant})")
                port, proc = servers[s.name]
                raw[s.name].append(timed(port, proc.pid, items, args.concurrency, args.requests, s.name))  # fmt: skip
    finally:
        for _, proc in servers.values():
            proc.terminate()
        for _, proc in servers.values():
            proc.wait(timeout=30)

    results = summarise(specs, raw, reference)
    for s in specs:
        results[s.name] = {
            "name": s.name,
            "path": s.path,
            "export": str(exports[s.name]),
            "variant": s.variant,
            **graph_facts(exports[s.name], s.int8),
            **accuracy(labels[s.name], gold, labels[reference]),
            **results[s.name],
        }
        bad = {c: n for c, n in results[s.name]["codes"].items() if c != 200}
        if bad:
            log(f"warning: {s.name} answered {bad} (status: requests) in its median run")
    print_table(specs, results, reference, args.repeats)
    out = {
        "texts": texts_path,
        "n_texts": len(items),
        "pairs": pair,
        "reference": reference,
        "settings": {
            "concurrency": args.concurrency,
            "requests": args.requests,
            "repeats": args.repeats,
            "threads": args.threads,
            "instances": args.instances,
            "cpus": os.cpu_count(),
            "max_batch_size": args.max_batch_size,
            "server_args": args.server_args,
        },
        "models": results,
        "raw": raw,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        log(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
