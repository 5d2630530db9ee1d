"""``hf_classifier``: a Hugging Face ``AutoModelForSequenceClassification`` as an xdpx model;
``hf_mlm``: an ``AutoModelForMaskedLM`` for ``train.task: mlm`` (:class:`HFMaskedLM`).

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

from xdpx.models.contract import ModelContract

log = logging.getLogger("xdpx.models.hf")

__all__ = ["HFClassifier", "HFMaskedLM", "load_hf_model", "pair_token_type_ids"]

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


def load_hf_model(
    auto_class: str,
    pretrained_model: str | None,
    hf_config: dict[str, Any] | None,
    vocab_size: int,
    pad_id: int,
    num_labels: int,
) -> tuple[nn.Module, dict[str, list[str]]]:
    """A ``transformers`` model of ``auto_class`` from ``pretrained_model`` (local files only)
    or, when it is None, initialised at random from ``hf_config`` (``model_type`` default
    ``bert``; ``vocab_size``/``pad_token_id`` default to the data's).

    Args:
        auto_class: ``AutoModelForSequenceClassification`` (gets ``num_labels``) or
            ``AutoModelForMaskedLM``.
        pretrained_model: see :mod:`xdpx.pretrained` for the accepted forms.

    Returns:
        ``(model, loading_info)``: missing/unexpected/mismatched keys when loaded (sorted).

    Raises:
        FileNotFoundError: ``pretrained_model`` does not exist.
    """
    import transformers

    from xdpx.pretrained import quiet_transformers, resolve_pretrained

    cls = getattr(transformers, auto_class)
    overrides = dict(hf_config or {})
    head = {"num_labels": num_labels} if auto_class.endswith("SequenceClassification") else {}
    with quiet_transformers():
        if pretrained_model:
            model, info = cls.from_pretrained(
                resolve_pretrained(pretrained_model),
                local_files_only=True,
                output_loading_info=True,
                ignore_mismatched_sizes=True,
                **head,
                **overrides,
            )
            return model, {
                k: sorted(str(x) for x in v) for k, v in info.items() if k != "error_msgs"
            }
        model_type = overrides.pop("model_type", "bert")
        overrides.setdefault("vocab_size", vocab_size)
        overrides.setdefault("pad_token_id", pad_id)
        config = transformers.AutoConfig.for_model(model_type, **head, **overrides)
        return cls.from_config(config), {}


class HFClassifier(ModelContract):
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
    #: the ``transformers`` auto class that builds the model
    auto_class = "AutoModelForSequenceClassification"

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
        self.hf, self.loading_info = load_hf_model(
            self.auto_class, pretrained_model, hf_config, vocab_size, pad_id, num_labels
        )
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
        # padding is masked out: a text's logits do not depend on its batch-mates' lengths,
        # so inference may batch texts by length (xdpx.inference.predict_logits)
        self.length_sorted_inference = True
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
        if self.is_head(name) or ".pooler." in f".{inner}":
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
        their output, as the official FreeLB code does (``xdpx.train.adversarial``)."""
        return self.hf.get_input_embeddings()

    def _inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """The transformers inputs derived from ``input_ids`` (module docstring)."""
        kwargs = {"input_ids": input_ids, "attention_mask": (input_ids != self.pad_id).long()}
        if self.use_token_types:
            kwargs["token_type_ids"] = pair_token_type_ids(input_ids, self.sep_id, self.pad_id)
        return kwargs

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, seq_len]`` int64. Returns: logits ``[batch, num_labels]``."""
        return self.hf(**self._inputs(input_ids)).logits


#: Parameter-name prefixes of masked-LM heads (BERT's ``cls.``, RoBERTa's ``lm_head.``).
MLM_HEAD_PREFIXES = ("cls.", "lm_head.")


def _read_weights(directory: str, keys: list[str]) -> dict[str, torch.Tensor]:
    """The tensors named ``keys`` from the safetensors weight files of a pretrained directory
    (keys not found there are left out)."""
    import glob
    import os

    from safetensors import safe_open

    out: dict[str, torch.Tensor] = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        with safe_open(path, "pt") as f:
            for key in set(keys) & set(f.keys()):
                out[key] = f.get_tensor(key)
    return out


class HFMaskedLM(HFClassifier):
    """``hf_mlm``: a transformers ``AutoModelForMaskedLM`` for ``train.task: mlm``.

    Maps ``input_ids [batch, seq_len]`` to ``logits [batch, seq_len, vocab_size]`` (the
    token predictions at every position; :mod:`xdpx.train.mlm` draws the masks and the loss).
    The constructor arguments are :class:`HFClassifier`'s (``num_labels`` is kept only so
    config.json has the same keys) plus ``carried``.

    Weights of the pretrained checkpoint that the masked-LM architecture does not use
    (BERT's pooler: ``BertForMaskedLM`` has none) are *carried*: kept unchanged as
    buffers, saved in xdpx checkpoints, and written back by :meth:`save_pretrained`, so
    fine-tuning from the adapted model starts from the same pooler as fine-tuning from the
    original one.

    Args:
        carried: ``{key: shape}`` of carried weights, as :meth:`saved_config` records them
            (None: read them from ``pretrained_model``).
    """

    auto_class = "AutoModelForMaskedLM"

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
        carried: dict[str, list[int]] | None = None,
    ) -> None:
        super().__init__(
            vocab_size, num_labels, pad_id, pretrained_model, hf_config, sep_id, pair,
            gradient_checkpointing, freeze_embeddings,
        )  # fmt: skip
        self.carried = nn.Module()
        if carried is None:
            carried = {}
            unused = self.loading_info.get("unexpected_keys", [])
            if unused and pretrained_model:
                from xdpx.pretrained import resolve_pretrained

                for key, t in _read_weights(resolve_pretrained(pretrained_model), unused).items():
                    self.carried.register_buffer(key.replace(".", "__"), t.clone())
                    carried[key] = list(t.shape)
        else:
            for key, shape in carried.items():
                self.carried.register_buffer(key.replace(".", "__"), torch.zeros(shape))
        self._init_args["carried"] = carried

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Token predictions.

        Args:
            input_ids: ``[batch, seq_len]`` int64, right-padded.
            labels: ``[batch, seq_len]`` (``xdpx.train.mlm``: original ids at masked positions,
                -100 elsewhere) or None.

        Returns:
            None labels: ``logits [batch, seq_len, vocab_size]``; else the logits of the
            masked positions only, ``[n_masked, vocab_size]`` in row-major order (the head
            is position-wise, so this equals selecting from the full logits, at ~15% of the
            head's cost: its vocabulary projection is as costly as the whole encoder for
            MiniLM-L6).
        """
        if labels is None:
            return super().forward(input_ids)
        head = getattr(self.hf, "cls", None) or getattr(self.hf, "lm_head", None)
        if head is None:  # an architecture with another head name: full logits, then select
            return super().forward(input_ids)[labels != -100]
        hidden = self.hf.base_model(**self._inputs(input_ids))[0]
        return head(hidden[labels != -100])

    def saved_config(self) -> dict[str, Any]:
        """:meth:`HFClassifier.saved_config` plus the carried weights' shapes."""
        return {**super().saved_config(), "carried": self._init_args["carried"]}

    def is_head(self, name: str) -> bool:
        """True for parameters of the masked-LM head."""
        return name.removeprefix("hf.").startswith(MLM_HEAD_PREFIXES)

    def save_pretrained(self, path: str, tokenizer_dir: str | None = None) -> None:
        """Write a ``from_pretrained`` directory (config.json, model.safetensors and, from
        ``tokenizer_dir``, the tokenizer files) that ``train.pretrained_model`` and
        ``prepro.tokenizer_path`` accept; atomic (temporary sibling, then replace).

        Args:
            path: destination directory (local or remote).
            tokenizer_dir: the tokenizer the data were prepared with (``prepro.tokenizer_path``);
                None when prepro used xdpx's own vocabulary (no tokenizer files then).
        """
        from transformers import AutoTokenizer

        from xdpx import io
        from xdpx.pretrained import quiet_transformers, resolve_pretrained

        state = dict(self.hf.state_dict())
        prefix = self.hf.base_model_prefix
        for key in self._init_args["carried"]:
            name = key if key.startswith(f"{prefix}.") else f"{prefix}.{key}"
            state[name] = getattr(self.carried, key.replace(".", "__")).detach().clone()
        tmp = io.tmp_sibling(path)
        try:
            with quiet_transformers():
                self.hf.save_pretrained(tmp, state_dict=state)
                if tokenizer_dir:
                    tok = AutoTokenizer.from_pretrained(
                        resolve_pretrained(tokenizer_dir), local_files_only=True
                    )
                    tok.save_pretrained(tmp)
            io.replace_dir(tmp, path, marker="config.json")
        except BaseException:
            io.rm(tmp, recursive=True)
            raise
