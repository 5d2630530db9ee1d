"""Training set-up in one step: the ``train`` section resolved against the prepared data.

:func:`resolve` reads the prepared data's ``meta.json`` once and turns a ``TrainConfig`` into
a :class:`TrainSetup`: the config with its model-dependent defaults made concrete
(``learning_rate``, ``loss``, ``optimizer``: :func:`xdpx.models.with_model_defaults`), the
checks that the model fits the data and the task fits the labels, the model's constructor
arguments (:func:`xdpx.models.model_config_from`). The resolved ``optimizer`` decides whether
the hashed tables train with sparse gradients, and so the DDP wrapper
(:func:`xdpx.train.ddp.set_sparse_grad`).
:meth:`TrainSetup.build` then builds the model and fits its tables to the training texts.

``stages.train`` (its pre-flight and its run), ``xdpx doctor`` (:mod:`xdpx.doctor`),
``xdpx tune`` and the suite (through ``stages.train``) all set up training through here, so
what they train is resolved alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from torch import nn

from xdpx import io
from xdpx.config import TrainConfig
from xdpx.data import VOCAB_FILE, PreparedMeta
from xdpx.models import (
    build_for_training,
    check_model_fits_data,
    model_config_from,
    with_model_defaults,
)

__all__ = ["TrainSetup", "resolve"]


@dataclass(frozen=True)
class TrainSetup:
    """A ``train`` section resolved against its prepared data (:func:`resolve`).

    Attributes:
        cfg: the config with ``learning_rate``, ``loss`` and ``optimizer`` concrete (what the
            run's ``params.yaml`` records).
        meta: the prepared data's ``meta.json``, read once.
        model_config: the model's constructor arguments before its tables are fitted to
            the data (``config.json`` gets :meth:`build`'s).
        masker: ``task: mlm``'s :class:`xdpx.train.mlm.MaskedLM` over the data's vocabulary
            (None for the other tasks).
    """

    cfg: TrainConfig
    meta: PreparedMeta
    model_config: dict[str, Any]
    masker: Any = None

    @property
    def vocab_file(self) -> str:
        """The prepared ``vocab.txt`` (what ``ngram_lr.prepare`` reads the tokens from)."""
        return io.join(self.cfg.data_dir, VOCAB_FILE)

    def build(
        self, texts: Iterable[Any] | None, resume_path: str | None = None
    ) -> tuple[nn.Module, dict[str, Any], dict[str, Any] | None]:
        """Build the model (init by ``cfg.seed``) and fit its tables to ``texts``
        (:func:`xdpx.models.build_for_training`); with ``resume_path`` the tables come from
        that checkpoint instead (its ``config.json`` supplies the sizes fitted then, and
        ``texts`` is not read). The trainer switches the tables to sparse gradients when
        ``cfg.optimizer`` (resolved here) is ``lazy_adamw``
        (:func:`xdpx.train.ddp.set_sparse_grad`).

        Returns:
            ``(model, model_config, facts)``: the config that rebuilds the model (saved as
            ``config.json``) and what fitting the tables reported (None when nothing was).
        """
        model_config = self.model_config
        if resume_path is not None:  # tables built from the data (ngram_lr's num_features)
            saved = json.loads(io.read_text(io.join(resume_path, "config.json")))["model_config"]
            model_config = {**model_config, **{k: v for k, v in saved.items() if k not in model_config}}  # fmt: skip
            texts = None
        return build_for_training(
            self.cfg.model, model_config, self.vocab_file, texts, self.cfg.seed
        )


def resolve(
    cfg: TrainConfig, meta: PreparedMeta | None = None, where: str = "train.model"
) -> TrainSetup:
    """Resolve ``cfg`` against its prepared data: one read of ``meta.json`` (none when
    ``meta`` is given), the checks, the model defaults and the model's arguments.

    Args:
        cfg: the ``train`` section (``data_dir`` holds prepro's output).
        meta: ``cfg.data_dir``'s meta.json when the caller has read it already.
        where: what named the model, for messages.

    Raises:
        FileNotFoundError, DataError: no readable ``meta.json`` in ``cfg.data_dir``.
        ValueError: the model does not fit the data (:func:`xdpx.models.check_model_fits_data`),
            ``task`` does not fit the labels (regression needs score labels and score labels
            need regression), or ``task: mlm`` continues a pretrained model on data not
            prepared with its tokenizer; each message names the fix.
        KeyError: unknown model.
    """
    if meta is None:
        meta = PreparedMeta.read(cfg.data_dir)
    check_model_fits_data(cfg.model, cfg.data_dir, where, meta=meta)
    scores = meta.prepro.get("label_type", "class") == "score"
    if scores != (cfg.task == "regression") and cfg.task != "mlm":
        raise ValueError(
            f"{cfg.data_dir} was prepared with prepro.label_type=score: set train.task=regression "
            "(and major_metric=pearson)"
            if scores
            else f"train.task=regression needs score labels: {cfg.data_dir} was prepared with "
            "prepro.label_type=class (prepare it with prepro.label_type=score)"
        )
    if cfg.task == "mlm" and cfg.pretrained_model and meta.tokenizer != "hf":
        raise ValueError(
            f"train.task=mlm continues {cfg.pretrained_model} but {cfg.data_dir} was prepared "
            f"with tokenizer={meta.tokenizer}: prepare it with the model's own tokenizer "
            "(prepro.tokenizer=hf, prepro.tokenizer_path=<the model dir>), or drop "
            "pretrained_model and give hf_config to pretrain from scratch on this vocabulary"
        )
    cfg = with_model_defaults(cfg)
    model_config = model_config_from(
        cfg.model, cfg, meta.vocab_size, meta.num_labels, meta.pad_id, meta
    )
    masker = None
    if cfg.task == "mlm":
        from xdpx.train.mlm import masker_for

        masker = masker_for(cfg)
        if masker.mask_id >= meta.vocab_size:  # own vocabulary: [MASK] appended
            model_config["vocab_size"] = masker.mask_id + 1
    return TrainSetup(cfg, meta, model_config, masker)


def in_memory_trainer(data_dir: str, save_dir: str, **overrides: Any) -> Any:
    """A :class:`~xdpx.train.trainer.Trainer` on a prepared directory's ``train`` and ``dev``
    splits loaded in memory, its model built from ``TrainConfig(data_dir, save_dir,
    **overrides)`` after ``torch.manual_seed(seed)`` (as ``stages.train`` seeds it), without
    the stage's set-up (no defaults resolved, no preflight, nothing written until it trains).
    For the trainer's own tests and ``bench/gpu_check.py``, which drive its loop directly.

    Raises:
        FileNotFoundError: ``data_dir`` has no ``meta.json`` or splits.
    """
    import torch

    from xdpx.data import load_split
    from xdpx.models import build_model, model_config_from
    from xdpx.train.trainer import Trainer

    cfg = with_model_defaults(TrainConfig(data_dir=data_dir, save_dir=save_dir, **overrides))
    meta = PreparedMeta.read(data_dir)
    train, dev = load_split(data_dir, "train"), load_split(data_dir, "dev")
    torch.manual_seed(cfg.seed)
    model_config = model_config_from(cfg.model, cfg, meta.vocab_size, meta.num_labels, 0)
    model = build_model(cfg.model, model_config)
    return Trainer(model, cfg, train.input_ids, train.labels, dev.input_ids, dev.labels, cfg.model, model_config, data_dir)  # fmt: skip
