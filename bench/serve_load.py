"""Load benchmark of ``xdpx serve --http``: dynamic batching against batching off.

Starts the server in a child process on 127.0.0.1 (``python -m xdpx.cli serve RUN --http``)
and drives it with concurrent asyncio clients (keep-alive HTTP/1.1 connections), each sending one real test text per
request (``POST /predict``), at each concurrency in turn. For every concurrency it prints
the throughput (requests/s), p50 and p99 latency (ms, client-side) and the mean texts per
model call (from the server's ``/metrics`` batch-size histogram). It runs the same server
twice in this process: with batching (``--max-batch-size``, ``--max-wait-ms``) and with
batching off (``--max-batch-size 1``), and prints the throughput ratio per concurrency.

Usage::

    python bench/serve_load.py                                   # models/default, c = 1 8 64
    python bench/serve_load.py --run models/minilm --requests 300 --concurrency 1 8 64
    python bench/serve_load.py --json reports/serve_load.json

Clients and server share this machine's cores; numbers are for this machine only.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(run: str, port: int, extra: list[str]) -> subprocess.Popen:
    """The server in a child process; returns once ``/v2/health/ready`` answers (<= 60 s)."""
    cmd = [sys.executable, "-m", "xdpx.cli", "serve", run, "--http", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server not ready within 60 s")


def batch_stats(port: int) -> tuple[float, float]:
    """(model calls, texts) so far, from /metrics' xdpx_batch_size histogram."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    count = float(re.search(r"^xdpx_batch_size_count (\S+)$", text, re.M).group(1))
    total = float(re.search(r"^xdpx_batch_size_sum (\S+)$", text, re.M).group(1))
    return count, total


async def drive(port: int, texts: list[str], concurrency: int, requests: int) -> dict:
    """``requests`` POSTs of one text each from ``concurrency`` clients, each on its own
    keep-alive connection; client-side latencies.

    The clients are plain asyncio streams writing HTTP/1.1 requests and reading
    ``Content-Length`` bodies: they share the server's 2 cores, and aiohttp's client spent
    so much CPU that it, not the server, set the pace (1,329 against 3,466 req/s at
    concurrency 64 with batching; httpx's async pool: 161 req/s).
    """
    bodies = [orjson.dumps({"texts": [t]}) for t in texts]
    head = "POST /predict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n"  # fmt: skip
    requests_bytes = [head.format(len(b)).encode() + b for b in bodies]
    latencies: list[float] = []
    codes: dict[int, int] = {}
    next_i = 0

    async def worker() -> None:
        nonlocal next_i
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while next_i < requests:
                i = next_i
                next_i += 1
                t0 = time.perf_counter()
                writer.write(requests_bytes[i % len(requests_bytes)])
                header = await reader.readuntil(b"\r\n\r\n")
                lines = header.split(b"\r\n")
                length = next(int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length:"))  # fmt: skip
                await reader.readexactly(length)
                latencies.append(time.perf_counter() - t0)
                code = int(lines[0].split()[1])
                codes[code] = codes.get(code, 0) + 1
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    latencies.sort()
    return {
        "concurrency": concurrency,
        "requests": requests,
        "codes": codes,
        "throughput_rps": requests / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


def run_server(args: argparse.Namespace, texts: list[str], batch: int, label: str) -> list[dict]:
    port = free_port()
    extra = ["--max-batch-size", str(batch), "--max-wait-ms", str(args.max_wait_ms)]
    extra += ["--max-queue", "100000", "--backend", args.backend]
    proc = start_server(args.run, port, extra)
    rows = []
    try:
        asyncio.run(drive(port, texts, 8, 200))  # warm-up
        for c in args.concurrency:
            before = batch_stats(port)
            row = asyncio.run(drive(port, texts, c, args.requests))
            after = batch_stats(port)
            calls, done = after[0] - before[0], after[1] - before[1]
            row["mean_batch"] = done / calls if calls else 0.0
            row["server"] = label
            rows.append(row)
            print(
                f"{label:14s} c={c:3d}  {row['throughput_rps']:7.0f} req/s  p50 {row['p50_ms']:7.2f} ms  "
                f"p99 {row['p99_ms']:7.2f} ms  mean batch {row['mean_batch']:5.1f}  codes {row['codes']}",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--run", default="models/default", help="run dir to serve (make demo first)"
    )
    parser.add_argument("--texts", default="data/raw/test.tsv", help="TSV with a 'text' column")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--requests", type=int, default=2000, help="requests per concurrency")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--backend", default="auto", help="auto, onnx or eager")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args()
    os.chdir(ROOT)
    with open(args.texts, encoding="utf-8", newline="") as f:
        texts = [r["text"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    print(f"serving {args.run}: {len(texts)} test texts, {args.requests} requests per concurrency")
    on = run_server(args, texts, args.max_batch_size, f"batching {args.max_batch_size}")
    off = run_server(args, texts, 1, "batching off")
    print(
        "\nconcurrency | batching req/s | off req/s | ratio | p99 batching ms | p99 off ms | mean batch"
    )
    for a, b in zip(on, off, strict=True):
        ratio = a["throughput_rps"] / b["throughput_rps"]
        a["ratio_vs_off"] = ratio
        print(
            f"{a['concurrency']:11d} | {a['throughput_rps']:14.0f} | {b['throughput_rps']:9.0f} | "
            f"{ratio:5.2f} | {a['p99_ms']:15.2f} | {b['p99_ms']:10.2f} | {a['mean_batch']:10.1f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"batching": on, "off": off}, indent=2) + "\n")


if __name__ == "__main__":
    main()
