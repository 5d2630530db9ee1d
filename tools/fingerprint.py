"""Fingerprints of training runs: the guard that a refactor changed no number.

Trains the fixed configs of :data:`CONFIGS` on a fixed subset of the built-in corpus
(fetch limit 1200, seed 1; prepro max_len 128, as the tests' ``real_subset``) and prints,
per config, the sha256 of ``best/model.safetensors``, of ``last/model.safetensors`` and of
``valid.log.tsv``, plus ``train.log.tsv`` without its wall-time column.

    python tools/fingerprint.py                       # print the fingerprints as JSON
    python tools/fingerprint.py --write tests/data/fingerprints.json

Weights are bit-identical on one machine (same CPU, same torch), not across CPUs:
``tests/test_fingerprint.py`` compares the logged numbers with the recorded ones within
1e-4 on any machine, the hashes where the recorded ``machine`` matches, and on every
machine a second run of each config in the same session bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import platform
import sys
import tempfile
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: name -> train overrides (threads 1: the same kernels whatever the machine's core count)
CONFIGS: dict[str, dict] = {
    "ngram_lr": {"max_epoch": 2, "threads": 1, "eval_interval": 10},
    "textcnn_update_freq2": {
        "model": "textcnn",
        "update_freq": 2,
        "batch_size": 16,
        "max_update": 24,
        "eval_interval": 8,
        "threads": 1,
    },
}


def machine() -> str:
    """What decides bit-identity: the CPU model, torch's version and its CPU capability."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} | torch {torch.__version__} | {torch.backends.cpu.get_cpu_capability()}"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fingerprint(run_dir: Path) -> dict:
    """Hashes and logged numbers of one run directory."""
    train_log = pd.read_csv(run_dir / "train.log.tsv", sep="\t")
    train_log = train_log.drop(columns=["wall_time"], errors="ignore")  # runs before time.log.tsv
    buf = io.StringIO()
    train_log.to_csv(buf, sep="\t", index=False)
    valid_log = (run_dir / "valid.log.tsv").read_bytes()
    return {
        "best_weights": _sha((run_dir / "best" / "model.safetensors").read_bytes()),
        "last_weights": _sha((run_dir / "last" / "model.safetensors").read_bytes()),
        "valid_log": _sha(valid_log),
        "train_log": _sha(buf.getvalue().encode()),
        "valid_rows": pd.read_csv(io.BytesIO(valid_log), sep="\t").to_dict("records"),
        "train_loss": [float(x) for x in train_log["loss"]],
    }


def prepare(root: Path) -> str:
    """The fixed subset: fetch (limit 1200, seed 1) + prepro (max_len 128)."""
    from stages import fetch, prepro
    from xdpx.config import FetchConfig, PreproConfig

    raw, prepared = str(root / "raw"), str(root / "prepared")
    fetch.run(FetchConfig(out_dir=raw, limit=1200, seed=1))
    prepro.run(PreproConfig(data_source=raw, data_dir=prepared, max_len=128))
    return prepared


def run_all(root: Path, names: list[str] | None = None, prepared: str | None = None) -> dict:
    """Train each config under ``root`` (on ``prepared``, else on :func:`prepare`'s subset
    made there) and return ``{machine, prepared, runs: {name: fingerprint}}``."""
    from stages import train
    from xdpx.config import TrainConfig

    prepared = prepared or prepare(root)
    runs = {}
    for name in names or list(CONFIGS):
        save_dir = root / "runs" / name
        train.run(TrainConfig(data_dir=prepared, save_dir=str(save_dir), **CONFIGS[name]))
        runs[name] = fingerprint(save_dir)
    return {"machine": machine(), "configs": CONFIGS, "prepared": prepared, "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", help="write the JSON here instead of printing it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = run_all(Path(tmp))
    text = json.dumps(result, indent=1) + "\n"
    if args.write:
        Path(args.write).write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
