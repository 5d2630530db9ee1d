"""Bidirectional LSTM classifier with masked mean+max pooling, and its reusable parts.

:func:`bidirectional` and :func:`masked_mean_max` are shared with the pair
models (``xdpx.models.pair``): the ESIM matcher runs them for its input
encoding and its composition layer, the siamese model pools each text with
:class:`BiLSTMEncoder`.
"""

from __future__ import annotations

import torch
from torch import nn

from xdpx.models.contract import ModelContract

__all__ = ["BiLSTM", "BiLSTMEncoder", "bidirectional", "masked_mean_max"]


def bidirectional(
    lstm_fwd: nn.LSTM, lstm_bwd: nn.LSTM, x: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Run a forward and a length-aware backward LSTM over right-padded sequences.

    The backward direction runs ``lstm_bwd`` over each sequence reversed within
    its own length (a gather, so it exports to ONNX, unlike packed sequences);
    padding stays at the end, so neither direction lets padding reach a real
    position: the outputs at real positions do not depend on the padding width.

    Args:
        lstm_fwd / lstm_bwd: ``batch_first`` LSTMs with the same hidden size ``H``.
        x: ``[batch, seq_len, D]`` inputs (padding rows anywhere after the last real token).
        valid: ``[batch, seq_len]`` bool, True at real tokens (a prefix of each row).

    Returns:
        ``[batch, seq_len, 2H]``: forward and backward states concatenated; values at
        padded positions are meaningless (mask them).
    """
    pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)  # [1, T]
    lengths = valid.long().sum(1, keepdim=True)  # [B, 1]
    # position t <-> length-1-t inside each sequence, padding stays in place (an involution)
    rev = torch.where(pos < lengths, lengths - 1 - pos, pos).unsqueeze(-1)  # [B, T, 1]
    h_fwd, _ = lstm_fwd(x)
    h_bwd, _ = lstm_bwd(x.gather(1, rev.expand_as(x)))
    h_bwd = h_bwd.gather(1, rev.expand_as(h_bwd))
    return torch.cat([h_fwd, h_bwd], dim=-1)


def masked_mean_max(h: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Mean and max over the real positions of each sequence.

    Args:
        h: ``[batch, seq_len, D]`` features.
        valid: ``[batch, seq_len]`` bool, True at real tokens (at least one per row).

    Returns:
        ``[batch, 2D]``: ``[mean; max]``, padding excluded from both.
    """
    mask = valid.unsqueeze(-1)  # [B, T, 1]
    m = mask.to(h.dtype)
    mean = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
    mx = h.masked_fill(~mask, torch.finfo(h.dtype).min).max(1).values
    return torch.cat([mean, mx], dim=-1)


class BiLSTMEncoder(ModelContract):
    """Embeddings -> dropout -> BiLSTM -> masked mean and max pooling (no classifier).

    The text encoder of :class:`BiLSTM` and of the siamese pair model; padding
    is excluded everywhere, so a sequence's vector does not depend on how much
    padding its batch added (the FAQ's padding check).

    Args:
        vocab_size: number of token ids.
        embedding_dim: embedding size.
        hidden_size: LSTM hidden size per direction.
        dropout: dropout on the embeddings.
        pad_id: padding token id.

    Attributes:
        output_dim: size of the pooled vector, ``4 * hidden_size``.
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int = 128,
        hidden_size: int = 128,
        dropout: float = 0.3,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.min_len = 1
        self.output_dim = 4 * hidden_size
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_id)
        self.lstm_fwd = nn.LSTM(embedding_dim, hidden_size, batch_first=True)
        self.lstm_bwd = nn.LSTM(embedding_dim, hidden_size, batch_first=True)
        self.dropout = nn.Dropout(dropout)

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding layer (FreeLB perturbs its output; see ``xdpx.train.adversarial``)."""
        return self.embedding

    def contextualize(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token states and the padding mask.

        Args:
            input_ids: ``[batch, seq_len]`` int64, right-padded with ``pad_id``.

        Returns:
            ``(h, valid)``: ``h`` ``[batch, seq_len, 2 * hidden_size]``, ``valid``
            ``[batch, seq_len]`` bool (True at real tokens).
        """
        valid = input_ids != self.pad_id
        x = self.dropout(self.embedding(input_ids))
        return bidirectional(self.lstm_fwd, self.lstm_bwd, x, valid), valid

    def encode(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, seq_len]`` int64. Returns: ``[batch, output_dim]``."""
        return masked_mean_max(*self.contextualize(input_ids))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Same as :meth:`encode`."""
        return self.encode(input_ids)


class BiLSTM(BiLSTMEncoder):
    """:class:`BiLSTMEncoder` -> dropout -> linear: ``input_ids -> logits``.

    Args:
        vocab_size: number of token ids (id 0 is padding).
        num_labels: output classes.
        embedding_dim: embedding size.
        hidden_size: LSTM hidden size per direction.
        dropout: dropout on embeddings and before the classifier.
        pad_id: padding token id.
    """

    #: ``train.learning_rate: null`` means this (Adam's default (Kingma & Ba 2015)).
    default_learning_rate = 1e-3

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        embedding_dim: int = 128,
        hidden_size: int = 128,
        dropout: float = 0.3,
        pad_id: int = 0,
    ) -> None:
        super().__init__(vocab_size, embedding_dim, hidden_size, dropout, pad_id)
        self.classifier = nn.Linear(self.output_dim, num_labels)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, seq_len]`` int64. Returns: logits ``[batch, num_labels]``."""
        return self.classifier(self.dropout(self.encode(input_ids)))
