"""fastText-style classifier over hashed character n-grams (Joulin et al., 2017, "Bag of Tricks")."""

from __future__ import annotations

import torch
from torch import nn

# Multipliers for position k of an n-gram window (distinct odd primes); hash = sum ids*P_k mod buckets.
_PRIMES = (1, 1_000_003, 998_244_353, 1_000_000_007, 2_147_483_647)


class FastText(nn.Module):
    """Mean of unigram and hashed n-gram embeddings -> dropout -> linear.

    n-gram ids are hashed from the token ids inside the model (integer ops
    only), so the exported ONNX graph takes ``input_ids`` alone. Windows that
    touch padding are masked out.

    Args:
        vocab_size: number of token ids (id 0 is padding).
        num_labels: output classes.
        embedding_dim: embedding size.
        ngram_orders: n-gram orders; 1 uses the token embedding, >= 2 the hash buckets.
        ngram_buckets: hash buckets shared by all orders >= 2.
        dropout: dropout on the pooled vector.
        pad_id: padding token id.
    """

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        embedding_dim: int = 128,
        ngram_orders: tuple[int, ...] | list[int] = (1, 2, 3),
        ngram_buckets: int = 200_003,
        dropout: float = 0.3,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        if max(ngram_orders) > len(_PRIMES):
            raise ValueError(f"ngram_orders up to {len(_PRIMES)} are supported, got {ngram_orders}")
        self.pad_id = pad_id
        self.orders = list(ngram_orders)
        self.min_len = 1
        self.buckets = ngram_buckets
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_id)
        self.ngram_embedding = nn.Embedding(ngram_buckets, embedding_dim)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(embedding_dim, num_labels)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, seq_len]`` int64. Returns: logits ``[batch, num_labels]``."""
        valid = input_ids != self.pad_id  # [B, T]
        total = torch.zeros(
            input_ids.shape[0], self.embedding.embedding_dim, device=input_ids.device
        )
        count = torch.zeros(input_ids.shape[0], 1, device=input_ids.device)
        for n in self.orders:
            if n == 1:
                emb, ok = self.embedding(input_ids), valid
            else:
                seq_len = input_ids.shape[1]
                span = max(seq_len - n + 1, 0)
                h = torch.zeros_like(input_ids[:, :span])
                ok = torch.ones_like(valid[:, :span])
                for k in range(n):
                    h = h + input_ids[:, k : k + span] * _PRIMES[k]
                    ok = ok & valid[:, k : k + span]
                emb = self.ngram_embedding(torch.remainder(h, self.buckets))
            w = ok.unsqueeze(-1).to(emb.dtype)
            total = total + (emb * w).sum(1)
            count = count + w.sum(1)
        pooled = total / count.clamp(min=1.0)
        return self.classifier(self.dropout(pooled))
