"""Serving an export from an environment without torch (``pip install 'xdpx[serve]'``)
against the full install: install size, the server's start-up seconds and memory, and the
same answers.

The script

1. makes (or reuses) a virtual environment ``--venv`` with only ``xdpx[serve]`` installed
   (editable, from this checkout: ``uv pip install --compile-bytecode -e '.[serve]'``, or
   pip when uv is missing; byte-compiled, as ``make install`` compiles the full one) and checks that ``import torch`` fails there;
2. measures each environment's ``site-packages`` (bytes on disk, distributions);
3. starts ``xdpx serve RUN --http`` from each environment ``--repeats`` times, alternating
   (slim, full, full, slim, ...), and times the seconds from the process start until
   ``GET /v2/health/ready`` answers 200 (polled every 20 ms), with the server's peak RSS
   (``VmHWM``) once ready;
4. posts the same texts to each server and requires the same labels and probabilities;
5. with ``--before REV``, does the same for the code of git revision ``REV`` (a temporary
   worktree, the full environment): the server as it was against today's.

Numbers are this machine's (2 cores, shared); the report records the settings.

Examples::

    python bench/serve_without_torch.py                      # models/default, 3 repeats
    python bench/serve_without_torch.py --run models/default --repeats 5 --json reports/serve_without_torch.json
    python bench/serve_without_torch.py --before 9bdfa39     # and the server as it was (it imported torch)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["质量很好，下次还来", "太差了，不会再来", "房间一般，早餐不错"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_slim(venv: Path) -> Path:
    """The slim environment's python: ``venv`` with ``xdpx[serve]`` (editable) only."""
    python = venv / "bin" / "python"
    if not python.exists():
        uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
        if Path(uv).exists():
            subprocess.run([uv, "venv", "-q", str(venv), "--python", sys.executable], check=True)  # fmt: skip
            subprocess.run([uv, "pip", "install", "-q", "--compile-bytecode", "--python", str(python), "-e", f"{ROOT}[serve]"], check=True)  # fmt: skip
        else:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", f"{ROOT}[serve]"], check=True)  # fmt: skip
            # bytecode, as make install compiles the full one (PYTHONDONTWRITEBYTECODE=1 would
            # otherwise make every start compile its imports)
            subprocess.run([str(python), "-m", "compileall", "-qq", "-j", "0", site_packages(str(python))["path"]], check=False)  # fmt: skip
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        raise SystemExit(f"{venv} has torch installed: not a slim environment")
    return python


def site_packages(python: str) -> dict[str, float]:
    """Bytes on disk under the environment's ``purelib`` and its distribution count."""
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True)  # fmt: skip
    root = Path(out.stdout.strip())
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())
    dists = sum(1 for p in root.iterdir() if p.name.endswith(".dist-info"))
    return {"mb": size / 2**20, "distributions": dists, "path": str(root)}


def start_once(python: str, run: str, src: Path = ROOT) -> dict:
    """One server start: seconds to ready, peak RSS once ready, the answers to :data:`TEXTS`
    (``src``: the checkout whose code runs, first on ``PYTHONPATH``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [python, "-m", "xdpx.cli", "serve", str(ROOT / run), "--http", "--port", str(port), "--threads", "1"]  # fmt: skip
    start = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{' '.join(cmd)} exited: {proc.stderr.read()[-2000:]}")
            if time.perf_counter() - start > 120:
                raise SystemExit(f"{' '.join(cmd)}: not ready within 120 s")
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        ready = time.perf_counter() - start
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss = next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM")), float("nan"))  # fmt: skip
        answer = httpx.post(f"{url}/predict", json={"texts": TEXTS}, timeout=30).json()
        return {"ready_s": ready, "peak_rss_mb": rss, "labels": answer["labels"], "probabilities": answer["probabilities"]}  # fmt: skip
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("Examples::")[1])  # fmt: skip
    ap.add_argument("--run", default="models/default", help="A run or export directory (default: the demo's).")  # fmt: skip
    ap.add_argument("--venv", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "xdpx-serve-venv"), help="The slim environment (made when missing).")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="reports/serve_without_torch.json")
    ap.add_argument("--before", default=None, metavar="REV", help="Also start the server of git revision REV (a worktree, the full environment): today's against an earlier one.")  # fmt: skip
    args = ap.parse_args(argv)
    slim = str(make_slim(Path(args.venv)))
    envs = {"serve": slim, "full": sys.executable}
    srcs = {"serve": ROOT, "full": ROOT}
    worktree = None
    if args.before:
        worktree = Path(tempfile.mkdtemp(prefix="xdpx-before-")) / "src"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(worktree), args.before], cwd=ROOT, check=True)  # fmt: skip
        envs["before"], srcs["before"] = sys.executable, worktree
    report: dict = {"run": args.run, "repeats": args.repeats, "cpus": os.cpu_count(), "before": args.before, "envs": {}}  # fmt: skip
    for name, python in envs.items():
        report["envs"][name] = {"python": python, "site_packages": site_packages(python), "starts": []}  # fmt: skip
    order = list(envs)
    try:
        for k in range(args.repeats):
            for name in order if k % 2 == 0 else order[::-1]:
                got = start_once(envs[name], args.run, srcs[name])
                report["envs"][name]["starts"].append(got)
                print(f"[{k + 1}/{args.repeats}] {name:6} ready in {got['ready_s']:.2f} s, peak RSS {got['peak_rss_mb']:.0f} MB")  # fmt: skip
    finally:
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)  # fmt: skip
    first = {name: e["starts"][0] for name, e in report["envs"].items()}
    same = all(
        a["labels"] == first["full"]["labels"]
        and all(
            abs(x - y) < 1e-9
            for ra, rb in zip(a["probabilities"], first["full"]["probabilities"], strict=True)
            for x, y in zip(ra, rb, strict=True)
        )  # fmt: skip
        for a in first.values()
    )
    report["same_answers"] = same
    for e in report["envs"].values():
        e["ready_s_median"] = statistics.median(s["ready_s"] for s in e["starts"])
        e["peak_rss_mb_median"] = statistics.median(s["peak_rss_mb"] for s in e["starts"])
    s, f = report["envs"]["serve"], report["envs"]["full"]
    report["ratios"] = {
        "install_mb": s["site_packages"]["mb"] / f["site_packages"]["mb"],
        "ready_s": s["ready_s_median"] / f["ready_s_median"],
        "peak_rss_mb": s["peak_rss_mb_median"] / f["peak_rss_mb_median"],
    }
    if "before" in report["envs"]:
        b = report["envs"]["before"]
        report["ratios_vs_before"] = {n: {"ready_s": e["ready_s_median"] / b["ready_s_median"], "peak_rss_mb": e["peak_rss_mb_median"] / b["peak_rss_mb_median"]} for n, e in report["envs"].items() if n != "before"}  # fmt: skip
    print(f"\n{'env':6} | {'site-packages MB':>16} | {'distributions':>13} | {'ready s (median)':>16} | {'peak RSS MB':>11}")  # fmt: skip
    for name, e in report["envs"].items():
        print(f"{name:6} | {e['site_packages']['mb']:16.0f} | {e['site_packages']['distributions']:13d} | {e['ready_s_median']:16.2f} | {e['peak_rss_mb_median']:11.0f}")  # fmt: skip
    r = report["ratios"]
    print(f"serve / full: install {r['install_mb']:.2f}x, start-up {r['ready_s']:.2f}x, memory {r['peak_rss_mb']:.2f}x; same answers: {same}")  # fmt: skip
    for n, v in report.get("ratios_vs_before", {}).items():
        print(f"{n} / before ({args.before}): start-up {v['ready_s']:.2f}x, memory {v['peak_rss_mb']:.2f}x")  # fmt: skip
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.json + ".tmp")
        tmp.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        tmp.replace(args.json)
        print(f"wrote {args.json}")
    if not same:
        raise SystemExit("the two environments answered differently")
    return report


if __name__ == "__main__":
    main()
