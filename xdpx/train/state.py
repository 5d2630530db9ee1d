"""The trainer's state and results: what a bit-exact resume needs besides the weights
(counters, position, RNG, optimizer), what ``fit`` returns, what ``on_eval`` receives.

A full checkpoint (``train.save_full_checkpoint``) holds, beside the model, the files
:func:`training_files` serialises (``xdpx.checkpoint.TRAINING_FILES``):
``trainer_state.json`` (:class:`TrainState`, the config, the world size, python/numpy RNG
states), ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt`` and ``rng.pt`` (torch/CUDA).
:func:`restore` puts all of it back and refuses a checkpoint whose config differs in a key
that changes the result (anything outside :data:`RESUMABLE_CHANGES`) or whose world size
differs.
"""

from __future__ import annotations

import io as _bytes_io
import json
import random
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import torch

from xdpx.checkpoint import load_training_state
from xdpx.metrics import is_better

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

    def record_eval(
        self, info: dict[str, Any], metrics: dict[str, float], major_metric: str, tolerance: int
    ) -> bool:
        """Book one evaluation: best score/update/metrics, the early-stop count (``tolerance``
        evaluations without improvement of ``major_metric``) and its ``valid.log.tsv`` row
        (``info`` = update, epoch, samples_seen; no wall time, so the log is a function of the
        config and a resumed run's equals an uninterrupted one's). Returns: it improved."""
        improved = is_better(major_metric, metrics[major_metric], self.best_score)
        if improved:
            self.best_score, self.best_update = metrics[major_metric], self.num_updates
            self.best_valid, self.bad_evals = metrics, 0
        else:
            self.bad_evals += 1
        self.stopped_early = self.bad_evals >= tolerance
        self.valid_rows.append({**info, **metrics, f"best_{major_metric}": self.best_score})
        return improved


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

    @classmethod
    def of(
        cls, state: TrainState, save_dir: str, major_metric: str, wall_time: float, epoch_len: int
    ) -> TrainResult:
        """The result of a run that ended in ``state``."""
        return cls(
            save_dir=save_dir,
            num_updates=state.num_updates,
            epochs=state.last_epoch,
            samples_seen=state.samples_seen,
            best_update=state.best_update,
            best_score=state.best_score,
            major_metric=major_metric,
            best_valid=state.best_valid,
            stopped_early=state.stopped_early,
            wall_time=wall_time,
            samples_per_epoch=epoch_len,
        )


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
        total_updates: the updates the run will make at most (its budget: ``max_epoch``,
            ``max_update``, ``max_samples``); progress is ``update / total_updates``.
    """

    update: int
    epoch: int
    samples_seen: int
    metrics: dict[str, float]
    major_metric: str
    best_score: float | None
    total_updates: int | None = None


class StopTraining(Exception):
    """Raised by an ``on_eval`` callback to end training after this evaluation (e.g. pruning).

    The trainer handles it like an early stop: the evaluation's logs are already written
    and its checkpoints are written right after, ``last/`` is re-saved as finished, and
    ``fit`` returns normally; ``Trainer.stop_reason`` holds the message.
    """


def _tensor_bytes(obj: Any) -> bytes:
    buf = _bytes_io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def training_files(
    state: TrainState,
    config: dict[str, Any],
    world_size: int,
    elapsed: float,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
) -> dict[str, bytes]:
    """The ``TRAINING_FILES`` of a full checkpoint, serialised (name -> bytes).

    Args:
        state: the trainer's state; ``elapsed`` (wall seconds so far) replaces its own.
        config: the ``train`` section as JSON (``model_dump(mode="json")``).
        world_size: processes training (a resume must use as many).
    """
    np_state = np.random.get_state()
    py_state = random.getstate()
    trainer_state = {
        **asdict(state),
        "elapsed": elapsed,
        "config": config,
        "world_size": world_size,
        "rng_python": [py_state[0], list(py_state[1]), py_state[2]],
        "rng_numpy": [np_state[0], np_state[1].tolist(), *[float(v) for v in np_state[2:]]],
    }
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return {
        "trainer_state.json": json.dumps(trainer_state, indent=1).encode(),
        "optimizer.pt": _tensor_bytes(optimizer.state_dict()),
        "scheduler.pt": _tensor_bytes(scheduler.state_dict()),
        "scaler.pt": _tensor_bytes(scaler.state_dict()),
        "rng.pt": _tensor_bytes(rng),
    }


def restore(
    path: str,
    config: dict[str, Any],
    world_size: int,
    module: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    scaler: torch.amp.GradScaler,
) -> TrainState:
    """Load the full checkpoint ``path`` into model/optimizer/scheduler/scaler and the RNGs.

    Returns the saved :class:`TrainState` (position, counters, best score, log rows).

    Raises:
        CheckpointError: not a full checkpoint, truncated or corrupt.
        ValueError: the checkpoint was trained with a different config (keys
            outside ``RESUMABLE_CHANGES``) or world size.
    """
    saved = load_training_state(path)
    ts = saved["trainer_state"]
    changed = sorted(
        k
        for k in config
        if k not in RESUMABLE_CHANGES and ts["config"].get(k) != config[k] and k in ts["config"]
    )
    if changed:
        diffs = ", ".join(f"{k}: {ts['config'][k]!r} -> {config[k]!r}" for k in changed)
        raise ValueError(f"cannot resume {path}: config differs from the checkpoint's ({diffs})")
    if ts["world_size"] != world_size:
        raise ValueError(
            f"cannot resume {path}: saved by {ts['world_size']} processes, now {world_size}"
        )
    module.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    if saved["scaler"]:
        scaler.load_state_dict(saved["scaler"])
    names = {f.name for f in fields(TrainState)}
    state = TrainState(**{k: v for k, v in ts.items() if k in names})
    py = ts["rng_python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    npy = ts["rng_numpy"]
    np.random.set_state(
        (npy[0], np.array(npy[1], dtype=np.uint32), int(npy[2]), int(npy[3]), npy[4])
    )
    torch.set_rng_state(saved["rng"]["torch"])
    if "cuda" in saved["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(saved["rng"]["cuda"])
    return state
