"""TextCNN (Kim, 2014, "Convolutional Neural Networks for Sentence Classification")."""

from __future__ import annotations

import torch
from torch import nn

from xdpx.models.contract import ModelContract

__all__ = ["TextCNN", "TextCNNEncoder"]


class TextCNNEncoder(ModelContract):
    """Token embeddings -> parallel 1-D convolutions -> masked max-pool over time (no classifier).

    The text encoder of :class:`TextCNN` and of the siamese pair model.

    Args:
        vocab_size: number of token ids.
        embedding_dim: embedding size.
        num_filters: output channels per filter size.
        filter_sizes: convolution widths in tokens (default 3/4/5 as in Kim 2014).
        pad_id: padding token id; windows that end on padding are masked out of the max-pool.

    Attributes:
        output_dim: size of the pooled vector, ``num_filters * len(filter_sizes)``.
        min_len: shortest input accepted, ``max(filter_sizes)`` (batches are padded up to it).
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_dim: int = 128,
        num_filters: int = 128,
        filter_sizes: tuple[int, ...] | list[int] = (3, 4, 5),
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.min_len = max(filter_sizes)
        self.output_dim = num_filters * len(filter_sizes)
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_id)
        self.convs = nn.ModuleList(nn.Conv1d(embedding_dim, num_filters, k) for k in filter_sizes)

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding layer (FreeLB perturbs its output; see ``xdpx.train.adversarial``)."""
        return self.embedding

    def encode(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, seq_len]`` int64, ``seq_len >= min_len``.

        Returns: ``[batch, output_dim]`` max-pooled filter activations (>= 0).
        """
        mask = (input_ids != self.pad_id).unsqueeze(1)  # [B, 1, T]
        x = self.embedding(input_ids).transpose(1, 2)  # [B, E, T]
        pooled = []
        for conv in self.convs:
            h = torch.relu(conv(x))  # [B, F, T-k+1]
            valid = mask[:, :, conv.kernel_size[0] - 1 :]  # window ends on a real token
            h = h.masked_fill(~valid, 0.0)  # relu output >= 0, so 0 is neutral for max
            pooled.append(h.max(dim=2).values)
        return torch.cat(pooled, dim=1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Same as :meth:`encode`."""
        return self.encode(input_ids)


class TextCNN(TextCNNEncoder):
    """:class:`TextCNNEncoder` -> dropout -> linear: ``input_ids -> logits``.

    Args:
        vocab_size: number of token ids (id 0 is padding).
        num_labels: output classes.
        embedding_dim: embedding size.
        num_filters: output channels per filter size.
        filter_sizes: convolution widths in tokens (default 3/4/5 as in Kim 2014).
        dropout: dropout probability before the classifier (Kim 2014 uses 0.5).
        pad_id: padding token id; padded positions are masked out of the max-pool.
    """

    #: ``train.learning_rate: null`` means this (Adam's default (Kingma & Ba 2015)).
    default_learning_rate = 1e-3

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        embedding_dim: int = 128,
        num_filters: int = 128,
        filter_sizes: tuple[int, ...] | list[int] = (3, 4, 5),
        dropout: float = 0.3,
        pad_id: int = 0,
    ) -> None:
        super().__init__(vocab_size, embedding_dim, num_filters, filter_sizes, pad_id)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(self.output_dim, num_labels)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, seq_len]`` int64, ``seq_len >= max(filter_sizes)``.

        Returns: logits ``[batch, num_labels]``.
        """
        return self.classifier(self.dropout(self.encode(input_ids)))
