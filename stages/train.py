"""Stage ``train``: build ``train.model`` from the prepared data's meta and run the Trainer.

Writes ``<save_dir>/{best,last}/`` checkpoints, ``train.log.tsv``,
``valid.log.tsv``, ``dvclive/``, the reproducibility bundle
(``params.yaml``, ``starter.yaml``, ``repro.json``, ``result.json``) and the run's volatile
facts (``run.json``, ``time.log.tsv``: git state, command, host, wall times), which are not
DVC outs: every out is a pure function of code, params and data.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from xdpx import io, preflight
from xdpx.checkpoint import (
    resolve_checkpoint,
    resume_path as checkpoint_to_resume,
)
from xdpx.config import TrainConfig
from xdpx.data import PreparedMeta, load_split
from xdpx.data.lazy import LazySplit, open_train_split
from xdpx.distill.teacher import load_teacher
from xdpx.doctor.checklist import preflight_doctor
from xdpx.inference import as_samples
from xdpx.pretrained import report_loading
from xdpx.rundir import RunDir
from xdpx.stage import stage_main
from xdpx.train.bundle import finish_run_info, write_bundle
from xdpx.train.launch import init_distributed, relaunch_if_asked
from xdpx.train.mlm import write_pretrained
from xdpx.train.objectives import build_objective
from xdpx.train.setup import TrainSetup, resolve
from xdpx.train.trainer import EvalEvent, Trainer, TrainResult

log = logging.getLogger("xdpx.train")


def check(cfg: TrainConfig | TrainSetup) -> TrainSetup:
    """Pre-flight checks before any work, and the one set-up step
    (:func:`xdpx.train.setup.resolve`: meta.json read once, the model fits the data, the
    model's defaults and arguments); then a checkpoint to resume from resolves, and the run
    directory (``xdpx.preflight.check_run_dir``: may pick ``<save_dir>-N`` under
    ``auto_suffix``). A :class:`~xdpx.train.setup.TrainSetup` (checked already, e.g. by
    ``stage_main``'s pre-flight) is returned as it is.

    Raises:
        FileNotFoundError, FileExistsError, CheckpointError, ValueError: see ``run``.
    """
    if isinstance(cfg, TrainSetup):
        return cfg
    preflight.must_exist(
        "train", "data_dir", PreparedMeta.path_in(cfg.data_dir), "run prepro first"
    )
    setup = resolve(cfg)
    if cfg.resume_from:
        resolve_checkpoint(cfg.resume_from)
    return dataclasses.replace(setup, cfg=preflight.check_run_dir(setup.cfg))


@io.stage("train")
def run(
    cfg: TrainConfig | TrainSetup, on_eval: Callable[[EvalEvent], None] | None = None
) -> TrainResult:
    """Train one model; see the module docstring for the outputs. ``cfg`` is the ``train``
    section, or what :func:`check` made of it.

    ``on_eval`` is passed to the ``Trainer``: called with an ``EvalEvent``
    after each dev evaluation; raising ``xdpx.train.trainer.StopTraining`` there
    ends the run like an early stop (``xdpx tune`` prunes trials this way).

    Under torchrun (``WORLD_SIZE`` > 1) every process calls this: the process
    group is created here (gloo on CPU, NCCL on CUDA), rank 0 prepares the run
    directory and the bundle, and all ranks train in lockstep.

    Raises:
        FileNotFoundError: ``data_dir`` has no ``meta.json`` (run prepro first).
        FileExistsError: ``save_dir`` holds a run and none of ``overwrite``, ``resume``,
            ``auto_suffix`` is set (see ``xdpx.preflight``).
        CheckpointError: the checkpoint to resume from is missing, partial or corrupt.
        ValueError: the checkpoint was trained with an incompatible config.
        DataError: ``distill_from`` is unreadable or not aligned with the training split
            (``xdpx.distill.teacher.load_teacher``: names the file and line).
        PreflightError: ``preflight_doctor`` is on and a check failed (nothing written).
    """
    setup = check(cfg)
    cfg = setup.cfg  # model defaults concrete: written as such into the run's params.yaml
    if cfg.preflight_doctor and os.environ.get("RANK", "0") == "0":
        preflight_doctor(cfg, setup)
    resume_path = checkpoint_to_resume(cfg)
    previous = RunDir(cfg.save_dir).markers()
    distributed = init_distributed(cfg.device)
    try:
        return _train(
            setup, resume_path, wipe=bool(previous) and resume_path is None, on_eval=on_eval
        )
    finally:
        if distributed:
            dist.destroy_process_group()


def _train(
    setup: TrainSetup,
    resume_path: str | None,
    wipe: bool,
    on_eval: Callable[[EvalEvent], None] | None = None,
) -> TrainResult:
    rank = dist.get_rank() if dist.is_initialized() else 0
    cfg, meta = setup.cfg, setup.meta
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    has_valid = cfg.valid_subset in meta.splits
    data, train, texts = open_train_split(
        cfg.data_dir, cfg.train_subset, cfg.seed, cfg.lazy_load, meta
    )
    valid: Any = None
    valid_labels = None
    if has_valid and cfg.lazy_load:  # scored one shard at a time (xdpx.data.lazy)
        valid = LazySplit(cfg.data_dir, cfg.valid_subset, meta)
    elif has_valid:
        split_v = load_split(cfg.data_dir, cfg.valid_subset, meta)
        valid, valid_labels = as_samples(split_v.input_ids, split_v.input_ids2), split_v.labels
    if valid is None:
        log.warning("no %r split in %s: no evaluation, best = last", cfg.valid_subset, cfg.data_dir)
    teacher = (
        load_teacher(cfg.distill_from, cfg.data_dir, cfg.train_subset, train, meta)
        if cfg.distill_from
        else None
    )
    model, model_config, facts = setup.build(texts, resume_path)
    if facts is not None:
        log.info("model %s prepared from the training data: %s", cfg.model, facts)
    if dist.is_initialized():  # every rank has checked the run directory (check()) before rank 0
        dist.barrier()  # writes it: a lagging rank would otherwise find rank 0's run and refuse
    if rank == 0:
        if wipe:
            io.rm(cfg.save_dir, recursive=True)
        io.makedirs(cfg.save_dir)
        write_bundle(cfg, meta, resumed_from=resume_path)
        report_loading(cfg.save_dir, cfg.pretrained_model, model.loading_info)
    if dist.is_initialized():
        dist.barrier()  # the run directory is ready before any rank writes to it
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "model %s: %d parameters; %d train / %d valid samples",
        cfg.model,
        n_params,
        len(data),
        len(valid) if valid is not None else 0,
    )
    objective = build_objective(
        cfg, model, data, model_config.get("num_labels"), meta.pad_id,
        teacher.logits if teacher is not None else None, setup.masker,
        write_pretrained=lambda _: write_pretrained(cfg, meta),
        teacher_gold=teacher.gold if teacher is not None else None,
    )  # fmt: skip
    trainer = Trainer(
        model,
        cfg,
        data,
        None,
        valid,
        valid_labels,
        model_name=cfg.model,
        model_config=model_config,
        assets_dir=cfg.data_dir,
        pad_id=meta.pad_id,
        on_eval=on_eval,
        objective=objective,
    )
    if resume_path is not None:
        trainer.resume(resume_path)
    try:
        result = trainer.fit()
    finally:
        for lazy in (getattr(data, "split", None), valid):
            if isinstance(lazy, LazySplit):
                lazy.close()  # the read-ahead threads
    if rank == 0:
        objective.after_fit(cfg.save_dir)
        finish_run_info(cfg, result)
    return result


def main(argv: list[str] | None = None) -> TrainResult | None:
    """``python -m stages.train [--nproc N] [--nnodes M --rdzv-endpoint HOST:PORT
    [--rdzv-id ID]] [--params params.yaml] [train.key=value ...]``.

    ``--nproc N`` (N > 1) relaunches the same command under ``torchrun`` with N processes
    (DDP; gloo on CPU, NCCL on CUDA) and exits with its status. ``--nnodes M`` (M > 1) makes
    this one of M nodes: run the same command on each host, with the same
    ``--rdzv-endpoint`` (one host's address and a free port) and ``--rdzv-id``
    (:func:`xdpx.train.launch.torchrun_command`).
    """
    args = relaunch_if_asked(list(sys.argv[1:] if argv is None else argv))
    return stage_main(
        "train",
        run,
        lambda r: (
            f"trained {r.num_updates} updates ({r.samples_seen} samples, {r.epochs} epochs); "
            f"best valid {r.major_metric}={r.best_score} at update {r.best_update}"
        ),
        args,
        check,
    )


if __name__ == "__main__":
    main()
