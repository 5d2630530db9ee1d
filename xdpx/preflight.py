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
  (``xdpx.config``), before this runs.
"""

from __future__ import annotations

import logging
from typing import Any

from xdpx import io
from xdpx.checkpoint import resolve_checkpoint

log = logging.getLogger("xdpx.preflight")

__all__ = ["check", "RUN_MARKERS", "run_markers_in", "free_run_dir"]

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
        RemoteIOError: an input or output on an object store did not answer (after retries).
    """
    if section == "prepro":
        _must_exist(section, "data_source", cfg.data_source)
        for split, name in cfg.data_files.items():
            _must_exist(section, f"data_files.{split}", io.join(cfg.data_source, name))
        for key in ("vocab_file", "target_map_file", "tokenizer_path"):
            if getattr(cfg, key):
                _must_exist(section, key, getattr(cfg, key))
        _reachable(cfg.data_dir)
    elif section == "train":
        _must_exist(section, "data_dir", io.join(cfg.data_dir, "meta.json"), "run prepro first")
        if cfg.resume_from:
            resolve_checkpoint(cfg.resume_from)
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
        resolve_checkpoint(cfg.checkpoint)
        if section == "predict":
            _must_exist(section, "data_file", cfg.data_file)
        else:
            _must_exist(section, "data_dir", io.join(cfg.data_dir, "meta.json"), "run prepro first")
        outputs = {
            "evaluate": lambda: (cfg.metrics_file, cfg.confusion_png),
            "predict": lambda: (cfg.out_file,),
            "export": lambda: (cfg.out_dir,),
        }[section]()
        for path in outputs:
            _reachable(path)
    return cfg
