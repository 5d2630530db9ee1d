"""A run's reproducibility bundle, beside its checkpoints: ``params.yaml`` (the resolved train
section and the prepro config), ``starter.yaml`` (the non-default train keys), ``repro.json``
(library versions, world size, resumed_from) and ``result.json`` (what the run produced) are
DVC outs; ``run.json`` (command, git state, host, start and end) holds the facts of the
machine and the moment and is not (``xdpx.rundir``)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from typing import Any

import torch

from xdpx import io
from xdpx.config import TrainConfig, dump_yaml, non_defaults
from xdpx.data import PreparedMeta
from xdpx.models import default_learning_rate
from xdpx.rundir import RunDir

__all__ = ["finish_run_info", "write_bundle"]


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def write_bundle(cfg: TrainConfig, meta: PreparedMeta, resumed_from: str | None = None) -> None:
    """Reproducibility bundle: resolved params, non-default starter config, code and library versions.

    Writes ``params.yaml`` (the resolved train section + the prepro config
    from meta.json), ``starter.yaml`` (only non-default train keys; usable as
    ``--params``), ``repro.json`` (python/torch/transformers versions, world size,
    resumed_from) and ``run.json`` (command line, working directory, git commit and dirty
    diff, host, start time in UTC: the facts that change with the machine and the moment,
    kept out of the DVC outs; :func:`finish_run_info` adds the end).
    """
    import transformers

    run_dir = RunDir(cfg.save_dir)
    io.write_text(run_dir.params, dump_yaml({"train": cfg, "prepro": meta.prepro}))
    starter = non_defaults(cfg)
    if starter.get("learning_rate") == default_learning_rate(cfg.model):
        del starter["learning_rate"]  # what learning_rate: null means for this model
    io.write_text(run_dir.starter, dump_yaml({"train": starter}))
    repro = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "resumed_from": resumed_from,
    }
    io.write_text(run_dir.repro, json.dumps(repro, indent=2))
    info = {
        "command": sys.argv,
        "cwd": os.getcwd(),
        "git_commit": _git("rev-parse", "HEAD").strip(),
        "git_dirty_diff": _git("diff", "HEAD"),
        "host": platform.node(),
        "started_utc": _utc_now(),
    }
    io.write_text(run_dir.run_info, json.dumps(info, indent=2))


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def finish_run_info(cfg: TrainConfig, result: Any) -> None:
    """Write ``result.json`` (what the run produced: a ``xdpx.train.state.TrainResult``,
    without its wall time) and add the end time and ``wall_time`` (seconds) to ``run.json``."""
    run_dir = RunDir(cfg.save_dir)
    pure = {k: v for k, v in result.__dict__.items() if k != "wall_time"}
    io.write_text(run_dir.result, json.dumps(pure, indent=2))
    info = json.loads(io.read_text(run_dir.run_info)) if io.exists(run_dir.run_info) else {}
    info.update(finished_utc=_utc_now(), wall_time=result.wall_time)
    io.write_text(run_dir.run_info, json.dumps(info, indent=2))
