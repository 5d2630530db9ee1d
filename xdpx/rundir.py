"""The layout of a training run directory, in one place.

A run directory (``train.save_dir``) holds::

    best/ last/             checkpoints (xdpx.checkpoint); last/ is full with save_full_checkpoint
    checkpoint-<update>/    every evaluation's checkpoint (keep_checkpoints)
    train.log.tsv valid.log.tsv grad.log.tsv samples.log.tsv   the trainer's logs
    dvclive/                DVCLive metrics and plots
    profile/                torch.profiler trace (profile)
    params.yaml starter.yaml repro.json result.json            the reproducibility bundle
    run.json time.log.tsv   volatile facts of this run (git state, command, host, wall
                            times): not DVC outs, so every out is a pure function of code,
                            params and data and a fresh clone's ``dvc repro`` leaves git clean
    export/                 ONNX export (stage export)
    eval/ predict/          what ``xdpx eval`` / ``xdpx pred`` of a checkpoint other than the
                            pipeline's write here (``xdpx.stage.beside_checkpoint``)
    pretrained/             task=mlm: the best model as a from_pretrained directory + tokenizer

Every other module asks a :class:`RunDir` for these paths instead of joining the names, so
the layout can change here alone. ``<run>/<best>`` and ``<run>/<last>`` are the aliases
users write for ``best/`` and ``last/`` (:data:`ALIASES`).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdpx import io

BEST = "best"
LAST = "last"
#: task=mlm: the best checkpoint as a transformers ``from_pretrained`` directory
PRETRAINED = "pretrained"
#: alias -> checkpoint directory name: ``models/default/<best>``
ALIASES = {f"<{BEST}>": BEST, f"<{LAST}>": LAST}
#: Files/dirs whose presence means a directory already holds a training run
#: (``export/`` alone does not count).
MARKERS = (BEST, LAST, "train.log.tsv", "valid.log.tsv", "params.yaml")
#: Subdirectories that are not runs of their own when searching a tree for runs.
INNER_DIRS = (BEST, LAST, "dvclive", "profile", "export", PRETRAINED, "eval", "predict")
CHECKPOINT_PREFIX = "checkpoint-"
#: Files whose direct presence makes a directory a run (:meth:`RunDir.is_run`,
#: ``xdpx.scripts.find_runs``).
RUN_FILES = ("valid.log.tsv", "result.json")


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory (local path or ``oss://``/``s3://`` URL).

    Attributes are plain strings joined with :func:`xdpx.io.join`; nothing is created.
    """

    path: str

    def _join(self, *names: str) -> str:
        return io.join(self.path, *names)

    @property
    def best(self) -> str:
        return self._join(BEST)

    @property
    def last(self) -> str:
        return self._join(LAST)

    @property
    def pretrained(self) -> str:
        return self._join(PRETRAINED)

    @property
    def best_alias(self) -> str:
        """``<run>/<best>``: what evaluate/predict/export accept as ``checkpoint``."""
        return self._join(f"<{BEST}>")

    def checkpoint(self, name_or_update: str | int) -> str:
        """``best``/``last``, or ``checkpoint-<update>`` for an int."""
        if isinstance(name_or_update, int):
            return self._join(f"{CHECKPOINT_PREFIX}{name_or_update}")
        return self._join(name_or_update)

    @property
    def train_log(self) -> str:
        return self.log("train")

    @property
    def valid_log(self) -> str:
        return self.log("valid")

    @property
    def grad_log(self) -> str:
        return self.log("grad")

    @property
    def samples_log(self) -> str:
        return self.log("samples")

    def log(self, name: str) -> str:
        """``<name>.log.tsv`` for ``train``/``valid``/``grad``/``samples``."""
        return self._join(f"{name}.log.tsv")

    @property
    def dvclive(self) -> str:
        return self._join("dvclive")

    @property
    def profile(self) -> str:
        return self._join("profile")

    @property
    def params(self) -> str:
        return self._join("params.yaml")

    @property
    def starter(self) -> str:
        return self._join("starter.yaml")

    @property
    def repro(self) -> str:
        return self._join("repro.json")

    @property
    def result(self) -> str:
        return self._join("result.json")

    @property
    def run_info(self) -> str:
        """``run.json``: the volatile facts (git commit and dirty diff, command, host, start
        and end times, wall seconds); not a DVC out."""
        return self._join("run.json")

    @property
    def time_log(self) -> str:
        """``time.log.tsv``: update, samples_seen, wall_time (seconds since the start) of
        every ``train.log.tsv`` row; not a DVC out."""
        return self._join("time.log.tsv")

    @property
    def export(self) -> str:
        return self._join("export")

    @property
    def eval_dir(self) -> str:
        """``eval/``: metrics and plots of ``xdpx eval`` of one of this run's checkpoints
        when it is not the pipeline's (metrics.json, confusion.png, valid_curve.png)."""
        return self._join("eval")

    @property
    def predict_dir(self) -> str:
        """``predict/``: ``<data file stem>.pred.tsv`` of ``xdpx pred`` of one of this run's
        checkpoints when it is not the pipeline's."""
        return self._join("predict")

    def is_run(self) -> bool:
        """Directly holds a ``valid.log.tsv`` or ``result.json``."""
        return any(io.exists(self._join(name)) for name in RUN_FILES)

    def markers(self) -> list[str]:
        """The :data:`MARKERS` present (empty: the directory holds no run).

        On an object store this is one (retried) listing; a store that keeps failing
        raises ``RemoteIOError`` rather than reporting a free directory.
        """
        if io.is_remote(self.path):
            try:
                names = {p.rstrip("/").rsplit("/", 1)[-1] for p in io.ls(self.path)}
            except FileNotFoundError:
                return []
            return [name for name in MARKERS if name in names]
        return [name for name in MARKERS if io.exists(self._join(name))]


def of_checkpoint(checkpoint_dir: str) -> RunDir:
    """The run directory a checkpoint directory (``<run>/best`` ...) sits in."""
    return RunDir(io.dirname(checkpoint_dir.rstrip("/")))


def unalias(checkpoint: str) -> str:
    """``checkpoint`` with a ``<best>``/``<last>`` alias (:data:`ALIASES`) written as the
    directory it names (``models/x/<best>`` -> ``models/x/best``); other paths unchanged.
    Nothing is read: the checkpoint need not exist."""
    path = str(checkpoint).rstrip("/")
    head, _, tail = path.rpartition("/")
    if tail in ALIASES:
        return io.join(head, ALIASES[tail]) if head else ALIASES[tail]
    return path
