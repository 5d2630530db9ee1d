"""What the trainer runs when something looks wrong, or when asked to look closer.

* :func:`check_update`: a NaN/Inf loss or gradient norm, or a loss above ``max_loss``,
  stops training with a message naming the update, the epoch and, for NaN/Inf, the first
  module whose output (or parameter gradient) went non-finite (:func:`find_nonfinite`,
  re-running the update's micro-batches with hooks).
* :func:`check_loss_scale`: fp16 loss scale below ``min_loss_scale`` (gradients overflow at
  every scale).
* :func:`group_grad_norms`: per-module gradient norms for ``grad.log.tsv`` (``inspect_grad``).
* :func:`start_profiler`: a torch.profiler trace of ``profile_steps`` updates (``profile``).
"""

from __future__ import annotations

import logging
import math
import tempfile
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xdpx import io
from xdpx.errors import DivergenceError, LossScaleError, NonFiniteLossError
from xdpx.inference import Batch, call_model
from xdpx.rundir import RunDir

log = logging.getLogger("xdpx.train.trainer")


def _has_nonfinite(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_floating_point() and not bool(torch.isfinite(value).all())
    if isinstance(value, (tuple, list)):
        return any(_has_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_has_nonfinite(v) for v in value.values())
    return False


def find_nonfinite(
    model: nn.Module,
    x: Batch,
    y: torch.Tensor,
    autocast: Any = nullcontext,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> str:
    """Re-run one micro-batch with hooks and name where NaN/Inf first appears.

    Forward hooks on every module (enabled only for this re-run) record the
    first module, in execution order, whose output holds NaN/Inf (a child
    finishes before its parent, so this is the innermost culprit). If every
    output is finite, gradient hooks on the parameters record the first
    parameter, in backward order, whose gradient is non-finite. Gradients are
    cleared afterwards.

    Args:
        model: the (unwrapped) model, in the mode the failing update used.
        x: ``[batch, seq_len]`` input ids, or a tuple of them for a pair model
            (called as ``model(*x)``); y: ``[batch]`` labels.
        autocast: zero-argument callable returning the autocast context used in training.
        loss_fn: ``loss_fn(logits, y)``, the training objective's loss (None: summed
            cross-entropy).

    Returns:
        A phrase such as ``"output of module 'convs.1' (Conv1d)"``.
    """
    names = {m: (n or "<model>") for n, m in model.named_modules()}
    found: list[str] = []

    def forward_hook(module: nn.Module, _inputs: Any, output: Any) -> None:
        if not found and _has_nonfinite(output):
            found.append(f"output of module {names[module]!r} ({type(module).__name__})")

    handles = [m.register_forward_hook(forward_hook) for m in model.modules()]
    try:
        model.zero_grad(set_to_none=True)
        with autocast():
            logits = call_model(model, x)
        if loss_fn is None:
            loss = F.cross_entropy(logits.float(), y, reduction="sum")
        else:
            loss = loss_fn(logits, y)
    finally:
        for h in handles:
            h.remove()
    if found:
        return found[0]
    if not torch.isfinite(loss):
        return "the loss itself (every module output was finite)"
    if not loss.requires_grad:  # detached from every parameter: no gradient to look at
        return "nothing on re-run (every output finite; the loss has no gradient)"
    grads: list[str] = []
    param_handles = [
        p.register_hook(
            lambda g, n=name: grads.append(n) if not grads and not torch.isfinite(g).all() else None
        )
        for name, p in model.named_parameters()
        if p.requires_grad
    ]
    try:
        loss.backward()
    finally:
        for h in param_handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    if grads:
        module = grads[0].rpartition(".")[0] or "<model>"
        return f"gradient of parameter {grads[0]!r} (module {module!r})"
    return "nothing on re-run (the non-finite value was not reproduced)"


def check_update(
    loss: float,
    grad_norm: float,
    update: int,
    epoch: int,
    max_loss: float | None,
    fp16: bool,
    diagnose: Callable[[], str],
) -> None:
    """Stop on a non-finite loss/gradient norm (fp16: the scaler handles inf gradients) or a
    loss above ``max_loss``; ``diagnose()`` names where NaN/Inf first appears.

    Raises:
        NonFiniteLossError: the loss or (fp32/bf16) the gradient norm is NaN/Inf.
        DivergenceError: ``loss > max_loss``.
    """
    if not math.isfinite(loss) or (not math.isfinite(grad_norm) and not fp16):
        what = "loss" if not math.isfinite(loss) else "gradient norm"
        raise NonFiniteLossError(
            f"non-finite {what} at update {update} (epoch {epoch}, loss={loss}, "
            f"grad_norm={grad_norm}); first non-finite value: {diagnose()}. "
            "Try a lower learning_rate, clip_norm, warmup_steps or precision=fp32"
        )
    if max_loss is not None and loss > max_loss:
        raise DivergenceError(
            f"loss {loss:.4g} > max_loss {max_loss} at update {update} "
            f"(epoch {epoch}); try a lower learning_rate or more warmup_steps"
        )


def check_loss_scale(scale: float, min_loss_scale: float, update: int) -> None:
    """Raise ``LossScaleError`` when the fp16 loss scale fell below ``min_loss_scale``."""
    if scale < min_loss_scale:
        raise LossScaleError(
            f"fp16 loss scale fell to {scale:g} < min_loss_scale "
            f"{min_loss_scale:g} at update {update}: gradients overflow "
            "at every scale; try precision=bf16, a lower learning_rate or clip_norm"
        )


def group_grad_norms(model: nn.Module) -> dict[str, float]:
    """L2 norm of the gradients of each top-level child module (``grad_norm/<name>``)."""
    out: dict[str, float] = {}
    for name, child in model.named_children():
        grads = [p.grad.detach().float() for p in child.parameters() if p.grad is not None]
        if grads:
            out[f"grad_norm/{name}"] = float(
                torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
            )
    own = [p.grad.detach().float() for p in model.parameters(recurse=False) if p.grad is not None]
    if own:
        out["grad_norm/<model>"] = float(
            torch.linalg.vector_norm(torch.stack([g.norm() for g in own]))
        )
    return out


def start_profiler(run: RunDir, steps: int, cuda: bool) -> Any:
    """Start a torch.profiler over ``steps`` updates after 1 wait + 1 warmup update; its
    trace and summary table go to ``<save_dir>/profile/``. Call ``.step()`` per update."""
    from torch.profiler import ProfilerActivity, profile, schedule

    def write_trace(prof: Any) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            trace = f"{tmp}/trace.json"
            prof.export_chrome_trace(trace)
            io.write_bytes(io.join(run.profile, "trace.json"), open(trace, "rb").read())
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
        io.write_text(io.join(run.profile, "summary.txt"), table + "\n")
        log.info("profile: trace of %d updates in %s", steps, run.profile)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(
        activities=activities,
        schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
        on_trace_ready=write_trace,
    )
    prof.start()
    return prof
