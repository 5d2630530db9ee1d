"""The one shared training loop (see DESIGN.md, "Trainer").

Read it top to bottom: :meth:`Trainer.fit` runs :meth:`Trainer._loop` (epochs of update
windows, evaluations, saves, stops); :meth:`Trainer._update` is one optimizer update
(micro-batches, backward, clip, step). The loop names no task: what is computed comes from an
objective (:mod:`xdpx.train.objectives`), every side effect is a callback
(:mod:`xdpx.train.callbacks`: run logs, DVCLive, ``on_eval``). The rest lives in small modules:
:mod:`xdpx.train.sampling` (epoch order by ``(seed, epoch)``, windows of ``batch_size *
update_freq * world_size`` samples, each rank's share, the dropout seed of update u by
``(seed, u)``: XDPX FAQ, seeds/000), :mod:`xdpx.train.state` (what a bit-exact resume
needs), :mod:`xdpx.train.diagnosis` (NaN/Inf and ``max_loss`` guards naming the first
non-finite module, grad norms, profiler).

Each micro-batch loss is the *sum* of per-sample losses divided by the window's loss units
per rank (:meth:`xdpx.train.objectives.Objective.loss_units`: its samples), so after DDP's
gradient averaging an update equals one big batch of the whole window for any split into
micro-batches (a partial last window is normalised by its own size); all micro-batches but
the last run under ``no_sync``. Precision: autocast fp16 (CUDA, ``GradScaler`` at init
scale 128; a skipped step leaves the scheduler where it was, as in HF accelerate) or bf16;
fp32 by default. ``auto_ga``: a CUDA OOM redoes the update with half the micro-batch (same
window). Evaluation every ``eval_interval`` updates (or at epoch ends) saves ``last/`` and,
on improvement of ``major_metric``, ``best/``; ``tolerance`` evaluations without
improvement stop training. Under DDP all ranks score their share of the valid split and
gather, so they decide alike; rank 0 saves and logs. A callback raising
:class:`StopTraining` in ``on_eval`` ends training like an early stop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from xdpx import log as xlog
from xdpx.checkpoint import save_checkpoint
from xdpx.config import TrainConfig
from xdpx.data.lazy import InMemoryData, LazySplit, TrainData
from xdpx.inference import Batch, as_samples, call_model
from xdpx.models import require_model_defaults
from xdpx.rundir import BEST, LAST, RunDir
from xdpx.train import ddp, diagnosis, optim
from xdpx.train.callbacks import Callback, CallbackList, OnEval
from xdpx.train.diagnosis import find_nonfinite
from xdpx.train.objectives import Objective, build_objective
from xdpx.train.runlog import RunLog, progress_bar, train_row
from xdpx.train.sampling import micro_batches, place, rank_share, total_updates, update_seed
from xdpx.train.state import (
    EvalEvent,
    StopTraining,
    TrainResult,
    TrainState,
    restore,
    training_files,
)

log = logging.getLogger("xdpx.train.trainer")

__all__ = ["Trainer", "TrainResult", "EvalEvent", "StopTraining"]


class Trainer:
    """Trains ``model`` on token-id sequences for an objective (classification by default).

    Args:
        model: maps ``input_ids [batch, seq_len]`` to ``logits [batch, num_labels]``;
            a pair model (``input_names`` of two) maps ``(input_ids, input_ids2)``.
        cfg: the ``train`` section.
        train_seqs: training samples, one per example: int arrays of token ids, or
            ``(input_ids, input_ids2)`` tuples for a pair model (``xdpx.inference.as_samples``);
            or a :class:`~xdpx.data.lazy.TrainData` (``LazyData``: read shard by shard).
        train_labels: ``[n]`` class indices (None with a ``TrainData``).
        valid_seqs: validation samples (None: no evaluation, best = last), or a
            :class:`~xdpx.data.lazy.LazySplit` (scored shard by shard).
        valid_labels: ``[n]`` their class indices (None with a ``LazySplit``).
        model_name: the model's name, saved in each checkpoint's config.json.
        model_config: its constructor arguments, saved there too.
        assets_dir: prepared data dir (vocab/target map/meta copied into checkpoints).
        pad_id: padding id.
        on_eval: ``on_eval(EvalEvent)`` after each dev evaluation's log rows
            (:class:`xdpx.train.callbacks.OnEval`, after ``callbacks``); ``StopTraining`` ends
            training, another exception leaves ``fit``, each after the checkpoints are saved.
            Under DDP every rank calls it and must decide alike.
        objective: what the task computes (:mod:`xdpx.train.objectives`); None:
            :func:`~xdpx.train.objectives.build_objective` of ``cfg``.
        callbacks: subscribers to the training events (:mod:`xdpx.train.callbacks`), after the run
            logs (:class:`xdpx.train.runlog.RunLog`, rank 0).

    Under ``torch.distributed`` (initialised by the caller, e.g. ``stages.train`` under
    torchrun) the model is wrapped in ``DistributedDataParallel`` (``SparseGradDDP`` with
    sparse gradients: :func:`xdpx.train.sampling.place`).

    Raises:
        ValueError: empty training split, ``auto_ga`` under DDP (one rank cannot change
            its micro-batch alone), or a config whose model defaults are not filled in
            (``learning_rate: null``, ``loss``/``optimizer: auto``: set-up,
            :func:`xdpx.train.setup.resolve`, fills them once, before the trainer).
        ConfigError: the default objective cannot be built for this model
            (:func:`~xdpx.train.objectives.build_objective`).
    """

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainConfig,
        train_seqs: list[np.ndarray] | TrainData,
        train_labels: np.ndarray | None,
        valid_seqs: list[np.ndarray] | LazySplit | None,
        valid_labels: np.ndarray | None,
        model_name: str,
        model_config: dict[str, Any],
        assets_dir: str,
        pad_id: int = 0,
        on_eval: Callable[[EvalEvent], None] | None = None,
        objective: Objective | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        if not isinstance(train_seqs, TrainData):
            assert train_labels is not None
            train_seqs = InMemoryData(train_seqs, train_labels, cfg.seed)
        self.data = train_seqs
        if len(self.data) == 0:
            raise ValueError("training split is empty")
        self.cfg = cfg = require_model_defaults(cfg)  # filled once, in set-up
        if objective is None:
            num_labels = model_config.get("num_labels")
            objective = build_objective(cfg, model, self.data, num_labels, pad_id)
        # module: the bare model (eval, save, diagnose); model: DDP-wrapped under torchrun
        self.module, self.model, self.device, self.world_size, self.rank = place(model, cfg)
        self.objective = objective.to(self.device)
        self.valid_seqs, self.valid_labels = valid_seqs, valid_labels
        self.model_name, self.model_config = model_name, model_config
        self.assets_dir, self.pad_id = assets_dir, pad_id
        self.save_dir, self.run = cfg.save_dir, RunDir(cfg.save_dir)
        self.is_main = self.rank == 0
        self.logs = RunLog(self.run, enabled=self.is_main)
        self.callbacks = CallbackList([self.logs, *callbacks, *([OnEval(on_eval)] if on_eval else [])])  # fmt: skip
        self.optimizer = optim.build_optimizer(self.module, cfg)
        self.window_size = cfg.batch_size * cfg.update_freq * self.world_size
        if cfg.group_by_length:  # lazy_load: refused by the config
            self.data.group_by_length(self.window_size)
        self.total_updates = total_updates(len(self.data), self.window_size, cfg)
        self.scheduler = optim.build_scheduler(self.optimizer, cfg, self.total_updates)
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision)
        self.scaler = torch.amp.GradScaler(self.device.type, init_scale=128.0, enabled=cfg.precision == "fp16")  # fmt: skip
        self.state = TrainState(micro_batch_size=cfg.batch_size)
        self.resumed_from: str | None = None
        self._auto_ga_logged = False
        self.stop_reason: str | None = None  # message of a StopTraining raised by a callback

    # ---------------------------------------------------------------- the loop
    def fit(self) -> TrainResult:
        """Run training until ``max_epoch``/``max_update``/``max_samples`` or early stop.

        Raises:
            NonFiniteLossError: the loss or the gradient norm became NaN/Inf.
            DivergenceError: the loss exceeded ``max_loss``.
            LossScaleError: fp16 loss scale fell below ``min_loss_scale``.
            RemoteIOError: a save_dir on an object store kept failing (after xdpx.io's retries).
        """
        cfg, st = self.cfg, self.state
        self._start = time.perf_counter()
        self.callbacks.on_fit_start(self)
        bar = progress_bar(self.total_updates, st.num_updates, enabled=self.is_main)
        profiler = None
        if cfg.profile and self.is_main:
            profiler = diagnosis.start_profiler(self.run, cfg.profile_steps, self.device.type == "cuda")  # fmt: skip
        try:
            self._loop(bar, profiler)
        finally:
            if profiler is not None:
                profiler.stop()
            bar.close()
            self.callbacks.on_fit_end(self)
        if self.world_size > 1:
            dist.barrier()
        return TrainResult.of(st, self.save_dir, cfg.major_metric, self._wall(), len(self.data))

    def _loop(self, bar: Any, profiler: Any) -> None:
        """Epochs of update windows, evaluations, saves; ends with a final eval and save."""
        cfg, st = self.cfg, self.state
        self.model.train()
        done = (
            st.finished
            or st.stopped_early
            or st.epoch > cfg.max_epoch
            or st.num_updates >= self.total_updates
        )
        while not done:
            self.data.set_epoch(st.epoch)
            while st.epoch_pos < len(self.data) and not done:
                window = self.data.window(st.epoch_pos, self.window_size)
                grad_norm, scale = self._update(window)
                st.epoch_pos += len(window)
                bar.update(1)
                if profiler is not None:
                    profiler.step()
                if st.num_updates % cfg.log_interval == 0 or st.num_updates == self.total_updates:
                    self._log_train_row(grad_norm, scale)
                    bar.set_postfix({"loss": f"{st.train_rows[-1]['loss']:.4f}"}, refresh=False)
                done = st.num_updates >= self.total_updates or (
                    cfg.max_samples is not None and st.samples_seen >= cfg.max_samples
                )
                due = cfg.eval_interval > 0 and st.num_updates % cfg.eval_interval == 0
                if due and st.num_updates >= cfg.eval_interval_warmup:
                    done = self._eval_and_save(st.epoch) or done
                elif cfg.save_interval and st.num_updates % cfg.save_interval == 0:
                    self._save(LAST, {"update": st.num_updates, "epoch": st.epoch}, full=True)
            if st.epoch_pos >= len(self.data):  # epoch finished
                finished_epoch = st.epoch
                st.epoch, st.epoch_pos = st.epoch + 1, 0
                if (
                    not done
                    and cfg.eval_interval == -1
                    and st.num_updates >= cfg.eval_interval_warmup
                ):
                    done = self._eval_and_save(finished_epoch)
                done = done or st.epoch > cfg.max_epoch
        if not st.valid_rows or st.valid_rows[-1]["update"] != st.num_updates:
            st.finished = True
            self._eval_and_save(st.last_epoch)
        elif not st.finished:
            st.finished = True
            self._save(LAST, {"update": st.num_updates, "epoch": st.last_epoch}, full=True)

    # ---------------------------------------------------------------- one update
    def _update(self, window: np.ndarray) -> tuple[float, float | None]:
        """One optimizer update on ``window`` (global sample ids); returns (grad norm, loss scale)."""
        cfg, st = self.cfg, self.state
        local = rank_share(window, self.rank, self.world_size)
        denom = self._loss_units(window)
        while True:
            torch.manual_seed(update_seed(cfg.seed, st.num_updates, self.rank))
            self.optimizer.zero_grad(set_to_none=True)
            try:
                loss_sum, correct = self._forward_backward(local, window, denom)
                break
            except torch.cuda.OutOfMemoryError as oom:  # auto_ga: half the micro-batch, or raise
                self._auto_ga_logged = optim.halve_micro_batch(
                    st, cfg.auto_ga, self.optimizer, oom, len(local), self._auto_ga_logged
                )
        ddp.sync_gradients(self.model)  # SparseGradDDP's exchange (DDP's is in the backward)
        stats = [loss_sum, correct]
        if self.world_size > 1:
            t = torch.tensor(stats, dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            stats = t.tolist()
        loss = stats[0] / denom  # mean loss of the window per loss unit
        self.scaler.unscale_(self.optimizer)
        if cfg.inspect_grad and (st.num_updates + 1) % cfg.log_interval == 0 and self.is_main:
            st.grad_rows.append(
                {"update": st.num_updates + 1, **diagnosis.group_grad_norms(self.module)}
            )
        max_norm = cfg.clip_norm if cfg.clip_norm > 0 else float("inf")
        grad_norm = float(optim.clip_grad_norm(self.module.parameters(), max_norm))
        fp16 = cfg.precision == "fp16"
        diagnosis.check_update(
            loss, grad_norm, st.num_updates + 1, st.epoch, cfg.max_loss, fp16,
            lambda: self._diagnose(local),
        )  # fmt: skip
        scale = self.scaler.get_scale() if fp16 else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if fp16 and self.scaler.get_scale() < scale:  # overflow: step skipped, no scheduler step
            diagnosis.check_loss_scale(
                self.scaler.get_scale(), cfg.min_loss_scale, st.num_updates + 1
            )
        else:
            self.scheduler.step()
        st.num_updates += 1
        st.samples_seen += len(window)
        st.last_epoch = st.epoch
        st.window_loss += loss * denom
        st.window_correct += stats[1]
        st.window_n += denom
        if cfg.log_sample_ids and self.is_main:
            ids = ",".join(map(str, window.tolist()))
            st.sample_rows.append({"update": st.num_updates, "epoch": st.epoch, "sample_ids": ids})
        return grad_norm, scale

    def _loss_units(self, window: np.ndarray) -> int:
        """What the window's summed loss is divided by (the objective's units, computed on
        every rank, so all ranks divide alike)."""
        return self.objective.loss_units(self.data, window, self.state.epoch)

    def _forward_backward(
        self, local: np.ndarray, window: np.ndarray, denom: int
    ) -> tuple[float, float]:
        """Accumulate the gradients of one window share; returns (summed loss, correct).

        Under DDP a rank whose share of a short last window is empty still joins the
        gradient all-reduce: it runs the window's first sample with weight 0.

        With several passes per micro-batch (:meth:`xdpx.train.objectives.Objective.passes`)
        the logged loss is their mean, the accuracy the first's.
        """
        weight = 1.0 if len(local) else 0.0
        chunks = micro_batches(local if len(local) else window[:1], self.state.micro_batch_size)
        per_rank = denom / self.world_size  # DDP averages over ranks: sum / per_rank overall
        objective, steps = self.objective, self.objective.num_passes
        seed = update_seed(self.cfg.seed, self.state.num_updates, self.rank)
        loss_sum = correct = 0.0
        sink: dict[str, list[float]] = {}
        for k, idx in enumerate(chunks):
            x, y = self._batch(idx)
            for t, context in enumerate(objective.passes(x, k, seed)):
                sync = self.world_size == 1 or (k == len(chunks) - 1 and t == steps - 1)
                with nullcontext() if sync else self.model.no_sync():
                    with self._autocast(), xlog.collecting(sink), context:
                        logits = call_model(self.model, x)
                    with xlog.collecting(sink):
                        loss = objective.loss(logits, y, idx)
                    if not weight:
                        loss = loss * weight
                    self.scaler.scale(loss / (per_rank * steps)).backward()
                loss_sum += loss.item() / steps
                if t == 0 and weight:
                    correct += objective.correct(logits, y)
        for name, values in sink.items():
            acc = self.state.summaries.setdefault(name, [0.0, 0])
            acc[0] += sum(values)
            acc[1] += len(values)
        return loss_sum, correct

    def _batch(self, idx: np.ndarray) -> tuple[Batch, torch.Tensor]:
        """The objective's padded inputs and targets of the samples ``idx``."""
        min_len = self.module.min_len
        return self.objective.batch(self.data, idx, self.pad_id, min_len, self.device)

    def _autocast(self) -> Any:
        enabled = self.amp_dtype is not None
        return torch.autocast(
            self.device.type, dtype=self.amp_dtype or torch.float32, enabled=enabled
        )

    def _diagnose(self, local: np.ndarray) -> str:
        """Name where NaN/Inf first appears, re-running this update's micro-batches with hooks."""
        for idx in micro_batches(local, self.state.micro_batch_size):
            torch.manual_seed(update_seed(self.cfg.seed, self.state.num_updates, self.rank))
            x, y = self._batch(idx)
            loss = lambda logits, y, idx=idx: self.objective.loss(logits, y, idx)  # noqa: E731
            where = find_nonfinite(self.module, x, y, self._autocast, loss)
            if not where.startswith("nothing"):
                return where
        return where

    # ---------------------------------------------------------------- evaluation, logs, saves
    def evaluate(self) -> dict[str, float]:
        """The objective's metrics of the current model on the validation split; under DDP
        each rank scores its share and all return the same metrics."""
        parts = [(self.valid_seqs, self.valid_labels)]
        if isinstance(self.valid_seqs, LazySplit):  # shard by shard
            parts = [(as_samples(d.input_ids, d.input_ids2), d.labels) for d in self.valid_seqs.iter_shards()]  # fmt: skip
        return self.objective.evaluate(
            self.module, parts, self.cfg.batch_size, self.pad_id, self.device, self.rank,
            self.world_size,
        )  # fmt: skip

    def _eval_and_save(self, epoch: int) -> bool:
        """Evaluate, fire ``on_eval``, save last (+best); True when training should stop (early
        stop, or a callback's ``StopTraining``: the checkpoints are saved all the same)."""
        st, cfg, metric = self.state, self.cfg, self.cfg.major_metric
        info: dict[str, Any] = {"update": st.num_updates, "epoch": epoch, "samples_seen": st.samples_seen}  # fmt: skip
        if self.valid_seqs is None:  # no validation split: best is the last model
            self._save(BEST, info)
            self._save(LAST, info, full=True)
            return False
        metrics = self.evaluate()
        improved = st.record_eval(info, metrics, metric, cfg.tolerance)
        event = EvalEvent(
            st.num_updates, epoch, st.samples_seen, dict(metrics), metric, st.best_score,
            self.total_updates,
        )  # fmt: skip
        raised = None  # on_eval runs before the saves (a kill after a save finds whole logs),
        try:  # and whatever a callback raises, this evaluation's checkpoints are saved first
            self.callbacks.on_eval(self, event)
        except Exception as e:
            raised = e
        if isinstance(raised, StopTraining):
            self.stop_reason = str(raised) or "stop requested by on_eval"
            log.info("update %d: training stopped: %s", st.num_updates, self.stop_reason)
        info_v = {**info, "valid": metrics}
        if improved:
            self._save(BEST, info_v)
        if cfg.keep_checkpoints:
            self._save(st.num_updates, info_v)
        self._save(LAST, info_v, full=True)
        log.info(
            "update %d epoch %d: valid %s=%.4f (best %.4f at %s)",
            st.num_updates, epoch, metric, metrics[metric], st.best_score, st.best_update,
        )  # fmt: skip
        if raised is not None and self.stop_reason is None:
            raise raised
        return self.stop_reason is not None or st.stopped_early

    def _log_train_row(self, grad_norm: float, scale: float | None) -> None:
        """Append a ``train.log.tsv`` row (means since the last row) and reset the sums."""
        st = self.state
        lr = optim.current_lr(self.optimizer, self.cfg.learning_rate)
        row, summaries = train_row(st, lr, grad_norm, scale, self._wall())
        st.train_rows.append({**row, **summaries})
        self.callbacks.on_train_row(self, row, summaries)
        st.window_loss = st.window_correct = st.window_n = 0.0
        st.summaries = {}

    def _wall(self) -> float:
        return self.state.elapsed + time.perf_counter() - self._start

    def _save(self, which: str | int, info: dict[str, Any], full: bool = False) -> None:
        """Write checkpoint ``which`` (``best``, ``last``, or an update: ``checkpoint-<update>``)
        of the run directory (atomic directory replace); rank 0 only. ``full``: with the
        training state (``save_full_checkpoint``)."""
        if not self.is_main:
            return
        extra = None
        if full and self.cfg.save_full_checkpoint:
            extra = training_files(
                self.state, self.cfg.model_dump(mode="json"), self.world_size, self._wall(),
                self.optimizer, self.scheduler, self.scaler,
            )  # fmt: skip
        path = self.run.checkpoint(which)
        save_checkpoint(path, self.module, self.model_name, self.model_config, info, self.assets_dir, extra)  # fmt: skip
        self.callbacks.on_save(self, which, path)

    def resume(self, path: str) -> None:
        """Load a full checkpoint (``save_full_checkpoint``) so ``fit`` continues where it stopped
        (model, optimizer, scheduler, GradScaler, RNG states, position, counters, log rows).

        Raises:
            CheckpointError: not a full checkpoint, truncated or corrupt.
            ValueError: the checkpoint was trained with a different config (keys
                outside ``RESUMABLE_CHANGES``) or world size.
        """
        self.state = restore(
            path, self.cfg.model_dump(mode="json"), self.world_size,
            self.module, self.optimizer, self.scheduler, self.scaler,
        )  # fmt: skip
        self.resumed_from = path
        self.data.set_epoch(self.state.epoch)
        log.info(
            "resumed from %s: epoch %d, %d samples into it (%s), update %d",
            path, self.state.epoch, self.state.epoch_pos,
            self.data.locate(self.state.epoch_pos), self.state.num_updates,
        )  # fmt: skip
