"""Load benchmark of ``xdpx serve --http``: dynamic batching against batching off.

Starts the server in a child process on 127.0.0.1 (``python -m xdpx.cli serve RUN --http``)
and drives it with concurrent asyncio clients (keep-alive HTTP/1.1 connections), each sending one real test text per
request (``POST /predict``), at each concurrency in turn. For every concurrency it prints
the throughput (requests/s), p50 and p99 latency (ms, client-side) and the mean texts per
model call (from the server's ``/metrics`` batch-size histogram). Two servers of the same
run are up at once: with batching (``--max-batch-size``, ``--max-wait-ms``) and with
batching off (``--max-batch-size 1``). Each concurrency is measured ``--repeats`` times on
both, in alternating order (A B, then B A, ...), so a slow minute of this shared machine
hits both; the table gives the medians and the ratio is the median of the paired ratios,
with their range.

Usage::

    python bench/serve_load.py                                   # models/default, c = 1 8 64
    python bench/serve_load.py --run models/minilm --requests 300 --concurrency 1 8 64
    python bench/serve_load.py --json reports/serve_load.json --requests 5000

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
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(run: str, port: int, extra: list[str]) -> subprocess.Popen:
    """``xdpx serve RUN --http`` in a child process; returns once it is ready (<= 60 s)."""
    cmd = [sys.executable, "-m", "xdpx.cli", "serve", run, "--http", "--port", str(port), *extra]
    return start_process(cmd, port)


def start_process(
    cmd: list[str], port: int, ready: str = "/v2/health/ready", timeout_s: float = 60
) -> subprocess.Popen:
    """Any server command in a child process (cwd: the repository root, stderr piped);
    returns once ``GET ready`` on 127.0.0.1:``port`` answers 200.

    Raises:
        RuntimeError: the process exited (its stderr's tail in the message), or it was not
            ready within ``timeout_s`` seconds (it is killed).
    """
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{ready}", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server not ready within {timeout_s:.0f} s: {' '.join(cmd)}")


def batch_stats(port: int) -> tuple[float, float]:
    """(model calls, texts) so far, from /metrics' xdpx_batch_size histogram."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    count = float(re.search(r"^xdpx_batch_size_count (\S+)$", text, re.M).group(1))
    total = float(re.search(r"^xdpx_batch_size_sum (\S+)$", text, re.M).group(1))
    return count, total


def text_body(item: Any) -> dict:
    """The ``POST /predict`` body of one item: ``{"texts": [t]}`` for a text, ``{"pairs":
    [[a, b]]}`` for a ``(text, text2)`` pair (what the server takes for a pair model)."""
    return {"pairs": [list(item)]} if isinstance(item, tuple) else {"texts": [item]}


async def drive(port: int, texts: list[Any], concurrency: int, requests: int) -> dict:
    """``requests`` POSTs of one text (or ``(text, text2)`` pair: :func:`text_body`) each
    from ``concurrency`` clients, each on its own keep-alive connection; client-side
    latencies.

    The clients are plain asyncio streams writing HTTP/1.1 requests and reading
    ``Content-Length`` bodies: they share the server's 2 cores, and aiohttp's client spent
    so much CPU that it, not the server, set the pace (1,329 against 3,466 req/s at
    concurrency 64 with batching; httpx's async pool: 161 req/s).
    """
    bodies = [orjson.dumps(text_body(t)) for t in texts]
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


def measure(
    port: int, texts: list[str], concurrency: int, requests: int, label: str, xdpx: bool = True
) -> dict:
    """One :func:`drive` at ``concurrency``, with the mean texts per model call it caused
    (``xdpx=False``: a server without xdpx's ``/metrics``; ``mean_batch`` is then 1.0, one
    text per request and call)."""
    before = batch_stats(port) if xdpx else (0.0, 0.0)
    row = asyncio.run(drive(port, texts, concurrency, requests))
    after = batch_stats(port) if xdpx else (1.0, 1.0)
    calls, done = after[0] - before[0], after[1] - before[1]
    row["mean_batch"] = done / calls if calls else 0.0
    row["server"] = label
    print(
        f"{label:14s} c={concurrency:3d}  {row['throughput_rps']:7.0f} req/s  p50 {row['p50_ms']:7.2f} ms  "
        f"p99 {row['p99_ms']:7.2f} ms  mean batch {row['mean_batch']:5.1f}  codes {row['codes']}",
        flush=True,
    )
    return row


def median_row(rows: list[dict]) -> dict:
    """The row of median throughput (its own latencies and batch size), for an odd count;
    the lower middle one otherwise."""
    return sorted(rows, key=lambda r: r["throughput_rps"])[(len(rows) - 1) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--run", default="models/default", help="run dir to serve (make demo first)"
    )
    parser.add_argument("--texts", default="data/raw/test.tsv", help="TSV with a 'text' column")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--requests", type=int, default=2000, help="requests per concurrency")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument(
        "--max-wait-ms", type=float, help="the servers' --max-wait-ms (default: the server's)"
    )
    parser.add_argument("--backend", default="auto", help="auto, onnx or eager")
    parser.add_argument(
        "--inline-ms", type=float, help="the servers' --inline-ms (default: the server's)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="the servers' onnxruntime/torch threads (default: the library's)",
    )
    parser.add_argument(
        "--instances", type=int, help="the servers' --instances (default: the server's)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="measurements per concurrency and server"
    )
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args()
    os.chdir(ROOT)
    with open(args.texts, encoding="utf-8", newline="") as f:
        texts = [r["text"] for r in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    print(f"serving {args.run}: {len(texts)} test texts, {args.requests} requests per concurrency")
    servers = {}
    common = ["--max-queue", "100000", "--backend", args.backend]
    if args.threads:
        common += ["--threads", str(args.threads)]
    if args.instances:
        common += ["--instances", str(args.instances)]
    if args.max_wait_ms is not None:
        common += ["--max-wait-ms", str(args.max_wait_ms)]
    if args.inline_ms is not None:
        common += ["--inline-ms", str(args.inline_ms)]
    labels = {"batching": f"batching {args.max_batch_size}", "off": "batching off"}
    try:
        for key, batch in (("batching", args.max_batch_size), ("off", 1)):
            port = free_port()
            servers[key] = (port, start_server(args.run, port, ["--max-batch-size", str(batch), *common]))  # fmt: skip
            asyncio.run(drive(port, texts, 8, 200))  # warm-up
        raw: dict[str, dict[int, list[dict]]] = {
            k: {c: [] for c in args.concurrency} for k in servers
        }
        for r in range(args.repeats):
            for c in args.concurrency:
                for key in ("batching", "off") if r % 2 == 0 else ("off", "batching"):
                    raw[key][c].append(measure(servers[key][0], texts, c, args.requests, labels[key]))  # fmt: skip
    finally:
        for _, proc in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
    print(
        f"\nmedians of {args.repeats} | batching req/s | off req/s | ratio (range)     | p99 batching ms | p99 off ms | mean batch"  # fmt: skip
    )
    on, off = [], []
    for c in args.concurrency:
        ratios = sorted(a["throughput_rps"] / b["throughput_rps"] for a, b in zip(raw["batching"][c], raw["off"][c], strict=True))  # fmt: skip
        a, b = median_row(raw["batching"][c]), median_row(raw["off"][c])
        a = {**a, "ratio_vs_off": statistics.median(ratios), "ratios_vs_off": ratios}
        on.append(a)
        off.append(b)
        print(
            f"c={c:<13d} | {a['throughput_rps']:14.0f} | {b['throughput_rps']:9.0f} | "
            f"{a['ratio_vs_off']:5.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f}) | {a['p99_ms']:15.2f} | "
            f"{b['p99_ms']:10.2f} | {a['mean_batch']:10.1f}"
        )
    if args.json:
        from xdpx.serving.server import ServeConfig

        default = ServeConfig()
        settings = {
            "backend": args.backend,
            "max_batch_size": args.max_batch_size,
            "max_wait_ms": default.max_wait_ms if args.max_wait_ms is None else args.max_wait_ms,
            "inline_ms": default.inline_ms if args.inline_ms is None else args.inline_ms,
            "threads": args.threads,
            "instances": args.instances,
            "requests": args.requests,
        }
        out = {
            "repeats": args.repeats,
            "settings": settings,
            "batching": on,
            "off": off,
            "raw": raw,
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
