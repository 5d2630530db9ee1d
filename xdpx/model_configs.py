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

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator


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


#: model name -> its family's config
FAMILIES: dict[str, type[_Family]] = {
    "ngram_lr": NgramArgs,
    "match_ngram": NgramArgs,
    "textcnn": TextCNNArgs,
    "bilstm": RecurrentArgs,
    "match_esim": RecurrentArgs,
    "siamese": SiameseArgs,
    "hf_classifier": HFArgs,
    "hf_mlm": HFArgs,
}
#: keys every family takes from the prepared data, not from ``train``
DATA_KEYS = ("vocab_size", "num_labels", "pad_id")
#: hf_classifier's extra data facts (the tokenizer's separator, jointly encoded pairs)
HF_DATA_KEYS = ("sep_id", "pair")


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
