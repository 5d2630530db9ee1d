"""Model checkpoints: safetensors weights + config.json + the data assets they need.

A checkpoint directory holds::

    model.safetensors   weights (safetensors, no pickle)
    config.json         {"model": name, "model_config": {...}, "update": .., "epoch": .., "samples_seen": .., "valid": {...}}
    vocab.txt, target_map.txt, meta.json   copies from the prepared data dir

so evaluate/predict/export/serve can rebuild the model and the exact
preprocessing from the directory alone. ``<run_dir>/<best>`` and
``<run_dir>/<last>`` are aliases of ``<run_dir>/best`` and ``<run_dir>/last``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from xdpx import io
from xdpx.models import build_model

__all__ = [
    "ASSETS",
    "CheckpointError",
    "Checkpoint",
    "resolve_checkpoint",
    "save_checkpoint",
    "load_checkpoint",
]

#: Files copied from the prepared data dir into every checkpoint.
ASSETS = ("vocab.txt", "target_map.txt", "meta.json")
ALIASES = {"<best>": "best", "<last>": "last"}


class CheckpointError(FileNotFoundError):
    """A checkpoint path or alias that does not resolve to a complete checkpoint."""


@dataclass
class Checkpoint:
    """A loaded checkpoint: the model in eval mode plus its saved config."""

    path: str
    model: nn.Module
    name: str
    model_config: dict[str, Any]
    info: dict[str, Any]


def resolve_checkpoint(path: str) -> str:
    """Resolve ``<run>/<best>`` / ``<run>/<last>`` aliases and check the directory is complete.

    Raises:
        CheckpointError: the directory or one of its files is missing.
    """
    path = str(path).rstrip("/")
    head, _, tail = path.rpartition("/")
    if tail in ALIASES:
        path = io.join(head, ALIASES[tail]) if head else ALIASES[tail]
    for name in ("model.safetensors", "config.json"):
        if not io.exists(io.join(path, name)):
            raise CheckpointError(f"checkpoint {path!r} is incomplete or missing: no {name}")
    return path


def save_checkpoint(
    path: str,
    model: nn.Module,
    name: str,
    model_config: dict[str, Any],
    info: dict[str, Any],
    assets_dir: str,
) -> None:
    """Write a checkpoint directory atomically (temp sibling, then replace).

    Args:
        path: destination directory (replaced if it exists).
        model: the module whose ``state_dict`` is saved (unwrap DDP first).
        name: key of the model in ``xdpx.models.MODELS``.
        model_config: constructor arguments of the model.
        info: training state to record (update, epoch, samples_seen, valid metrics).
        assets_dir: prepared data dir whose vocab/target map/meta are copied.
    """
    tmp = io.tmp_sibling(path)
    try:
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        io.write_bytes(io.join(tmp, "model.safetensors"), st_save(state))
        config = {"model": name, "model_config": model_config, **info}
        io.write_text(io.join(tmp, "config.json"), json.dumps(config, indent=2, ensure_ascii=False))
        for asset in ASSETS:
            src = io.join(assets_dir, asset)
            if io.exists(src):
                io.write_bytes(io.join(tmp, asset), io.read_bytes(src))
        io.replace_dir(tmp, path)
    except BaseException:
        io.rm(tmp, recursive=True)
        raise


def load_checkpoint(path: str, device: str | torch.device = "cpu") -> Checkpoint:
    """Rebuild the model of a checkpoint directory (or alias) in eval mode.

    Raises:
        CheckpointError: missing/incomplete directory, or weights that do not
            match the saved config (missing or unexpected keys are listed).
    """
    path = resolve_checkpoint(path)
    config = json.loads(io.read_text(io.join(path, "config.json")))
    model = build_model(config["model"], config["model_config"])
    try:
        state = st_load(io.read_bytes(io.join(path, "model.safetensors")))
    except Exception as e:  # safetensors raises its own error types on corrupt files
        raise CheckpointError(f"{path}/model.safetensors is corrupt: {e}") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match model {config['model']!r}: "
            f"missing keys {sorted(missing)}, unexpected keys {sorted(unexpected)}"
        )
    model.to(device).eval()
    info = {k: v for k, v in config.items() if k not in ("model", "model_config")}
    return Checkpoint(
        path=path, model=model, name=config["model"], model_config=config["model_config"], info=info
    )
