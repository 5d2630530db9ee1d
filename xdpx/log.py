"""Scalars from model code into the training logs: ``log.add_summary(name, value)``.

Call it anywhere in a model's ``forward``::

    from xdpx import log

    log.add_summary("gate_mean", gate.mean())

While the Trainer runs a training forward pass, every value is collected;
each ``log_interval`` updates the mean of the values since the last log
lands in ``train.log.tsv`` (column ``name``) and in DVCLive as
``train/<name>`` (so in ``dvc plots``). Outside training (evaluation,
inference, export) the call does nothing, so models need no flag.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["add_summary", "collecting"]

_sink: dict[str, list[float]] | None = None


def add_summary(name: str, value: Any) -> None:
    """Record scalar ``value`` (float, or a one-element tensor) under ``name``; no-op outside training.

    Raises:
        ValueError: ``value`` is not a scalar.
    """
    if _sink is None:
        return
    if hasattr(value, "detach"):
        if value.numel() != 1:
            raise ValueError(
                f"add_summary({name!r}): expected a scalar, got shape {tuple(value.shape)}"
            )
        value = value.detach().float().item()
    _sink.setdefault(name, []).append(float(value))


@contextmanager
def collecting(sink: dict[str, list[float]]) -> Iterator[dict[str, list[float]]]:
    """Collect ``add_summary`` calls made inside the block into ``sink`` (name -> values)."""
    global _sink
    previous, _sink = _sink, sink
    try:
        yield sink
    finally:
        _sink = previous
