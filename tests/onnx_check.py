"""An export check independent of export's own parity report: the ONNX graph on
onnxruntime against the eager checkpoint, both loaded the way ``xdpx serve`` loads them,
on real texts that export's parity sample did not choose."""

from __future__ import annotations

import numpy as np

from xdpx.serving.server import ServedModel


def onnx_vs_eager(
    export_dir: str, run: str, texts: list[str], texts2: list[str] | None = None
) -> float:
    """The largest absolute difference of the class probabilities of ``texts`` (and
    ``texts2`` for a pair model) between ``export_dir``'s ONNX graph and ``run``'s best
    checkpoint run eagerly; asserts that both predict the same classes."""
    onnx, eager = ServedModel(export_dir, "onnx"), ServedModel(run, "eager")
    assert onnx.backend == "onnx" and eager.backend == "eager"
    a = onnx.probs(onnx.encode(texts, texts2))
    b = eager.probs(eager.encode(texts, texts2))
    assert a.shape == b.shape == (len(texts), len(eager.labels))
    assert (a.argmax(1) == b.argmax(1)).all()
    return float(np.abs(a - b).max())
