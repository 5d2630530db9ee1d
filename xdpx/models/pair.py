"""Sentence-pair models over two separately encoded texts: ESIM matcher and siamese encoder.

Both take ``(input_ids, input_ids2)``, each ``[batch, seq_len_i]`` int64 and
right-padded with ``pad_id`` (the two widths may differ), and return
``logits [batch, num_labels]``. They declare ``input_names = ("input_ids",
"input_ids2")``; the trainer, inference, export and serve pass one padded
tensor per name, in that order. Padding is masked everywhere, so extra padding
on either side does not change the logits (eval mode).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from xdpx.models.bilstm import BiLSTMEncoder, bidirectional, masked_mean_max
from xdpx.models.contract import ModelContract
from xdpx.models.textcnn import TextCNNEncoder

__all__ = ["PAIR_INPUTS", "MatchESIM", "Siamese", "soft_align"]

#: Input names (positional order of ``forward``) of every pair model; also the ONNX input names.
PAIR_INPUTS = ("input_ids", "input_ids2")


def soft_align(
    a: torch.Tensor, b: torch.Tensor, valid_a: torch.Tensor, valid_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """ESIM's soft alignment (Chen et al. 2017, eq. 11-13), with padding masks.

    ``e_ij = a_i . b_j``; ``a~_i = sum_j softmax_j(e_ij) b_j`` over the real tokens
    ``j`` of ``b``, and ``b~_j = sum_i softmax_i(e_ij) a_i`` over the real tokens of ``a``.

    Args:
        a: ``[batch, len_a, D]``; b: ``[batch, len_b, D]``.
        valid_a: ``[batch, len_a]`` bool; valid_b: ``[batch, len_b]`` bool (at least
            one True per row).

    Returns:
        ``(a_tilde [batch, len_a, D], b_tilde [batch, len_b, D])``.
    """
    e = torch.bmm(a, b.transpose(1, 2))  # [B, La, Lb]
    low = torch.finfo(e.dtype).min  # exp(low - max) == 0: masked positions get weight 0
    attn_a = e.masked_fill(~valid_b.unsqueeze(1), low).softmax(dim=2)  # over b's tokens
    attn_b = e.transpose(1, 2).masked_fill(~valid_a.unsqueeze(1), low).softmax(dim=2)
    return torch.bmm(attn_a, b), torch.bmm(attn_b, a)


class MatchESIM(ModelContract):
    """ESIM (Chen et al. 2017, "Enhanced LSTM for Natural Language Inference") for text pairs.

    1. input encoding: shared embedding + BiLSTM (:class:`BiLSTMEncoder`) of each text;
    2. local inference: soft alignment (:func:`soft_align`) and the enhancement
       ``m = [a; a~; a - a~; a * a~]``;
    3. composition: a ReLU projection of ``m`` to ``hidden_size`` (the paper's ``F``),
       dropout, then a second BiLSTM;
    4. pooling: masked mean and max of both texts, ``v = [a_mean; a_max; b_mean; b_max]``;
    5. MLP: dropout, ``tanh`` hidden layer of ``hidden_size``, dropout, linear -> logits.

    Args:
        vocab_size: number of token ids.
        num_labels: output classes.
        embedding_dim: embedding size.
        hidden_size: LSTM hidden size per direction; also the projection and MLP size.
        dropout: dropout on embeddings, after the projection and in the MLP (paper: 0.5).
        pad_id: padding token id.
    """

    #: ``train.learning_rate: null`` means this (Adam's default; ESIM used 4e-4 (Chen et al. 2017)).
    default_learning_rate = 1e-3

    input_names = PAIR_INPUTS

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
        h = hidden_size
        self.encoder = BiLSTMEncoder(vocab_size, embedding_dim, h, dropout, pad_id)
        self.projection = nn.Sequential(nn.Linear(8 * h, h), nn.ReLU())
        self.comp_fwd = nn.LSTM(h, h, batch_first=True)
        self.comp_bwd = nn.LSTM(h, h, batch_first=True)
        self.dropout = nn.Dropout(dropout)
        self.hidden = nn.Linear(8 * h, h)
        self.classifier = nn.Linear(h, num_labels)

    def get_input_embeddings(self) -> nn.Embedding:
        """The embedding layer shared by both texts (FreeLB perturbs both; ``xdpx.train.adversarial``)."""
        return self.encoder.embedding

    def _compose(self, x: torch.Tensor, x_tilde: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Enhancement + projection + composition BiLSTM + pooling: ``[B, T, 2H] -> [B, 4H]``."""
        m = torch.cat([x, x_tilde, x - x_tilde, x * x_tilde], dim=-1)  # [B, T, 8H]
        v = self.dropout(self.projection(m))  # [B, T, H]
        return masked_mean_max(bidirectional(self.comp_fwd, self.comp_bwd, v, valid), valid)

    def forward(self, input_ids: torch.Tensor, input_ids2: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, len_a]``, input_ids2 ``[batch, len_b]`` int64 (0 = padding).

        Returns: logits ``[batch, num_labels]``.
        """
        a, valid_a = self.encoder.contextualize(input_ids)  # [B, La, 2H]
        b, valid_b = self.encoder.contextualize(input_ids2)  # [B, Lb, 2H]
        a_tilde, b_tilde = soft_align(a, b, valid_a, valid_b)
        v = torch.cat([self._compose(a, a_tilde, valid_a), self._compose(b, b_tilde, valid_b)], -1)
        return self.classifier(self.dropout(torch.tanh(self.hidden(self.dropout(v)))))


class Siamese(ModelContract):
    """One shared text encoder, then ``[u; v; |u - v|; u * v]`` -> MLP -> logits.

    The comparison features are those of InferSent (Conneau et al. 2017) and
    Sentence-BERT (Reimers & Gurevych 2019). The encoder never sees the other text,
    so a text's vector can be computed once and cached (retrieval, serving at scale);
    ESIM is the stronger matcher when that does not matter.

    Args:
        vocab_size: number of token ids.
        num_labels: output classes.
        siamese_encoder: ``bilstm`` (:class:`BiLSTMEncoder`: masked mean+max, order-aware)
            or ``textcnn`` (:class:`TextCNNEncoder`: faster, the usual distillation student).
        embedding_dim: embedding size.
        hidden_size: BiLSTM hidden size per direction; also the MLP size.
        num_filters / filter_sizes: TextCNN encoder settings.
        dropout: dropout on the BiLSTM's embeddings and in the MLP.
        pad_id: padding token id.

    Raises:
        ValueError: unknown ``siamese_encoder``.
    """

    #: ``train.learning_rate: null`` means this (Adam's default (Kingma & Ba 2015)).
    default_learning_rate = 1e-3

    input_names = PAIR_INPUTS

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        siamese_encoder: Literal["bilstm", "textcnn"] = "bilstm",
        embedding_dim: int = 128,
        hidden_size: int = 128,
        num_filters: int = 128,
        filter_sizes: tuple[int, ...] | list[int] = (3, 4, 5),
        dropout: float = 0.3,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.encoder: BiLSTMEncoder | TextCNNEncoder
        if siamese_encoder == "bilstm":
            self.encoder = BiLSTMEncoder(vocab_size, embedding_dim, hidden_size, dropout, pad_id)
        elif siamese_encoder == "textcnn":
            self.encoder = TextCNNEncoder(
                vocab_size, embedding_dim, num_filters, filter_sizes, pad_id
            )
        else:
            raise ValueError(
                f"siamese_encoder must be 'bilstm' or 'textcnn', got {siamese_encoder!r}"
            )
        self.min_len = self.encoder.min_len
        self.dropout = nn.Dropout(dropout)
        self.hidden = nn.Linear(4 * self.encoder.output_dim, hidden_size)
        self.classifier = nn.Linear(hidden_size, num_labels)

    def get_input_embeddings(self) -> nn.Embedding:
        """The embedding layer shared by both texts (FreeLB perturbs both; ``xdpx.train.adversarial``)."""
        return self.encoder.embedding

    def forward(self, input_ids: torch.Tensor, input_ids2: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, len_a]``, input_ids2 ``[batch, len_b]`` int64 (0 = padding),
        each ``>= min_len`` wide.

        Returns: logits ``[batch, num_labels]``.
        """
        u, v = self.encoder.encode(input_ids), self.encoder.encode(input_ids2)
        features = torch.cat([u, v, (u - v).abs(), u * v], dim=-1)
        return self.classifier(self.dropout(torch.relu(self.hidden(self.dropout(features)))))
