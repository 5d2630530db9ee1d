"""Stage ``train``: build ``train.model`` from the prepared data's meta and run the Trainer.

Writes ``<save_dir>/{best,last}/`` checkpoints, ``train.log.tsv``,
``valid.log.tsv``, ``dvclive/``, the reproducibility bundle
(``params.yaml``, ``starter.yaml``, ``repro.json``, ``result.json``) and the run's volatile
facts (``run.json``, ``time.log.tsv``: git state, command, host, wall times), which are not
DVC outs: every out is a pure function of code, params and data.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from xdpx import io, preflight
from xdpx.checkpoint import (
    CheckpointError,
    find_resumable,
    remove_partial_saves,
    resolve_checkpoint,
)
from xdpx.config import TrainConfig, dump_yaml, non_defaults
from xdpx.data import VOCAB_FILE, PreparedMeta, load_split
from xdpx.data.lazy import LazySplit, open_train_split
from xdpx.data.vocab import read_tokens
from xdpx.distill import load_teacher_logits
from xdpx.errors import PreflightError
from xdpx.inference import as_samples
from xdpx.mlm import MaskedLM
from xdpx.models import (
    build_for_training,
    check_model_fits_data,
    default_learning_rate,
    model_config_from,
    with_model_defaults,
)
from xdpx.objectives import build_objective
from xdpx.rundir import BEST, LAST, RunDir
from xdpx.stage import stage_main
from xdpx.trainer import EvalEvent, Trainer, TrainResult

log = logging.getLogger("xdpx.train")


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


def finish_run_info(cfg: TrainConfig, result: TrainResult) -> None:
    """Write ``result.json`` (what the run produced, without its wall time) and add the end
    time and ``wall_time`` (seconds) to ``run.json``."""
    run_dir = RunDir(cfg.save_dir)
    pure = {k: v for k, v in result.__dict__.items() if k != "wall_time"}
    io.write_text(run_dir.result, json.dumps(pure, indent=2))
    info = json.loads(io.read_text(run_dir.run_info)) if io.exists(run_dir.run_info) else {}
    info.update(finished_utc=_utc_now(), wall_time=result.wall_time)
    io.write_text(run_dir.run_info, json.dumps(info, indent=2))


def _init_distributed(cfg: TrainConfig) -> bool:
    """Join the torchrun process group (gloo on CPU, NCCL on CUDA); False when not under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or dist.is_initialized():
        return False
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return True


def _resume_path(cfg: TrainConfig) -> str | None:
    """The full checkpoint to resume from, or None to start fresh.

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
            log.info("train.resume: removed the partial saves of the killed run: %s", stale)
    if path is None:
        log.info("train.resume: nothing to resume in %s; starting a new run", cfg.save_dir)
    return path


def _report_loading(cfg: TrainConfig, info: dict[str, list[str]] | None) -> None:
    """Log and save which pretrained weights were missing/unexpected (FAQ: eval mismatches)."""
    if not info:
        return
    io.write_text(io.join(cfg.save_dir, "loading_info.json"), json.dumps(info, indent=2))
    for kind, what in (
        ("missing_keys", "newly initialised (not in the checkpoint)"),
        ("unexpected_keys", "in the checkpoint but unused"),
        ("mismatched_keys", "shape mismatch, re-initialised"),
    ):
        keys = info.get(kind) or []
        if keys:
            shown = ", ".join(keys[:8]) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
            log.warning("pretrained_model %s: %s %s: %s", cfg.pretrained_model, kind, what, shown)


def check(cfg: TrainConfig) -> TrainConfig:
    """Pre-flight checks before any work: the model fits the prepared data, a checkpoint to
    resume from resolves, and the run directory (``xdpx.preflight.check_run_dir``: may pick
    ``<save_dir>-N`` under ``auto_suffix``).

    Raises:
        FileNotFoundError, FileExistsError, CheckpointError, ValueError: see ``run``.
    """
    preflight.must_exist(
        "train", "data_dir", PreparedMeta.path_in(cfg.data_dir), "run prepro first"
    )
    check_model_fits_data(cfg.model, cfg.data_dir, "train.model")
    meta = PreparedMeta.read(cfg.data_dir)
    if cfg.task == "mlm" and cfg.pretrained_model and meta.tokenizer != "hf":
        raise ValueError(
            f"train.task=mlm continues {cfg.pretrained_model} but {cfg.data_dir} was prepared "
            f"with tokenizer={meta.tokenizer}: prepare it with the model's own tokenizer "
            "(prepro.tokenizer=hf, prepro.tokenizer_path=<the model dir>), or drop "
            "pretrained_model and give hf_config to pretrain from scratch on this vocabulary"
        )
    if cfg.resume_from:
        resolve_checkpoint(cfg.resume_from)
    return preflight.check_run_dir(cfg)


def preflight_doctor(cfg: TrainConfig) -> None:
    """``train.preflight_doctor``: run the fast subset of ``xdpx doctor``'s training checks
    (:data:`xdpx.checklist.FAST`) before anything is written; log each finding.

    Raises:
        PreflightError: a check failed; the message names each failed check and its fix.
    """
    from xdpx.checklist import run_checklist

    def show(c: Any) -> None:
        level = {"fail": logging.ERROR, "warn": logging.WARNING}.get(c.status, logging.INFO)
        log.log(level, "preflight_doctor %s", c.line())

    fails = [c for c in run_checklist(cfg, fast=True, on_check=show) if c.status == "fail"]
    if fails:
        raise PreflightError(
            f"train.preflight_doctor: {len(fails)} check(s) failed before training: "
            + " | ".join(f"{c.name}: {c.detail}" for c in fails)
            + " (`xdpx doctor` prints the full report; train.preflight_doctor=false skips it)"
        )


@io.stage("train")
def run(cfg: TrainConfig, on_eval: Callable[[EvalEvent], None] | None = None) -> TrainResult:
    """Train one model; see the module docstring for the outputs.

    ``on_eval`` is passed to the ``Trainer``: called with an ``EvalEvent``
    after each dev evaluation; raising ``xdpx.trainer.StopTraining`` there
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
            (``xdpx.distill.load_teacher_logits``: names the file and line).
        PreflightError: ``preflight_doctor`` is on and a check failed (nothing written).
    """
    cfg = check(cfg)
    cfg = with_model_defaults(cfg)  # written as such into the run's params.yaml
    if cfg.preflight_doctor and os.environ.get("RANK", "0") == "0":
        preflight_doctor(cfg)
    resume_path = _resume_path(cfg)
    previous = RunDir(cfg.save_dir).markers()
    distributed = _init_distributed(cfg)
    try:
        return _train(
            cfg, resume_path, wipe=bool(previous) and resume_path is None, on_eval=on_eval
        )
    finally:
        if distributed:
            dist.destroy_process_group()


def _train(
    cfg: TrainConfig,
    resume_path: str | None,
    wipe: bool,
    on_eval: Callable[[EvalEvent], None] | None = None,
) -> TrainResult:
    rank = dist.get_rank() if dist.is_initialized() else 0
    meta = PreparedMeta.read(cfg.data_dir)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    has_valid = cfg.valid_subset in meta.splits
    data, train, texts = open_train_split(cfg.data_dir, cfg.train_subset, cfg.seed, cfg.lazy_load)
    valid: Any = None
    valid_labels = None
    if has_valid and cfg.lazy_load:  # scored one shard at a time (xdpx.data.lazy)
        valid = LazySplit(cfg.data_dir, cfg.valid_subset)
    elif has_valid:
        split_v = load_split(cfg.data_dir, cfg.valid_subset)
        valid, valid_labels = as_samples(split_v.input_ids, split_v.input_ids2), split_v.labels
    if valid is None:
        log.warning("no %r split in %s: no evaluation, best = last", cfg.valid_subset, cfg.data_dir)
    teacher = (
        load_teacher_logits(cfg.distill_from, cfg.data_dir, cfg.train_subset, train)
        if cfg.distill_from
        else None
    )
    model_config = model_config_from(
        cfg.model, cfg, meta.vocab_size, meta.num_labels, meta.pad_id, meta
    )
    mlm = _masker(cfg) if cfg.task == "mlm" else None
    if mlm is not None and mlm.mask_id >= meta.vocab_size:  # own vocabulary: [MASK] appended
        model_config["vocab_size"] = mlm.mask_id + 1
    if resume_path is not None:  # tables built from the data (ngram_lr's num_features) as saved
        saved = json.loads(io.read_text(io.join(resume_path, "config.json")))["model_config"]
        model_config = {**model_config, **{k: v for k, v in saved.items() if k not in model_config}}
    model, model_config, facts = build_for_training(
        cfg.model, model_config, io.join(cfg.data_dir, VOCAB_FILE),
        texts if resume_path is None else None, cfg.seed,
    )  # fmt: skip
    if facts is not None:
        log.info("model %s prepared from the training data: %s", cfg.model, facts)
    if rank == 0:
        if wipe:
            io.rm(cfg.save_dir, recursive=True)
        io.makedirs(cfg.save_dir)
        write_bundle(cfg, meta, resumed_from=resume_path)
        _report_loading(cfg, getattr(model, "loading_info", None))
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
        cfg, model, data, model_config.get("num_labels"), meta.pad_id, teacher, mlm,
        write_pretrained=lambda _: write_pretrained(cfg, meta),
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


def _masker(cfg: TrainConfig) -> MaskedLM:
    """The masker of ``task: mlm`` over the prepared data's vocabulary (``vocab.txt``)."""
    tokens = read_tokens(io.join(cfg.data_dir, VOCAB_FILE))
    return MaskedLM(
        tokens, MaskedLM.mask_id_for(tokens), cfg.mlm_probability, cfg.mask_whole_words, cfg.seed
    )


def write_pretrained(cfg: TrainConfig, meta: PreparedMeta) -> str:
    """``task: mlm``: write the run's best checkpoint as ``<save_dir>/pretrained``, a
    ``from_pretrained`` directory with the data's tokenizer, which ``train.pretrained_model``
    and ``prepro.tokenizer_path`` accept for fine-tuning.

    Returns:
        the directory written.
    """
    from xdpx.checkpoint import load_checkpoint

    run = RunDir(cfg.save_dir)
    model = load_checkpoint(io.join(cfg.save_dir, BEST)).model
    tokenizer = meta.prepro.get("tokenizer_path") if meta.tokenizer == "hf" else None
    model.save_pretrained(run.pretrained, tokenizer_dir=tokenizer)
    log.info(
        "wrote %s: fine-tune it with train.pretrained_model=%s%s",
        run.pretrained, run.pretrained,
        f" (prepro.tokenizer_path={run.pretrained})" if tokenizer else "",
    )  # fmt: skip
    return run.pretrained


def torchrun_command(
    nproc: int,
    argv: list[str],
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "xdpx",
) -> list[str]:
    """The ``torchrun`` command line that runs ``python -m stages.train argv`` with
    ``nproc`` processes on this node: ``--standalone`` on one node; on ``nnodes`` > 1 the
    c10d rendezvous at ``rdzv_endpoint`` (``host:port`` of one of the nodes, the same on
    every node; the node that can bind it hosts the store) with the job id ``rdzv_id``, as
    PyTorch's multi-node recipe launches it on each host. Global ranks come from the
    rendezvous; rank 0 (on whichever node) alone writes the run directory.

    Raises:
        ValueError: ``nnodes`` > 1 without ``rdzv_endpoint``.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes > 1:
        if not rdzv_endpoint:
            raise ValueError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")  # fmt: skip
        cmd += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id]
    else:
        cmd += ["--standalone"]
    return cmd + ["--nproc-per-node", str(nproc), "-m", "stages.train", *argv]


def launch_torchrun(nproc: int, argv: list[str], **nodes: Any) -> int:
    """Re-run ``python -m stages.train argv`` under :func:`torchrun_command`.

    Returns:
        torchrun's exit status.
    """
    cmd = torchrun_command(nproc, argv, **nodes)
    log.info("launching %s", " ".join(cmd))
    return subprocess.call(cmd)


def _pop_option(args: list[str], name: str, kind: type, example: str) -> Any:
    """Remove ``name VALUE`` from ``args``; the value as ``kind``, or None when absent."""
    if name not in args:
        return None
    i = args.index(name)
    try:
        value = kind(args[i + 1])
    except (IndexError, ValueError):
        print(f"error: {name} needs a value, e.g. {name} {example}", file=sys.stderr)
        raise SystemExit(2) from None
    del args[i : i + 2]
    return value


def main(argv: list[str] | None = None) -> TrainResult | None:
    """``python -m stages.train [--nproc N] [--nnodes M --rdzv-endpoint HOST:PORT
    [--rdzv-id ID]] [--params params.yaml] [train.key=value ...]``.

    ``--nproc N`` (N > 1) relaunches the same command under ``torchrun`` with N processes
    (DDP; gloo on CPU, NCCL on CUDA) and exits with its status. ``--nnodes M`` (M > 1) makes
    this one of M nodes: run the same command on each host, with the same
    ``--rdzv-endpoint`` (one host's address and a free port) and ``--rdzv-id``
    (:func:`torchrun_command`).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    nproc = _pop_option(args, "--nproc", int, "2") or 1
    nnodes = _pop_option(args, "--nnodes", int, "2") or 1
    endpoint = _pop_option(args, "--rdzv-endpoint", str, "10.0.0.1:29400")
    rdzv_id = _pop_option(args, "--rdzv-id", str, "run1") or "xdpx"
    if (nproc > 1 or nnodes > 1) and "LOCAL_RANK" not in os.environ:
        logging.basicConfig(level=logging.INFO)
        try:
            nodes = {"nnodes": nnodes, "rdzv_endpoint": endpoint, "rdzv_id": rdzv_id}
            raise SystemExit(launch_torchrun(nproc, args, **nodes))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
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
