"""Pre-flight checks: what a stage can verify before it starts any work (no model code here).

Each stage has a ``check(cfg) -> cfg`` that its ``run`` calls first (and ``stage_main`` for
every config of a grid before the first run), so ``dvc repro``, the Prefect flow and the
``xdpx`` command line all fail the same way, early, and with nothing written. This module
holds the checks that need no model code (so ``fetch`` and ``prepro`` stay free of it);
those that do live beside the models (``xdpx.models.check_model_fits_data``,
``xdpx.checkpoint.check_reader``, ``stages.train.check``):

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

import logging
from typing import Any

from xdpx import io
from xdpx.rundir import RunDir

log = logging.getLogger("xdpx.preflight")

__all__ = [
    "check_prepro",
    "check_run_dir",
    "free_run_dir",
    "must_exist",
    "must_resolve",
    "reachable",
]


def must_exist(section: str, key: str, path: str, what: str = "") -> None:
    """Raise ``FileNotFoundError`` naming ``section.key`` and ``path`` when it is missing."""
    if not io.exists(path):
        hint = f" ({what})" if what else ""
        raise FileNotFoundError(f"{section}.{key}: {path} not found{hint}")


def reachable(path: str) -> None:
    """For an output on an object store: one (retried) stat, so a store that is down fails
    the stage now, before any work, with ``RemoteIOError`` naming the URL and the stage."""
    if io.is_remote(path):
        io.exists(path)


def must_resolve(section: str, key: str, path: str) -> None:
    """A pretrained directory (local, ``pkg:`` or URL) must exist; see :mod:`xdpx.pretrained`."""
    from xdpx.pretrained import resolve_pretrained

    try:
        resolve_pretrained(path)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{section}.{key}: {e}") from None


def free_run_dir(path: str) -> str:
    """The first of ``path``, ``path-2``, ``path-3``, ... that holds no run."""
    if not RunDir(path).markers():
        return path
    k = 2
    while RunDir(f"{path}-{k}").markers():
        k += 1
    return f"{path}-{k}"


def check_prepro(cfg: Any) -> Any:
    """prepro: raw files (globs match), vocab/target-map files and the tokenizer exist;
    output reachable.

    Raises:
        FileNotFoundError: an input is missing (names ``prepro.<key>`` and the path).
        RemoteIOError: the output's object store did not answer (after retries).
    """
    from xdpx.data.stream import expand_sources  # the data layer: no model code

    must_exist("prepro", "data_source", cfg.data_source)
    expand_sources(cfg)  # every file exists, every glob matches
    for key in ("vocab_file", "target_map_file"):
        if getattr(cfg, key):
            must_exist("prepro", key, getattr(cfg, key))
    if cfg.tokenizer_path:
        must_resolve("prepro", "tokenizer_path", cfg.tokenizer_path)
    reachable(cfg.data_dir)
    return cfg


def check_run_dir(cfg: Any) -> Any:
    """train: the inputs that need no model code (the prepared data is checked first, by
    ``stages.train.check``), and what to do with an existing run dir.

    Returns ``cfg``, or with ``auto_suffix`` and an occupied ``save_dir`` a copy whose
    ``save_dir`` is the first free suffixed name (``auto_suffix`` cleared, so a second
    check keeps it).

    Raises:
        FileNotFoundError: ``pretrained_model`` or ``distill_from`` missing.
        FileExistsError: ``save_dir`` holds a run and none of ``overwrite``, ``resume``,
            ``resume_from``, ``auto_suffix`` is set.
    """
    if cfg.pretrained_model:
        must_resolve("train", "pretrained_model", cfg.pretrained_model)
    if cfg.distill_from:
        must_exist("train", "distill_from", cfg.distill_from, "predict.distill=true output")
    previous = RunDir(cfg.save_dir).markers()
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
    return cfg
