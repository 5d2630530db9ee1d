"""Optimizer parameter groups: weight-decay exclusions, head learning rate, layer-wise lr decay.

With the defaults (``weight_decay=0``, no ``head_learning_rate``,
``layerwise_lr_decay=1``) every trainable parameter lands in one group, so the
optimizer is exactly ``AdamW(model.parameters())``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from torch import nn

__all__ = [
    "LazyAdamW",
    "build_optimizer",
    "build_scheduler",
    "clip_grad_norm",
    "param_groups",
    "warmup_updates",
]


def _is_head(module: nn.Module, name: str) -> bool:
    return bool(module.is_head(name))  # the contract's default: under classifier.


def param_groups(module: nn.Module, cfg: Any) -> list[dict[str, Any]]:
    """AdamW parameter groups for ``module`` under TrainConfig ``cfg``.

    * ``weight_decay`` applies to every parameter except those whose name contains one of
      ``cfg.no_decay`` (default ``bias``, ``LayerNorm.weight``, as in transformers'
      ``run_glue.py``).
    * The classification head trains at ``head_learning_rate`` (default ``learning_rate``).
    * Layer-wise lr decay for models with ``param_depth(name)`` (hf_classifier): a parameter
      at depth ``d`` of ``L + 1`` (0 = embeddings, ``L + 1`` = pooler/head) gets
      ``learning_rate * layerwise_lr_decay ** (L + 1 - d)`` (Sun et al. 2019, "How to
      Fine-Tune BERT for Text Classification", section 5.3; Clark et al. 2020, ELECTRA).
    * Frozen parameters (``requires_grad=False``) are left out.

    Returns:
        ``[{"params": [...], "lr": float, "weight_decay": float}, ...]`` in first-seen order.
    """
    top = int(module.num_layers) + 1
    groups: dict[tuple[float, float], list[nn.Parameter]] = {}
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        if _is_head(module, name) and cfg.head_learning_rate is not None:
            lr = cfg.head_learning_rate
        elif cfg.layerwise_lr_decay != 1.0 and (depth := module.param_depth(name)) is not None:
            lr = cfg.learning_rate * cfg.layerwise_lr_decay ** (top - depth)
        else:
            lr = cfg.learning_rate
        wd = 0.0 if any(s in name for s in cfg.no_decay) else cfg.weight_decay
        groups.setdefault((lr, wd), []).append(p)
    if not groups:
        raise ValueError("the model has no trainable parameters (everything frozen?)")
    return [{"params": ps, "lr": lr, "weight_decay": wd} for (lr, wd), ps in groups.items()]


def warmup_updates(cfg: Any, total_updates: int) -> int:
    """Warmup length in updates: ``warmup_steps``, or ``ceil(warmup_ratio * total_updates)``."""
    if cfg.warmup_ratio:
        return math.ceil(cfg.warmup_ratio * total_updates)
    return cfg.warmup_steps


class LazyAdamW(torch.optim.Optimizer):
    """AdamW whose sparse gradients update only the rows they touch ("lazy" Adam).

    A dense gradient gets the AdamW update (Loshchilov & Hutter 2019: Adam's moments with
    bias correction, decoupled weight decay). A sparse gradient (``torch.sparse_coo``, from
    ``embedding_bag(..., sparse=True)``) updates the moments and the weights of its rows
    only, as ``torch.optim.SparseAdam`` and Keras' ``LazyAdam`` do, with the decay applied to
    those rows; the step count is per parameter, as in SparseAdam. For a hashed table of
    millions of rows of which a batch touches a few thousand, a step costs what the batch
    touches instead of the whole table.

    Args:
        params: parameters or groups (``lr``, ``weight_decay`` per group).
        lr: learning rate; betas, eps, weight_decay: as ``torch.optim.AdamW``.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(
            params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        )

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # noqa: D102 (torch's)
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
                step_size = lr / (1 - beta1**t)
                root_bc2 = math.sqrt(1 - beta2**t)
                grad = p.grad
                if grad.is_sparse:
                    grad = grad.coalesce()
                    rows, values = grad.indices()[0], grad.values()
                    m_rows = m.index_select(0, rows).mul_(beta1).add_(values, alpha=1 - beta1)
                    v_rows = v.index_select(0, rows).mul_(beta2)
                    v_rows.addcmul_(values, values, value=1 - beta2)
                    m.index_copy_(0, rows, m_rows)
                    v.index_copy_(0, rows, v_rows)
                    w = p.index_select(0, rows)
                    if wd:
                        w.mul_(1 - lr * wd)
                    w.addcdiv_(m_rows, v_rows.sqrt_().div_(root_bc2).add_(eps), value=-step_size)
                    p.index_copy_(0, rows, w)
                else:
                    if wd:
                        p.mul_(1 - lr * wd)
                    m.mul_(beta1).add_(grad, alpha=1 - beta1)
                    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                    p.addcdiv_(m, v.sqrt().div_(root_bc2).add_(eps), value=-step_size)
        return loss


def clip_grad_norm(params: Any, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` (L2) that also takes sparse gradients
    (``optimizer: lazy_adamw``), whose norm is that of their coalesced values.

    Returns:
        The total L2 norm of all gradients before clipping (a 0-d tensor).
    """
    params = [p for p in params if p.grad is not None]
    if not any(p.grad.is_sparse for p in params):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    parts = []
    for p in params:
        if p.grad.is_sparse:
            p.grad = p.grad.coalesce()
            parts.append(torch.linalg.vector_norm(p.grad.values()))
        else:
            parts.append(torch.linalg.vector_norm(p.grad))
    total = torch.linalg.vector_norm(torch.stack(parts))
    coef = max_norm / (total + 1e-6)
    if coef < 1:
        for p in params:
            (p.grad.values() if p.grad.is_sparse else p.grad).mul_(coef)
    return total


def build_optimizer(module: nn.Module, cfg: Any) -> torch.optim.Optimizer:
    """``AdamW`` over :func:`param_groups` with ``adam_betas``, ``adam_eps``, ``weight_decay``;
    :class:`LazyAdamW` with ``optimizer: lazy_adamw``, which also switches a model with
    ``sparse_grad_tables`` (ngram_lr, match_ngram) to sparse gradients for them
    (:func:`xdpx.train.ddp.set_sparse_grad`).

    ``fused=True``: one kernel per step, several times faster than ``foreach`` on CPU for
    big embedding tables (measured on ngram_lr's hashed table).
    """
    if cfg.optimizer == "lazy_adamw":
        from xdpx.train.ddp import set_sparse_grad

        set_sparse_grad(module, cfg)
        return LazyAdamW(
            param_groups(module, cfg),
            lr=cfg.learning_rate,
            betas=tuple(cfg.adam_betas),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )
    return torch.optim.AdamW(
        param_groups(module, cfg),
        lr=cfg.learning_rate,
        betas=tuple(cfg.adam_betas),
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
        fused=True,
    )


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Any, total_updates: int) -> Any:
    """``transformers.get_scheduler(cfg.lr_scheduler)`` over ``total_updates`` updates with
    :func:`warmup_updates` of warmup."""
    from transformers import get_scheduler

    return get_scheduler(
        cfg.lr_scheduler,
        optimizer,
        num_warmup_steps=warmup_updates(cfg, total_updates),
        num_training_steps=total_updates,
    )


def current_lr(optimizer: torch.optim.Optimizer, learning_rate: float) -> float:
    """The learning rate to log: the first group's, or with several groups (a head or no-decay
    group of its own) ``learning_rate`` times the schedule's current factor."""
    groups = optimizer.param_groups
    if len(groups) > 1:
        return learning_rate * groups[0]["lr"] / groups[0]["initial_lr"]
    return groups[0]["lr"]


def halve_micro_batch(
    state: Any,
    auto_ga: bool,
    optimizer: torch.optim.Optimizer,
    oom: Exception,
    n_local: int,
    logged: bool,
) -> bool:
    """``train.auto_ga`` after a CUDA out-of-memory: halve ``state.micro_batch_size`` (the
    update is then redone on the same samples in more micro-batches, so it is unchanged) and
    clear the gradients and CUDA's cache; the first halving is logged.

    Args:
        state: the trainer's state (``micro_batch_size``, ``num_updates``).
        auto_ga: ``train.auto_ga``; oom: the error; n_local: samples of this rank's share;
        logged: a halving was logged already.

    Returns:
        True (a halving has been logged).

    Raises:
        the ``oom`` itself without ``auto_ga`` or at micro-batch 1.
    """
    if not auto_ga or state.micro_batch_size == 1:
        raise oom
    optimizer.zero_grad(set_to_none=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    state.micro_batch_size = math.ceil(state.micro_batch_size / 2)
    if not logged:
        logging.getLogger("xdpx.train.trainer").warning(
            "auto_ga: CUDA out of memory at update %d; retrying with micro-batch %d "
            "(%d micro-batches per update, same samples); further halvings are not logged",
            state.num_updates + 1,
            state.micro_batch_size,
            math.ceil(n_local / state.micro_batch_size),
        )
    return True
