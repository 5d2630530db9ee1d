"""The model contract: what every model family offers the trainer, inference, export and
the doctor, declared once with its defaults.

Every family in :data:`xdpx.models.MODELS` is a :class:`ModelContract` (an ``nn.Module``).
The rest of xdpx reads these attributes and calls these methods directly (``model.min_len``,
``model.param_depth(name)``), never probing with ``getattr``/``hasattr``
(``tests/test_models.py`` scans for it); a family overrides what it offers. A wrapper that is
not a family (a DDP module) is unwrapped first (:func:`xdpx.train.ddp.unwrap`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from torch import nn

__all__ = ["ModelContract", "CONTRACT_ATTRIBUTES"]


class ModelContract(nn.Module):
    """The base of every model family, with the contract's defaults.

    Class attributes (a family sets them on the class or the instance):
        min_len: batches are padded to at least this many ids (TextCNN: its widest filter).
        length_sorted_inference: padding is masked everywhere, so inference may sort a
            split by length and pad each batch to its own longest text (the transformers).
        sparse_grad_tables: names of embedding tables trained with sparse gradients (the
            n-gram models); non-empty makes ``optimizer: auto`` mean ``lazy_adamw``.
        sparse_grad: the tables produce sparse gradients now (set by
            ``xdpx.train.optim.build_optimizer``; DDP then all-reduces them itself).
        num_layers: transformer layers, for layer-wise lr decay (0: not layered).
        loading_info: what loading pretrained weights reported (missing / unexpected keys),
            or None.
        default_loss: the loss ``loss: auto`` means for this family.
        fits_on_data: the family builds tables from the training texts before training
            (:meth:`prepare`: the n-gram sub-word and idf tables, the static vectors).
        vocab_as_written: :meth:`prepare` reads ``vocab.txt`` as written (the tokenizer's
            own ids), not through :class:`xdpx.data.vocab.Vocab` (``[PAD]``/``[UNK]`` first).
    """

    min_len: int = 1
    length_sorted_inference: bool = False
    sparse_grad_tables: ClassVar[tuple[str, ...]] = ()
    sparse_grad: bool = False
    num_layers: int = 0
    loading_info: dict[str, Any] | None = None
    default_loss: ClassVar[str] = "cross_entropy"
    fits_on_data: ClassVar[bool] = False
    vocab_as_written: ClassVar[bool] = False

    def is_head(self, name: str) -> bool:
        """Is parameter ``name`` part of the classification head (``head_learning_rate``)?
        Default: under ``classifier.`` (TextCNN's, BiLSTM's and the pair models' output
        layer)."""
        return name.startswith("classifier.")

    def param_depth(self, name: str) -> int | None:
        """The depth of parameter ``name`` for layer-wise lr decay (0: embeddings,
        ``num_layers + 1``: pooler and head), or None for a model that is not layered."""
        return None

    def get_input_embeddings(self) -> nn.Module | None:
        """The token embedding layer FreeLB perturbs (``xdpx.train.adversarial``), or None
        for a model without one (the n-gram models)."""
        return None

    def prepare(self, tokens: Sequence[str], texts: Any) -> Any:
        """Build what the family fits on the training data (only when :attr:`fits_on_data`);
        ``tokens``: ``vocab.txt``; ``texts``: the training split. Returns facts to log."""
        return None

    def saved_config_updates(self) -> dict[str, Any]:
        """Constructor arguments :meth:`prepare` fixed, merged into the saved config."""
        return {}

    def saved_config(self) -> dict[str, Any] | None:
        """The whole config to save instead of the constructor arguments (a transformers
        model: its ``config.json``, so loading needs no hub), or None."""
        return None


#: The names the contract declares (what :class:`ModelContract` defines beyond
#: ``nn.Module``): nothing outside this module may probe a model for them.
CONTRACT_ATTRIBUTES = tuple(
    sorted(n for n in vars(ModelContract) if not n.startswith("_") and n not in vars(nn.Module))
)
