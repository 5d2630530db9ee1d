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

__all__ = [
    "HFClassifier",
    "HFMaskedLM",
    "load_hf_model",
    "pair_token_type_ids",
    "pool_windows",
    "text_windows",
]

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


def text_windows(
    input_ids: torch.Tensor, pad_id: int, window: int, stride: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every text of a batch cut into windows of ``window`` tokens that cover it.

    A text is ``[CLS] t_1 ... t_L [SEP]`` (any tokenizer's first and last special tokens,
    read from the text itself) right-padded with ``pad_id``. Its content ``t_1..t_L`` is cut
    into windows of ``C = window - 2`` tokens, window ``k`` starting at ``k * (C - stride)``,
    so consecutive windows share ``stride`` tokens (transformers' ``stride`` with
    ``return_overflowing_tokens``; Pappagari et al. 2019's "chunk and pool" with overlap),
    and each window is ``[CLS] chunk [SEP]``, right-padded. A text of ``L`` content tokens
    has ``1 + max(0, ceil((L - C) / (C - stride)))`` windows (:func:`xdpx.batching.
    window_count`); a text of ``L <= C`` is its own single window.

    Only tensor operations on the batch's shape: the ONNX export (legacy tracer) keeps the
    number of windows dynamic in the sequence length.

    Args:
        input_ids: ``[batch, seq_len]`` int64.
        pad_id: the padding id; window: tokens per window (``>= 4``); stride: tokens shared
            by consecutive windows (``0 <= stride <= window - 3``).

    Returns:
        ``(windows, valid)``: ``[batch, n, width]`` int64 windows (``n`` the most that a
        text of ``seq_len`` tokens needs; ``width = min(window, seq_len)``: a batch of
        texts shorter than the window is one window as wide as the batch) and ``[batch, n]`` bool, True for the windows a text
        has (always its first).
    """
    lengths = (input_ids != pad_id).sum(1)  # [B]: special tokens included
    first = input_ids[:, :1]  # [B, 1]
    last = input_ids.gather(1, (lengths - 1).clamp(min=0)[:, None])  # [B, 1]
    content = (lengths - 2).clamp(min=0)  # [B]
    body = input_ids[:, 1:]  # [B, T-1]
    tb = torch._shape_as_tensor(body)[1]  # a tensor: traced, not a constant, in the export
    # a batch of texts shorter than the window is one window as wide as the batch
    c = torch.clamp(torch.minimum(tb + 1, torch.tensor(window)) - 2, min=1)
    step = torch.clamp(c - stride, min=1)
    n = torch.clamp(torch.div(tb - 1 - c + step - 1, step, rounding_mode="floor"), min=0) + 1
    starts = torch.arange(n, device=input_ids.device) * step  # [N]
    pos = starts[:, None] + torch.arange(c, device=input_ids.device)[None, :]  # [N, C]
    inside = pos[None, :, :] < content[:, None, None]  # [B, N, C]
    chunks = body[:, torch.minimum(pos, tb - 1)]  # [B, N, C]
    chunks = torch.where(inside, chunks, torch.full_like(chunks, pad_id))
    # window k is needed while window k-1 (ending at start_k - step + c) stops short of the end
    valid = (starts[None, :] - step + c < content[:, None]) | (starts[None, :] == 0)  # [B, N]
    filled = inside.sum(2)  # [B, N] content tokens per window
    heads = first[:, :, None].expand(-1, chunks.shape[1], 1)
    out = torch.cat([heads, chunks, torch.full_like(heads, pad_id)], 2)  # [B, N, C + 2]
    at = torch.arange(c + 2, device=input_ids.device)[None, None, :]
    out = torch.where(at == (filled + 1)[:, :, None], last[:, :, None].expand_as(out), out)
    return out, valid


def pool_windows(logits: torch.Tensor, owner: torch.Tensor, batch: torch.Tensor, pooling: str) -> torch.Tensor:  # fmt: skip
    """A text's logits from its windows' logits.

    Args:
        logits: ``[m, num_labels]`` of the ``m`` windows the texts have.
        owner: ``[m]`` int64, the text of each window (``0..batch-1``, every text at least
            once); batch: the number of texts (a 0-dim tensor, traced).
        pooling: ``mean`` (the average of a text's windows' logits) or ``max`` (per class, the
            largest).

    Returns:
        ``[batch, num_labels]`` logits.
    """
    texts = torch.arange(batch, device=logits.device)
    member = owner[None, :] == texts[:, None]  # [B, m]
    if pooling == "mean":
        weights = member.to(logits.dtype)
        return (weights @ logits) / weights.sum(1, keepdim=True)
    masked = torch.where(member[:, :, None], logits[None, :, :], torch.full_like(logits[None, :, :], float("-inf")))  # fmt: skip
    return masked.max(1).values


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
        window: read each text as windows of this many tokens (:func:`text_windows`), the
            encoder run on every window a text has and their logits pooled
            (:func:`pool_windows`): training then fits the pooled logits (the text's loss),
            and evaluate, predict, serve and the ONNX graph read texts the same way. None:
            the text as one sequence.
        window_stride: tokens consecutive windows share.
        window_pooling: ``mean`` or ``max``.

    Raises:
        FileNotFoundError: ``pretrained_model`` does not exist.
        ValueError: the data's ``vocab_size`` exceeds the model's vocabulary; a window on
            text pairs, or longer than the model's positions.
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
        window: int | None = None,
        window_stride: int = 32,
        window_pooling: str = "mean",
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
        positions = int(getattr(self.hf.config, "max_position_embeddings", 0) or 0)
        if window is not None and (pair or (positions and window > positions) or window < 4):
            why = "text pairs are not cut into windows" if pair else f"{positions} positions"
            raise ValueError(f"train.window={window}: {why} (a window has 4..{positions or 'n'} tokens)")  # fmt: skip
        self.window, self.window_stride, self.window_pooling = window, window_stride, window_pooling
        windowed = {} if window is None else {"window": window, "window_stride": window_stride, "window_pooling": window_pooling}  # fmt: skip
        self._init_args = {
            **windowed,
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
        """Args: input_ids ``[batch, seq_len]`` int64. Returns: logits ``[batch, num_labels]``
        (with ``window``: each text's windows' logits, pooled)."""
        if self.window is None:
            return self.hf(**self._inputs(input_ids)).logits
        windows, valid = text_windows(input_ids, self.pad_id, self.window, self.window_stride)
        n = windows.shape[1]
        kept = torch.nonzero(valid.reshape(-1)).squeeze(1)  # [m]: only the windows texts have
        logits = self.hf(**self._inputs(windows.reshape(-1, windows.shape[2])[kept])).logits
        owner = torch.div(kept, n, rounding_mode="floor")
        return pool_windows(
            logits, owner, torch._shape_as_tensor(input_ids)[0], self.window_pooling
        )


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
