"""What every check of ``xdpx doctor``'s training checklist shares: the finding
(:class:`Check`) and the probe (:class:`Probe`: the config, the data as the trainer reads
it and the model as ``stages.train`` builds it, through the one set-up step).
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from xdpx import io
from xdpx.config import TrainConfig
from xdpx.data import PreparedMeta
from xdpx.data.lazy import TrainData, open_train_split
from xdpx.data.vocab import read_tokens
from xdpx.inference import Batch, pad_batch
from xdpx.train.setup import TrainSetup, resolve

#: Statuses in increasing severity (``skip``: the check does not apply, with the reason).
STATUSES = ("ok", "skip", "warn", "fail")


@dataclass
class Check:
    """One finding of the doctor.

    Attributes:
        status: ``ok``, ``warn``, ``fail`` or ``skip`` (does not apply; ``detail`` says why).
        name: the check (``labels[train]``, ``padding``, ``overfit_batch``, ...).
        detail: one line: what was measured, the cause and what to change.
        lines: extra lines printed under it (the decoded batch).
        seconds: wall time of the check.
        table: rows behind the finding for export, not printed nor in the JSON report
            (the label check's flagged rows: ``xdpx doctor --label-issues FILE``).
    """

    status: str
    name: str
    detail: str
    lines: list[str] = field(default_factory=list)
    seconds: float = 0.0
    table: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def line(self) -> str:
        """``OK    name: detail`` style, aligned."""
        return f"{self.status.upper():5} {self.name}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        """The check as a JSON object (``reports/doctor.json``), without :attr:`table`."""
        out = asdict(self)
        out.pop("table")
        return out


# ---------------------------------------------------------------------------- the probe
#: Seconds of training the learning check aims for by default (:attr:`Probe.learning_seconds`).
LEARN_SECONDS = 8.0


@dataclass
class Probe:
    """What the checks share: the config, the prepared data as the trainer reads it and the
    model as ``stages.train`` builds it (never trained here: each check copies it).

    Attributes:
        cfg: the ``train`` section, ``learning_rate`` resolved.
        meta: the prepared data's ``meta.json``.
        data: the training split (:class:`~xdpx.data.lazy.TrainData`).
        template: the freshly initialised model.
        model_config: its constructor arguments.
        tokens: ``vocab.txt`` in id order.
        workdir: a temporary directory for the trainers' (unused) save_dirs, removed by
            :meth:`close`.
        learning_seconds: the learning check's training budget in seconds of this machine
            (:func:`xdpx.doctor.fitting.check_learning`; ``xdpx doctor --learning-seconds``).
    """

    cfg: TrainConfig
    meta: PreparedMeta
    data: TrainData
    template: nn.Module
    model_config: dict[str, Any]
    tokens: list[str]
    workdir: str = field(default_factory=lambda: io.mkdtemp("xdpx-doctor-"))
    learning_seconds: float = LEARN_SECONDS
    #: results one check leaves for a later one (the alignment classifier's features)
    shared: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        """Remove :attr:`workdir`; stop a lazy split's read-ahead threads."""
        import shutil

        shutil.rmtree(self.workdir, ignore_errors=True)
        close = getattr(getattr(self.data, "split", None), "close", None)
        if close is not None:
            close()

    @classmethod
    def open(cls, cfg: TrainConfig, setup: TrainSetup | None = None) -> Probe:
        """Read the data and build the model from ``cfg`` as ``stages.train`` does: through
        the one set-up step (:func:`xdpx.train.setup.resolve`; ``setup``: its result when the
        caller has it, e.g. ``train.preflight_doctor``).

        Raises:
            FileNotFoundError, DataError: no prepared data; ValueError: the model does not
            fit the data (``xdpx.models.check_model_fits_data``).
        """
        setup = setup if setup is not None else resolve(cfg)
        cfg, meta = setup.cfg, setup.meta
        data, _, texts = open_train_split(
            cfg.data_dir, cfg.train_subset, cfg.seed, cfg.lazy_load, meta
        )
        model, model_config, _ = setup.build(texts)
        return cls(cfg, meta, data, model, model_config, read_tokens(setup.vocab_file))

    @property
    def num_labels(self) -> int:
        """Labels in the target map."""
        return len(self.meta.labels)

    @property
    def pad_id(self) -> int:
        return self.meta.pad_id

    def model(self, dropout: bool = False) -> nn.Module:
        """A fresh copy of the initial model; ``dropout=False``: eval mode (deterministic),
        except RNN modules on CUDA, whose backward needs train mode (their dropout only acts
        between stacked layers)."""
        model = copy.deepcopy(self.template)
        model.train(dropout)
        if not dropout and torch.cuda.is_available():
            for m in model.modules():
                if isinstance(m, nn.RNNBase):
                    m.train()
        return model

    def first_ids(self, n: int | None = None) -> np.ndarray:
        """The sample ids of the trainer's first micro-batch (epoch 1, ``batch_size``), or the
        first ``n`` of epoch 1's order."""
        self.data.set_epoch(1)
        return self.data.window(0, n or self.cfg.batch_size)

    def batch(self, ids: np.ndarray, extra_pad: int = 0) -> tuple[Batch, torch.Tensor]:
        """Padded inputs and labels of ``ids`` (each input padded ``extra_pad`` wider)."""
        samples = self.data.samples(ids)
        min_len = self.template.min_len
        x = pad_batch(samples, self.pad_id, min_len)
        if extra_pad:
            x = _pad_more(x, self.pad_id, extra_pad)
        return x, torch.from_numpy(self.data.labels(ids))

    def trainer(self, model: nn.Module, samples: np.ndarray | None = None, **updates: Any) -> Any:
        """A :class:`~xdpx.train.trainer.Trainer` over this data (or over ``samples`` only, as a new
        split), with ``cfg`` keys replaced by ``updates``; no validation split. It writes
        nothing unless ``fit`` or a save runs, and its save_dir is a temporary directory."""
        from xdpx.data.lazy import InMemoryData
        from xdpx.train.trainer import Trainer

        cfg = self.cfg.model_copy(update={"save_dir": tempfile.mkdtemp(dir=self.workdir), **updates})  # fmt: skip
        data: TrainData = self.data
        if samples is not None:
            data = InMemoryData(self.data.samples(samples), self.data.labels(samples), cfg.seed)
        return Trainer(
            model, cfg, data, None, None, None, self.cfg.model, self.model_config,
            self.cfg.data_dir, self.pad_id,
        )  # fmt: skip


def _pad_more(x: Batch, pad_id: int, extra: int) -> Batch:
    if isinstance(x, tuple):
        return tuple(_pad_more(t, pad_id, extra) for t in x)  # type: ignore[misc]
    return F.pad(x, (0, extra), value=pad_id)


def ce_loss(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float(F.cross_entropy(logits.float(), y))


def fmt(x: float) -> str:
    return f"{x:.3g}"
