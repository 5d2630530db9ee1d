"""Model checkpoints: safetensors weights + config.json + the data assets they need.

A checkpoint directory holds::

    model.safetensors   weights (safetensors, no pickle)
    config.json         {"model": name, "model_config": {...}, "update": .., "epoch": .., "samples_seen": .., "valid": {...}}
    vocab.txt, target_map.txt, meta.json   copies from the prepared data dir

    manifest.json       size and sha256 of every other file (checked on load)

so evaluate/predict/export/serve can rebuild the model and the exact
preprocessing from the directory alone. ``<run_dir>/<best>`` and
``<run_dir>/<last>`` are aliases of ``<run_dir>/best`` and ``<run_dir>/last``.

With ``train.save_full_checkpoint`` the ``last`` directory also holds the
training state a bit-exact resume needs (``TRAINING_FILES``)::

    trainer_state.json  epoch, position in the epoch, update, samples seen, best score,
                        log rows, python/numpy RNG states
    optimizer.pt, scheduler.pt, scaler.pt, rng.pt   state dicts / torch+CUDA RNG states
                        (plain tensors and containers: ``torch.load(weights_only=True)``)

A directory is written beside its destination and renamed into place, so a
crash while saving leaves the previous complete checkpoint. On an object store
(``oss://``, ``s3://``) the directory is staged locally and uploaded with
``manifest.json`` last (``xdpx.io.replace_dir``): a remote checkpoint counts only
once its manifest is there, and every file is checked against it on load.
"""

from __future__ import annotations

import hashlib
import io as _bytes_io
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as st_load, save as st_save
from torch import nn

from xdpx import io, preflight
from xdpx.config import ConfigError, StageArgs, load_stage_configs
from xdpx.data import META_FILE, TARGET_MAP_FILE, VOCAB_FILE, PreparedMeta
from xdpx.models import build_model, check_model_fits_data
from xdpx.rundir import ALIASES, LAST, RunDir, unalias

_log = logging.getLogger("xdpx.train")

__all__ = [
    "ASSETS",
    "CheckpointError",
    "Checkpoint",
    "resolve_checkpoint",
    "save_checkpoint",
    "load_checkpoint",
    "verify_checkpoint",
    "load_training_state",
    "find_resumable",
    "TRAINING_FILES",
    "resume_path",
]

#: Files copied from the prepared data dir into every checkpoint.
ASSETS = (VOCAB_FILE, TARGET_MAP_FILE, META_FILE)
MANIFEST = "manifest.json"
#: Extra files of a full checkpoint (``train.save_full_checkpoint``).
TRAINING_FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt", "scaler.pt", "rng.pt")


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
    required = ("model.safetensors", "config.json")
    if io.is_remote(path):  # the manifest is uploaded last: without it the upload did not finish
        required += (MANIFEST,)
    for name in required:
        if not io.exists(io.join(path, name)):
            raise CheckpointError(f"checkpoint {path!r} is incomplete or missing: no {name}")
    return path


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` on the CPU, contiguous, with a private copy of every tensor that shares
    memory with an earlier one (tied weights, e.g. a masked-LM decoder and the word
    embeddings: safetensors refuses shared tensors; loading assigns both names alike)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in state.items():
        t = v.detach().cpu().contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[k] = t.clone() if ptr in seen and t.numel() else t
        seen.add(ptr)
    return out


def save_checkpoint(
    path: str,
    model: nn.Module,
    name: str,
    model_config: dict[str, Any],
    info: dict[str, Any],
    assets_dir: str,
    extra_files: dict[str, bytes] | None = None,
) -> None:
    """Write a checkpoint directory atomically (temp sibling, then replace).

    Args:
        path: destination directory (replaced if it exists).
        model: the module whose ``state_dict`` is saved (unwrap DDP first).
        name: key of the model in ``xdpx.models.MODELS``.
        model_config: constructor arguments of the model.
        info: training state to record (update, epoch, samples_seen, valid metrics).
        assets_dir: prepared data dir whose vocab/target map/meta are copied.
        extra_files: more files (name -> bytes), e.g. the ``TRAINING_FILES`` of a full checkpoint.
    """
    tmp = io.tmp_sibling(path)
    try:
        state = _unshared(model.state_dict())
        config = {"model": name, "model_config": model_config, **info}
        files = {
            "model.safetensors": st_save(state),
            "config.json": json.dumps(config, indent=2, ensure_ascii=False).encode(),
        }
        for asset in ASSETS:
            src = io.join(assets_dir, asset)
            if io.exists(src):
                files[asset] = io.read_bytes(src)
        files.update(extra_files or {})
        manifest = {
            n: {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()} for n, b in files.items()
        }
        files[MANIFEST] = json.dumps(manifest, indent=2).encode()
        for n, b in files.items():
            io.write_bytes(io.join(tmp, n), b)
        io.replace_dir(tmp, path, marker=MANIFEST)
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
    verify_checkpoint(path)
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


def verify_checkpoint(path: str) -> None:
    """Check every file listed in the checkpoint's ``manifest.json`` (size, then sha256).

    Checkpoints written before manifests existed pass unchecked.

    Raises:
        CheckpointError: a listed file is missing, truncated or corrupt (names the file).
    """
    manifest_path = io.join(path, MANIFEST)
    if not io.exists(manifest_path):
        return
    try:
        manifest = json.loads(io.read_text(manifest_path))
    except ValueError as e:
        raise CheckpointError(f"{manifest_path} is corrupt: {e}") from None
    for name, entry in manifest.items():
        file = io.join(path, name)
        if not io.exists(file):
            raise CheckpointError(f"checkpoint {path!r} is incomplete: {name} is missing")
        data = io.read_bytes(file)
        if len(data) != entry["bytes"]:
            raise CheckpointError(
                f"{file} is truncated or corrupt: {len(data)} bytes, the manifest says {entry['bytes']}"
            )
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise CheckpointError(f"{file} is corrupt: sha256 differs from the manifest")


def find_resumable(run_dir: str) -> str | None:
    """The newest full checkpoint of a run directory, or None if it has none.

    ``<run_dir>/last`` normally (on an object store only with its ``manifest.json``,
    uploaded last); if a crash hit the instant between the two renames of a local
    atomic replace, the complete previous ``last.old-*`` copy.
    """
    last = RunDir(run_dir).last
    markers = ("trainer_state.json", MANIFEST) if io.is_remote(run_dir) else ("trainer_state.json",)
    if all(io.exists(io.join(last, name)) for name in markers):
        return last
    if io.is_local(run_dir) and os.path.isdir(run_dir):
        olds = sorted(
            (e for e in os.scandir(run_dir) if e.name.startswith(f"{LAST}.old-") and e.is_dir()),
            key=lambda e: e.stat().st_mtime,
            reverse=True,
        )
        for entry in olds:
            if os.path.exists(os.path.join(entry.path, "trainer_state.json")):
                return entry.path
    return None


def remove_partial_saves(run_dir: str) -> list[str]:
    """Delete the temporary directories of saves that were killed half-way (local run dirs).

    A checkpoint is written into a hidden sibling (``.last.tmp-<tag>``, ``xdpx.io.tmp_sibling``)
    and renamed into place; a process killed during the save leaves that sibling behind. A
    resumed run calls this before training. Returns the names removed. On an object store
    the staging directories are local (``xdpx.io.cache_dir``) and nothing is left in the run.
    """
    if not (io.is_local(run_dir) and os.path.isdir(run_dir)):
        return []
    removed = []
    for entry in os.scandir(run_dir):
        if entry.name.startswith(".") and ".tmp-" in entry.name and entry.is_dir():
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return sorted(removed)


def load_training_state(path: str) -> dict[str, Any]:
    """Load a full checkpoint's training state (see the module docstring).

    Tensors are read with ``safetensors`` / ``torch.load(weights_only=True)``:
    no pickled code runs.

    Returns:
        ``{"trainer_state": dict, "optimizer": dict, "scheduler": dict, "scaler": dict,
        "rng": dict, "model": {name: tensor}}``.

    Raises:
        CheckpointError: a file is missing (the checkpoint was saved without
            ``save_full_checkpoint``), truncated or corrupt.
    """
    path = resolve_checkpoint(path)
    missing = [n for n in TRAINING_FILES if not io.exists(io.join(path, n))]
    if missing:
        raise CheckpointError(
            f"{path} is not a full checkpoint (no {', '.join(missing)}); "
            "it was saved without train.save_full_checkpoint=true"
        )
    verify_checkpoint(path)
    out: dict[str, Any] = {}
    for name in TRAINING_FILES:
        file = io.join(path, name)
        try:
            if name.endswith(".json"):
                out["trainer_state"] = json.loads(io.read_text(file))
            else:
                out[name[:-3]] = torch.load(
                    _bytes_io.BytesIO(io.read_bytes(file)), weights_only=True, map_location="cpu"
                )
        except Exception as e:  # torch/json raise many types on truncated input
            raise CheckpointError(
                f"{file} is truncated or corrupt: {type(e).__name__}: {e}"
            ) from None
    try:
        out["model"] = st_load(io.read_bytes(io.join(path, "model.safetensors")))
    except Exception as e:
        raise CheckpointError(f"{path}/model.safetensors is corrupt: {e}") from None
    return out


def check_reader(section: str, cfg: Any) -> Any:
    """Pre-flight of a stage that reads a checkpoint (evaluate, predict, export).

    The checkpoint resolves to a complete one, its inputs exist, its model fits the
    data, and its outputs on an object store answer (``xdpx.preflight``). Returns ``cfg``.

    Raises:
        CheckpointError: the path/alias does not resolve to a complete checkpoint.
        FileNotFoundError: ``data_file`` / prepared ``data_dir`` missing.
        ValueError: the checkpoint's model does not fit the data, or is a masked LM.
        RemoteIOError: an output's object store did not answer (after retries).
    """
    path = resolve_checkpoint(cfg.checkpoint)
    model = json.loads(io.read_text(io.join(path, "config.json")))["model"]
    if model == "hf_mlm":
        run = path.rstrip("/").rpartition("/")[0] or "."
        raise ValueError(
            f"{section}.checkpoint {path} is a masked language model (train.task=mlm): it "
            f"predicts tokens, not labels; fine-tune it first (train.model=hf_classifier, "
            f"train.pretrained_model={run}/pretrained) and {section} that run"
        )
    if section == "predict":
        preflight.must_exist(section, "data_file", cfg.data_file)
        outputs: tuple[str, ...] = (cfg.out_file,)
    else:
        preflight.must_exist(
            section, "data_dir", PreparedMeta.path_in(cfg.data_dir), "run prepro first"
        )
        check_model_fits_data(model, cfg.data_dir, f"{section}.checkpoint {path}: model")
        if section == "export" and cfg.quantize and PreparedMeta.read(path).prepro.get("label_type") == "score":  # fmt: skip
            raise ValueError(
                f"export.quantize=int8 reports a classifier's accuracy change; {path} is a "
                "regression model (prepro.label_type=score): export it with quantize=null"
            )
        outputs = (
            (cfg.metrics_file, cfg.confusion_png, cfg.curve_png)
            if section == "evaluate"
            else (cfg.out_dir,)
        )
    for out in outputs:
        preflight.reachable(out)
    return cfg


def resume_path(cfg: Any) -> str | None:
    """The full checkpoint ``train`` resumes from (``cfg``: the ``train`` section's
    ``resume_from``, ``resume`` and ``save_dir``), or None to start fresh; with ``resume``,
    the partial saves a killed run left are removed.

    Raises:
        CheckpointError: ``resume_from`` given but not a full checkpoint, or
            ``resume`` with a save_dir that holds a run but no full checkpoint.
    """
    if cfg.resume_from:
        return resolve_checkpoint(cfg.resume_from)
    if not cfg.resume:
        return None
    path = find_resumable(cfg.save_dir)
    run = RunDir(cfg.save_dir)
    if path is None and run.markers():
        remote = io.is_remote(cfg.save_dir)
        if not io.exists(run.last):
            raise CheckpointError(
                f"train.resume: {cfg.save_dir} holds a run that never saved a checkpoint "
                f"(no {LAST}/: it stopped before its first evaluation or save_interval); "
                "nothing to resume, set train.overwrite=true to start it over"
            )
        raise CheckpointError(
            f"train.resume: {cfg.save_dir} holds a run but no full checkpoint "
            f"({LAST}/trainer_state.json"
            + (" with its manifest.json" if remote else "")
            + "); it was trained without save_full_checkpoint=true"
            + (f" or the upload of {LAST}/ was interrupted" if remote else "")
        )
    if path is not None:
        stale = remove_partial_saves(cfg.save_dir)
        if stale:
            _log.info("train.resume: removed the partial saves of the killed run: %s", stale)
    if path is None:
        _log.info("train.resume: nothing to resume in %s; starting a new run", cfg.save_dir)
    return path


def beside_checkpoint(
    section: str,
    configs: list[tuple[str, Any]],
    args: StageArgs,
    beside: Callable[[Any], dict[str, str]],
) -> list[tuple[str, Any]]:
    """The configs of a stage that reads ``cfg.checkpoint``, with the output paths of an
    ad-hoc run moved next to its checkpoint.

    A run is ad hoc when its checkpoint (``<best>``/``<last>`` aliases compared as the
    directories they name) differs from the one the same config file or params file gives
    without the command-line overrides: the pipeline's, whose outputs (``reports/...``,
    DVC outs) another model must not overwrite. Each output key that the overrides do not
    set then takes ``beside(cfg)[key]`` (under the checkpoint's run directory, e.g.
    ``models/mine/eval/metrics.json``); one they set is kept as given. Logged at INFO.

    Args:
        section: the stage's params section.
        configs: ``load_stage_configs``' result for ``args``.
        args: the parsed command line (config file, params file, overrides).
        beside: ``cfg -> {output key: path next to cfg.checkpoint}``.

    Returns:
        ``configs``, an ad-hoc run's outputs moved; the pipeline's unchanged.
    """
    given = set()
    for item in args.overrides:
        path = item.split("=", 1)[0].strip()
        if path.startswith(f"{section}."):
            given.add(path.split(".", 1)[1])
    try:
        pipeline = load_stage_configs(section, args.config_file, [], args.params)
    except ConfigError:  # the file alone does not load: no pipeline checkpoint to keep apart
        pipeline = []
    out = []
    for i, (label, cfg) in enumerate(configs):
        base = pipeline[min(i, len(pipeline) - 1)][1] if pipeline else None
        if base is not None and unalias(cfg.checkpoint) == unalias(base.checkpoint):
            out.append((label, cfg))
            continue
        update = {k: v for k, v in beside(cfg).items() if k not in given}
        if update:
            logging.getLogger(f"xdpx.{section}").info(
                "%s: checkpoint %s is not the pipeline's (%s): writing next to it: %s",
                section,
                cfg.checkpoint,
                None if base is None else base.checkpoint,
                ", ".join(update.values()),
            )
        out.append((label, cfg.model_copy(update=update)))
    return out
