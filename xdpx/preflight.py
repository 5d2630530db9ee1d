"""Pre-flight checks: everything a stage can verify before it starts any work.

Each stage's ``run`` calls :func:`check` first, so ``dvc repro``, the Prefect
flow and the ``xdpx`` command line all fail the same way, early, and with
nothing written:

* every input path exists (local or remote, through ``xdpx.io``);
* a checkpoint path or alias (``<run>/<best>``, ``<run>/<last>``) resolves;
* an output on an object store (``oss://``, ``s3://``) answers a stat, so an outage
  fails the stage before any work (``RemoteIOError`` naming the URL and the stage);
* an existing ``train.save_dir`` is an error unless ``overwrite`` (replace it),
  ``resume`` (continue it) or ``auto_suffix`` (pick ``<save_dir>-2``, ``-3``, ...)
  is set. Conflicting options are rejected when the config is validated
  (``xdpx.config``), before this runs;
* the model fits the data: a pair model (``match_esim``, ``siamese``) needs
  separately encoded pairs (``prepro.text2_column`` with a char/word/whitespace
  tokenizer), a single-text model needs single texts or jointly encoded (hf) pairs
  (``train.model`` against ``train.data_dir``, a checkpoint's model against
  ``evaluate/export.data_dir``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from xdpx import io
from xdpx.checkpoint import resolve_checkpoint
from xdpx.models import input_names

log = logging.getLogger("xdpx.preflight")

__all__ = ["check", "check_model_fits_data", "RUN_MARKERS", "run_markers_in", "free_run_dir"]

#: Files/dirs whose presence means a directory already holds a training run.
RUN_MARKERS = ("best", "last", "train.log.tsv", "valid.log.tsv", "params.yaml")


def _must_exist(section: str, key: str, path: str, what: str = "") -> None:
    if not io.exists(path):
        hint = f" ({what})" if what else ""
        raise FileNotFoundError(f"{section}.{key}: {path} not found{hint}")


def _reachable(path: str) -> None:
    """For an output on an object store: one (retried) stat, so a store that is down fails
    the stage now, before any work, with ``RemoteIOError`` naming the URL and the stage."""
    if io.is_remote(path):
        io.exists(path)


def _must_resolve(section: str, key: str, path: str) -> None:
    """A pretrained directory (local, ``pkg:`` or URL) must exist; see :mod:`xdpx.pretrained`."""
    from xdpx.pretrained import resolve_pretrained

    try:
        resolve_pretrained(path)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{section}.{key}: {e}") from None


def check_model_fits_data(model: str, data_dir: str, where: str) -> None:
    """Refuse a pair model on single-text data, a single-text model on separate pairs, or
    hf_classifier on ids that did not come from a transformers tokenizer.

    Args:
        model: a ``MODELS`` key.
        data_dir: prepared data dir (its ``meta.json`` tells ``pair_encoding``).
        where: what named the model, for the message (``train.model``, ``checkpoint ...``).

    Raises:
        ValueError: the model's inputs (:func:`xdpx.models.input_names`) do not match
            the data's encoding; the message names the model, the data dir and the fix.
    """
    meta_path = io.join(data_dir, "meta.json")
    meta = json.loads(io.read_text(meta_path))
    encoding = meta.get("pair_encoding", "separate" if meta.get("pair") else None)
    pair_model = "input_ids2" in input_names(model)  # a second, separately encoded text
    if pair_model and encoding != "separate":
        what = (
            "pairs encoded jointly into one sequence (prepro.tokenizer=hf)"
            if encoding == "joint"
            else "single texts (prepro.text2_column is null)"
        )
        raise ValueError(
            f"{where}={model} is a pair model (inputs input_ids, input_ids2) but {meta_path} "
            f"holds {what}; run prepro with prepro.text2_column=<column> and a char/word/whitespace "
            "tokenizer, or pick a single-text model (textcnn, bilstm, ngram_lr)"
        )
    tokenizer = meta.get("tokenizer")
    if model == "hf_classifier" and tokenizer != "hf":
        raise ValueError(
            f"{where}=hf_classifier needs data prepared with the model's own tokenizer "
            f"(prepro.tokenizer=hf, prepro.tokenizer_path=<the model dir>); {meta_path} "
            f"says tokenizer={tokenizer}"
        )
    if not pair_model and encoding == "separate":
        raise ValueError(
            f"{where}={model} takes one text but {meta_path} holds text pairs encoded "
            "separately (input_ids, input_ids2; prepro.text2_column is set); use a pair model "
            "(match_esim, siamese)"
        )


def run_markers_in(path: str) -> list[str]:
    """The ``RUN_MARKERS`` present in ``path`` (empty: it holds no training run).

    On an object store this is one (retried) listing; a store that keeps failing raises
    ``RemoteIOError`` rather than reporting a free directory.
    """
    if io.is_remote(path):
        try:
            names = {p.rstrip("/").rsplit("/", 1)[-1] for p in io.ls(path)}
        except FileNotFoundError:
            return []
        return [name for name in RUN_MARKERS if name in names]
    return [name for name in RUN_MARKERS if io.exists(io.join(path, name))]


def free_run_dir(path: str) -> str:
    """The first of ``path``, ``path-2``, ``path-3``, ... that holds no run."""
    if not run_markers_in(path):
        return path
    k = 2
    while run_markers_in(f"{path}-{k}"):
        k += 1
    return f"{path}-{k}"


def check(section: str, cfg: Any) -> Any:
    """Check ``cfg`` (the config of stage ``section``) before any work; return the config to run.

    The returned config equals ``cfg`` except with ``train.auto_suffix``, where
    ``save_dir`` becomes the first free suffixed name (and ``auto_suffix`` is
    cleared, so a second check keeps it).

    Raises:
        FileNotFoundError: an input path is missing (names ``section.key`` and the path).
        CheckpointError: a checkpoint path/alias does not resolve to a complete checkpoint.
        FileExistsError: ``train.save_dir`` holds a run and neither ``overwrite``,
            ``resume`` nor ``auto_suffix`` is set.
        ValueError: the model does not fit the data (:func:`check_model_fits_data`).
        RemoteIOError: an input or output on an object store did not answer (after retries).
    """
    if section == "prepro":
        _must_exist(section, "data_source", cfg.data_source)
        for split, name in cfg.data_files.items():
            _must_exist(section, f"data_files.{split}", io.join(cfg.data_source, name))
        for key in ("vocab_file", "target_map_file"):
            if getattr(cfg, key):
                _must_exist(section, key, getattr(cfg, key))
        if cfg.tokenizer_path:
            _must_resolve(section, "tokenizer_path", cfg.tokenizer_path)
        _reachable(cfg.data_dir)
    elif section == "train":
        _must_exist(section, "data_dir", io.join(cfg.data_dir, "meta.json"), "run prepro first")
        check_model_fits_data(cfg.model, cfg.data_dir, "train.model")
        if cfg.resume_from:
            resolve_checkpoint(cfg.resume_from)
        if cfg.pretrained_model:
            _must_resolve(section, "pretrained_model", cfg.pretrained_model)
        if cfg.distill_from:
            _must_exist(section, "distill_from", cfg.distill_from, "predict.distill=true output")
        previous = run_markers_in(cfg.save_dir)
        if previous and cfg.auto_suffix:
            fresh = free_run_dir(cfg.save_dir)
            log.info("train.auto_suffix: %s holds a run; using %s", cfg.save_dir, fresh)
            return cfg.model_copy(update={"save_dir": fresh, "auto_suffix": False})
        if previous and not (cfg.overwrite or cfg.resume or cfg.resume_from):
            raise FileExistsError(
                f"train.save_dir: {cfg.save_dir} already holds a run ({', '.join(previous)}); "
                "set train.overwrite=true to replace it, train.resume=true to continue it "
                "or train.auto_suffix=true to pick a fresh name"
            )
    elif section in ("evaluate", "predict", "export"):
        path = resolve_checkpoint(cfg.checkpoint)
        if section == "predict":
            _must_exist(section, "data_file", cfg.data_file)
        else:
            _must_exist(section, "data_dir", io.join(cfg.data_dir, "meta.json"), "run prepro first")
            model = json.loads(io.read_text(io.join(path, "config.json")))["model"]
            check_model_fits_data(model, cfg.data_dir, f"{section}.checkpoint {path}: model")
        outputs = {
            "evaluate": lambda: (cfg.metrics_file, cfg.confusion_png),
            "predict": lambda: (cfg.out_file,),
            "export": lambda: (cfg.out_dir,),
        }[section]()
        for out in outputs:
            _reachable(out)
    return cfg
