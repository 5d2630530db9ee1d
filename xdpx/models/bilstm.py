"""Bidirectional LSTM classifier with masked mean+max pooling."""

from __future__ import annotations

import torch
from torch import nn


class BiLSTM(nn.Module):
    """Embeddings -> BiLSTM -> masked mean and max pooling -> dropout -> linear.

    The backward direction runs a second LSTM over each sequence reversed
    within its own length (a gather, so it exports to ONNX, unlike packed
    sequences), and padding is excluded from both poolings: a sequence's
    logits do not depend on how much padding its batch added (the FAQ's
    padding check).

    Args:
        vocab_size: number of token ids (id 0 is padding).
        num_labels: output classes.
        embedding_dim: embedding size.
        hidden_size: LSTM hidden size per direction.
        dropout: dropout on embeddings and before the classifier.
        pad_id: padding token id.
    """

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        embedding_dim: int = 128,
        hidden_size: int = 128,
        dropout: float = 0.3,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.min_len = 1
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_id)
        self.lstm_fwd = nn.LSTM(embedding_dim, hidden_size, batch_first=True)
        self.lstm_bwd = nn.LSTM(embedding_dim, hidden_size, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(4 * hidden_size, num_labels)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, seq_len]`` int64. Returns: logits ``[batch, num_labels]``."""
        valid = input_ids != self.pad_id  # [B, T]
        mask = valid.unsqueeze(-1)  # [B, T, 1]
        x = self.dropout(self.embedding(input_ids))  # [B, T, E]
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)  # [1, T]
        lengths = valid.long().sum(1, keepdim=True)  # [B, 1]
        # position t <-> length-1-t inside each sequence, padding stays in place (an involution)
        rev = torch.where(pos < lengths, lengths - 1 - pos, pos).unsqueeze(-1)  # [B, T, 1]
        h_fwd, _ = self.lstm_fwd(x)
        h_bwd, _ = self.lstm_bwd(x.gather(1, rev.expand_as(x)))
        h_bwd = h_bwd.gather(1, rev.expand_as(h_bwd))
        h = torch.cat([h_fwd, h_bwd], dim=-1)  # [B, T, 2H]
        m = mask.to(h.dtype)
        mean = (h * m).sum(1) / m.sum(1).clamp(min=1.0)
        mx = h.masked_fill(~mask, torch.finfo(h.dtype).min).max(1).values
        return self.classifier(self.dropout(torch.cat([mean, mx], dim=-1)))
