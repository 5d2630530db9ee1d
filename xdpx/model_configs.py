"""Each model family's own config: which ``train`` keys it takes, and their checks.

params.yaml keeps ``train`` flat (so ``dvc exp run -S train.num_filters=64`` works); the
keys a model uses are declared here, once per family, as a pydantic model. ``TrainConfig``
validates only the chosen family's keys (a bad ``filter_sizes`` does not matter to
``ngram_lr``), and ``xdpx.models.model_config_from`` builds the constructor arguments from
:func:`model_args` plus the data facts (``vocab_size``, ``num_labels``, ``pad_id`` and, for
hf_classifier, ``sep_id``/``pair``). No model code is imported here, so validating a config
stays cheap; tests/test_models.py checks each family against its constructor.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator


class _Family(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _orders(values: list[int] | None, low: int, high: int, name: str) -> list[int] | None:
    if values is not None and (not values or any(not low <= k <= high for k in values)):
        raise ValueError(f"{name} must lie in {low}..{high}, got {values}")
    return values


class NgramArgs(_Family):
    """``ngram_lr`` and ``match_ngram``: hashed TF-IDF n-grams."""

    ngram_orders: list[int] | None
    char_ngram_orders: list[int] | None
    ngram_weighting: Literal["binary", "tfidf"]
    ngram_min_df: int
    ngram_norm: Literal["joint", "union"]
    ngram_dropout: float
    ngram_buckets: int

    @field_validator("ngram_orders")
    @classmethod
    def _token_orders(cls, v: list[int] | None) -> list[int] | None:
        return _orders(v, 1, 5, "ngram_orders")

    @field_validator("char_ngram_orders")
    @classmethod
    def _char_orders(cls, v: list[int] | None) -> list[int] | None:
        return _orders(v, 1, 8, "char_ngram_orders") if v else v  # [] = none


class _Embedded(_Family):
    embedding_dim: int
    dropout: float


class _Convolutional(_Embedded):
    num_filters: int
    filter_sizes: list[int]

    @field_validator("filter_sizes")
    @classmethod
    def _widths(cls, v: list[int]) -> list[int]:
        if not v or any(k < 1 for k in v):
            raise ValueError(f"filter_sizes must be positive widths, got {v}")
        return v


class TextCNNArgs(_Convolutional):
    """``textcnn`` (Kim 2014)."""


class RecurrentArgs(_Embedded):
    """``bilstm`` and ``match_esim``."""

    hidden_size: int


class SiameseArgs(_Convolutional):
    """``siamese``: a shared bilstm or textcnn encoder."""

    siamese_encoder: Literal["bilstm", "textcnn"]
    hidden_size: int


class HFArgs(_Family):
    """``hf_classifier``: a transformers encoder + classification head."""

    pretrained_model: str | None
    hf_config: dict[str, Any] | None
    gradient_checkpointing: bool
    freeze_embeddings: bool


class HFClassifierArgs(HFArgs):
    """``hf_classifier``: HFArgs plus windowed reading of long texts (:func:`xdpx.models.hf.
    text_windows`)."""

    window: int | None
    window_stride: int
    window_pooling: Literal["mean", "max"]

    @model_validator(mode="after")
    def _window_fits(self) -> HFClassifierArgs:
        if self.window is not None and not 0 <= self.window_stride <= self.window - 3:
            raise ValueError(
                f"window_stride (tokens shared by consecutive windows) must lie in "
                f"0..window-3 = {self.window - 3}, got {self.window_stride}"
            )
        return self


class StaticArgs(_Family):
    """``static_embed``: static piece vectors distilled from an encoder (Model2Vec) + linear."""

    static_vectors: str | None
    static_encoder: str | None
    static_dim: int
    static_weighting: Literal["zipf", "sif", "none"]
    static_tokens: Literal["all", "train"]
    static_layer_norm: bool
    freeze_embeddings: bool
    dropout: float

    @model_validator(mode="after")
    def _one_source(self) -> StaticArgs:
        if self.static_vectors and self.static_encoder:
            raise ValueError(
                "static_vectors and static_encoder both give the piece vectors; set one"
            )
        return self


#: model name -> its family's config
FAMILIES: dict[str, type[_Family]] = {
    "ngram_lr": NgramArgs,
    "match_ngram": NgramArgs,
    "textcnn": TextCNNArgs,
    "bilstm": RecurrentArgs,
    "match_esim": RecurrentArgs,
    "siamese": SiameseArgs,
    "hf_classifier": HFClassifierArgs,
    "hf_mlm": HFArgs,
    "static_embed": StaticArgs,
}
#: keys every family takes from the prepared data, not from ``train``
DATA_KEYS = ("vocab_size", "num_labels", "pad_id")
#: hf_classifier's extra data facts (the tokenizer's separator, jointly encoded pairs)
HF_DATA_KEYS = ("sep_id", "pair")
#: the models that take :data:`HF_DATA_KEYS` (they read a transformers tokenizer's ids)
HF_DATA_MODELS = ("hf_classifier", "hf_mlm", "static_embed")


def model_args(model: str, train_cfg: Any) -> _Family:
    """The ``train`` keys model ``model`` takes, validated by its family.

    Raises:
        ValueError: a key is invalid for this family (one line naming it).
    """
    family = FAMILIES[model]
    try:
        return family(**{k: getattr(train_cfg, k) for k in family.model_fields})
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(err["msg"].removeprefix("Value error, ")) from None


def model_keys() -> set[str]:
    """Every ``train`` key some model family takes."""
    return {k for family in FAMILIES.values() for k in family.model_fields}


# ------------------------------------------------------------- who reads which key
_NGRAM = ("ngram_lr", "match_ngram")
_EMBEDDED = ("textcnn", "bilstm", "match_esim", "siamese")
_HF = ("hf_classifier", "hf_mlm")
_STATIC = ("static_embed",)

#: ``train`` keys the trainer reads for some models only (beyond each family's constructor
#: arguments, :data:`FAMILIES`), and those models, as the code reads them:
#: ``head_learning_rate``: ``xdpx.train.optim.param_groups`` gives it to the parameters a
#: model calls its head (``classifier.*``, or its ``is_head``): ngram_lr and match_ngram have
#: none (their weights are the whole linear model); ``layerwise_lr_decay``: models with
#: ``param_depth`` (the transformers); FreeLB's ``adv_*``: ``adv: freelb``, which needs an
#: embedding layer (``MODELS_WITHOUT_EMBEDDINGS``) and a classification task (not hf_mlm);
#: ``mlm_probability``, ``mask_whole_words``: ``task: mlm``, which is hf_mlm's.
TRAINER_KEYS: dict[str, tuple[str, ...]] = {
    "head_learning_rate": _EMBEDDED + _HF + _STATIC,
    "layerwise_lr_decay": _HF,
    "adv": _EMBEDDED + ("hf_classifier",) + _STATIC,
    "adv_steps": _EMBEDDED + ("hf_classifier",) + _STATIC,
    "adv_lr": _EMBEDDED + ("hf_classifier",) + _STATIC,
    "adv_init_mag": _EMBEDDED + ("hf_classifier",) + _STATIC,
    "adv_max_norm": _EMBEDDED + ("hf_classifier",) + _STATIC,
    "mlm_probability": ("hf_mlm",),
    "mask_whole_words": ("hf_mlm",),
}

#: ``train`` keys every model reads (the data, the run directory, the budget, the optimizer,
#: the loss, evaluation, checkpoints, diagnostics). Every ``TrainConfig`` field is here or in
#: :func:`key_readers` (tests/test_config.py checks it, so a new key cannot go unclassified).
GENERIC_KEYS: tuple[str, ...] = (
    "data_dir", "save_dir", "overwrite", "auto_suffix", "task", "train_subset", "valid_subset",
    "lazy_load", "group_by_length", "model", "batch_size", "update_freq", "max_epoch", "max_update",
    "learning_rate", "loss", "optimizer", "weight_decay", "adam_betas", "adam_eps",
    "lr_scheduler", "warmup_steps", "warmup_ratio", "no_decay", "distill_from", "distill_alpha",
    "distill_temperature", "class_weight", "clip_norm", "precision", "device", "eval_interval",
    "eval_interval_warmup", "major_metric", "tolerance", "log_interval", "seed", "threads",
    "max_samples", "save_interval", "keep_checkpoints", "save_full_checkpoint", "resume",
    "resume_from", "min_loss_scale", "auto_ga", "max_loss", "inspect_grad", "log_sample_ids",
    "profile", "profile_steps", "preflight_doctor",
)  # fmt: skip

#: A key a model reads only under a setting of another key: ``(model, key) -> (key, value)``
#: (siamese builds its textcnn encoder, the only user of the filters, with that encoder only).
READ_WHEN: dict[tuple[str, str], tuple[str, Any]] = {
    ("siamese", "num_filters"): ("siamese_encoder", "textcnn"),
    ("siamese", "filter_sizes"): ("siamese_encoder", "textcnn"),
}

#: What to set instead of a key that a model does not read: ``(key, model)`` or ``key``.
INSTEAD: dict[tuple[str, str] | str, str] = {
    **{("dropout", m): "train.ngram_dropout (dropout on the n-gram inputs)" for m in _NGRAM},
    **{
        (
            "dropout",
            m,
        ): "train.hf_config={hidden_dropout_prob: ..., attention_probs_dropout_prob: ...}"  # fmt: skip
        for m in _HF
    },
    **{("embedding_dim", m): "train.ngram_buckets (the hashed n-gram table)" for m in _NGRAM},
    **{("embedding_dim", m): "train.hf_config={hidden_size: ...} (random init only)" for m in _HF},
    **{("hidden_size", m): "train.hf_config={hidden_size: ...} (random init only)" for m in _HF},
    ("hidden_size", "textcnn"): "train.num_filters (filters per width)",
    ("embedding_dim", "static_embed"): "train.static_dim (the PCA dimensions of the vectors)",
    ("pretrained_model", "static_embed"): "train.static_encoder (the encoder of the vectors)",
    **{
        (k, m): "train.hidden_size"
        for k in ("num_filters", "filter_sizes")
        for m in ("bilstm", "match_esim")
    },  # fmt: skip
    **{
        (k, "siamese"): "train.siamese_encoder=textcnn (they size its textcnn encoder; the "
        "bilstm encoder's size is train.hidden_size)"
        for k in ("num_filters", "filter_sizes")
    },
    **{
        ("head_learning_rate", m): "train.learning_rate (the whole model is linear)" for m in _NGRAM
    },  # fmt: skip
    "adv": "a model with an embedding layer (textcnn, bilstm, match_esim, siamese, hf_classifier)",
    "mlm_probability": "train.task=mlm with train.model=hf_mlm (params/pretrain-minilm.yaml)",
    "mask_whole_words": "train.task=mlm with train.model=hf_mlm (params/pretrain-minilm.yaml)",
}
for _k in ("adv_steps", "adv_lr", "adv_init_mag", "adv_max_norm"):
    INSTEAD[_k] = INSTEAD["adv"]


def key_readers() -> dict[str, tuple[str, ...]]:
    """Each model-specific ``train`` key -> the models that read it: the keys of their
    family (:data:`FAMILIES`) and :data:`TRAINER_KEYS`. The other keys are
    :data:`GENERIC_KEYS`."""
    out: dict[str, list[str]] = {}
    for model, family in FAMILIES.items():
        for key in family.model_fields:
            out.setdefault(key, []).append(model)
    for key, models in TRAINER_KEYS.items():
        out.setdefault(key, []).extend(m for m in models if m not in out.get(key, []))
    return {k: tuple(v) for k, v in out.items()}


def reads(model: str, key: str, train_cfg: Any) -> bool:
    """Whether model ``model`` reads ``train.<key>`` under ``train_cfg`` (a TrainConfig):
    a generic key always, a model-specific one when :func:`key_readers` lists the model
    (and :data:`READ_WHEN`'s condition holds)."""
    if key in GENERIC_KEYS:
        return True
    if model not in key_readers().get(key, ()):
        return False
    when = READ_WHEN.get((model, key))
    return when is None or getattr(train_cfg, when[0]) == when[1]


def unread_keys(train_cfg: Any) -> list[str]:
    """The ``train`` keys set to a value other than their default that ``train_cfg.model``
    does not read (:func:`reads`), in field order: they would do nothing."""
    fields = type(train_cfg).model_fields
    return [
        k
        for k, f in fields.items()
        if getattr(train_cfg, k) != f.default and not reads(train_cfg.model, k, train_cfg)
    ]


def unread_message(key: str, train_cfg: Any) -> str:
    """One line for a key ``train_cfg.model`` does not read: the key and its value, the
    model, the models that read it and what to use instead."""
    model = train_cfg.model
    readers = [m for m in key_readers().get(key, ()) if m != model]
    when = READ_WHEN.get((model, key))
    if when is not None:
        readers.append(f"{model} with train.{when[0]}={when[1]}")
    who = ", ".join(readers[:-1]) + f" or {readers[-1]}" if len(readers) > 1 else "".join(readers)
    instead = INSTEAD.get((key, model)) or INSTEAD.get(key)
    default = type(train_cfg).model_fields[key].default
    fix = f"use {instead}, or leave" if instead else "leave"
    return (
        f"train.{key}={getattr(train_cfg, key)!r} does nothing for model={model} (only "
        f"model={who or 'none'} reads it): {fix} it at its default {default!r}"
    )


def reading_config(key: str) -> dict[str, Any]:
    """The smallest ``train`` section in which ``train.<key>`` is read: ``{}`` for a generic
    key, else the first model of :func:`key_readers` with what it needs to load (a
    transformers config, ``task: mlm``; :data:`READ_WHEN`'s setting). For checking a value
    of one key alone (``xdpx tune``'s space), where the section's default model may not
    read it."""
    readers = key_readers().get(key)
    if not readers:
        return {}
    model = readers[0]
    body: dict[str, Any] = {"model": model}
    if model in _HF:
        body["hf_config"] = {"num_hidden_layers": 1}
    if model == "hf_mlm":
        body.update(task="mlm", major_metric="loss")
    when = READ_WHEN.get((model, key))
    if when is not None:
        body[when[0]] = when[1]
    return body
