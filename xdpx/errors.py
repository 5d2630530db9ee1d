"""Errors a training run stops with; importable without torch (``xdpx.stage`` reports them in one line)."""

from __future__ import annotations

__all__ = [
    "DivergenceError",
    "NonFiniteLossError",
    "LossScaleError",
    "PreflightError",
    "RemoteIOError",
]


class DivergenceError(RuntimeError):
    """Training diverged: the loss exceeded ``train.max_loss``, became NaN/Inf, or fp16 overflowed for good."""


class NonFiniteLossError(DivergenceError):
    """The loss or the gradient became NaN/Inf; the message names the first non-finite module."""


class LossScaleError(DivergenceError):
    """fp16: the GradScaler loss scale fell below ``train.min_loss_scale`` (persistent overflow)."""


class RemoteIOError(OSError):
    """A remote read/write (``oss://``, ``s3://``) still failed after xdpx.io's retries.

    The message names the URL and the operation; callers add the stage. Prefect tasks retry
    on this error only (a transient store outage), never on bad input.
    """


class PreflightError(ValueError):
    """``train.preflight_doctor``: a check of ``xdpx doctor``'s training checklist failed
    before training; the message names each failed check, its cause and the fix."""
