"""Objectives: what a training task computes, so that :class:`xdpx.train.trainer.Trainer` never
names a task (as fairseq's criterions or torchtune's recipes' loss).

An :class:`Objective` is given a window of samples and answers the trainer's questions:

* :meth:`~Objective.loss_units`: what the window's *summed* loss is divided by (its
  samples; masked LM: its masked tokens), asked once per window on every rank, so any split
  into micro-batches or ranks gives the same update;
* :meth:`~Objective.batch`: the model's padded inputs and the targets of some samples;
* :meth:`~Objective.loss`: the summed loss of a micro-batch's logits;
* :meth:`~Objective.correct`: how many predictions were right (the train log's accuracy;
  NaN where there is none);
* :meth:`~Objective.passes`: the forward passes of a micro-batch (one; FreeLB's ascent
  steps: :class:`FreeLBPasses`);
* :meth:`~Objective.evaluate`: the metrics of a split;
* :meth:`~Objective.after_fit`: what to write beside the weights when training ends.

The objectives here: :class:`Classification` (cross-entropy or squared hinge, class
weights), :class:`Distillation` (Hinton et al.'s loss against a teacher's logits),
:class:`Regression` (``train.task: regression``: squared error on score labels),
:class:`MaskedLMObjective` (``train.task: mlm``), and the wrapper :class:`FreeLBPasses`
(``train.adv: freelb``). :func:`build_objective` picks them from the ``train`` section. A new
task is a new subclass; the trainer does not change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch
from torch import nn

from xdpx import log as xlog
from xdpx.data.lazy import TrainData
from xdpx.distill.teacher import distill_loss
from xdpx.inference import (
    Batch,
    pad_batch,
    predict_logits_sharded,
    probs_from_logits,
    to_device,
)
from xdpx.metrics import classification_metrics, regression_metrics
from xdpx.train.adversarial import FreeLB, rng_state, set_rng_state
from xdpx.train.losses import resolve_class_weight, training_loss
from xdpx.train.mlm import IGNORE_INDEX, MaskedLM, evaluate_mlm, mlm_loss, pad_masked

__all__ = [
    "Classification",
    "Distillation",
    "FreeLBPasses",
    "MaskedLMObjective",
    "Objective",
    "Regression",
    "build_objective",
]

log = logging.getLogger("xdpx.train.trainer")

#: Parts of a split to score: ``(samples, labels)`` pairs (one per shard of a lazy split).
Parts = Sequence[tuple[Sequence[Any], np.ndarray | None]]


class Objective:
    """The interface (and the classification defaults) of a training task.

    Subclasses override what differs. Every method runs on every DDP rank; the trainer
    all-reduces the summed loss and the correct count, and divides by :meth:`loss_units`.
    """

    #: forward passes per micro-batch (the loss of each is divided by it)
    num_passes = 1

    def to(self, device: torch.device) -> Objective:
        """Move the objective's tensors to the training device; returns self."""
        return self

    def loss_units(self, data: TrainData, window: np.ndarray, epoch: int) -> int:
        """What the window's summed loss is divided by: its sample count.

        Args:
            data: the training data; window: ``[n]`` global sample ids of the update;
            epoch: the current epoch (masks are drawn per epoch).
        """
        return len(window)

    def batch(
        self, data: TrainData, idx: np.ndarray, pad_id: int, min_len: int, device: torch.device
    ) -> tuple[Batch, torch.Tensor]:
        """Padded inputs (``[batch, width]``, a tuple for pairs, each input to its own width)
        and ``[batch]`` class indices of the samples ``idx``, on ``device``."""
        x = pad_batch(data.samples(idx), pad_id, min_len)
        return to_device(x, device), torch.from_numpy(data.labels(idx)).to(device)

    def loss(self, logits: torch.Tensor, y: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
        """The micro-batch's loss, *summed* over its samples (0-d float32)."""
        raise NotImplementedError

    def correct(self, logits: torch.Tensor, y: torch.Tensor) -> float:
        """Right predictions in a micro-batch: ``argmax(logits, -1) == y`` counted."""
        return float((logits.argmax(-1) == y).sum().item())

    def passes(self, x: Batch, k: int, seed: int) -> Iterator[AbstractContextManager[Any]]:
        """The forward passes of micro-batch ``k`` of an update whose dropout seed is
        ``seed``: one context per pass, entered around the model's forward. One plain pass."""
        yield nullcontext()

    def evaluate(
        self, module: nn.Module, parts: Parts, batch_size: int, pad_id: int,
        device: torch.device, rank: int, world_size: int,
    ) -> dict[str, float]:  # fmt: skip
        """Metrics of ``module`` on a split (:func:`xdpx.metrics.classification_metrics` of
        its probabilities, scored 256 samples at a time); under DDP each rank scores its
        share and all return the same metrics."""
        probs = [
            probs_from_logits(
                predict_logits_sharded(module, x, 256, pad_id, device, rank, world_size)
            )  # fmt: skip
            for x, _ in parts
        ]
        labels = np.concatenate([y for _, y in parts])  # type: ignore[misc]
        return classification_metrics(labels, np.concatenate(probs))

    def after_fit(self, save_dir: str) -> None:
        """Write what the task keeps beside the run's checkpoints (rank 0, after training)."""


class Classification(Objective):
    """Cross-entropy (or ``train.loss: squared_hinge``) over class indices, each sample
    weighted by its class's weight (``train.class_weight``; :func:`xdpx.train.losses.training_loss`).

    Args:
        cfg: the ``train`` section (``loss``).
        class_weight: ``[num_labels]`` or None.
    """

    def __init__(self, cfg: Any, class_weight: torch.Tensor | None = None) -> None:
        self.cfg, self.class_weight = cfg, class_weight

    def to(self, device: torch.device) -> Classification:
        if self.class_weight is not None:
            self.class_weight = self.class_weight.to(device)
        return self

    def loss(self, logits: torch.Tensor, y: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
        return training_loss(logits, y, self.class_weight, self.cfg)


class Distillation(Classification):
    """Hinton et al.'s distillation (:func:`xdpx.distill.teacher.distill_loss`, ``train.distill_alpha``
    and ``distill_temperature``) against the teacher's logits of each training sample; its
    parts go to the ``distill_ce`` / ``distill_kl`` summaries (per-sample means).

    Args:
        cfg: the ``train`` section.
        teacher_logits: ``[n_train, num_labels]``, row ``i`` for sample id ``i``
            (:func:`xdpx.distill.teacher.load_teacher`).
        n: training samples.
        gold: ``[n_train]`` bool, False for a sample without a gold label (a transfer-set
            row labelled by the teacher alone: KL term only); None = all gold.
        class_weight: ``[num_labels]`` or None: each sample's loss (both terms) weighted by
            its label's class (``train.class_weight``; :func:`build_objective` resolves it
            from the gold rows' label counts).

    Raises:
        ValueError: ``teacher_logits`` is not ``[n, num_labels]`` or ``gold`` not ``[n]``.
    """

    def __init__(
        self,
        cfg: Any,
        teacher_logits: np.ndarray | torch.Tensor,
        n: int,
        gold: np.ndarray | None = None,
        class_weight: torch.Tensor | None = None,
    ) -> None:
        super().__init__(cfg, class_weight)
        if teacher_logits.ndim != 2 or len(teacher_logits) != n:
            raise ValueError(
                f"teacher_logits must be [{n}, num_labels], got {tuple(teacher_logits.shape)}"
            )
        if gold is not None and gold.shape != (n,):
            raise ValueError(f"gold must be [{n}], got {tuple(gold.shape)}")
        self.teacher_logits = torch.as_tensor(teacher_logits, dtype=torch.float32)
        self.gold = None if gold is None else torch.as_tensor(gold, dtype=torch.bool)

    def to(self, device: torch.device) -> Distillation:
        super().to(device)
        self.teacher_logits = self.teacher_logits.to(device)
        if self.gold is not None:
            self.gold = self.gold.to(device)
        return self

    def loss(self, logits: torch.Tensor, y: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
        rows = torch.from_numpy(idx).to(logits.device)
        teacher = self.teacher_logits[rows]
        gold = self.gold[rows] if self.gold is not None else None
        cfg = self.cfg
        weight = None if self.class_weight is None else self.class_weight[y]
        loss, ce, kl = distill_loss(
            logits, y, teacher, cfg.distill_alpha, cfg.distill_temperature, gold, weight
        )
        xlog.add_summary("distill_ce", ce / len(idx))
        xlog.add_summary("distill_kl", kl / len(idx))
        return loss


class Regression(Objective):
    """``train.task: regression``: the model's one output (``logits[:, 0]``) fit to the score
    labels (``prepro.label_type: score``) by squared error, summed; dev metrics are
    Pearson's and Spearman's correlation and the mean squared error
    (:func:`xdpx.metrics.regression_metrics`). There is no accuracy: the train log's
    ``accuracy`` column is NaN.
    """

    def loss(self, logits: torch.Tensor, y: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
        return (logits.float()[:, 0] - y.float()).square().sum()

    def correct(self, logits: torch.Tensor, y: torch.Tensor) -> float:
        return float("nan")

    def evaluate(
        self, module: nn.Module, parts: Parts, batch_size: int, pad_id: int,
        device: torch.device, rank: int, world_size: int,
    ) -> dict[str, float]:  # fmt: skip
        scores = [
            predict_logits_sharded(module, x, 256, pad_id, device, rank, world_size)[:, 0]
            for x, _ in parts
        ]
        gold = np.concatenate([y for _, y in parts])  # type: ignore[misc]
        return regression_metrics(gold, np.concatenate(scores))


class MaskedLMObjective(Objective):
    """``train.task: mlm``: each window's samples are masked by (seed, epoch, sample id)
    (:class:`xdpx.train.mlm.MaskedLM`); the model is called as ``model(input_ids, labels)`` (both
    ``[batch, seq_len]``) and returns the logits of the masked positions,
    ``[n_masked, vocab_size]`` (:class:`xdpx.models.HFMaskedLM`); the loss is the
    cross-entropy at masked positions divided by the window's masked tokens; evaluation
    reports MLM loss, perplexity and masked-token accuracy (:func:`xdpx.train.mlm.evaluate_mlm`).

    Args:
        masker: the masker; write_pretrained: called with the run directory after training
            (``stages.train`` writes ``<save_dir>/pretrained``), or None.
    """

    def __init__(
        self, masker: MaskedLM, write_pretrained: Callable[[str], None] | None = None
    ) -> None:
        self.masker, self.write_pretrained = masker, write_pretrained
        self._masked: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # this window's masks

    def loss_units(self, data: TrainData, window: np.ndarray, epoch: int) -> int:
        """The window's masked tokens (its masks are drawn here, on every rank)."""
        self._masked = self.masker.mask_many(data.samples(window), window, epoch)
        return max(1, sum(int((y >= 0).sum()) for _, y in self._masked.values()))

    def batch(
        self, data: TrainData, idx: np.ndarray, pad_id: int, min_len: int, device: torch.device
    ) -> tuple[Batch, torch.Tensor]:
        """``((masked input_ids, labels), [n_masked] original ids)``: the model takes both."""
        x, y = pad_masked([self._masked[int(i)] for i in idx], pad_id, min_len)
        return to_device((x, y), device), y[y != IGNORE_INDEX].to(device)

    def loss(self, logits: torch.Tensor, y: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
        return mlm_loss(logits, y)

    def evaluate(
        self, module: nn.Module, parts: Parts, batch_size: int, pad_id: int,
        device: torch.device, rank: int, world_size: int,
    ) -> dict[str, float]:  # fmt: skip
        return evaluate_mlm(
            module, [x for x, _ in parts], self.masker, batch_size, pad_id, device, rank,
            world_size,
        )  # fmt: skip

    def after_fit(self, save_dir: str) -> None:
        if self.write_pretrained is not None:
            self.write_pretrained(save_dir)


class FreeLBPasses(Objective):
    """``train.adv: freelb``: ``inner``'s task with FreeLB's ``adv_steps`` passes per
    micro-batch (:class:`xdpx.train.adversarial.FreeLB`): ``delta_0`` drawn from a generator of its
    own, seeded per micro-batch (so dropout stays that of plain training), every pass drawing
    the same dropout masks, the perturbation ascended between passes.

    Args:
        inner: the objective whose loss is perturbed; freelb: the perturbation.
    """

    def __init__(self, inner: Objective, freelb: FreeLB) -> None:
        self.inner, self.freelb = inner, freelb
        self.num_passes = freelb.steps
        self._rng: torch.Generator | None = None

    def to(self, device: torch.device) -> FreeLBPasses:
        self.inner = self.inner.to(device)
        self._rng = torch.Generator(device=device)
        return self

    def passes(self, x: Batch, k: int, seed: int) -> Iterator[AbstractContextManager[Any]]:
        assert self._rng is not None, "FreeLBPasses.to(device) first"
        device = self._rng.device
        self._rng.manual_seed(seed + k + 1)
        self.freelb.start(x, self._rng)
        state = rng_state(device)
        for t in range(self.num_passes):
            if t:  # after the previous pass's backward: ascend, replay its dropout masks
                self.freelb.ascend()
                set_rng_state(state, device)
            yield self.freelb.perturb()

    # the rest is the inner task's
    def loss_units(self, data: TrainData, window: np.ndarray, epoch: int) -> int:
        return self.inner.loss_units(data, window, epoch)

    def batch(
        self, data: TrainData, idx: np.ndarray, pad_id: int, min_len: int, device: torch.device
    ) -> tuple[Batch, torch.Tensor]:
        return self.inner.batch(data, idx, pad_id, min_len, device)

    def loss(self, logits: torch.Tensor, y: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
        return self.inner.loss(logits, y, idx)

    def correct(self, logits: torch.Tensor, y: torch.Tensor) -> float:
        return self.inner.correct(logits, y)

    def evaluate(self, *args: Any) -> dict[str, float]:
        return self.inner.evaluate(*args)

    def after_fit(self, save_dir: str) -> None:
        self.inner.after_fit(save_dir)


def _class_weight(
    cfg: Any, data: Any, num_labels: int | None, gold: np.ndarray | None = None
) -> torch.Tensor | None:
    """``train.class_weight`` resolved from the train label counts
    (:func:`xdpx.train.losses.resolve_class_weight`), counting the gold rows only when
    ``gold`` marks some rows as the teacher's: a transfer set's teacher-labelled rows follow
    how it was sampled (e.g. recombined pairs, mostly unrelated), not the task's classes."""
    if not cfg.class_weight:
        return None
    k = int(num_labels or len(data.label_counts(0)))
    gold_only = gold is not None and not bool(np.all(gold))
    if not gold_only:
        counts = data.label_counts(k)
    else:
        counts = np.zeros(k, dtype=np.int64)
        ids = np.flatnonzero(gold)
        for lo in range(0, len(ids), 65536):  # lazy data: one block of labels at a time
            counts += np.bincount(data.labels(ids[lo : lo + 65536]), minlength=k)[:k]
    weight = resolve_class_weight(cfg.class_weight, counts)
    log.info(
        "class_weight=%s: %s%s", cfg.class_weight, "balanced" if weight is not None else "none",
        " (from the gold rows' labels)" if gold_only else "",
    )  # fmt: skip
    return weight


def build_objective(
    cfg: Any,
    model: nn.Module,
    data: TrainData,
    num_labels: int | None,
    pad_id: int = 0,
    teacher_logits: np.ndarray | None = None,
    masker: MaskedLM | None = None,
    write_pretrained: Callable[[str], None] | None = None,
    teacher_gold: np.ndarray | None = None,
) -> Objective:
    """The objective of the ``train`` section: masked LM with a ``masker``, distillation with
    ``teacher_logits``, :class:`Regression` with ``task: regression``, else classification
    (class weights resolved from the train label counts, ``train.class_weight``; for
    distillation from the gold rows' counts, and applied to both of its terms); wrapped in
    :class:`FreeLBPasses` with ``adv: freelb``.

    Args:
        cfg: the ``train`` section; model: the bare model (FreeLB hooks its embeddings);
        data: the training data; num_labels: classes (None: from the train labels);
        pad_id: padding id; teacher_logits: ``[n_train, num_labels]`` or None;
        masker: ``task: mlm``'s masker or None; write_pretrained: see
        :class:`MaskedLMObjective`; teacher_gold: ``[n_train]`` bool or None (see
        :class:`Distillation`).

    Raises:
        ValueError: ``teacher_logits`` of the wrong shape.
        ConfigError: ``adv: freelb`` for a model without an embedding layer.
    """
    objective: Objective
    if masker is not None:
        objective = MaskedLMObjective(masker, write_pretrained)
    elif teacher_logits is not None:
        weight = _class_weight(cfg, data, num_labels, teacher_gold)
        objective = Distillation(cfg, teacher_logits, len(data), teacher_gold, weight)
    elif cfg.task == "regression":
        objective = Regression()
    else:
        objective = Classification(cfg, _class_weight(cfg, data, num_labels))
    if cfg.adv == "freelb":
        objective = FreeLBPasses(objective, FreeLB.from_config(model, cfg, pad_id))
    return objective
