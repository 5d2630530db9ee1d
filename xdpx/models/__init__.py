"""Models: a flat ``MODELS`` dict keyed by the names allowed in ``TrainConfig.model``.

A single-text model maps ``input_ids [batch, seq_len]`` (int64, 0 = padding)
to ``logits [batch, num_labels]``. A pair model (``match_esim``, ``siamese``)
declares ``input_names = ("input_ids", "input_ids2")`` and is called as
``model(input_ids, input_ids2)``, each ``[batch, seq_len_i]`` padded to its own
width. ``hf_mlm`` (``train.task: mlm``) is the exception: it predicts tokens, ``logits
[batch, seq_len, vocab_size]`` (:class:`HFMaskedLM`). Every model exposes ``min_len`` (shortest sequence it accepts; each input
is padded up to it). :func:`input_names` tells the two kinds apart.

A model with a token embedding layer exposes it as ``get_input_embeddings()``
(the ``transformers`` name; every model but ``ngram_lr``): FreeLB
(:mod:`xdpx.train.adversarial`) adds its perturbation to that layer's output.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from xdpx.data.meta import PreparedMeta
from xdpx.model_configs import HF_DATA_MODELS, model_args
from xdpx.models.bilstm import BiLSTM
from xdpx.models.hf import HFClassifier, HFMaskedLM
from xdpx.models.match_ngram import MatchNgram
from xdpx.models.ngram import NgramLR
from xdpx.models.pair import PAIR_INPUTS, MatchESIM, Siamese
from xdpx.models.static import StaticEmbedding
from xdpx.models.textcnn import TextCNN

MODELS: dict[str, type[nn.Module]] = {
    "ngram_lr": NgramLR,
    "textcnn": TextCNN,
    "bilstm": BiLSTM,
    "match_esim": MatchESIM,
    "siamese": Siamese,
    "match_ngram": MatchNgram,
    "hf_classifier": HFClassifier,
    "hf_mlm": HFMaskedLM,  # train.task: mlm
    "static_embed": StaticEmbedding,
}

#: Input names of a model that declares none: one text.
SINGLE_INPUT = ("input_ids",)


def input_names(model: str | nn.Module | type[nn.Module]) -> tuple[str, ...]:
    """The inputs a model takes, in ``forward`` order (also its ONNX input names).

    Args:
        model: a ``MODELS`` key, a model class or an instance.

    Returns:
        ``("input_ids",)`` for single-text models, ``("input_ids", "input_ids2")``
        for pair models over separately encoded texts.

    Raises:
        KeyError: unknown model name.
    """
    if isinstance(model, str):
        if model not in MODELS:
            raise KeyError(f"unknown model {model!r}; valid: {sorted(MODELS)}")
        model = MODELS[model]
    return tuple(getattr(model, "input_names", SINGLE_INPUT))


def model_config_from(
    name: str,
    train_cfg: Any,
    vocab_size: int,
    num_labels: int,
    pad_id: int,
    meta: PreparedMeta | None = None,
) -> dict:
    """The constructor arguments of model ``name`` (saved as config.json): the data facts plus
    the ``train`` keys its family declares (``xdpx.model_configs``).

    ``meta`` (prepro's meta.json) supplies hf_classifier's data facts: ``sep_id`` (the
    tokenizer's separator) and ``pair`` (jointly encoded text pairs); without it there are
    none (no separator, single texts). A model class with a ``resolve_config(cfg, meta)``
    classmethod fills its data-dependent defaults there (``ngram_lr``: n-gram orders by
    tokenizer), so config.json holds concrete values.
    """
    cfg: dict[str, Any] = {"vocab_size": vocab_size, "num_labels": num_labels, "pad_id": pad_id}
    if name in HF_DATA_MODELS:
        cfg["sep_id"] = meta.sep_id if meta is not None else None
        cfg["pair"] = meta is not None and meta.pair_encoding == "joint"
    cfg.update(model_args(name, train_cfg).model_dump())
    resolve = getattr(MODELS[name], "resolve_config", None)
    return resolve(cfg, meta) if resolve else cfg


def default_learning_rate(name: str) -> float:
    """The peak learning rate that ``train.learning_rate: null`` means for model ``name``
    (each class's ``default_learning_rate``: ngram_lr 1e-2, textcnn/bilstm/match_esim/
    siamese 1e-3, hf_classifier 5e-5).

    Raises:
        KeyError: unknown model name.
    """
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; valid: {sorted(MODELS)}")
    return float(MODELS[name].default_learning_rate)


def require_model_defaults(train_cfg: Any) -> Any:
    """``train_cfg`` itself, once its model defaults are filled in (:func:`with_model_defaults`
    runs once per run, in set-up: ``xdpx.train.setup.resolve``; the trainer re-derives nothing).

    Raises:
        ValueError: ``learning_rate`` is null, or ``loss`` / ``optimizer`` is ``auto``.
    """
    unset = [k for k, v in (("learning_rate", train_cfg.learning_rate is None), ("loss", train_cfg.loss == "auto"), ("optimizer", train_cfg.optimizer == "auto")) if v]  # fmt: skip
    if unset:
        raise ValueError(f"Trainer needs the model's defaults filled in ({', '.join(unset)} unset): pass the config through xdpx.train.setup.resolve (or xdpx.models.with_model_defaults) first")  # fmt: skip
    return train_cfg


def with_model_defaults(train_cfg: Any) -> Any:
    """``train_cfg`` (a TrainConfig) with its model-dependent settings made concrete:
    ``learning_rate: null`` -> the model's :func:`default_learning_rate`; ``loss: auto`` ->
    the model class's ``default_loss`` (``cross_entropy`` when absent, and always with
    ``distill_from``); ``optimizer: auto`` -> ``lazy_adamw`` for a model class with
    ``sparse_grad_tables`` (hashed n-gram tables: ngram_lr, match_ngram), else ``adamw``.
    Unchanged (the same object) when nothing is ``null``/``auto``.

    Raises:
        KeyError: unknown model name.
    """
    update: dict[str, Any] = {}
    if train_cfg.learning_rate is None:
        update["learning_rate"] = default_learning_rate(train_cfg.model)
    cls = MODELS[train_cfg.model]
    if train_cfg.loss == "auto":
        loss = cls.default_loss
        update["loss"] = "cross_entropy" if train_cfg.distill_from else loss
    if train_cfg.optimizer == "auto":
        update["optimizer"] = "lazy_adamw" if cls.sparse_grad_tables else "adamw"
    return train_cfg.model_copy(update=update) if update else train_cfg


def build_for_training(
    name: str,
    model_config: dict,
    vocab_file: str | None,
    texts: Iterable[Any] | None,
    seed: int,
) -> tuple[nn.Module, dict, dict | None]:
    """Build model ``name`` as ``stages.train`` does before training (and ``xdpx doctor``).

    Seeds torch's RNG with ``seed`` (parameter init by seed: XDPX FAQ), builds the model,
    lets a model with ``prepare`` (ngram_lr; static_embed: its piece vectors) fit its tables
    to the training texts, and returns the config that rebuilds it (what ``config.json``
    saves).

    Args:
        name: a ``MODELS`` key; model_config: its constructor arguments
            (:func:`model_config_from`).
        vocab_file: the prepared ``vocab.txt`` (``prepare``'s token strings).
        texts: every training text (id arrays), or None to skip ``prepare`` (a resumed run
            restores the tables from its checkpoint).
        seed: ``train.seed``.

    Returns:
        ``(model, model_config, facts)``: ``facts`` is what ``prepare`` reports, or None.

    Raises:
        KeyError: unknown model name.
    """
    import torch

    from xdpx.data.vocab import Vocab, read_tokens

    torch.manual_seed(seed)
    model = build_model(name, model_config)
    facts = None
    if model.fits_on_data and texts is not None:  # ngram_lr: sub-word and idf tables
        assert vocab_file is not None
        # static_embed: the tokenizer's own ids (vocab.txt as written, not Vocab's [PAD]/[UNK])
        read = read_tokens if model.vocab_as_written else lambda p: Vocab.load(p).tokens  # fmt: skip
        facts = model.prepare(read(vocab_file), texts)
        model_config = {**model_config, **model.saved_config_updates()}
    saved = model.saved_config()  # hf_classifier: config.json rebuilds it without the hub
    if saved is not None:
        model_config = saved
    return model, model_config, facts


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
    "PAIR_INPUTS",
    "SINGLE_INPUT",
    "TextCNN",
    "BiLSTM",
    "NgramLR",
    "MatchESIM",
    "MatchNgram",
    "Siamese",
    "HFClassifier",
    "HFMaskedLM",
    "StaticEmbedding",
    "build_model",
    "reads_spelled_oov",
    "uses_sparse_grad",
    "build_for_training",
    "default_learning_rate",
    "input_names",
    "model_config_from",
    "with_model_defaults",
    "require_model_defaults",
]


def uses_sparse_grad(model: str | nn.Module, optimizer: str) -> bool:
    """Whether ``model`` (a ``MODELS`` key or an instance) trains its hashed tables with
    sparse gradients under ``optimizer`` (resolved: ``adamw`` or ``lazy_adamw``): with
    ``lazy_adamw``, a model whose class has ``sparse_grad_tables`` (``ngram_lr``,
    ``match_ngram``). DDP's reducer cannot bucket those: ``xdpx.train.ddp`` exchanges them.

    Raises:
        KeyError: unknown model name.
    """
    cls = MODELS[model] if isinstance(model, str) else model
    return optimizer == "lazy_adamw" and bool(cls.sparse_grad_tables)


def reads_spelled_oov(model: str) -> bool:
    """Whether model ``model`` (a ``MODELS`` key) reads data prepared with ``prepro.oov:
    spell`` (its class's ``reads_spelled_oov``: ``ngram_lr``, ``match_ngram``); the others
    would meet untrained ``##c`` vectors at dev and test time."""
    return getattr(MODELS.get(model), "reads_spelled_oov", False)


def check_model_fits_data(
    model: str, data_dir: str, where: str, meta: PreparedMeta | None = None
) -> None:
    """Refuse a pair model on single-text data, a single-text model on separate pairs,
    hf_classifier on ids that did not come from a transformers tokenizer, or a model without
    ``reads_spelled_oov`` (all but ``ngram_lr``, ``match_ngram``) on word tokens prepared
    with ``prepro.oov: spell``.

    Args:
        model: a ``MODELS`` key.
        data_dir: prepared data dir (its ``meta.json`` tells ``pair_encoding``).
        where: what named the model, for the message (``train.model``, ``checkpoint ...``).
        meta: ``data_dir``'s meta.json when the caller has read it (else it is read here).

    Raises:
        ValueError: the model's inputs (:func:`xdpx.models.input_names`) do not match
            the data's encoding; the message names the model, the data dir and the fix.
    """
    if meta is None:
        meta = PreparedMeta.read(data_dir)
    meta_path = PreparedMeta.path_in(data_dir)
    # files from before pair_encoding existed only had pair (always separate then)
    encoding = meta.pair_encoding or ("separate" if meta.pair else None)
    pair_model = "input_ids2" in input_names(model)  # a second, separately encoded text
    if pair_model and encoding != "separate":
        what = (
            "pairs encoded jointly into one sequence (prepro.tokenizer=hf)"
            if encoding == "joint"
            else "single texts (prepro.text2_column is null)"
        )
        raise ValueError(
            f"{where}={model} is a pair model (inputs input_ids, input_ids2) but {meta_path} "
            f"holds {what}; run prepro with prepro.text2_column=<column> and a char/word/whitespace "
            "tokenizer, or pick a single-text model (textcnn, bilstm, ngram_lr)"
        )
    tokenizer = meta.tokenizer
    if model == "hf_classifier" and tokenizer != "hf":
        raise ValueError(
            f"{where}=hf_classifier needs data prepared with the model's own tokenizer "
            f"(prepro.tokenizer=hf, prepro.tokenizer_path=<the model dir>); {meta_path} "
            f"says tokenizer={tokenizer}"
        )
    if meta.spells_oov and not reads_spelled_oov(model):
        raise ValueError(
            f"{where}={model} learns no vector for the ##c tokens that {meta_path}'s "
            "prepro.oov=spell writes after [UNK] for a word outside the vocabulary (the train "
            "split has none, so every one stays untrained: on STS-B siamese's dev accuracy fell "
            "from 77.60 to 70.93 with them); run prepro with prepro.oov=unk for this model, or "
            "use ngram_lr / match_ngram, which hash the spelled characters' n-grams"
        )
    if not pair_model and encoding == "separate":
        raise ValueError(
            f"{where}={model} takes one text but {meta_path} holds text pairs encoded "
            "separately (input_ids, input_ids2; prepro.text2_column is set); use a pair model "
            "(match_esim, siamese)"
        )
