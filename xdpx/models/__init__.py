"""Models: a flat ``MODELS`` dict keyed by the names allowed in ``TrainConfig.model``.

Every model maps ``input_ids [batch, seq_len]`` (int64, 0 = padding) to
``logits [batch, num_labels]`` and exposes ``min_len`` (shortest sequence it
accepts; batches are padded up to it).
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from xdpx.models.bilstm import BiLSTM
from xdpx.models.hf import HFClassifier
from xdpx.models.ngram import NgramLR
from xdpx.models.textcnn import TextCNN

MODELS: dict[str, type[nn.Module]] = {
    "ngram_lr": NgramLR,
    "textcnn": TextCNN,
    "bilstm": BiLSTM,
    "hf_classifier": HFClassifier,
}


def model_config_from(
    name: str,
    train_cfg: Any,
    vocab_size: int,
    num_labels: int,
    pad_id: int,
    meta: dict[str, Any] | None = None,
) -> dict:
    """The constructor arguments of model ``name`` taken from a TrainConfig (saved as config.json).

    ``meta`` (prepro's meta.json) supplies data facts a model may take: ``sep_id`` (the
    tokenizer's separator) and ``pair`` (jointly encoded text pairs).
    """
    params = inspect.signature(MODELS[name].__init__).parameters
    cfg: dict[str, Any] = {"vocab_size": vocab_size, "num_labels": num_labels, "pad_id": pad_id}
    meta = meta or {}
    from_meta = {"sep_id": meta.get("sep_id"), "pair": meta.get("pair_encoding") == "joint"}
    cfg.update({k: v for k, v in from_meta.items() if k in params})
    for key in params:
        if key not in cfg and key != "self" and hasattr(train_cfg, key):
            value = getattr(train_cfg, key)
            cfg[key] = list(value) if isinstance(value, tuple) else value
    return cfg


def build_model(name: str, model_config: dict) -> nn.Module:
    """Instantiate ``MODELS[name](**model_config)``.

    Raises:
        KeyError: unknown model name (lists the valid ones).
    """
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; valid: {sorted(MODELS)}")
    return MODELS[name](**model_config)


__all__ = [
    "MODELS",
    "TextCNN",
    "BiLSTM",
    "NgramLR",
    "HFClassifier",
    "build_model",
    "model_config_from",
]
