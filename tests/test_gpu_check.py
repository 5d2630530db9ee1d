"""bench/gpu_check.py: which tests it runs as CUDA tests, and its --cpu-smoke run end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_check import find_cuda_tests  # noqa: E402


@pytest.mark.unit
def test_finds_every_test_that_uses_cuda():
    ids = find_cuda_tests()
    assert {
        "tests/test_precision.py::test_fp16_gradscaler_starts_at_128_and_logs_the_scale",
        "tests/test_precision.py::test_fp16_min_loss_scale_stops_with_clear_error",
        "tests/test_precision.py::test_auto_ga_on_real_cuda_oom",
        "tests/test_freelb.py::test_freelb_fp16_on_cuda",
    } <= set(ids)
    # CPU tests in the same files, and the simulated OOM of test_trainer.py, are not among them
    assert "tests/test_precision.py::test_bf16_textcnn_within_one_point_of_fp32_on_cpu" not in ids
    assert not any("test_trainer.py" in i or "test_gpu_check.py" in i for i in ids)


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


@pytest.mark.e2e
def test_cpu_smoke_writes_a_report_with_real_numbers(tmp_path):
    out = tmp_path / "gpu_check.json"
    cmd = [sys.executable, "bench/gpu_check.py", "--cpu-smoke", "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "cpu-smoke" and report["errors"] == []
    assert report["device"]["torch"] and report["device"]["name"]

    fp32 = report["finetune"]["fp32"]
    for side in ("hf", "xdpx"):
        assert (
            _finite(fp32[f"{side}_window_samples_per_s"])
            and fp32[f"{side}_window_samples_per_s"] > 0
        )
        assert _finite(fp32[f"{side}_loss"])
        assert 0.0 <= fp32[f"{side}_dev_accuracy"] <= 1.0
    assert _finite(fp32["window_ratio"]) and fp32["window_ratio"] > 0
    assert report["finetune"]["config"]["dev_samples"] > 0

    scale = report["loss_scale"]
    assert scale["ok"], scale["problems"]
    injected = [u for u in scale["updates"] if u["injected"]]
    assert len(injected) == 1 and injected[0]["scale_after"] == injected[0]["scale_before"] / 2

    tests = report["cuda_tests"]
    assert len(tests["node_ids"]) >= 4 and tests["returncode"] == 0
    assert tests["skipped"] == len(tests["node_ids"]) == len(tests["tests"])  # GPU hidden: all skip
    assert all(t["message"] for t in tests["tests"])  # each skip says why

    skipped = {s["what"]: s["reason"] for s in report["skipped"]}
    assert {"auto_ga", "ddp"} <= set(skipped) and all(skipped.values())
    assert "loss_scale: ok" in done.stdout and "skipped ddp:" in done.stdout
