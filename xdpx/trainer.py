"""The one shared training loop (see DESIGN.md, "Trainer").

Read it top to bottom: ``Trainer.fit`` is the loop, ``Trainer._update`` one
optimizer update. Features are plain branches, not hooks:

* precision: ``torch.amp`` autocast in fp16 (CUDA, with ``GradScaler``,
  init scale 128) or bf16; fp32 by default. A step the scaler skips
  (overflow) does not advance the lr scheduler (HF accelerate semantics); a
  scale below ``min_loss_scale`` stops training (``LossScaleError``).
* update windows: each update consumes a *window* of
  ``batch_size * update_freq * world_size`` samples of the epoch order. Rank
  ``r`` of ``world_size`` takes every ``world_size``-th sample of the window
  (for full windows the same sets as ``DistributedSampler`` + batching) and
  splits its share into micro-batches of ``batch_size``. Each micro-batch
  loss is the *sum* of per-sample cross-entropies divided by the window's
  samples per rank, so after DDP's gradient averaging an update equals one
  big batch of the whole window, for any split (the last, partial window of
  an epoch is normalised by its own size). Under DDP all micro-batches but
  the last run under ``no_sync``.
* ``auto_ga``: a CUDA out-of-memory error inside an update redoes it with
  half the micro-batch (so twice the micro-batches: the window and the data
  order stay the same); logged once.
* seeding (XDPX FAQ, seeds/000): init by ``seed``; the order of epoch e by
  ``(seed, e)``; dropout of update u by ``(seed, u)`` (plus the rank under
  DDP). The data order thus does not depend on ``batch_size``/``update_freq``
  as long as their product is kept.
* evaluation every ``eval_interval`` updates (or at epoch ends), best/last
  checkpoints, early stop after ``tolerance`` evals without improvement of
  ``major_metric`` (direction from ``xdpx.metrics.METRIC_DIRECTIONS``). Under
  DDP every rank scores its share of the valid split and the predictions are
  gathered, so all ranks take the same early-stop decision; rank 0 saves and
  logs.
* full checkpoints (``save_full_checkpoint``): ``last/`` also holds the
  optimizer, scheduler, scaler, RNG states and the position inside the
  epoch; ``Trainer.resume`` continues bit-exactly (CPU, fp32).
* guards: NaN/Inf loss or gradient stops training with a report naming the
  first module whose output (or parameter gradient) went non-finite, found
  by re-running the update with hooks (``find_nonfinite``); ``max_loss``.
* logs: ``train.log.tsv`` / ``valid.log.tsv`` (rewritten atomically from the
  state, so a resumed run's logs equal an uninterrupted one's),
  ``grad.log.tsv`` (``inspect_grad``), ``samples.log.tsv``
  (``log_sample_ids``), scalars from ``xdpx.log.add_summary``, DVCLive
  metrics/plots under ``<save_dir>/dvclive``, a tqdm progress bar, and an
  optional torch.profiler trace (``profile``).
* remote save_dir (``oss://``, ``s3://``): every log rewrite and checkpoint goes
  through ``xdpx.io`` (atomic objects, retried); DVCLive writes to a local staging
  directory mirrored to ``<save_dir>/dvclive`` after each evaluation and at the end.
* FreeLB (``adv: freelb``, :mod:`xdpx.adversarial`): each micro-batch runs
  ``adv_steps`` forward/backward passes with a perturbation added to the
  embedding output, each backward on ``loss / adv_steps`` (the parameter
  gradients of the K steps are averaged, Zhu et al. 2020, Algorithm 1),
  the perturbation ascending and projected in between; every step replays
  the micro-batch's random state (same dropout masks). The initial
  perturbation comes from a generator of its own, seeded by (``seed``,
  update, micro-batch), so the dropout masks are those of the same run
  without ``adv``. Under DDP only the
  last pass of the last micro-batch syncs. The logged loss is the mean over
  the K passes; the accuracy is the first pass's.
* distillation (``distill_from``, :mod:`xdpx.distill`): with teacher logits
  for every training sample the per-sample loss is
  ``(1 - distill_alpha) CE + distill_alpha T^2 KL(teacher_T || student_T)``
  (Hinton et al. 2015), normalised like the plain cross-entropy; the two
  parts are logged as ``distill_ce`` and ``distill_kl`` (per sample).
* ``on_eval``: the one outside call, for tuners (``xdpx.tune``): after each
  dev evaluation (logs written, checkpoints saved) the trainer calls
  ``on_eval(EvalEvent)``; raising ``StopTraining`` there ends training
  like an early stop (Optuna pruning).
"""

from __future__ import annotations

import io as _bytes_io
import json
import logging
import math
import random
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm
from transformers import get_scheduler

from xdpx import io
from xdpx import log as xlog
from xdpx.adversarial import FreeLB, rng_state, set_rng_state
from xdpx.checkpoint import load_training_state, save_checkpoint
from xdpx.config import TrainConfig
from xdpx.distill import distill_loss
from xdpx.errors import DivergenceError, LossScaleError, NonFiniteLossError
from xdpx.inference import Batch, call_model, pad_batch, predict_probs, to_device
from xdpx.metrics import classification_metrics, is_better
from xdpx.models import with_default_learning_rate
from xdpx.optim import param_groups, warmup_updates

log = logging.getLogger("xdpx.trainer")

__all__ = [
    "Trainer",
    "TrainResult",
    "EvalEvent",
    "StopTraining",
    "TrainState",
    "ShardedOrder",
    "DivergenceError",
    "NonFiniteLossError",
    "LossScaleError",
    "epoch_order",
    "update_seed",
    "find_nonfinite",
    "RESUMABLE_CHANGES",
]

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

#: ``train`` keys that may differ between a checkpoint and the run resuming it
#: (``save_dir``/``auto_suffix``: ``resume_from`` continues another run in a new directory).
RESUMABLE_CHANGES = frozenset(
    {
        "resume",
        "resume_from",
        "save_dir",
        "auto_suffix",
        "overwrite",
        "max_epoch",
        "max_update",
        "max_samples",
        "threads",
        "log_interval",
        "save_interval",
        "tolerance",
        "inspect_grad",
        "log_sample_ids",
        "profile",
        "profile_steps",
        "auto_ga",
        "max_loss",
    }
)


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
    samples_per_epoch: int = 0  # samples seen per epoch (epoch boundaries of the curves)


@dataclass
class TrainState:
    """Everything besides tensors that a bit-exact resume needs (saved as trainer_state.json).

    ``epoch`` is the epoch being trained (1-based) and ``epoch_pos`` the number
    of samples of its (padded) order already consumed: a resume continues at
    ``order[epoch_pos:]``.
    """

    epoch: int = 1
    epoch_pos: int = 0
    num_updates: int = 0
    samples_seen: int = 0
    last_epoch: int = 0  # epoch of the latest update
    micro_batch_size: int = 0  # batch_size, halved by auto_ga
    best_score: float | None = None
    best_update: int | None = None
    best_valid: dict[str, float] = field(default_factory=dict)
    bad_evals: int = 0
    stopped_early: bool = False
    finished: bool = False
    elapsed: float = 0.0  # wall seconds spent before the latest (re)start
    # running sums since the last train.log.tsv row
    window_loss: float = 0.0
    window_correct: float = 0.0
    window_n: float = 0.0
    summaries: dict[str, list[float]] = field(default_factory=dict)  # name -> [sum, count]
    train_rows: list[dict[str, Any]] = field(default_factory=list)
    valid_rows: list[dict[str, Any]] = field(default_factory=list)
    grad_rows: list[dict[str, Any]] = field(default_factory=list)
    sample_rows: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class EvalEvent:
    """One dev evaluation, as passed to ``Trainer(on_eval=...)``.

    Attributes:
        update: updates done so far.
        epoch: epoch of the latest update (1-based).
        samples_seen: training samples consumed so far (the progress measure
            that compares runs with different batch sizes, as ``xdpx viz`` does).
        metrics: the valid metrics (``classification_metrics``), e.g. ``accuracy``, ``loss``.
        major_metric: ``train.major_metric``; its value is ``metrics[major_metric]``.
        best_score: best ``major_metric`` so far, this evaluation included.
    """

    update: int
    epoch: int
    samples_seen: int
    metrics: dict[str, float]
    major_metric: str
    best_score: float | None


class StopTraining(Exception):
    """Raised by an ``on_eval`` callback to end training after this evaluation (e.g. pruning).

    The trainer handles it like an early stop: the evaluation's logs and
    checkpoints are already written, ``last/`` is re-saved as finished, and
    ``fit`` returns normally; ``Trainer.stop_reason`` holds the message.
    """


def epoch_order(n: int, seed: int, epoch: int) -> np.ndarray:
    """Permutation of ``range(n)`` for ``epoch``, seeded by ``(seed, epoch)`` only (FAQ: shuffling)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


class ShardedOrder:
    """Seeded, rank-sharded epoch order with ``DistributedSampler`` semantics.

    ``set_epoch(e)`` selects the permutation of epoch ``e`` (``epoch_order``),
    padded by wrapping around to a multiple of ``world_size`` (as
    ``DistributedSampler(drop_last=False)`` does) so every rank gets the same
    number of samples. ``shard(window)`` is rank ``rank``'s share of a window
    of that order: every ``world_size``-th sample starting at ``rank``.

    Args:
        n: dataset size.
        seed: ``train.seed``.
        world_size / rank: process group size and this process's rank.
    """

    def __init__(self, n: int, seed: int, world_size: int = 1, rank: int = 0) -> None:
        self.n, self.seed, self.world_size, self.rank = n, seed, world_size, rank
        self.epoch = 1

    def set_epoch(self, epoch: int) -> None:
        """Select the order of ``epoch`` (1-based)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(self.n / self.world_size) * self.world_size

    def order(self) -> np.ndarray:
        """Global order of the current epoch, ``[len(self)]`` sample ids."""
        order = epoch_order(self.n, self.seed, self.epoch)
        pad = len(self) - self.n
        return np.concatenate([order, order[:pad]]) if pad else order

    def shard(self, window: np.ndarray) -> np.ndarray:
        """This rank's samples of ``window`` (a slice of ``order()``)."""
        return window[self.rank :: self.world_size]


def update_seed(seed: int, num_updates: int, rank: int = 0) -> int:
    """Seed of the step noise (dropout) of update ``num_updates`` (FAQ: by seed and num_updates).

    Under DDP the rank is mixed in so ranks draw different dropout masks; rank 0
    draws what a single process would.
    """
    entropy = [seed, num_updates] + ([rank] if rank else [])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def _tsv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def fmt(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    lines = ["\t".join(columns)] + ["\t".join(fmt(r.get(c)) for c in columns) for r in rows]
    return "\n".join(lines) + "\n"


def _has_nonfinite(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_floating_point() and not bool(torch.isfinite(value).all())
    if isinstance(value, (tuple, list)):
        return any(_has_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nonfinite(v) for v in value.values())
    return False


def find_nonfinite(model: nn.Module, x: Batch, y: torch.Tensor, autocast: Any = nullcontext) -> str:
    """Re-run one micro-batch with hooks and name where NaN/Inf first appears.

    Forward hooks on every module (enabled only for this re-run) record the
    first module, in execution order, whose output holds NaN/Inf (a child
    finishes before its parent, so this is the innermost culprit). If every
    output is finite, gradient hooks on the parameters record the first
    parameter, in backward order, whose gradient is non-finite. Gradients are
    cleared afterwards.

    Args:
        model: the (unwrapped) model, in the mode the failing update used.
        x: ``[batch, seq_len]`` input ids, or a tuple of them for a pair model
            (called as ``model(*x)``); y: ``[batch]`` labels.
        autocast: zero-argument callable returning the autocast context used in training.

    Returns:
        A phrase such as ``"output of module 'convs.1' (Conv1d)"``.
    """
    names = {m: (n or "<model>") for n, m in model.named_modules()}
    found: list[str] = []

    def forward_hook(module: nn.Module, _inputs: Any, output: Any) -> None:
        if not found and _has_nonfinite(output):
            found.append(f"output of module {names[module]!r} ({type(module).__name__})")

    handles = [m.register_forward_hook(forward_hook) for m in model.modules()]
    try:
        model.zero_grad(set_to_none=True)
        with autocast():
            logits = call_model(model, x)
        loss = F.cross_entropy(logits.float(), y, reduction="sum")
    finally:
        for h in handles:
            h.remove()
    if found:
        return found[0]
    if not torch.isfinite(loss):
        return "the loss itself (every module output was finite)"
    grads: list[str] = []
    param_handles = [
        p.register_hook(
            lambda g, n=name: grads.append(n) if not grads and not torch.isfinite(g).all() else None
        )
        for name, p in model.named_parameters()
        if p.requires_grad
    ]
    try:
        loss.backward()
    finally:
        for h in param_handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    if grads:
        module = grads[0].rpartition(".")[0] or "<model>"
        return f"gradient of parameter {grads[0]!r} (module {module!r})"
    return "nothing on re-run (the non-finite value was not reproduced)"


def balanced_class_weight(labels: np.ndarray, num_labels: int) -> torch.Tensor:
    """``n / (num_labels * n_c)`` per class ``c`` with ``n_c`` training samples (0 for a class
    without any), scikit-learn's ``compute_class_weight("balanced")``: the weights of all
    samples sum to ``n``, so the loss keeps the scale of the unweighted one.

    Args:
        labels: ``[n]`` class indices.
        num_labels: number of classes.

    Returns:
        ``[num_labels]`` float32.
    """
    counts = np.bincount(labels, minlength=num_labels).astype(np.float64)
    weight = np.divide(
        len(labels), num_labels * counts, out=np.zeros_like(counts), where=counts > 0
    )
    return torch.as_tensor(weight, dtype=torch.float32)


class Trainer:
    """Trains ``model`` on token-id sequences with cross-entropy.

    Args:
        model: maps ``input_ids [batch, seq_len]`` to ``logits [batch, num_labels]``;
            a pair model (``input_names`` of two) maps ``(input_ids, input_ids2)``.
        cfg: the ``train`` section.
        train_seqs: training samples, one per example: int arrays of token ids, or
            ``(input_ids, input_ids2)`` tuples for a pair model (``xdpx.inference.as_samples``).
        train_labels: ``[n]`` class indices.
        valid_seqs / valid_labels: validation split (may be None: no evaluation,
            then best = last).
        model_name / model_config: saved in each checkpoint's config.json.
        assets_dir: prepared data dir (vocab/target map/meta copied into checkpoints).
        pad_id: padding id.
        on_eval: called as ``on_eval(EvalEvent)`` after each dev evaluation,
            once its valid.log.tsv row, DVCLive step and checkpoints are
            written (never without a valid split). It may raise
            ``StopTraining`` to end training there; any other exception
            propagates out of ``fit``. Under DDP every rank calls it with the
            same metrics and must decide the same way. None (default): no call.
        teacher_logits: ``[n, num_labels]`` teacher logits aligned with ``train_seqs``
            (``xdpx.distill.load_teacher_logits``): adds the distillation term with
            ``cfg.distill_alpha`` / ``cfg.distill_temperature``. None: plain cross-entropy.

    Under ``torch.distributed`` (initialised by the caller, e.g. ``stages.train``
    under torchrun) the model is wrapped in ``DistributedDataParallel``.

    Raises:
        ValueError: empty training split, ``auto_ga`` under DDP (one rank
            cannot change its micro-batch alone), or ``teacher_logits`` of the wrong shape.
        ConfigError: ``cfg.adv`` set for a model without an embedding layer.
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
        on_eval: Callable[[EvalEvent], None] | None = None,
        teacher_logits: np.ndarray | None = None,
    ) -> None:
        if len(train_seqs) == 0:
            raise ValueError("training split is empty")
        if teacher_logits is not None and (
            teacher_logits.ndim != 2 or len(teacher_logits) != len(train_seqs)
        ):
            raise ValueError(
                f"teacher_logits must be [{len(train_seqs)}, num_labels], got {teacher_logits.shape}"
            )
        cfg = with_default_learning_rate(cfg)
        self.cfg = cfg
        distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if distributed else 1
        self.rank = dist.get_rank() if distributed else 0
        if cfg.auto_ga and self.world_size > 1:
            raise ValueError("train.auto_ga works in a single process only (not under DDP)")
        use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
        )
        self.module = model.to(self.device)  # the bare model: eval, save, diagnose
        self.model: nn.Module = self.module
        if self.world_size > 1:
            self.model = nn.parallel.DistributedDataParallel(
                self.module, device_ids=[self.device.index] if use_cuda else None
            )
        self.train_seqs, self.train_labels = train_seqs, np.asarray(train_labels, dtype=np.int64)
        self.valid_seqs, self.valid_labels = valid_seqs, valid_labels
        self.model_name, self.model_config = model_name, model_config
        self.assets_dir, self.pad_id = assets_dir, pad_id
        self.save_dir = cfg.save_dir
        self.is_main = self.rank == 0
        self.optimizer = torch.optim.AdamW(
            param_groups(self.module, cfg),
            lr=cfg.learning_rate,
            betas=tuple(cfg.adam_betas),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
            fused=True,  # one kernel per step: several times faster than foreach on CPU for big tables
        )
        self.sampler = ShardedOrder(len(train_seqs), cfg.seed, self.world_size, self.rank)
        self.window_size = cfg.batch_size * cfg.update_freq * self.world_size
        self.updates_per_epoch = math.ceil(len(self.sampler) / self.window_size)
        self.total_updates = cfg.max_epoch * self.updates_per_epoch
        if cfg.max_update is not None:
            self.total_updates = min(self.total_updates, cfg.max_update)
        if cfg.max_samples is not None:
            self.total_updates = min(
                self.total_updates, math.ceil(cfg.max_samples / self.window_size)
            )
        self.scheduler = get_scheduler(
            cfg.lr_scheduler,
            self.optimizer,
            num_warmup_steps=warmup_updates(cfg, self.total_updates),
            num_training_steps=self.total_updates,
        )
        self.amp_dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision)
        self.scaler = torch.amp.GradScaler(
            self.device.type, init_scale=128.0, enabled=cfg.precision == "fp16"
        )
        self.state = TrainState(micro_batch_size=cfg.batch_size)
        self.resumed_from: str | None = None
        self._auto_ga_logged = False
        self._live: Any = None
        self._live_mirror: io.DirMirror | None = None  # remote save_dir: dvclive/ staged locally
        self.on_eval = on_eval
        self.stop_reason: str | None = None  # message of a StopTraining raised by on_eval
        self.freelb = (
            FreeLB(
                self.module, cfg.adv_steps, cfg.adv_lr, cfg.adv_init_mag, cfg.adv_max_norm, pad_id
            )
            if cfg.adv == "freelb"
            else None
        )
        self._adv_rng = torch.Generator(device=self.device)  # FreeLB's delta_0
        num_labels = self.model_config.get("num_labels") or int(self.train_labels.max()) + 1
        self.class_weight = (
            balanced_class_weight(self.train_labels, int(num_labels)).to(self.device)
            if cfg.class_weight == "balanced"
            else None
        )
        self.teacher_logits = (
            torch.as_tensor(teacher_logits, dtype=torch.float32, device=self.device)
            if teacher_logits is not None
            else None
        )

    # ---------------------------------------------------------------- saving / resuming
    def _training_files(self) -> dict[str, bytes]:
        """The ``TRAINING_FILES`` of a full checkpoint, serialised."""

        def tensor_bytes(obj: Any) -> bytes:
            buf = _bytes_io.BytesIO()
            torch.save(obj, buf)
            return buf.getvalue()

        np_state = np.random.get_state()
        py_state = random.getstate()
        trainer_state = {
            **asdict(self.state),
            "elapsed": self._wall(),
            "config": self.cfg.model_dump(mode="json"),
            "world_size": self.world_size,
            "rng_python": [py_state[0], list(py_state[1]), py_state[2]],
            "rng_numpy": [np_state[0], np_state[1].tolist(), *[float(v) for v in np_state[2:]]],
        }
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "trainer_state.json": json.dumps(trainer_state, indent=1).encode(),
            "optimizer.pt": tensor_bytes(self.optimizer.state_dict()),
            "scheduler.pt": tensor_bytes(self.scheduler.state_dict()),
            "scaler.pt": tensor_bytes(self.scaler.state_dict()),
            "rng.pt": tensor_bytes(rng),
        }

    def _save(self, name: str, info: dict[str, Any], full: bool = False) -> None:
        """Write checkpoint ``<save_dir>/<name>`` (atomic directory replace); rank 0 only."""
        if not self.is_main:
            return
        save_checkpoint(
            io.join(self.save_dir, name),
            self.module,
            self.model_name,
            self.model_config,
            info,
            self.assets_dir,
            extra_files=self._training_files() if full and self.cfg.save_full_checkpoint else None,
        )

    def resume(self, path: str) -> None:
        """Load a full checkpoint (``save_full_checkpoint``) so ``fit`` continues where it stopped.

        Restores model, optimizer, scheduler, GradScaler, python/numpy/torch/CUDA
        RNG states, the position in the epoch, counters, best score and log rows.

        Raises:
            CheckpointError: not a full checkpoint, truncated or corrupt.
            ValueError: the checkpoint was trained with a different config (keys
                outside ``RESUMABLE_CHANGES``) or world size.
        """
        saved = load_training_state(path)
        ts = saved["trainer_state"]
        now = self.cfg.model_dump(mode="json")
        changed = sorted(
            k
            for k in now
            if k not in RESUMABLE_CHANGES and ts["config"].get(k) != now[k] and k in ts["config"]
        )
        if changed:
            diffs = ", ".join(f"{k}: {ts['config'][k]!r} -> {now[k]!r}" for k in changed)
            raise ValueError(
                f"cannot resume {path}: config differs from the checkpoint's ({diffs})"
            )
        if ts["world_size"] != self.world_size:
            raise ValueError(
                f"cannot resume {path}: saved by {ts['world_size']} processes, now {self.world_size}"
            )
        self.module.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        self.scheduler.load_state_dict(saved["scheduler"])
        if saved["scaler"]:
            self.scaler.load_state_dict(saved["scaler"])
        names = {f.name for f in fields(TrainState)}
        self.state = TrainState(**{k: v for k, v in ts.items() if k in names})
        py = ts["rng_python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
        npy = ts["rng_numpy"]
        np.random.set_state(
            (npy[0], np.array(npy[1], dtype=np.uint32), int(npy[2]), int(npy[3]), npy[4])
        )
        torch.set_rng_state(saved["rng"]["torch"])
        if "cuda" in saved["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["rng"]["cuda"])
        self.resumed_from = path
        log.info(
            "resumed from %s: epoch %d, %d samples into it, update %d",
            path,
            self.state.epoch,
            self.state.epoch_pos,
            self.state.num_updates,
        )

    # ---------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        """Metrics of the current model on the validation split (``classification_metrics``).

        Under DDP each rank scores every ``world_size``-th sample and the
        probabilities are gathered, so every rank returns the same metrics.
        """
        if self.world_size == 1:
            probs = predict_probs(self.module, self.valid_seqs, 256, self.pad_id, self.device)
            return classification_metrics(self.valid_labels, probs)
        idx = np.arange(self.rank, len(self.valid_seqs), self.world_size)
        local = (
            predict_probs(
                self.module, [self.valid_seqs[i] for i in idx], 256, self.pad_id, self.device
            )
            if len(idx)
            else None
        )
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, (idx, local))
        num_labels = next(p.shape[1] for _, p in gathered if p is not None)
        probs = np.zeros((len(self.valid_seqs), num_labels))
        for i, p in gathered:
            if p is not None:
                probs[i] = p
        return classification_metrics(self.valid_labels, probs)

    # ---------------------------------------------------------------- logs
    def _wall(self) -> float:
        return self.state.elapsed + time.perf_counter() - self._start

    def _write_logs(self) -> None:
        """Rewrite the TSV logs from the state rows (atomic); rank 0 only."""
        if not self.is_main:
            return
        st = self.state
        summary_cols = sorted({k for r in st.train_rows for k in r} - set(TRAIN_COLUMNS))
        io.write_text(
            io.join(self.save_dir, "train.log.tsv"),
            _tsv(st.train_rows, TRAIN_COLUMNS + summary_cols),
        )
        if st.valid_rows:
            cols = list(dict.fromkeys(k for r in st.valid_rows for k in r))
            io.write_text(io.join(self.save_dir, "valid.log.tsv"), _tsv(st.valid_rows, cols))
        if st.grad_rows:
            cols = list(dict.fromkeys(k for r in st.grad_rows for k in r))
            io.write_text(io.join(self.save_dir, "grad.log.tsv"), _tsv(st.grad_rows, cols))
        if st.sample_rows:
            io.write_text(
                io.join(self.save_dir, "samples.log.tsv"),
                _tsv(st.sample_rows, ["update", "epoch", "sample_ids"]),
            )

    def _open_live(self) -> Any:
        """DVCLive writer at ``<save_dir>/dvclive`` (rank 0); on resume, drop steps after the checkpoint.

        DVCLive writes to a local directory; for a save_dir on an object store it writes
        to a staging directory under ``xdpx.io.cache_dir("live")`` (filled from the
        remote ``dvclive/`` on resume) that :meth:`_push_live` uploads after each
        evaluation and at the end.
        """
        if not self.is_main:
            return None
        import hashlib
        import shutil

        from dvclive import Live

        live_dir = io.join(self.save_dir, "dvclive")
        resumed = self.resumed_from is not None
        if io.is_remote(live_dir):
            remote = live_dir
            live_dir = io.cache_dir("live", hashlib.sha256(remote.encode()).hexdigest()[:16])
            shutil.rmtree(live_dir, ignore_errors=True)
            if resumed and io.isdir(remote):
                io.download_dir(remote, live_dir)
            self._live_mirror = io.DirMirror(live_dir, remote)
        if resumed and io.is_local(live_dir):
            _truncate_dvclive(live_dir, self.state.num_updates)
        return Live(dir=live_dir, save_dvc_exp=False, dvcyaml=None, report=None, resume=resumed)

    def _push_live(self) -> None:
        """Upload what DVCLive changed to the remote ``<save_dir>/dvclive`` (remote save_dir only)."""
        if self._live_mirror is not None:
            self._live_mirror.push()

    def _log_train_row(self, grad_norm: float, scale: float | None) -> None:
        st, live = self.state, self._live
        groups = self.optimizer.param_groups
        lr = groups[0]["lr"]  # several groups: learning_rate x the schedule's current factor
        if len(groups) > 1:
            lr = self.cfg.learning_rate * groups[0]["lr"] / groups[0]["initial_lr"]
        row = {
            "update": st.num_updates,
            "epoch": st.last_epoch,
            "samples_seen": st.samples_seen,
            "lr": lr,
            "loss": st.window_loss / st.window_n,
            "accuracy": st.window_correct / st.window_n,
            "grad_norm": grad_norm,
            "loss_scale": scale,
            "wall_time": self._wall(),
        }
        row.update({k: s / c for k, (s, c) in st.summaries.items()})
        st.train_rows.append(row)
        self._write_logs()
        if live is not None:
            live.step = st.num_updates  # DVCLive's x axis = updates
            live.log_metric("train/loss", row["loss"])
            live.log_metric("train/lr", lr)
            if scale is not None:
                live.log_metric("train/loss_scale", scale)
            for k, (s, c) in st.summaries.items():
                live.log_metric(f"train/{k}", s / c)
        st.window_loss = st.window_correct = st.window_n = 0.0
        st.summaries = {}

    def _eval_and_save(self, epoch: int) -> bool:
        """Evaluate, log, save last (+best); returns True when training should stop early."""
        st, cfg, metric = self.state, self.cfg, self.cfg.major_metric
        info: dict[str, Any] = {
            "update": st.num_updates,
            "epoch": epoch,
            "samples_seen": st.samples_seen,
        }
        if self.valid_seqs is None:  # no validation split: best is the last model
            self._save("best", info)
            self._save("last", info, full=True)
            return False
        metrics = self.evaluate()
        improved = is_better(metric, metrics[metric], st.best_score)
        if improved:
            st.best_score, st.best_update, st.best_valid, st.bad_evals = (
                metrics[metric],
                st.num_updates,
                metrics,
                0,
            )
        else:
            st.bad_evals += 1
        st.stopped_early = st.bad_evals >= cfg.tolerance
        # no wall time here: valid.log.tsv is a function of the config (resume == uninterrupted)
        st.valid_rows.append({**info, **metrics, f"best_{metric}": st.best_score})
        self._write_logs()
        if self._live is not None:
            self._live.step = st.num_updates
            for k, v in metrics.items():
                self._live.log_metric(f"valid/{k}", v)
            self._live.log_metric("valid/samples_seen", st.samples_seen, plot=False)
            self._live.make_summary()
            self._push_live()
        info_v = {**info, "valid": metrics}
        if improved:
            self._save("best", info_v)
        if cfg.keep_checkpoints:
            self._save(f"checkpoint-{st.num_updates}", info_v)
        self._save("last", info_v, full=True)
        log.info(
            "update %d epoch %d: valid %s=%.4f (best %.4f at %s)",
            st.num_updates,
            epoch,
            metric,
            metrics[metric],
            st.best_score,
            st.best_update,
        )
        if self.on_eval is not None:
            event = EvalEvent(
                st.num_updates, epoch, st.samples_seen, dict(metrics), metric, st.best_score
            )
            try:
                self.on_eval(event)
            except StopTraining as stop:
                self.stop_reason = str(stop) or "stop requested by on_eval"
                log.info("update %d: training stopped: %s", st.num_updates, self.stop_reason)
                return True
        return st.stopped_early

    # ---------------------------------------------------------------- one update
    def _autocast(self) -> Any:
        return torch.autocast(
            self.device.type,
            dtype=self.amp_dtype or torch.float32,
            enabled=self.amp_dtype is not None,
        )

    def _batch(self, idx: np.ndarray) -> tuple[Batch, torch.Tensor]:
        """Padded inputs (a tuple for pairs, each input to its own width) and labels of ``idx``."""
        x = pad_batch(
            [self.train_seqs[i] for i in idx], self.pad_id, getattr(self.module, "min_len", 1)
        )
        return to_device(x, self.device), torch.from_numpy(self.train_labels[idx]).to(self.device)

    def _loss(self, logits: torch.Tensor, y: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
        """The training loss of a micro-batch, summed over its samples.

        Cross-entropy (each sample's weighted by its class with ``class_weight``); with
        teacher logits, Hinton et al.'s distillation loss
        (``xdpx.distill.distill_loss``), its parts sent to the ``distill_ce`` /
        ``distill_kl`` summaries (per-sample means).
        """
        if self.teacher_logits is None:
            return F.cross_entropy(logits.float(), y, weight=self.class_weight, reduction="sum")
        cfg = self.cfg
        teacher = self.teacher_logits[torch.from_numpy(idx).to(self.device)]
        loss, ce, kl = distill_loss(logits, y, teacher, cfg.distill_alpha, cfg.distill_temperature)
        xlog.add_summary("distill_ce", ce / len(idx))
        xlog.add_summary("distill_kl", kl / len(idx))
        return loss

    def _forward_backward(self, local: np.ndarray, n_window: int) -> tuple[float, float]:
        """Accumulate the gradients of one window share; returns (summed loss, correct).

        With FreeLB each micro-batch takes ``adv_steps`` passes (module docstring).
        """
        micro = self.state.micro_batch_size
        chunks = [local[i : i + micro] for i in range(0, len(local), micro)]
        per_rank = n_window / self.world_size  # DDP averages over ranks: sum / per_rank overall
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
                        loss = self._loss(logits, y, idx)
                    self.scaler.scale(loss / (per_rank * steps)).backward()
                if t < steps - 1:
                    self.freelb.ascend()  # type: ignore[union-attr]
                loss_sum += loss.item() / steps
                if t == 0:
                    correct += (logits.argmax(-1) == y).sum().item()
        for name, values in sink.items():
            acc = self.state.summaries.setdefault(name, [0.0, 0])
            acc[0] += sum(values)
            acc[1] += len(values)
        return loss_sum, correct

    def _diagnose(self, local: np.ndarray) -> str:
        """Name where NaN/Inf first appears, re-running this update's micro-batches with hooks."""
        micro = self.state.micro_batch_size
        for i in range(0, len(local), micro):
            torch.manual_seed(update_seed(self.cfg.seed, self.state.num_updates, self.rank))
            where = find_nonfinite(self.module, *self._batch(local[i : i + micro]), self._autocast)
            if not where.startswith("nothing"):
                return where
        return where

    def _update(self, window: np.ndarray) -> tuple[float, float | None]:
        """One optimizer update on ``window`` (global sample ids); returns (grad norm, loss scale)."""
        cfg, st = self.cfg, self.state
        local = self.sampler.shard(window)
        while True:
            torch.manual_seed(update_seed(cfg.seed, st.num_updates, self.rank))
            self.optimizer.zero_grad(set_to_none=True)
            try:
                loss_sum, correct = self._forward_backward(local, len(window))
                break
            except torch.cuda.OutOfMemoryError:
                if not cfg.auto_ga or st.micro_batch_size == 1:
                    raise
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
                        math.ceil(len(local) / st.micro_batch_size),
                    )
                    self._auto_ga_logged = True
        stats = [loss_sum, correct]
        if self.world_size > 1:
            t = torch.tensor(stats, dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            stats = t.tolist()
        loss = stats[0] / len(window)  # mean cross-entropy of the window
        self.scaler.unscale_(self.optimizer)
        logging_now = (st.num_updates + 1) % cfg.log_interval == 0
        if cfg.inspect_grad and logging_now and self.is_main:
            st.grad_rows.append({"update": st.num_updates + 1, **_group_grad_norms(self.module)})
        grad_norm = float(
            torch.nn.utils.clip_grad_norm_(
                self.module.parameters(), cfg.clip_norm if cfg.clip_norm > 0 else float("inf")
            )
        )
        fp16 = cfg.precision == "fp16"
        if not math.isfinite(loss) or (not math.isfinite(grad_norm) and not fp16):
            what = "loss" if not math.isfinite(loss) else "gradient norm"
            where = self._diagnose(local)
            raise NonFiniteLossError(
                f"non-finite {what} at update {st.num_updates + 1} (epoch {st.epoch}, loss={loss}, "
                f"grad_norm={grad_norm}); first non-finite value: {where}. "
                "Try a lower learning_rate, clip_norm, warmup_steps or precision=fp32"
            )
        if cfg.max_loss is not None and loss > cfg.max_loss:
            raise DivergenceError(
                f"loss {loss:.4g} > max_loss {cfg.max_loss} at update {st.num_updates + 1} "
                f"(epoch {st.epoch}); try a lower learning_rate or more warmup_steps"
            )
        scale = self.scaler.get_scale() if fp16 else None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if fp16 and self.scaler.get_scale() < scale:  # overflow: step skipped, no scheduler step
            if self.scaler.get_scale() < cfg.min_loss_scale:
                raise LossScaleError(
                    f"fp16 loss scale fell to {self.scaler.get_scale():g} < min_loss_scale "
                    f"{cfg.min_loss_scale:g} at update {st.num_updates + 1}: gradients overflow "
                    "at every scale; try precision=bf16, a lower learning_rate or clip_norm"
                )
        else:
            self.scheduler.step()
        st.num_updates += 1
        st.samples_seen += len(window)
        st.last_epoch = st.epoch
        st.window_loss += loss * len(window)
        st.window_correct += stats[1]
        st.window_n += len(window)
        if cfg.log_sample_ids and self.is_main:
            st.sample_rows.append(
                {
                    "update": st.num_updates,
                    "epoch": st.epoch,
                    "sample_ids": ",".join(map(str, window.tolist())),
                }
            )
        return grad_norm, scale

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
        self._live = self._open_live()
        if self.resumed_from is not None:
            self._write_logs()  # drop rows the interrupted run wrote after its checkpoint
        bar = tqdm(
            total=self.total_updates,
            initial=st.num_updates,
            desc="train",
            unit="upd",
            mininterval=1.0,
            dynamic_ncols=True,
            disable=not self.is_main,
        )
        profiler = self._start_profiler()
        try:
            self._loop(bar, profiler)
        finally:
            if profiler is not None:
                profiler.stop()
            bar.close()
            if self._live is not None:
                self._live.end()
        self._push_live()  # remote save_dir: the final DVCLive files
        if self.world_size > 1:
            dist.barrier()
        return TrainResult(
            save_dir=self.save_dir,
            num_updates=st.num_updates,
            epochs=st.last_epoch,
            samples_seen=st.samples_seen,
            best_update=st.best_update,
            best_score=st.best_score,
            major_metric=cfg.major_metric,
            best_valid=st.best_valid,
            stopped_early=st.stopped_early,
            wall_time=self._wall(),
            samples_per_epoch=len(self.sampler),
        )

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
            self.sampler.set_epoch(st.epoch)
            order = self.sampler.order()
            while st.epoch_pos < len(order) and not done:
                window = order[st.epoch_pos : st.epoch_pos + self.window_size]
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
                    self._save("last", {"update": st.num_updates, "epoch": st.epoch}, full=True)
            if st.epoch_pos >= len(order):  # epoch finished
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
            self._save("last", {"update": st.num_updates, "epoch": st.last_epoch}, full=True)

    def _start_profiler(self) -> Any:
        """torch.profiler over ``profile_steps`` updates after 1 wait + 1 warmup (rank 0)."""
        if not (self.cfg.profile and self.is_main):
            return None
        from torch.profiler import ProfilerActivity, profile, schedule

        def write_trace(prof: Any) -> None:
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                trace = f"{tmp}/trace.json"
                prof.export_chrome_trace(trace)
                io.write_bytes(
                    io.join(self.save_dir, "profile", "trace.json"), open(trace, "rb").read()
                )
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
            io.write_text(io.join(self.save_dir, "profile", "summary.txt"), table + "\n")
            log.info(
                "profile: trace of %d updates in %s/profile/", self.cfg.profile_steps, self.save_dir
            )

        activities = [ProfilerActivity.CPU] + (
            [ProfilerActivity.CUDA] if self.device.type == "cuda" else []
        )
        prof = profile(
            activities=activities,
            schedule=schedule(wait=1, warmup=1, active=self.cfg.profile_steps, repeat=1),
            on_trace_ready=write_trace,
        )
        prof.start()
        return prof


def _group_grad_norms(model: nn.Module) -> dict[str, float]:
    """L2 norm of the gradients of each top-level child module (``grad_norm/<name>``)."""
    out: dict[str, float] = {}
    for name, child in model.named_children():
        grads = [p.grad.detach().float() for p in child.parameters() if p.grad is not None]
        if grads:
            out[f"grad_norm/{name}"] = float(
                torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
            )
    own = [p.grad.detach().float() for p in model.parameters(recurse=False) if p.grad is not None]
    if own:
        out["grad_norm/<model>"] = float(
            torch.linalg.vector_norm(torch.stack([g.norm() for g in own]))
        )
    return out


def _truncate_dvclive(live_dir: str, step: int) -> None:
    """Drop DVCLive plot rows with ``step`` > ``step`` (written after the checkpoint we resume from)."""
    import csv
    import os

    plots = os.path.join(live_dir, "plots", "metrics")
    for root, _, files in os.walk(plots):
        for name in files:
            if not name.endswith(".tsv"):
                continue
            path = os.path.join(root, name)
            with open(path, newline="") as f:
                rows = list(csv.reader(f, delimiter="\t"))
            if not rows or "step" not in rows[0]:
                continue
            col = rows[0].index("step")
            kept = [rows[0]] + [r for r in rows[1:] if int(r[col]) <= step]
            io.write_text(path, "".join("\t".join(r) + "\n" for r in kept))
