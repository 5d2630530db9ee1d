"""A run's logs: ``train.log.tsv``, ``valid.log.tsv``, ``grad.log.tsv``, ``samples.log.tsv``
and the DVCLive mirror under ``<save_dir>/dvclive``; the wall clock of the train rows goes
to ``time.log.tsv`` (not a DVC out: ``xdpx.rundir``).

The rows live in the trainer's state (``xdpx.train.state.TrainState``), so a resumed run
rewrites its logs from the checkpoint's rows and they equal an uninterrupted run's. Every
write replaces the whole file atomically through ``xdpx.io`` (a remote save_dir included).
DVCLive writes to a local directory; for a save_dir on an object store that is a staging
directory mirrored to ``<save_dir>/dvclive`` after each evaluation and at the end.
Only rank 0 writes (``RunLog(..., enabled=False)`` on the others).
"""

from __future__ import annotations

import csv
import hashlib
import os
import shutil
from typing import Any

from xdpx import io
from xdpx.rundir import RunDir
from xdpx.train.callbacks import Callback

#: Columns of ``train.log.tsv`` (``xdpx.log.add_summary`` scalars follow, sorted by name).
TRAIN_COLUMNS = [
    "update",
    "epoch",
    "samples_seen",
    "lr",
    "loss",
    "accuracy",
    "grad_norm",
    "loss_scale",
]
#: Columns of ``time.log.tsv``: the wall clock of each ``train.log.tsv`` row, kept apart so
#: that ``train.log.tsv`` (a DVC out) is a pure function of code, params and data.
TIME_COLUMNS = ["update", "samples_seen", "wall_time"]


def progress_bar(total: int, initial: int, enabled: bool) -> Any:
    """The tqdm bar of the updates (``train: 12/30 [..., loss=0.41]``); rank 0 only."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        initial=initial,
        desc="train",
        unit="upd",
        mininterval=1.0,
        dynamic_ncols=True,
        disable=not enabled,
    )


def train_row(
    state: Any, lr: float, grad_norm: float, scale: float | None, wall_time: float
) -> tuple[dict[str, Any], dict[str, float]]:
    """A ``train.log.tsv`` row from ``state``'s running sums since the last row, and the
    means of the ``xdpx.log.add_summary`` scalars (``name -> mean``)."""
    row = {
        "update": state.num_updates,
        "epoch": state.last_epoch,
        "samples_seen": state.samples_seen,
        "lr": lr,
        "loss": state.window_loss / state.window_n,
        "accuracy": state.window_correct / state.window_n,
        "grad_norm": grad_norm,
        "loss_scale": scale,
        "wall_time": wall_time,
    }
    return row, {k: s / c for k, (s, c) in state.summaries.items()}


def tsv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Rows as TSV text with a header; floats with 6 significant digits, None empty."""

    def fmt(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.6g}"
        return str(v)

    lines = ["\t".join(columns)] + ["\t".join(fmt(r.get(c)) for c in columns) for r in rows]
    return "\n".join(lines) + "\n"


class RunLog(Callback):
    """Writes one run's logs. ``enabled=False`` (DDP ranks > 0) makes every call a no-op.

    The trainer's first callback (``xdpx.train.callbacks``): DVCLive opens at the start of ``fit``
    (a resumed run first rewrites its logs from the restored rows), each train row and each
    evaluation is written, DVCLive closes (and a remote mirror is pushed) at the end.

    Args:
        run: the run directory.
        enabled: this process writes (rank 0).
    """

    def __init__(self, run: RunDir, enabled: bool = True) -> None:
        self.run, self.enabled = run, enabled
        self.live: Any = None
        self._mirror: io.DirMirror | None = None

    # ------------------------------------------------------------------ the trainer's events
    def on_fit_start(self, trainer: Any) -> None:
        resumed = trainer.resumed_from is not None
        self.open_live(trainer.state.num_updates if resumed else None)
        if resumed:
            self.write(trainer.state)  # drop rows the interrupted run wrote after its checkpoint

    def on_train_row(self, trainer: Any, row: dict[str, Any], summaries: dict[str, float]) -> None:
        self.log_train(trainer.state, row, summaries)

    def on_eval(self, trainer: Any, event: Any) -> None:
        self.log_valid(trainer.state, event.metrics)

    def on_fit_end(self, trainer: Any) -> None:
        self.end()
        if trainer.state.finished:  # not after an error: it would replace the error
            self.push_live()  # remote save_dir: the final DVCLive files

    # ------------------------------------------------------------------ the files
    def write(self, state: Any) -> None:
        """Rewrite the TSV logs from ``state``'s rows (``train_rows``, ``valid_rows``, ...)."""
        if not self.enabled:
            return
        summary_cols = sorted(
            {k for r in state.train_rows for k in r} - set(TRAIN_COLUMNS) - set(TIME_COLUMNS)
        )
        io.write_text(self.run.train_log, tsv(state.train_rows, TRAIN_COLUMNS + summary_cols))
        io.write_text(self.run.time_log, tsv(state.train_rows, TIME_COLUMNS))
        for rows, path in (
            (state.valid_rows, self.run.valid_log),
            (state.grad_rows, self.run.grad_log),
        ):
            if rows:
                io.write_text(path, tsv(rows, list(dict.fromkeys(k for r in rows for k in r))))
        if state.sample_rows:
            io.write_text(
                self.run.samples_log, tsv(state.sample_rows, ["update", "epoch", "sample_ids"])
            )

    def open_live(self, resumed_at: int | None) -> None:
        """Start DVCLive at ``<save_dir>/dvclive``; ``resumed_at``: the update a resumed run
        continues from (DVCLive steps after it are dropped), None for a fresh run."""
        if not self.enabled:
            return
        from dvclive import Live

        live_dir = self.run.dvclive
        resumed = resumed_at is not None
        if io.is_remote(live_dir):
            remote = live_dir
            live_dir = io.cache_dir("live", hashlib.sha256(remote.encode()).hexdigest()[:16])
            shutil.rmtree(live_dir, ignore_errors=True)
            if resumed and io.isdir(remote):
                io.download_dir(remote, live_dir)
            self._mirror = io.DirMirror(live_dir, remote)
        if resumed and io.is_local(live_dir):
            truncate_dvclive(live_dir, resumed_at)
        self.live = Live(
            dir=live_dir, save_dvc_exp=False, dvcyaml=None, report=None, resume=resumed
        )

    def push_live(self) -> None:
        """Upload what DVCLive changed to the remote ``<save_dir>/dvclive`` (remote save_dir only)."""
        if self._mirror is not None:
            self._mirror.push()

    def log_train(self, state: Any, row: dict[str, Any], summaries: dict[str, float]) -> None:
        """Append a ``train.log.tsv`` row (already in ``state.train_rows``): files + DVCLive."""
        self.write(state)
        if self.live is None:
            return
        self.live.step = row["update"]  # DVCLive's x axis = updates
        self.live.log_metric("train/loss", row["loss"])
        self.live.log_metric("train/lr", row["lr"])
        if row["loss_scale"] is not None:
            self.live.log_metric("train/loss_scale", row["loss_scale"])
        for k, v in summaries.items():
            self.live.log_metric(f"train/{k}", v)

    def log_valid(self, state: Any, metrics: dict[str, float]) -> None:
        """After a ``valid.log.tsv`` row was added to ``state``: files, DVCLive step, mirror."""
        self.write(state)
        if self.live is None:
            return
        self.live.step = state.num_updates
        for k, v in metrics.items():
            self.live.log_metric(f"valid/{k}", v)
        self.live.log_metric("valid/samples_seen", state.samples_seen, plot=False)
        self.live.make_summary()
        self.push_live()

    def end(self) -> None:
        """Close DVCLive (its final files)."""
        if self.live is not None:
            self.live.end()


def truncate_dvclive(live_dir: str, step: int) -> None:
    """Drop DVCLive plot rows with ``step`` > ``step`` (written after the checkpoint we resume from)."""
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
