"""FreeLB adversarial training on the embedding output (Zhu et al. 2020, Algorithm 1).

"FreeLB: Enhanced Adversarial Training for Natural Language Understanding"
(ICLR 2020). For one micro-batch with input embeddings ``X`` (``[batch,
seq_len, dim]``, the output of the token embedding layer):

1. ``delta_0 = U(-1, 1) * mask * adv_init_mag / sqrt(L_b * dim)`` per example
   ``b`` with ``L_b`` real tokens (the official code's L2 initialisation:
   every entry lies in ``[-m, m]`` with ``m = adv_init_mag / sqrt(L_b * dim)``,
   so ``||delta_0||_F <= adv_init_mag``); ``delta_0 = 0`` when
   ``adv_init_mag`` is 0.
2. For ``t = 1 .. K`` (``adv_steps``): forward ``f(X + delta_{t-1})``,
   backward ``loss / K``, which accumulates ``1/K`` of the parameter gradient
   of every step (the paper's ``g_t = g_{t-1} + 1/K grad_theta L``); then,
   except after the last step, ascend
   ``delta_t = delta_{t-1} + adv_lr * g_delta / ||g_delta||_F`` and project
   each example onto the ball ``||delta||_F <= adv_max_norm``
   (``adv_max_norm`` 0 = no bound).
3. The optimizer steps once on the accumulated gradient (the trainer's usual step).

Norms are per example, Frobenius over all its positions and dimensions;
padding positions (``input_ids == pad_id``) are masked out of the
initialisation, the gradient step and hence the norm: they never get a
perturbation. A pair model over two separately encoded texts (``match_esim``,
``siamese``) perturbs both texts' embeddings, and one example's perturbation
is the pair of them: its norm is taken over both (as for a jointly encoded
pair in one sequence). Every ascent step of a micro-batch replays the same
random state, so dropout draws the same masks at each step (the paper's
section 3.3; XDPX's FreeLBTask did the same).

**The embedding hook.** A model opts in by exposing its token embedding layer
as ``get_input_embeddings() -> nn.Embedding`` (the ``transformers`` name):
``textcnn``, ``bilstm``, ``match_esim``, ``siamese`` and ``hf_classifier``
(its word embeddings, before position/type embeddings are added, as in the
official FreeLB code) do; ``ngram_lr`` has no token embedding and is refused.
The model must call that layer once per model input, in input order
(``input_ids`` then ``input_ids2``), with the input ids themselves. During a
FreeLB step a forward hook on the layer adds ``delta`` to its output; outside
(evaluation, inference, export) nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from xdpx.config import ConfigError

__all__ = ["FreeLB", "init_bound", "input_embeddings", "rng_state", "set_rng_state"]


def input_embeddings(model: nn.Module) -> nn.Module | None:
    """The token embedding layer a model exposes through ``get_input_embeddings()``, or None.

    Args:
        model: an xdpx model (or any module; a DDP wrapper is unwrapped:
            :func:`xdpx.train.ddp.unwrap`).
    """
    from xdpx.train.ddp import unwrap

    model = unwrap(model)
    return model.get_input_embeddings()


def rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The CPU (and, on CUDA, the device's) random state: restore it to redraw the same dropout."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    """Restore a state from :func:`rng_state`."""
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


class FreeLB:
    """Perturbations of one micro-batch's embedding output and their ascent (module docstring).

    Usage (what ``xdpx.train.trainer.Trainer`` does for each micro-batch)::

        freelb.start(x)                       # delta_0 for this batch
        for t in range(freelb.steps):
            with freelb.perturb():            # embedding output + delta_{t}
                loss = loss_fn(model(*x))
            (loss / freelb.steps).backward()  # also fills delta.grad
            if t < freelb.steps - 1:
                freelb.ascend()               # delta_{t+1}, projected

    Args:
        model: the bare model (not DDP-wrapped); must expose ``get_input_embeddings()``.
        steps: ``K`` (``train.adv_steps``), >= 1.
        lr: ascent step size ``alpha`` (``train.adv_lr``), in embedding units per step.
        init_mag: ``epsilon_0`` (``train.adv_init_mag``); 0 = start from ``delta = 0``.
        max_norm: ``epsilon`` (``train.adv_max_norm``); 0 = unbounded.
        pad_id: padding id of the inputs (masked out).

    Attributes:
        deltas: the current perturbations, one ``[batch, seq_len_i, dim]`` float32 leaf
            tensor per model input (``requires_grad``).
        masks: ``[batch, seq_len_i]`` bool, True at real tokens, per input.

    Raises:
        ConfigError: the model exposes no embedding layer.
    """

    @classmethod
    def from_config(cls, model: nn.Module, cfg: Any, pad_id: int) -> FreeLB:
        """From the ``train`` section: ``adv_steps``, ``adv_lr``, ``adv_init_mag``, ``adv_max_norm``."""
        return cls(model, cfg.adv_steps, cfg.adv_lr, cfg.adv_init_mag, cfg.adv_max_norm, pad_id)

    def __init__(
        self,
        model: nn.Module,
        steps: int,
        lr: float,
        init_mag: float,
        max_norm: float,
        pad_id: int = 0,
    ) -> None:
        embedding = input_embeddings(model)
        if embedding is None:
            raise ConfigError(
                f"train.adv=freelb perturbs the embedding output, but {type(model).__name__} "
                "exposes no embedding layer (get_input_embeddings()); use textcnn, bilstm, "
                "match_esim, siamese or hf_classifier"
            )
        if steps < 1:
            raise ConfigError(f"train.adv_steps must be >= 1, got {steps}")
        self.embedding = embedding
        self.steps, self.lr, self.init_mag, self.max_norm = steps, lr, init_mag, max_norm
        self.pad_id = pad_id
        self.dim = int(getattr(embedding, "embedding_dim", 0) or embedding.weight.shape[1])
        self.deltas: list[torch.Tensor] = []
        self.masks: list[torch.Tensor] = []
        self._calls = 0

    # ------------------------------------------------------------------ perturbation
    def start(
        self, x: torch.Tensor | tuple[torch.Tensor, ...], generator: torch.Generator | None = None
    ) -> None:
        """Draw ``delta_0`` for a padded batch (a tensor, or one per input of a pair model).

        ``delta_0`` entries are ``U(-1, 1) * m_b`` at real tokens with
        ``m_b = init_mag / sqrt(dim * sum_i L_{i,b})`` (all inputs' real tokens of example
        ``b``), 0 at padding; all zeros when ``init_mag`` is 0.

        Args:
            x: ``[batch, seq_len]`` ids, or a tuple of them (pair models).
            generator: draws ``delta_0`` (on the inputs' device); the trainer passes its own,
                seeded per micro-batch, so the global random stream (dropout) stays that of
                plain training. None: the global generator.
        """
        inputs = x if isinstance(x, tuple) else (x,)
        self.masks = [t != self.pad_id for t in inputs]
        shapes = [(*t.shape, self.dim) for t in inputs]
        device = inputs[0].device
        deltas = [torch.zeros(s, dtype=torch.float32, device=device) for s in shapes]
        if self.init_mag > 0:
            tokens = sum(m.sum(1) for m in self.masks).to(torch.float32)  # [B]
            mag = self.init_mag / torch.sqrt(tokens.clamp(min=1.0) * self.dim)  # [B]
            deltas = [
                d.uniform_(-1.0, 1.0, generator=generator) * m.unsqueeze(-1) * mag.view(-1, 1, 1)
                for d, m in zip(deltas, self.masks, strict=True)
            ]
        self.deltas = [d.requires_grad_() for d in deltas]

    @contextmanager
    def perturb(self) -> Iterator[None]:
        """Within the block, the embedding layer's ``i``-th call returns ``output + deltas[i]``.

        Raises:
            RuntimeError: the model called its embedding layer more often than it has
                inputs, or with ids that are not the batch's inputs (so the perturbation
                would land on the wrong positions).
        """
        self._calls = 0
        handle = self.embedding.register_forward_hook(self._hook)
        try:
            yield
        finally:
            handle.remove()

    def _hook(self, module: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> Any:
        i = self._calls
        self._calls += 1
        if i >= len(self.deltas):
            raise RuntimeError(
                f"FreeLB: the embedding layer ran {i + 1} times in one forward but the model has "
                f"{len(self.deltas)} input(s); get_input_embeddings() must be called once per input"
            )
        ids = inputs[0]
        if ids.shape != self.masks[i].shape or not torch.equal(ids != self.pad_id, self.masks[i]):
            raise RuntimeError(
                f"FreeLB: call {i} of the embedding layer got ids of shape {tuple(ids.shape)} that "
                f"are not model input {i} {tuple(self.masks[i].shape)}; the layer must embed the "
                "inputs themselves, in input order"
            )
        return output + self.deltas[i].to(output.dtype)

    def norms(self, tensors: list[torch.Tensor] | None = None) -> torch.Tensor:
        """Per-example Frobenius norm over all inputs, positions and dims: ``[batch]`` float32."""
        tensors = self.deltas if tensors is None else tensors
        sq = sum(t.detach().float().pow(2).sum(dim=(1, 2)) for t in tensors)
        return torch.sqrt(sq)  # type: ignore[arg-type]

    @torch.no_grad()
    def ascend(self) -> bool:
        """One ascent step on the gradients in ``deltas[i].grad``, then the projection.

        ``delta += lr * g / max(||g||_F, 1e-8)`` per example (g masked to real tokens);
        then, with ``max_norm > 0``, ``delta *= max_norm / ||delta||_F`` where the norm
        exceeds ``max_norm``. A non-finite gradient (an fp16 overflow: the GradScaler
        will skip this update anyway) leaves ``delta`` unchanged.

        Returns:
            False when the gradient was missing or non-finite (no step taken), else True.
        """
        grads = [d.grad for d in self.deltas]
        if any(g is None for g in grads):
            return False
        grads = [g.float() * m.unsqueeze(-1) for g, m in zip(grads, self.masks, strict=True)]
        if not all(bool(torch.isfinite(g).all()) for g in grads):
            self.deltas = [d.detach().requires_grad_() for d in self.deltas]
            return False
        scale = self.lr / self.norms(grads).clamp(min=1e-8)  # [B]
        new = [
            d.detach() + g * scale.view(-1, 1, 1) for d, g in zip(self.deltas, grads, strict=True)
        ]
        if self.max_norm > 0:
            norm = self.norms(new)
            shrink = torch.where(norm > self.max_norm, self.max_norm / norm.clamp(min=1e-12), 1.0)
            new = [d * shrink.view(-1, 1, 1) for d in new]
        self.deltas = [d.requires_grad_() for d in new]
        return True

    def bound_ok(self, atol: float = 1e-6) -> bool:
        """True when every example's ``||delta||_F <= max_norm + atol`` (always with no bound)."""
        return self.max_norm <= 0 or bool((self.norms() <= self.max_norm + atol).all())

    def __repr__(self) -> str:
        return (
            f"FreeLB(steps={self.steps}, lr={self.lr}, init_mag={self.init_mag}, "
            f"max_norm={self.max_norm}, dim={self.dim})"
        )


def init_bound(init_mag: float, tokens: int, dim: int) -> float:
    """Largest ``|delta_0|`` entry for an example of ``tokens`` real tokens: ``init_mag / sqrt(tokens * dim)``."""
    return init_mag / math.sqrt(tokens * dim)
