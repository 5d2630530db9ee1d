"""Logistic regression over hashed character n-grams, trained end to end in PyTorch.

The strongest cheap text classifier on small corpora is still a linear model
over n-gram presence (Wang & Manning 2012; Joulin et al. 2017, "Bag of
Tricks"). This module is that model in the shape of every other xdpx model:
``input_ids -> logits``, with the n-gram ids hashed inside the graph, so it
trains with the shared Trainer and exports to ONNX with ``input_ids`` alone.
"""

from __future__ import annotations

import torch
from torch import nn

# Multipliers for position k of an n-gram window (distinct primes): hash = sum_k ids[i+k] * P_k.
_PRIMES = (1, 1_000_003, 998_244_353, 1_000_000_007, 2_147_483_647)
# Added per order so that the same ids in different orders land in different buckets.
_ORDER_SALT = 7_919


class NgramLR(nn.Module):
    """Binary bag of hashed n-grams, normalised by sqrt(#distinct n-grams), then linear.

    Every n-gram (orders ``ngram_orders``; 1 = the tokens) of a text is hashed
    into ``ngram_buckets`` rows of a ``[ngram_buckets, num_labels]`` weight
    table. Repeats inside a text count once (binary features, like sublinear
    tf), and the sum is divided by sqrt(number of distinct n-grams), the L2
    norm of the binary feature vector, as TF-IDF + logistic regression does.
    Windows that touch padding are ignored, so logits do not depend on padding.

    Args:
        vocab_size: number of token ids (only checked: ids are hashed).
        num_labels: output classes.
        ngram_orders: n-gram orders, each in 1..5.
        ngram_buckets: hash buckets (rows of the weight table).
        pad_id: padding token id.
    """

    def __init__(
        self,
        vocab_size: int,
        num_labels: int,
        ngram_orders: tuple[int, ...] | list[int] = (1, 2, 3, 4),
        ngram_buckets: int = 4_194_304,
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        if not ngram_orders or min(ngram_orders) < 1 or max(ngram_orders) > len(_PRIMES):
            raise ValueError(
                f"ngram_orders must lie in 1..{len(_PRIMES)}, got {list(ngram_orders)}"
            )
        self.vocab_size = vocab_size
        self.orders = sorted(set(ngram_orders))
        self.buckets = ngram_buckets
        self.pad_id = pad_id
        self.min_len = 1
        # row 0 is "no n-gram" (padding), buckets are rows 1..ngram_buckets
        self.weight = nn.Embedding(ngram_buckets + 1, num_labels, padding_idx=0)
        nn.init.zeros_(self.weight.weight)  # logistic regression starts at zero
        self.bias = nn.Parameter(torch.zeros(num_labels))

    def ngram_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Row ids of every n-gram window, 0 where a window touches padding.

        Args:
            input_ids: ``[batch, seq_len]`` int64.

        Returns:
            ``[batch, sum_n (seq_len - n + 1)]`` int64 row ids in ``0..ngram_buckets``.
        """
        valid = input_ids != self.pad_id
        parts = []
        for n in self.orders:
            h = torch.zeros_like(input_ids[:, n - 1 :]) + n * _ORDER_SALT
            ok = valid[:, n - 1 :]
            for k in range(n):
                # window start k; negative end keeps seq_len symbolic when traced for ONNX
                end = k - n + 1
                h = h + (input_ids[:, k:end] if end < 0 else input_ids[:, k:]) * _PRIMES[k]
                ok = ok & (valid[:, k:end] if end < 0 else valid[:, k:])
            ids = torch.remainder(h, self.buckets) + 1
            parts.append(torch.where(ok, ids, torch.zeros_like(ids)))
        return torch.cat(parts, dim=1)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids ``[batch, seq_len]`` int64. Returns: logits ``[batch, num_labels]``."""
        ids, _ = torch.sort(self.ngram_ids(input_ids), dim=1)
        repeat = torch.cat(
            [torch.zeros_like(ids[:, :1], dtype=torch.bool), ids[:, 1:] == ids[:, :-1]], dim=1
        )
        ids = ids.masked_fill(repeat, 0)  # each distinct n-gram once
        count = (ids != 0).sum(dim=1, keepdim=True).to(torch.float32).clamp(min=1.0)
        return self.weight(ids).sum(dim=1) / count.sqrt() + self.bias
