"""The one shared training loop (see DESIGN.md, "Trainer").

Read it top to bottom: :meth:`Trainer.fit` runs :meth:`Trainer._loop` (epochs of update
windows, evaluations, saves, stops); :meth:`Trainer._update` is one optimizer update
(micro-batches, backward, clip, step). What the loop calls lives in small modules:
:mod:`xdpx.sampling` (epoch order by ``(seed, epoch)``, windows of ``batch_size *
update_freq * world_size`` samples, each rank's share, the dropout seed of update u by
``(seed, u)``: XDPX FAQ, seeds/000), :mod:`xdpx.train_state` (what a bit-exact resume
needs), :mod:`xdpx.runlog` (TSV logs, DVCLive), :mod:`xdpx.diagnosis` (NaN/Inf and
``max_loss`` guards naming the first non-finite module, grad norms, profiler),
:mod:`xdpx.losses` (cross-entropy, class weights, distillation) and :mod:`xdpx.adversarial`
(FreeLB).

Each micro-batch loss is the *sum* of per-sample losses divided by the window's samples
per rank, so after DDP's gradient averaging an update equals one big batch of the whole
window for any split into micro-batches (a partial last window is normalised by its own
size); all micro-batches but the last run under ``no_sync``. Precision: autocast fp16
(CUDA, ``GradScaler`` at init scale 128; a skipped step does not advance the scheduler, as
in HF accelerate) or bf16; fp32 by default. ``auto_ga``: a CUDA OOM redoes the update with
half the micro-batch (same window). Evaluation every ``eval_interval`` updates (or at epoch
ends) saves ``last/`` and, on improvement of ``major_metric``, ``best/``; ``tolerance``
evaluations without improvement stop training. Under DDP all ranks score their share of the
valid split and gather, so they decide alike; rank 0 saves and logs. ``on_eval`` is the one
outside call (tuners): raising :class:`StopTraining` there ends training like an early stop.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from xdpx import diagnosis
from xdpx import log as xlog
from xdpx.adversarial import FreeLB, rng_state, set_rng_state
from xdpx.checkpoint import save_checkpoint
from xdpx.config import TrainConfig
from xdpx.data.lazy import InMemoryData, LazySplit, TrainData
from xdpx.diagnosis import find_nonfinite
from xdpx.inference import (
    Batch,
    as_samples,
    call_model,
    pad_batch,
    predict_probs_sharded,
    to_device,
)
from xdpx.losses import resolve_class_weight, training_loss
from xdpx.metrics import classification_metrics
from xdpx.mlm import IGNORE_INDEX, MaskedLM, evaluate_mlm, mlm_loss, pad_masked
from xdpx.models import with_model_defaults
from xdpx.optim import build_optimizer, build_scheduler, clip_grad_norm
from xdpx.rundir import BEST, LAST, RunDir
from xdpx.runlog import RunLog, progress_bar, train_row
from xdpx.sampling import micro_batches, place, rank_share, total_updates, update_seed
from xdpx.train_state import (
    EvalEvent,
    StopTraining,
    TrainResult,
    TrainState,
    restore,
    training_files,
)

log = logging.getLogger("xdpx.trainer")

__all__ = ["Trainer", "TrainResult", "EvalEvent", "StopTraining"]


class Trainer:
    """Trains ``model`` on token-id sequences with cross-entropy.

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
        on_eval: called as ``on_eval(EvalEvent)`` after each dev evaluation, once its
            valid.log.tsv row, DVCLive step and checkpoints are written. It may raise
            ``StopTraining`` to end training there; any other exception propagates out of
            ``fit``. Under DDP every rank calls it and must decide the same way.
        teacher_logits: ``[n, num_labels]`` teacher logits aligned with ``train_seqs``
            (``xdpx.distill.load_teacher_logits``): adds the distillation term with
            ``cfg.distill_alpha`` / ``cfg.distill_temperature``. None: plain cross-entropy.
        mlm: ``train.task: mlm``: the masker (:class:`xdpx.mlm.MaskedLM`). The model is then
            called as ``model(input_ids, labels)`` (both ``[batch, seq_len]``) and returns
            the logits of the masked positions, ``[n_masked, vocab_size]``
            (:class:`xdpx.models.HFMaskedLM`); each window's samples are masked by
            (seed, epoch, sample id), the loss is the cross-entropy at masked
            positions divided by the window's masked tokens (so any micro-batching or rank
            split gives the same update), and evaluation reports MLM loss, perplexity and
            masked-token accuracy (:func:`xdpx.mlm.evaluate_mlm`); labels are unused.

    Under ``torch.distributed`` (initialised by the caller, e.g. ``stages.train`` under
    torchrun) the model is wrapped in ``DistributedDataParallel``.

    Raises:
        ValueError: empty training split, ``auto_ga`` under DDP (one rank cannot change
            its micro-batch alone), or ``teacher_logits`` of the wrong shape.
        ConfigError: ``cfg.adv`` set for a model without an embedding layer.
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
        teacher_logits: np.ndarray | None = None,
        mlm: MaskedLM | None = None,
    ) -> None:
        if not isinstance(train_seqs, TrainData):
            assert train_labels is not None
            train_seqs = InMemoryData(train_seqs, train_labels, cfg.seed)
        self.data = train_seqs
        n = len(self.data)
        if n == 0:
            raise ValueError("training split is empty")
        if teacher_logits is not None and (teacher_logits.ndim != 2 or len(teacher_logits) != n):
            raise ValueError(
                f"teacher_logits must be [{n}, num_labels], got {teacher_logits.shape}"
            )
        self.cfg = cfg = with_model_defaults(cfg)
        # module: the bare model (eval, save, diagnose); model: DDP-wrapped under torchrun
        self.module, self.model, self.device, self.world_size, self.rank = place(model, cfg)
        self.valid_seqs, self.valid_labels = valid_seqs, valid_labels
        self.model_name, self.model_config = model_name, model_config
        self.assets_dir, self.pad_id = assets_dir, pad_id
        self.save_dir, self.run = cfg.save_dir, RunDir(cfg.save_dir)
        self.is_main = self.rank == 0
        self.logs = RunLog(self.run, enabled=self.is_main)
        self.optimizer = build_optimizer(self.module, cfg)
        self.window_size = cfg.batch_size * cfg.update_freq * self.world_size
        self.total_updates = total_updates(n, self.window_size, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg, self.total_updates)
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision)
        self.scaler = torch.amp.GradScaler(
            self.device.type, init_scale=128.0, enabled=cfg.precision == "fp16"
        )
        self.state = TrainState(micro_batch_size=cfg.batch_size)
        self.resumed_from: str | None = None
        self._auto_ga_logged = False
        self.on_eval = on_eval
        self.mlm = mlm
        self._masked: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # this window's masks
        self.stop_reason: str | None = None  # message of a StopTraining raised by on_eval
        self.freelb = FreeLB.from_config(self.module, cfg, pad_id) if cfg.adv == "freelb" else None
        self._adv_rng = torch.Generator(device=self.device)  # FreeLB's delta_0
        num_labels = self.model_config.get("num_labels") or len(self.data.label_counts(0))
        self.class_weight = self.teacher_logits = None
        if cfg.class_weight and self.mlm is None and teacher_logits is None:
            weight = resolve_class_weight(cfg.class_weight, self.data.label_counts(int(num_labels)))
            self.class_weight = weight.to(self.device) if weight is not None else None
            log.info(
                "class_weight=%s: %s",
                cfg.class_weight,
                "balanced" if weight is not None else "none",
            )
        if teacher_logits is not None:
            self.teacher_logits = torch.as_tensor(teacher_logits, dtype=torch.float32).to(
                self.device
            )

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
        self.logs.open_live(st.num_updates if self.resumed_from is not None else None)
        if self.resumed_from is not None:
            self.logs.write(st)  # drop rows the interrupted run wrote after its checkpoint
        bar = progress_bar(self.total_updates, st.num_updates, enabled=self.is_main)
        profiler = None
        if cfg.profile and self.is_main:
            profiler = diagnosis.start_profiler(
                self.run, cfg.profile_steps, self.device.type == "cuda"
            )
        try:
            self._loop(bar, profiler)
        finally:
            if profiler is not None:
                profiler.stop()
            bar.close()
            self.logs.end()
        self.logs.push_live()  # remote save_dir: the final DVCLive files
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
                due = (
                    cfg.eval_interval > 0
                    and st.num_updates % cfg.eval_interval == 0
                    and st.num_updates >= cfg.eval_interval_warmup
                )
                if due:
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
            except torch.cuda.OutOfMemoryError as oom:
                self._halve_micro_batch(oom, len(local))
        stats = [loss_sum, correct]
        if self.world_size > 1:
            t = torch.tensor(stats, dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            stats = t.tolist()
        loss = stats[0] / denom  # mean loss of the window (per sample; mlm: per masked token)
        self.scaler.unscale_(self.optimizer)
        if cfg.inspect_grad and (st.num_updates + 1) % cfg.log_interval == 0 and self.is_main:
            st.grad_rows.append(
                {"update": st.num_updates + 1, **diagnosis.group_grad_norms(self.module)}
            )
        max_norm = cfg.clip_norm if cfg.clip_norm > 0 else float("inf")
        grad_norm = float(clip_grad_norm(self.module.parameters(), max_norm))
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
        """What the window's summed loss is divided by: its samples, or under ``task: mlm``
        its masked tokens (the masks of the whole window are drawn here, on every rank,
        so all ranks divide alike)."""
        if self.mlm is None:
            return len(window)
        samples = self.data.samples(window)
        self._masked = self.mlm.mask_many(samples, window, self.state.epoch)
        return max(1, sum(int((y >= 0).sum()) for _, y in self._masked.values()))

    def _forward_backward(
        self, local: np.ndarray, window: np.ndarray, denom: int
    ) -> tuple[float, float]:
        """Accumulate the gradients of one window share; returns (summed loss, correct).

        Under DDP a rank whose share of a short last window is empty still joins the
        gradient all-reduce: it runs the window's first sample with weight 0.

        With FreeLB each micro-batch takes ``adv_steps`` passes (``xdpx.adversarial``), each
        replaying its random state; the logged loss is their mean, the accuracy the first's.
        """
        weight = 1.0 if len(local) else 0.0
        chunks = micro_batches(local if len(local) else window[:1], self.state.micro_batch_size)
        per_rank = denom / self.world_size  # DDP averages over ranks: sum / per_rank overall
        steps = self.freelb.steps if self.freelb is not None else 1
        loss_sum = correct = 0.0
        sink: dict[str, list[float]] = {}
        for k, idx in enumerate(chunks):
            x, y = self._batch(idx)
            if self.freelb is not None:  # delta_0 from its own stream: dropout stays as without adv
                seed = update_seed(self.cfg.seed, self.state.num_updates, self.rank)
                self._adv_rng.manual_seed(seed + k + 1)
                self.freelb.start(x, self._adv_rng)
                rng = rng_state(self.device)
            for t in range(steps):
                sync = self.world_size == 1 or (k == len(chunks) - 1 and t == steps - 1)
                if t:  # FreeLB: every ascent step draws the same dropout masks
                    set_rng_state(rng, self.device)
                perturb = self.freelb.perturb() if self.freelb is not None else nullcontext()
                with nullcontext() if sync else self.model.no_sync():
                    with self._autocast(), xlog.collecting(sink), perturb:
                        logits = call_model(self.model, x)
                    with xlog.collecting(sink):
                        loss = (
                            mlm_loss(logits, y)
                            if self.mlm is not None
                            else training_loss(
                                logits, y, idx, self.class_weight, self.teacher_logits, self.cfg
                            )
                        )
                    if not weight:
                        loss = loss * weight
                    self.scaler.scale(loss / (per_rank * steps)).backward()
                if t < steps - 1:
                    self.freelb.ascend()  # type: ignore[union-attr]
                loss_sum += loss.item() / steps
                if t == 0 and weight:
                    correct += (logits.argmax(-1) == y).sum().item()
        for name, values in sink.items():
            acc = self.state.summaries.setdefault(name, [0.0, 0])
            acc[0] += sum(values)
            acc[1] += len(values)
        return loss_sum, correct

    def _batch(self, idx: np.ndarray) -> tuple[Batch, torch.Tensor]:
        """Padded inputs (a tuple for pairs, each input to its own width) and labels of ``idx``."""
        min_len = getattr(self.module, "min_len", 1)
        if self.mlm is not None:  # model(masked input, labels) -> logits at the masked positions
            x, y = pad_masked([self._masked[int(i)] for i in idx], self.pad_id, min_len)
            return to_device((x, y), self.device), y[y != IGNORE_INDEX].to(self.device)
        x = pad_batch(self.data.samples(idx), self.pad_id, min_len)
        return to_device(x, self.device), torch.from_numpy(self.data.labels(idx)).to(self.device)

    def _autocast(self) -> Any:
        enabled = self.amp_dtype is not None
        return torch.autocast(
            self.device.type, dtype=self.amp_dtype or torch.float32, enabled=enabled
        )

    def _halve_micro_batch(self, oom: Exception, n_local: int) -> None:
        """``auto_ga`` after a CUDA OOM: half the micro-batch, same window (re-raises otherwise)."""
        st = self.state
        if not self.cfg.auto_ga or st.micro_batch_size == 1:
            raise oom
        self.optimizer.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        st.micro_batch_size = math.ceil(st.micro_batch_size / 2)
        if not self._auto_ga_logged:
            log.warning(
                "auto_ga: CUDA out of memory at update %d; retrying with micro-batch %d "
                "(%d micro-batches per update, same samples); further halvings are not logged",
                st.num_updates + 1,
                st.micro_batch_size,
                math.ceil(n_local / st.micro_batch_size),
            )
            self._auto_ga_logged = True

    def _diagnose(self, local: np.ndarray) -> str:
        """Name where NaN/Inf first appears, re-running this update's micro-batches with hooks."""
        for idx in micro_batches(local, self.state.micro_batch_size):
            torch.manual_seed(update_seed(self.cfg.seed, self.state.num_updates, self.rank))
            where = find_nonfinite(self.module, *self._batch(idx), self._autocast)
            if not where.startswith("nothing"):
                return where
        return where

    # ---------------------------------------------------------------- evaluation, logs, saves
    def evaluate(self) -> dict[str, float]:
        """Metrics of the current model on the validation split (``classification_metrics``);
        under DDP each rank scores its share and all return the same metrics."""
        parts = [(self.valid_seqs, self.valid_labels)]
        if isinstance(self.valid_seqs, LazySplit):  # shard by shard
            parts = [(as_samples(d.input_ids, d.input_ids2), d.labels) for d in self.valid_seqs.iter_shards()]  # fmt: skip
        if self.mlm is not None:
            return evaluate_mlm(
                self.module, [x for x, _ in parts], self.mlm, self.cfg.batch_size, self.pad_id,
                self.device, self.rank, self.world_size,
            )  # fmt: skip
        probs = [
            predict_probs_sharded(
                self.module, x, 256, self.pad_id, self.device, self.rank, self.world_size
            )  # fmt: skip
            for x, _ in parts
        ]
        return classification_metrics(np.concatenate([y for _, y in parts]), np.concatenate(probs))

    def _eval_and_save(self, epoch: int) -> bool:
        """Evaluate, log, save last (+best); returns True when training should stop early."""
        st, cfg, metric = self.state, self.cfg, self.cfg.major_metric
        info: dict[str, Any] = {"update": st.num_updates, "epoch": epoch}
        info["samples_seen"] = st.samples_seen
        if self.valid_seqs is None:  # no validation split: best is the last model
            self._save(BEST, info)
            self._save(LAST, info, full=True)
            return False
        metrics = self.evaluate()
        improved = st.record_eval(info, metrics, metric, cfg.tolerance)
        self.logs.log_valid(st, metrics)
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
        if self.on_eval is not None:
            try:
                self.on_eval(
                    EvalEvent(
                        st.num_updates,
                        epoch,
                        st.samples_seen,
                        dict(metrics),
                        metric,
                        st.best_score,
                        self.total_updates,
                    )  # fmt: skip
                )
            except StopTraining as stop:
                self.stop_reason = str(stop) or "stop requested by on_eval"
                log.info("update %d: training stopped: %s", st.num_updates, self.stop_reason)
                return True
        return st.stopped_early

    def _log_train_row(self, grad_norm: float, scale: float | None) -> None:
        """Append a ``train.log.tsv`` row (means since the last row) and reset the sums."""
        st = self.state
        groups = self.optimizer.param_groups
        lr = groups[0]["lr"]  # several groups: learning_rate x the schedule's current factor
        if len(groups) > 1:
            lr = self.cfg.learning_rate * groups[0]["lr"] / groups[0]["initial_lr"]
        row, summaries = train_row(st, lr, grad_norm, scale, self._wall())
        st.train_rows.append({**row, **summaries})
        self.logs.log_train(st, row, summaries)
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
