"""A probability-averaging ensemble served as one model: its members' exports side by side
in one directory, their class probabilities averaged with weights chosen on dev.

An ensemble directory (written by :func:`xdpx.ensemble.build_ensemble`, ``xdpx ensemble``):

- ``members/<k>-<name>/``: member ``k``'s export directory (``model.onnx`` or the int8
  graph, ``report.json``, the encoder's files), copied whole;
- ``ensemble.json`` (written last: it marks a complete ensemble): ``labels`` (the
  ensemble's class order), ``pair``, and per member ``dir``, ``name``, ``kind``,
  ``onnx_file`` and ``weight`` (the weights sum to 1); for a cascade also ``cascade``:
  ``{"threshold": t}`` (see below);
- ``report.json``, ``confusion.png``: how it was chosen and how it scores.

:class:`EnsembleModel` has the surface of :class:`~xdpx.serving.runtime.ServedModel` that the
server, the REPL and the benches use (``encode``, ``probs``, ``labels``, ``pair``, ``name``,
``kind``, ``backend``, ``source``, ``max_padding``, ``control_chars``), so ``xdpx serve
--http ENSEMBLE_DIR`` serves it like any run. Each text is encoded by every member's own
tokenizer; a batch of texts is one call of every member's graph (each cut into chunks of
similar length by its own :meth:`ServedModel.probs`), and its probabilities are
``sum_k w_k * p_k`` with every member's classes reordered to the ensemble's. Like
:mod:`xdpx.serving.runtime`, importing this module imports no torch.

A **cascade** (``xdpx ensemble --cascade``; Viola & Jones 2001's cascade of classifiers,
for text models Wang et al. 2022, "Wisdom of Committees: An Overlooked Approach to Faster
and More Accurate Models", ICLR) answers with member 0 alone (the fast one, e.g. the
n-gram) wherever its top class probability is ``>= threshold``, and sends only the other
texts to the rest of the members, answering those with the weighted average of all of them
(:func:`cascade_probs`). The threshold is chosen on dev under a budget of deferred texts
(:func:`xdpx.ensemble.choose_threshold`), so the slow members see a bounded share of the
traffic: served throughput is about ``1 / (1 / R_0 + d / R_1)`` for a deferred share ``d``
and members' rates ``R_0``, ``R_1``. A cascade's members other than member 0 encode only
the deferred texts.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from xdpx import io
from xdpx.serving.runtime import ServedModel, split_line

__all__ = [
    "ENSEMBLE_FILE",
    "EnsembleModel",
    "cascade_probs",
    "deferred_mask",
    "run_cascade",
    "is_ensemble",
    "load_served",
    "weighted_probs",
]

#: The file that marks (and describes) an ensemble directory.
ENSEMBLE_FILE = "ensemble.json"


def is_ensemble(path: str) -> bool:
    """True when ``path`` is an ensemble directory (it holds :data:`ENSEMBLE_FILE`)."""
    return io.exists(io.join(str(path).rstrip("/"), ENSEMBLE_FILE))


def weighted_probs(
    member_probs: Sequence[np.ndarray],
    weights: Sequence[float],
    orders: Sequence[Sequence[int]] | None = None,
) -> np.ndarray:
    """The ensemble's probabilities: ``sum_k weights[k] * member_probs[k][:, orders[k]]``.

    Args:
        member_probs: per member ``[n, num_labels]`` probabilities, in the member's own
            class order.
        weights: per member, ``>= 0``, summing to 1 (Caruana et al. 2004's ensemble
            selection gives such weights; :func:`xdpx.ensemble.choose_weights`).
        orders: per member, ``orders[k][j]`` is the column of the ensemble's class ``j`` in
            member ``k``'s probabilities; None: every member has the ensemble's order.

    Returns:
        ``[n, num_labels]`` float64; rows sum to 1 when the members' rows do.

    Raises:
        ValueError: the members' shapes differ, or the weights are not a distribution.
    """
    if len(member_probs) != len(weights) or not member_probs:
        raise ValueError(f"{len(member_probs)} members' probabilities but {len(weights)} weights")
    w = np.asarray(weights, np.float64)
    if (w < 0).any() or abs(w.sum() - 1.0) > 1e-6:
        raise ValueError(f"ensemble weights must be >= 0 and sum to 1, got {w.tolist()}")
    out = None
    for k, (p, wk) in enumerate(zip(member_probs, w, strict=True)):
        p = np.asarray(p, np.float64)
        if orders is not None:
            p = p[:, list(orders[k])]
        if out is not None and p.shape != out.shape:
            raise ValueError(f"member {k}'s probabilities are {p.shape}, member 0's {out.shape}")
        out = wk * p if out is None else out + wk * p
    return out


def deferred_mask(first: np.ndarray, threshold: float) -> np.ndarray:
    """``[n]`` bool: the rows a cascade defers, those whose top class probability in
    ``first`` (``[n, num_labels]``, member 0's probabilities) is below ``threshold``."""
    return np.asarray(first).max(axis=1) < threshold


def cascade_probs(
    first: np.ndarray, rest: Sequence[np.ndarray], weights: Sequence[float], threshold: float
) -> np.ndarray:
    """A cascade's probabilities: ``first``'s row where :func:`deferred_mask` is False, else
    the weighted average (:func:`weighted_probs`) of ``first`` and ``rest`` on that row.

    Args:
        first: ``[n, num_labels]`` member 0's probabilities, in the ensemble's class order.
        rest: per other member ``[m, num_labels]``, in the ensemble's class order, of the
            ``m`` deferred rows only (in their order in ``first``).
        weights: all members' weights (member 0 first), summing to 1.
        threshold: the cascade's confidence threshold (0: defer nothing; above 1: defer all).

    Returns:
        ``[n, num_labels]`` float64.

    Raises:
        ValueError: a member of ``rest`` has not one row per deferred row.
    """
    first = np.asarray(first, np.float64)
    mask = deferred_mask(first, threshold)
    out = first.copy()
    m = int(mask.sum())
    for k, p in enumerate(rest):
        if len(p) != m:
            raise ValueError(f"member {k + 1} has {len(p)} rows for {m} deferred ones")
    if m:
        out[mask] = weighted_probs([first[mask], *rest], weights)
    return out


def run_cascade(
    first: np.ndarray,
    members: Sequence[ServedModel],
    orders: Sequence[Sequence[int]],
    weights: Sequence[float],
    threshold: float,
    texts: Sequence[str],
    texts2: Sequence[str] | None,
) -> tuple[np.ndarray, int]:
    """A cascade's answers given member 0's: the deferred texts (:func:`deferred_mask`) are
    encoded and scored by the other members, in one call each, and combined by
    :func:`cascade_probs`.

    Args:
        first: ``[n, num_labels]`` member 0's probabilities of ``texts``, in the ensemble's
            class order.
        members: every member (member 0 first; it is not run again).
        orders: per member, its class columns in the ensemble's order (:func:`label_orders`).
        weights, threshold: as :func:`cascade_probs`.
        texts, texts2: the ``n`` raw texts (and second texts of a pair task, else None).

    Returns:
        ``([n, num_labels]`` float64 probabilities, the number of texts deferred).
    """
    idx = np.flatnonzero(deferred_mask(first, threshold))
    rest = []
    if len(idx):
        sub = [texts[i] for i in idx]
        sub2 = [texts2[i] for i in idx] if texts2 is not None else None
        for k in range(1, len(members)):
            m = members[k]
            rest.append(m.probs(m.encode(sub, sub2))[:, list(orders[k])])
    return cascade_probs(first, rest, weights, threshold), len(idx)


def label_orders(
    labels: Sequence[str], member_labels: Sequence[Sequence[str]], where: Sequence[str]
) -> list[list[int]]:
    """Per member, the column of each of ``labels`` in that member's class order.

    Raises:
        ValueError: a member's classes are not ``labels`` (naming the member ``where[k]``).
    """
    orders = []
    for k, theirs in enumerate(member_labels):
        if sorted(theirs) != sorted(labels):
            raise ValueError(
                f"{where[k]} has classes {list(theirs)}, {where[0]} has {list(labels)}: an "
                "ensemble's members must be trained on the same labels (the same prepared raw data)"
            )
        orders.append([list(theirs).index(lab) for lab in labels])
    return orders


class EnsembleModel:
    """An ensemble directory loaded for serving (see the module docstring).

    Args:
        path: the ensemble directory (local path or fsspec URL).
        threads: onnxruntime intra-op threads of every member's session (None: default).

    Attributes:
        members: the members' :class:`ServedModel` (ONNX backend), in ``ensemble.json``'s
            order; weights: their weights; orders: each member's class columns in the
            ensemble's order (:func:`label_orders`).
        threshold: a cascade's confidence threshold (None: a plain average);
        seen, deferred: texts scored, and of them deferred to the other members (a cascade).
        name, labels, pair, kind (``"ensemble"``), backend (``"onnx"``), source,
        max_padding (the smallest of the members'), control_chars (member 0's).

    Raises:
        FileNotFoundError: no ``ensemble.json``, or a member's export is missing.
        ValueError: the members disagree on the task (pairs or not) or on the classes.
    """

    kind = "ensemble"
    backend = "onnx"

    def __init__(self, path: str, threads: int | None = None) -> None:
        path = str(path).rstrip("/")
        spec_path = io.join(path, ENSEMBLE_FILE)
        if not io.exists(spec_path):
            raise FileNotFoundError(f"{spec_path} not found: not an ensemble directory (xdpx ensemble writes one)")  # fmt: skip
        spec: dict[str, Any] = json.loads(io.read_text(spec_path))
        self.spec = spec
        self.name = path.rsplit("/", 1)[-1] or "ensemble"
        self.source = path
        self.members = [
            # the members share the cores: no thread spinning (ort_session)
            ServedModel(
                io.join(path, m["dir"]),
                "onnx",
                threads,
                m.get("onnx_file", "model.onnx"),
                spinning=False,
            )
            for m in spec["members"]
        ]
        self.weights = [float(m["weight"]) for m in spec["members"]]
        self.labels: list[str] = list(spec["labels"])
        where = [io.join(path, m["dir"]) for m in spec["members"]]
        self.orders = label_orders(self.labels, [m.labels for m in self.members], where)
        pairs = {m.pair for m in self.members}
        if len(pairs) != 1:
            raise ValueError(f"{path}: some members take text pairs and some single texts")
        self.pair = pairs.pop()
        self.control_chars = self.members[0].control_chars
        self._max_padding = min(m.max_padding for m in self.members)
        cascade = spec.get("cascade")
        self.threshold: float | None = float(cascade["threshold"]) if cascade else None
        self.seen = self.deferred = 0
        self._counting = threading.Lock()  # the server's model instances count at once

    @property
    def max_padding(self) -> float:
        """The members' length-chunking tolerance (setting it sets every member's)."""
        return self._max_padding

    @max_padding.setter
    def max_padding(self, value: float) -> None:
        self._max_padding = value
        for m in self.members:
            m.max_padding = value

    def encode(self, texts: Sequence[str], texts2: Sequence[str] | None = None) -> list[tuple]:
        """One sample per text: the tuple of every member's sample (its own token ids); a
        cascade's: member 0's sample and the raw ``(text, text2)``, which the other members
        encode in :meth:`probs` only when the text is deferred."""
        if self.threshold is not None:
            first = self.members[0].encode(texts, texts2)
            raw = texts2 if texts2 is not None else [None] * len(texts)
            return list(zip(first, texts, raw, strict=True))
        per_member = [m.encode(texts, texts2) for m in self.members]
        return list(zip(*per_member, strict=True))

    def split(self, line: str, where: str = "<stdin>") -> tuple[str, str | None]:
        """One REPL line -> (text, text2) (:func:`xdpx.serving.runtime.split_line`)."""
        return split_line(line, self.pair, where)

    def predict(self, texts: Sequence[str], texts2: Sequence[str] | None = None) -> np.ndarray:
        """``[n, num_labels]`` probabilities of raw texts (the REPL's call)."""
        return self.probs(self.encode(texts, texts2))

    def probs(self, samples: Sequence[tuple]) -> np.ndarray:
        """``[n, num_labels]`` float64: the weighted average of the members' probabilities
        (:func:`weighted_probs`) of :meth:`encode`'s samples, in order (``ensemble.json``
        holds only members of weight > 0: :func:`xdpx.ensemble.build_ensemble` leaves the
        others out)."""
        if not samples:
            return np.zeros((0, len(self.labels)))
        if self.threshold is not None:
            return self._cascade(samples)
        parts = [m.probs([s[k] for s in samples]) for k, m in enumerate(self.members)]
        return weighted_probs(parts, self.weights, self.orders)

    def _cascade(self, samples: Sequence[tuple]) -> np.ndarray:
        """A cascade's :meth:`probs` (:func:`run_cascade`): member 0 on every sample, the
        others on the deferred ones."""
        first = self.members[0].probs([s[0] for s in samples])[:, self.orders[0]]
        texts = [s[1] for s in samples]
        texts2 = [s[2] for s in samples] if self.pair else None
        probs, deferred = run_cascade(first, self.members, self.orders, self.weights, self.threshold, texts, texts2)  # fmt: skip
        with self._counting:
            self.seen += len(samples)
            self.deferred += deferred
        return probs


def load_served(run: str, backend: str = "auto", threads: int | None = None, onnx_file: str = "model.onnx") -> Any:  # fmt: skip
    """The served model of ``run``: an :class:`EnsembleModel` for an ensemble directory,
    else a :class:`ServedModel` (``backend`` and ``onnx_file`` as there; an ensemble's
    members name their own graphs).

    Raises:
        ValueError: ``backend="eager"`` for an ensemble (it serves its members' exports).
    """
    if is_ensemble(run):
        if backend == "eager":
            raise ValueError(f"{run} is an ensemble: it serves its members' ONNX exports (--backend onnx or auto)")  # fmt: skip
        return EnsembleModel(run, threads)
    return ServedModel(run, backend, threads, onnx_file)
