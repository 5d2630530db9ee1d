"""Callbacks: the side effects of training subscribe to the trainer's events, as Lightning's
callbacks or HF's ``TrainerCallback`` do, instead of being wired into the loop.

The events, in the order :class:`xdpx.train.trainer.Trainer` fires them on every rank:

* ``on_fit_start(trainer)``: before the first update (after a resume's restore);
* ``on_train_row(trainer, row, summaries)``: a ``train.log.tsv`` row was added to the state
  (every ``log_interval`` updates);
* ``on_eval(trainer, event)``: a dev evaluation was recorded
  (:class:`xdpx.train.state.EvalEvent`), before its checkpoints are written (so the run log's
  rows are whole when a killed run's last checkpoint is found); raising
  :class:`xdpx.train.state.StopTraining` here is the one way a callback stops training (like
  an early stop: ``fit`` returns normally); whatever a callback raises, the evaluation's
  checkpoints are written before it takes effect;
* ``on_save(trainer, which, path)``: a checkpoint was written (rank 0 only);
* ``on_fit_end(trainer)``: training ended, before ``fit`` returns; also when it raised
  (then ``trainer.state.finished`` is False and the error propagates after the callbacks).

Subscribers: :class:`xdpx.train.runlog.RunLog` (the TSV logs and DVCLive, rank 0),
:class:`OnEval` (a plain ``on_eval`` function: the tuner's pruning, the Prefect progress
artifact, tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xdpx.train.state import EvalEvent

__all__ = ["Callback", "CallbackList", "OnEval"]


class Callback:
    """Base class: every event is a no-op; override the ones you need (module docstring)."""

    def on_fit_start(self, trainer: Any) -> None:
        """Before the first update of ``fit`` (after a resume's restore)."""

    def on_train_row(self, trainer: Any, row: dict[str, Any], summaries: dict[str, float]) -> None:
        """A train-log row (``xdpx.train.runlog.train_row``) and its summaries were recorded."""

    def on_save(self, trainer: Any, which: str | int, path: str) -> None:
        """Checkpoint ``which`` (``best``, ``last`` or an update) was written at ``path``."""

    def on_eval(self, trainer: Any, event: EvalEvent) -> None:
        """A dev evaluation, before its checkpoints; may raise ``StopTraining`` to end
        training after it."""

    def on_fit_end(self, trainer: Any) -> None:
        """Training ended (normally, by a stop, or by an exception)."""


class OnEval(Callback):
    """A function of :class:`EvalEvent` as a callback (``Trainer(on_eval=fn)``)."""

    def __init__(self, fn: Callable[[EvalEvent], None]) -> None:
        self.fn = fn

    def on_eval(self, trainer: Any, event: EvalEvent) -> None:
        self.fn(event)


class CallbackList:
    """Fires each event on every callback, in order. An exception (``StopTraining``
    included) propagates after the callbacks before it have run."""

    def __init__(self, callbacks: Sequence[Callback]) -> None:
        self.callbacks = list(callbacks)

    def __getattr__(self, event: str) -> Callable[..., None]:
        if not event.startswith("on_"):
            raise AttributeError(event)

        def fire(*args: Any) -> None:
            for cb in self.callbacks:
                getattr(cb, event)(*args)

        return fire
