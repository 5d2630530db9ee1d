"""The one shared training loop (see DESIGN.md, "Trainer").

Read it top to bottom: ``Trainer.fit`` is the loop. Features are plain
branches, not hooks:

* precision: ``torch.amp`` autocast in fp16 (CUDA, with ``GradScaler``,
  init scale 128) or bf16; fp32 by default. A step the scaler skips
  (overflow) does not advance the lr scheduler (HF accelerate semantics).
* gradient accumulation: ``update_freq`` micro-batches form one update; each
  micro-batch loss is the *sum* of per-sample cross-entropies divided by the
  number of samples in the whole window, so an update equals one big batch
  of ``batch_size * update_freq`` (the last, partial window is flushed and
  normalised by its own size).
* seeding (XDPX FAQ, seeds/000): init by ``seed``; the shuffle of epoch e by
  ``(seed, e)``; dropout of update u by ``(seed, u)``. The data order thus
  does not depend on ``batch_size``/``update_freq``.
* evaluation every ``eval_interval`` updates (or at epoch ends), best/last
  checkpoints, early stop after ``tolerance`` evals without improvement of
  ``major_metric`` (direction from ``xdpx.metrics.METRIC_DIRECTIONS``).
* logs: ``train.log.tsv`` / ``valid.log.tsv`` (rewritten atomically), DVCLive
  metrics/plots under ``<save_dir>/dvclive``, a tqdm progress bar.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers import get_scheduler

from xdpx import io
from xdpx.checkpoint import save_checkpoint
from xdpx.config import TrainConfig
from xdpx.inference import pad_batch, predict_probs
from xdpx.metrics import classification_metrics, is_better

log = logging.getLogger("xdpx.trainer")

__all__ = ["Trainer", "TrainResult", "NonFiniteLossError", "epoch_order", "update_seed"]

TRAIN_COLUMNS = [
    "update",
    "epoch",
    "samples_seen",
    "lr",
    "loss",
    "accuracy",
    "grad_norm",
    "loss_scale",
    "wall_time",
]


class NonFiniteLossError(RuntimeError):
    """Training loss or gradient became NaN/Inf."""


@dataclass
class TrainResult:
    """What a training run produced."""

    save_dir: str
    num_updates: int
    epochs: int
    samples_seen: int
    best_update: int | None
    best_score: float | None
    major_metric: str
    best_valid: dict[str, float] = field(default_factory=dict)
    stopped_early: bool = False
    wall_time: float = 0.0


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """Permutation of ``range(n)`` for ``epoch``, seeded by ``(seed, epoch)`` only (FAQ: shuffling)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def update_seed(seed: int, num_updates: int) -> int:
    """Seed of the step noise (dropout) of update ``num_updates`` (FAQ: by seed and num_updates)."""
    return int(np.random.SeedSequence([seed, num_updates]).generate_state(1)[0])


def _tsv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    lines = ["\t".join(columns)] + ["\t".join(fmt(r.get(c)) for c in columns) for r in rows]
    return "\n".join(lines) + "\n"


class Trainer:
    """Trains ``model`` on token-id sequences with cross-entropy.

    Args:
        model: maps ``input_ids [batch, seq_len]`` to ``logits [batch, num_labels]``.
        cfg: the ``train`` section.
        train_seqs: training sequences (int arrays of token ids), one per sample.
        train_labels: ``[n]`` class indices.
        valid_seqs / valid_labels: validation split (may be None: no evaluation,
            then best = last).
        model_name / model_config: saved in each checkpoint's config.json.
        assets_dir: prepared data dir (vocab/target map/meta copied into checkpoints).
        pad_id: padding id.
    """

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainConfig,
        train_seqs: list[np.ndarray],
        train_labels: np.ndarray,
        valid_seqs: list[np.ndarray] | None,
        valid_labels: np.ndarray | None,
        model_name: str,
        model_config: dict[str, Any],
        assets_dir: str,
        pad_id: int = 0,
    ) -> None:
        if len(train_seqs) == 0:
            raise ValueError("training split is empty")
        self.cfg = cfg
        self.device = torch.device(
            "cuda"
            if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
            else "cpu"
        )
        self.model = model.to(self.device)
        self.train_seqs, self.train_labels = train_seqs, np.asarray(train_labels, dtype=np.int64)
        self.valid_seqs, self.valid_labels = valid_seqs, valid_labels
        self.model_name, self.model_config = model_name, model_config
        self.assets_dir, self.pad_id = assets_dir, pad_id
        self.save_dir = cfg.save_dir
        self.optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=cfg.learning_rate,
            betas=tuple(cfg.adam_betas),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
            fused=True,  # one kernel per step: several times faster than foreach on CPU for big tables
        )
        micro_per_epoch = math.ceil(len(train_seqs) / cfg.batch_size)
        self.updates_per_epoch = math.ceil(micro_per_epoch / cfg.update_freq)
        self.total_updates = cfg.max_epoch * self.updates_per_epoch
        if cfg.max_update is not None:
            self.total_updates = min(self.total_updates, cfg.max_update)
        self.scheduler = get_scheduler(
            cfg.lr_scheduler,
            self.optimizer,
            num_warmup_steps=cfg.warmup_steps,
            num_training_steps=self.total_updates,
        )
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision)
        self.scaler = torch.amp.GradScaler(
            self.device.type, init_scale=128.0, enabled=cfg.precision == "fp16"
        )
        self.train_rows: list[dict[str, Any]] = []
        self.valid_rows: list[dict[str, Any]] = []

    def _save(self, name: str, info: dict[str, Any]) -> None:
        """Write checkpoint ``<save_dir>/<name>`` (atomic directory replace)."""
        save_checkpoint(
            io.join(self.save_dir, name),
            self.model,
            self.model_name,
            self.model_config,
            info,
            self.assets_dir,
        )

    # ---------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        """Metrics of the current model on the validation split (``classification_metrics``)."""
        probs = predict_probs(self.model, self.valid_seqs, 256, self.pad_id, self.device)
        return classification_metrics(self.valid_labels, probs)

    # ---------------------------------------------------------------- the loop
    def fit(self) -> TrainResult:
        """Run training until ``max_epoch``/``max_update`` or early stop.

        Raises:
            NonFiniteLossError: the loss or the gradient norm became NaN/Inf.
        """
        cfg, model = self.cfg, self.model
        from dvclive import Live

        live = Live(
            dir=io.join(self.save_dir, "dvclive"), save_dvc_exp=False, dvcyaml=None, report=None
        )
        metric = cfg.major_metric
        num_updates = samples_seen = 0
        best_score: float | None = None
        best_update: int | None = None
        best_valid: dict[str, float] = {}
        bad_evals, stopped_early, epoch = 0, False, 0
        start = time.perf_counter()
        window_loss = window_correct = window_n = 0.0
        bar = tqdm(
            total=self.total_updates, desc="train", unit="upd", mininterval=1.0, dynamic_ncols=True
        )

        def run_eval() -> bool:
            """Evaluate, log, save; returns True when training should stop early."""
            nonlocal best_score, best_update, best_valid, bad_evals
            info = {"update": num_updates, "epoch": epoch, "samples_seen": samples_seen}
            if self.valid_seqs is None:  # no validation split: best is the last model
                for name in ("last", "best"):
                    self._save(name, info)
                return False
            metrics = self.evaluate()
            improved = is_better(metric, metrics[metric], best_score)
            if improved:
                best_score, best_update, best_valid, bad_evals = (
                    metrics[metric],
                    num_updates,
                    metrics,
                    0,
                )
            else:
                bad_evals += 1
            row = {
                **info,
                **metrics,
                f"best_{metric}": best_score,
                "wall_time": time.perf_counter() - start,
            }
            self.valid_rows.append(row)
            cols = ["update", "epoch", "samples_seen", *metrics, f"best_{metric}", "wall_time"]
            io.write_text(io.join(self.save_dir, "valid.log.tsv"), _tsv(self.valid_rows, cols))
            live.step = num_updates  # DVCLive's x axis = updates
            for k, v in metrics.items():
                live.log_metric(f"valid/{k}", v)
            live.log_metric("valid/samples_seen", samples_seen, plot=False)
            live.make_summary()
            info_v = {**info, "valid": metrics}
            self._save("last", info_v)
            if improved:
                self._save("best", info_v)
            bar.set_postfix(
                {metric: f"{metrics[metric]:.4f}", "best": f"{best_score:.4f}"}, refresh=False
            )
            log.info(
                "update %d epoch %d: valid %s=%.4f (best %.4f at %s)",
                num_updates,
                epoch,
                metric,
                metrics[metric],
                best_score,
                best_update,
            )
            return bad_evals >= cfg.tolerance

        model.train()
        done = False
        for epoch in range(1, cfg.max_epoch + 1):
            order = epoch_order(len(self.train_seqs), cfg.seed, epoch)
            micro = [order[i : i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
            for w in range(0, len(micro), cfg.update_freq):
                window = micro[w : w + cfg.update_freq]
                n_window = sum(len(idx) for idx in window)
                torch.manual_seed(update_seed(cfg.seed, num_updates))
                self.optimizer.zero_grad(set_to_none=True)
                loss_total = 0.0
                for idx in window:
                    x = pad_batch(
                        [self.train_seqs[i] for i in idx], self.pad_id, getattr(model, "min_len", 1)
                    ).to(self.device)
                    y = torch.from_numpy(self.train_labels[idx]).to(self.device)
                    with torch.autocast(
                        self.device.type,
                        dtype=self.amp_dtype or torch.float32,
                        enabled=self.amp_dtype is not None,
                    ):
                        logits = model(x)
                    loss = F.cross_entropy(logits.float(), y, reduction="sum") / n_window
                    self.scaler.scale(loss).backward()
                    loss_total += loss.item()
                    window_correct += (logits.argmax(-1) == y).sum().item()
                self.scaler.unscale_(self.optimizer)
                grad_norm = float(
                    torch.nn.utils.clip_grad_norm_(
                        model.parameters(), cfg.clip_norm if cfg.clip_norm > 0 else float("inf")
                    )
                )
                if not math.isfinite(loss_total) or (
                    not math.isfinite(grad_norm) and cfg.precision != "fp16"
                ):
                    raise NonFiniteLossError(
                        f"non-finite {'loss' if not math.isfinite(loss_total) else 'gradient norm'} at update {num_updates + 1} "
                        f"(epoch {epoch}, loss={loss_total}, grad_norm={grad_norm}); try a lower learning_rate or precision=fp32"
                    )
                scale = self.scaler.get_scale()
                self.scaler.step(self.optimizer)
                self.scaler.update()
                if (
                    self.scaler.get_scale() >= scale
                ):  # a skipped fp16 step lowers the scale: no scheduler step
                    self.scheduler.step()
                num_updates += 1
                samples_seen += n_window
                window_loss += loss_total * n_window
                window_n += n_window
                bar.update(1)
                if num_updates % cfg.log_interval == 0 or num_updates == self.total_updates:
                    self.train_rows.append(
                        {
                            "update": num_updates,
                            "epoch": epoch,
                            "samples_seen": samples_seen,
                            "lr": self.optimizer.param_groups[0]["lr"],
                            "loss": window_loss / window_n,
                            "accuracy": window_correct / window_n,
                            "grad_norm": grad_norm,
                            "loss_scale": scale if cfg.precision == "fp16" else None,
                            "wall_time": time.perf_counter() - start,
                        }
                    )
                    io.write_text(
                        io.join(self.save_dir, "train.log.tsv"),
                        _tsv(self.train_rows, TRAIN_COLUMNS),
                    )
                    live.step = num_updates
                    live.log_metric("train/loss", window_loss / window_n)
                    live.log_metric("train/lr", self.optimizer.param_groups[0]["lr"])
                    bar.set_postfix({"loss": f"{window_loss / window_n:.4f}"}, refresh=False)
                    window_loss = window_correct = window_n = 0.0
                due = (
                    cfg.eval_interval > 0
                    and num_updates % cfg.eval_interval == 0
                    and num_updates >= cfg.eval_interval_warmup
                )
                if due and run_eval():
                    stopped_early = done = True
                if num_updates >= self.total_updates:
                    done = True
                if done:
                    break
            if not done and cfg.eval_interval == -1 and num_updates >= cfg.eval_interval_warmup:
                if run_eval():
                    stopped_early = done = True
            if done:
                break
        if not self.valid_rows or self.valid_rows[-1]["update"] != num_updates:
            if run_eval():
                stopped_early = True
        bar.close()
        live.end()
        return TrainResult(
            save_dir=self.save_dir,
            num_updates=num_updates,
            epochs=epoch,
            samples_seen=samples_seen,
            best_update=best_update,
            best_score=best_score,
            major_metric=metric,
            best_valid=best_valid,
            stopped_early=stopped_early,
            wall_time=time.perf_counter() - start,
        )
