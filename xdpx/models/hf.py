"""``hf_classifier``: a Hugging Face ``AutoModelForSequenceClassification`` as an xdpx model.

Like every xdpx model it maps ``input_ids [batch, seq_len]`` (right-padded with
``pad_id``) to ``logits [batch, num_labels]``, so the shared Trainer, evaluate,
predict, serve and the ONNX export work unchanged. The other inputs BERT-family
models take are derived inside the graph, exactly:

* ``attention_mask = input_ids != pad_id`` (the Parquet shards hold unpadded
  sequences, so every stored token is real);
* ``token_type_ids`` for text pairs encoded jointly by the tokenizer
  (``[CLS] a [SEP] b [SEP]``): 0 up to and including the first ``[SEP]``, 1
  after it, 0 on padding, which is what BERT's tokenizer writes
  (Devlin et al. 2019, section 3, "segment embeddings").

Weights come from ``pretrained_model`` (see :mod:`xdpx.pretrained` for the path
forms) or, with ``pretrained_model=None``, are initialised at random from
``hf_config`` (a ``transformers`` config dict; ``model_type`` defaults to
``bert``). The checkpoint's config.json stores the full ``transformers``
config, so evaluate/predict/export rebuild the architecture without the
pretrained files.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger("xdpx.models.hf")

__all__ = ["HFClassifier", "pair_token_type_ids"]

#: Parameter-name prefixes (inside the transformers model) that form the classification head.
HEAD_PREFIXES = ("classifier.", "pre_classifier.", "score.")


def pair_token_type_ids(input_ids: torch.Tensor, sep_id: int, pad_id: int) -> torch.Tensor:
    """BERT segment ids of jointly encoded pairs ``[CLS] a [SEP] b [SEP] <pad>...``.

    Args:
        input_ids: ``[batch, seq_len]`` int64, right-padded with ``pad_id``.
        sep_id: the separator token id.
        pad_id: the padding id.

    Returns:
        ``[batch, seq_len]`` int64: 0 up to and including the first ``sep_id``, 1 after it,
        0 on padding (what BERT's tokenizer returns as ``token_type_ids``).
    """
    is_sep = (input_ids == sep_id).long()
    before = torch.cumsum(is_sep, dim=1) - is_sep  # separators strictly before each position
    return ((before > 0) & (input_ids != pad_id)).long()


class HFClassifier(nn.Module):
    """A transformers sequence classifier taking ``input_ids`` only.

    Args:
        vocab_size: number of token ids the data uses (prepro meta); must not exceed the
            model's embedding rows.
        num_labels: output classes (a new head is created when it differs from the
            pretrained one; reported as missing keys).
        pad_id: padding id of the tokenizer.
        pretrained_model: directory, ``pkg:<module>/<dir>`` or URL of a pretrained model;
            None = random init from ``hf_config``.
        hf_config: ``transformers`` config fields: the whole architecture when
            ``pretrained_model`` is None (e.g. ``{"hidden_size": 128, "num_hidden_layers": 2}``),
            otherwise overrides (e.g. ``{"hidden_dropout_prob": 0.2}``).
        sep_id: the tokenizer's separator id (``[SEP]``), used for pair token types.
        pair: the data are jointly encoded text pairs.
        gradient_checkpointing: recompute activations in backward (less memory, ~30% slower).
        freeze_embeddings: do not train the embedding layer (word, position, type, LayerNorm).

    Raises:
        FileNotFoundError: ``pretrained_model`` does not exist.
        ValueError: the data's ``vocab_size`` exceeds the model's vocabulary.
    """

    #: ``train.learning_rate: null`` means this (transformers.TrainingArguments' default).
    default_learning_rate = 5e-5

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        pad_id: int = 0,
        pretrained_model: str | None = None,
        hf_config: dict[str, Any] | None = None,
        sep_id: int | None = None,
        pair: bool = False,
        gradient_checkpointing: bool = False,
        freeze_embeddings: bool = False,
    ) -> None:
        super().__init__()
        from transformers import AutoConfig, AutoModelForSequenceClassification

        overrides = dict(hf_config or {})
        self.loading_info: dict[str, list[str]] = {}
        from xdpx.pretrained import quiet_transformers, resolve_pretrained

        with quiet_transformers():
            if pretrained_model:
                local = resolve_pretrained(pretrained_model)
                self.hf, info = AutoModelForSequenceClassification.from_pretrained(
                    local,
                    num_labels=num_labels,
                    local_files_only=True,
                    output_loading_info=True,
                    ignore_mismatched_sizes=True,
                    **overrides,
                )
                self.loading_info = {
                    k: sorted(str(x) for x in v) for k, v in info.items() if k != "error_msgs"
                }
            else:
                model_type = overrides.pop("model_type", "bert")
                overrides.setdefault("vocab_size", vocab_size)
                overrides.setdefault("pad_token_id", pad_id)
                config = AutoConfig.for_model(model_type, num_labels=num_labels, **overrides)
                self.hf = AutoModelForSequenceClassification.from_config(config)
        rows = self.hf.get_input_embeddings().num_embeddings
        if vocab_size > rows:
            raise ValueError(
                f"the data use {vocab_size} token ids but the model has {rows} embedding rows: "
                "prepro must use this model's own tokenizer (prepro.tokenizer_path)"
            )
        self.pad_id = pad_id
        self.sep_id = sep_id
        self.pair = pair and sep_id is not None
        self.use_token_types = self.pair and getattr(self.hf.config, "type_vocab_size", 0) >= 2
        self.min_len = 1
        self.num_layers = int(getattr(self.hf.config, "num_hidden_layers", 0))
        self.vocab_size = vocab_size
        if gradient_checkpointing:
            self.hf.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        if freeze_embeddings:
            base = self.hf.base_model
            getattr(base, "embeddings", self.hf.get_input_embeddings()).requires_grad_(False)
        self._init_args = {
            "vocab_size": vocab_size,
            "num_labels": num_labels,
            "pad_id": pad_id,
            "sep_id": sep_id,
            "pair": pair,
            "gradient_checkpointing": gradient_checkpointing,
            "freeze_embeddings": freeze_embeddings,
        }

    def saved_config(self) -> dict[str, Any]:
        """Constructor arguments that rebuild this architecture without the pretrained files.

        ``pretrained_model`` becomes None and ``hf_config`` the full transformers config,
        so a checkpoint's config.json plus its weights are self-contained.
        """
        config = self.hf.config.to_dict()
        for key in (
            "architectures",
            "_name_or_path",
            "transformers_version",
            "id2label",
            "label2id",
        ):
            config.pop(key, None)
        return {**self._init_args, "pretrained_model": None, "hf_config": config}

    def param_depth(self, name: str) -> int:
        """Depth of parameter ``name`` for layer-wise lr decay.

        0 = embeddings, ``i + 1`` = encoder layer ``i``, ``num_layers + 1`` = pooler and
        classification head (Sun et al. 2019, "How to Fine-Tune BERT for Text Classification").
        """
        inner = name.removeprefix("hf.")
        if inner.startswith(HEAD_PREFIXES) or ".pooler." in f".{inner}":
            return self.num_layers + 1
        parts = inner.split(".")
        for i, part in enumerate(parts[:-1]):
            if part in ("layer", "layers") and parts[i + 1].isdigit():
                return int(parts[i + 1]) + 1
        return 0

    def is_head(self, name: str) -> bool:
        """True for parameters of the newly created classification head."""
        return name.removeprefix("hf.").startswith(HEAD_PREFIXES)

    def get_input_embeddings(self) -> nn.Module:
        """The word embeddings (before position/type embeddings are added): FreeLB perturbs
        their output, as the official FreeLB code does (``xdpx.adversarial``)."""
        return self.hf.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, seq_len]`` int64. Returns: logits ``[batch, num_labels]``."""
        mask = input_ids != self.pad_id
        kwargs: dict[str, torch.Tensor] = {"attention_mask": mask.long()}
        if self.use_token_types:
            kwargs["token_type_ids"] = pair_token_type_ids(input_ids, self.sep_id, self.pad_id)
        return self.hf(input_ids=input_ids, **kwargs).logits
