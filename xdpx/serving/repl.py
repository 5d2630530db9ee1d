"""Interactive serving: a text (or a tab-separated pair) per line in, label and probabilities out.

Preprocessing is the checkpoint's own (tokenizer, vocab, ``lower``, ``max_len``
from its ``meta.json``), exactly as ``predict`` applies it, so a line gives
the same label and probabilities in both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

import numpy as np

from xdpx import io
from xdpx.checkpoint import load_checkpoint
from xdpx.data import Encoder
from xdpx.inference import as_samples, format_probs, predict_probs
from xdpx.rundir import RunDir
from xdpx.serving.runtime import refuse_regression, split_line

__all__ = ["Predictor", "serve_lines", "refuse_regression"]


class Predictor:
    """A loaded checkpoint plus its encoder.

    Args:
        checkpoint: a checkpoint dir, an alias ``<run>/<best>``/``<run>/<last>``,
            or a run dir (its ``<best>`` is used).

    Raises:
        CheckpointError: the path does not resolve to a complete checkpoint.
    """

    def __init__(self, checkpoint: str) -> None:
        run = RunDir(checkpoint)
        if not io.exists(io.join(checkpoint, "model.safetensors")) and io.exists(run.best):
            checkpoint = run.best_alias
        self.ckpt = load_checkpoint(checkpoint)
        self.encoder = Encoder.from_dir(self.ckpt.path)
        refuse_regression(self.encoder, self.ckpt.path)
        self.pair = self.encoder.pair

    @property
    def labels(self) -> list[str]:
        """Class names in logit order."""
        return self.encoder.labels

    def split(self, line: str, where: str = "<stdin>") -> tuple[str, str | None]:
        """One input line -> (text, text2) (:func:`xdpx.serving.runtime.split_line`)."""
        return split_line(line, self.pair, where)

    def predict(self, texts: list[str], texts2: list[str] | None = None) -> np.ndarray:
        """Probabilities ``[n, num_labels]`` (float64) of ``texts`` (and ``texts2``).

        Encoded by the same :meth:`Encoder.encode_inputs` call as ``predict``: a
        separately encoded pair becomes ``(input_ids, input_ids2)``, a joint (hf) one
        a single sequence.
        """
        seqs = as_samples(*self.encoder.encode_inputs(texts, texts2))
        return predict_probs(self.ckpt.model, seqs, 256, self.encoder.pad_id)


def serve_lines(
    predictor: Predictor, lines: Iterable[str], out: TextIO, prompt: TextIO | None = None
) -> int:
    """Answer each line with ``label<TAB>prob_1<TAB>...``; empty lines are skipped.

    Args:
        predictor: the loaded model.
        lines: input lines (stdin or a batch file).
        out: where answers go (one line each, flushed).
        prompt: if given (an interactive terminal), ``> `` prompts are written there.

    Returns:
        The number of lines answered.
    """
    n = 0
    if prompt is not None:
        prompt.write("> ")
        prompt.flush()
    for i, line in enumerate(lines, 1):
        if line.strip():
            text, text2 = predictor.split(line, f"line {i}")
            p = predictor.predict([text], [text2] if text2 is not None else None)[0]
            out.write("\t".join([predictor.labels[int(p.argmax())], *format_probs(p)]) + "\n")
            out.flush()
            n += 1
        if prompt is not None:
            prompt.write("> ")
            prompt.flush()
    return n
