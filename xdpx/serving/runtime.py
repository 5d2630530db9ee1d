"""The serving runtime: an exported model (``model.onnx`` + ``report.json`` + the encoder's
files) loaded and answering raw texts with onnxruntime, the run's own tokenizer and numpy.

Importing this module imports neither torch nor :mod:`xdpx.models` (a test checks
``sys.modules``): a machine that only serves needs ``pip install 'xdpx[serve]'`` and an
export directory. :class:`ServedModel` with ``backend="eager"`` (a checkpoint with no
export) is the optional backend that imports torch and the model code, when asked for.
The HTTP layer (FastAPI, the V2 bodies, the dynamic batcher) is :mod:`xdpx.serving.server`,
on top of this module.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort

from xdpx import io
from xdpx.batching import Sample, as_samples, length_chunks, pad_ids, probs_from_logits
from xdpx.config import HF_MODELS
from xdpx.data import DataError, Encoder
from xdpx.data.shards import sample_lengths

log = logging.getLogger("xdpx.serving.server")

__all__ = [
    "ENCODER_MAX_PADDING",
    "OUTPUT_NAME",
    "ServedModel",
    "find_export",
    "ort_logits",
    "ort_session",
    "refuse_regression",
    "split_line",
]

#: The ONNX graph's output (``xdpx.serving.export`` names it).
OUTPUT_NAME = "logits"


def refuse_regression(encoder: Encoder, path: str) -> None:
    """Serving answers with labels and probabilities: a regression model (``prepro.label_type:
    score``) is refused, naming the stage that scores it.

    Raises:
        ValueError: ``encoder`` is a regression model's.
    """
    if encoder.label_type == "score":
        raise ValueError(
            f"{path} is a regression model (prepro.label_type=score): xdpx serve answers with "
            "labels and probabilities; score texts with the predict stage (a score column)"
        )


def find_export(run: str, onnx_file: str = "model.onnx") -> str | None:
    """The export directory of ``run``: ``run`` itself when it holds ``onnx_file`` and
    ``report.json`` (an export directory), else ``run/export`` when that does (a run
    directory); None when neither does."""
    run = str(run).rstrip("/")
    for d in (run, io.join(run, "export")):
        if io.exists(io.join(d, onnx_file)) and io.exists(io.join(d, "report.json")):
            return d
    return None


def split_line(line: str, pair: bool, where: str = "<stdin>") -> tuple[str, str | None]:
    """One REPL / batch-file line -> ``(text, text2)``; a pair model needs ``text1<TAB>text2``.

    Raises:
        DataError: empty line, or a pair model given no tab (names ``where``).
    """
    line = line.rstrip("\r\n")
    if not line.strip():
        raise DataError(f"{where}: empty text")
    if not pair:
        return line.strip(), None
    parts = line.split("\t")
    if len(parts) != 2:
        raise DataError(f"{where}: a pair model needs 'text1<TAB>text2', got {len(parts)} field(s)")
    return parts[0].strip(), parts[1].strip()


def ort_session(
    path: str, threads: int | None = None, spinning: bool = True
) -> ort.InferenceSession:
    """An onnxruntime CPU session of an ONNX file read through :mod:`xdpx.io`.

    Args:
        path: ``.onnx`` file (local path or fsspec URL).
        threads: intra-op threads; ``None`` keeps onnxruntime's default.
        spinning: onnxruntime's ``session.intra_op.allow_spinning`` (its default, on): the
            pool's threads busy-wait after each run for the next one. Off for sessions that
            take turns on the same cores (an ensemble's members): a member's spinning threads
            took CPU from the member running (STS-B's n-gram -> MiniLM int8 cascade, batches of
            32 on 2 cores: 30% less CPU and ~6% more pairs/s with it off).
    """
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(
        io.read_bytes(path), sess_options=options, providers=["CPUExecutionProvider"]
    )


def ort_logits(session: ort.InferenceSession, names: Sequence[str], x: Any) -> np.ndarray:
    """``[batch, num_labels]`` float32 logits of one padded batch on onnxruntime.

    Args:
        session: an :func:`ort_session`; names: the graph's input names, in order
            (``xdpx.models.input_names``); x: ``[batch, seq_len]`` int64 (a tuple of them,
            one per input, for a pair model): numpy arrays (:func:`xdpx.batching.pad_ids`) or
            CPU torch tensors (:func:`xdpx.inference.pad_batch`), read through ``np.asarray``.
    """
    xs = x if isinstance(x, tuple) else (x,)
    feed = {n: np.asarray(t) for n, t in zip(names, xs, strict=True)}
    return session.run([OUTPUT_NAME], feed)[0]


class ServedModel:
    """A run's model and preprocessing: texts in, probabilities out.

    Args:
        run: a run directory (``models/default``: its ``export/model.onnx`` or ``<best>``),
            an export directory (``model.onnx`` + ``report.json``), or a checkpoint dir.
        backend: ``auto`` (onnxruntime when an export exists, else eager), ``onnx`` or
            ``eager``.
        threads: onnxruntime intra-op / torch threads (None: the library default).
        onnx_file: the graph in the export directory (``model.int8.onnx``: the int8 one
            that ``export.quantize: int8`` writes).
        spinning: the onnxruntime session's thread spinning (:func:`ort_session`).

    Attributes:
        name: the model name in V2 URLs (the run directory's base name).
        labels: class names in logit order; pair: the model takes text pairs;
        backend: ``onnx`` or ``eager``; source: the file or directory loaded.
        kind: the model's ``train.model`` (``hf_classifier``, ``ngram_lr``, ...).
        max_padding: :func:`length_chunks`' tolerance for this model:
            :data:`ENCODER_MAX_PADDING` for a transformer encoder, else 0.5.

    Raises:
        FileNotFoundError: ``backend="onnx"`` and no ``model.onnx``; nothing to load.
        CheckpointError: the checkpoint is incomplete.
    """

    def __init__(
        self,
        run: str,
        backend: str = "auto",
        threads: int | None = None,
        onnx_file: str = "model.onnx",
        spinning: bool = True,
    ) -> None:
        run = run.rstrip("/")
        found = find_export(run, onnx_file)
        export_dir = found or io.join(run, "export")
        onnx_path = io.join(export_dir, onnx_file)
        has_onnx = found is not None
        if backend == "onnx" and not has_onnx:
            raise FileNotFoundError(
                f"{onnx_path} (with report.json) not found: run the export stage "
                f"(xdpx export export.checkpoint={run}/<best>) or serve with --backend eager"
            )
        self.name = run.rsplit("/", 1)[-1] or "model"
        # the eager backend runs one call at a time (PyTorch's one thread pool a process);
        # an onnxruntime session takes concurrent runs (the server's model instances)
        self._lock: Any = contextlib.nullcontext()
        self._encode_lock = threading.Lock()  # the encoders keep caches (new characters, ...)
        if backend in ("auto", "onnx") and has_onnx:
            import json

            report = json.loads(io.read_text(io.join(export_dir, "report.json")))
            self.session = ort_session(onnx_path, threads, spinning)
            self.kind = str(report.get("model", ""))
            self.input_names = tuple(report["input_names"])
            self.min_len = int(report.get("min_len", 1))
            self.encoder = Encoder.from_dir(export_dir)
            refuse_regression(self.encoder, export_dir)
            self.backend, self.source, self.model = "onnx", onnx_path, None
            if self.name == "export":
                self.name = run.rsplit("/", 2)[-2] if "/" in run else "model"
        else:  # the REPL's loader: a run dir means its <best>
            import torch

            from xdpx.serving.repl import Predictor  # the eager backend: torch and xdpx.models

            if threads:
                torch.set_num_threads(threads)
            predictor = Predictor(run)
            self.model, self.encoder = predictor.ckpt.model, predictor.encoder
            self.min_len = self.model.min_len
            self.backend, self.source, self.session = "eager", predictor.ckpt.path, None
            self._lock = threading.Lock()
            self.kind = predictor.ckpt.name
        self.max_padding = ENCODER_MAX_PADDING if self.kind in HF_MODELS else 0.5
        self.pad_id = self.encoder.pad_id
        self.labels: list[str] = list(self.encoder.labels)
        self.pair = self.encoder.pair
        meta = self.encoder.meta
        #: ``prepro.control_chars`` of the run's data: requests are cleaned as prepro cleaned
        #: its lines (:func:`xdpx.data.readers.clean_text`)
        self.control_chars: str = str((meta.prepro.get("control_chars") if meta is not None else None) or "strip_warn")  # fmt: skip
        log.info("serving %s (%s, %s) from %s", self.name, self.backend, "pairs" if self.pair else "texts", self.source)  # fmt: skip

    def encode(self, texts: Sequence[str], texts2: Sequence[str] | None = None) -> list[Sample]:
        """Token ids of raw texts, as prepro stores them (truncated at ``max_len``); one
        call at a time (safe from the server's model instances)."""
        with self._encode_lock:
            return as_samples(*self.encoder.encode_inputs(texts, texts2))

    def probs(self, samples: Sequence[Sample]) -> np.ndarray:
        """``[n, num_labels]`` float64 softmax probabilities of ``samples``, in order.

        The samples are sorted by length and cut into chunks of similar length
        (:func:`length_chunks`, at most :attr:`max_padding` padding), each padded to its
        own longest text (each input of a pair to its own) and run as one model call: one
        long review no longer pads a whole batch of short ones to its width (the n-gram
        graph's cost grows with the padded width, a transformer's with every padded token).
        The models are padding-invariant, so the numbers do not depend on it.
        """
        lengths = sample_lengths(samples).tolist()
        out: list[np.ndarray] = [None] * len(samples)  # type: ignore[list-item]
        for chunk in length_chunks(lengths, self.max_padding):
            logits = self._logits([samples[i] for i in chunk])
            for i, row in zip(chunk, probs_from_logits(logits), strict=True):
                out[i] = row
        return np.stack(out)

    def _logits(self, samples: Sequence[Sample]) -> np.ndarray:
        """One model call: ``[n, num_labels]`` float32 logits of ``samples``."""
        x = pad_ids(samples, self.pad_id, self.min_len)
        with self._lock:
            if self.session is not None:
                return ort_logits(self.session, self.input_names, x)
            import torch

            from xdpx.inference import call_model

            with torch.inference_mode():
                xt = tuple(torch.from_numpy(t) for t in x) if isinstance(x, tuple) else torch.from_numpy(x)  # fmt: skip
                return call_model(self.model, xt).float().numpy()


#: :func:`length_chunks`' padding tolerance for transformer encoders (``hf_classifier``).
#: Their cost per token is flat in the batch size on CPU (onnxruntime, MiniLM-L6, 48 tokens:
#: the same ms per text at batch 1 and 16), so a padded token costs as much as a real one
#: and a call more costs almost nothing; 0.5 (the n-gram models' setting) made a batch of 64
#: dev texts 1.40x their real tokens, 0.1 makes it 1.05x in 10 calls. Server CPU per request
#: at concurrency 64 (MiniLM-L6 fp32, ``bench/serve_encoder.py``'s clients, a shared
#: machine, medians of 3 alternating runs): 0.5: 40.9 ms vs 0.1: 35.5; then 0.25: 35.4,
#: 0: 38.0 (40 calls of 1.6 texts) vs 0.1: 32.6.
ENCODER_MAX_PADDING = 0.1
