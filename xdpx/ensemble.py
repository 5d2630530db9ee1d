"""``xdpx ensemble``: a probability-averaging ensemble of trained runs, its weights chosen on
dev, evaluated like a model and written as one servable directory.

The procedure (:func:`build_ensemble`):

1. every member is an export directory (``xdpx export``'s ``model.onnx`` + ``report.json``;
   a run directory means its ``export/``), loaded on onnxruntime
   (:class:`~xdpx.serving.runtime.ServedModel`). The members must be trained on the same
   classes; each reads the raw texts with its own tokenizer;
2. the raw dev (and test) file is read with member 0's prepro settings (format, columns,
   ``control_chars``); by default the files that member 0's prepro read
   (``data_source`` / ``data_files``);
3. every member's probabilities of every dev text;
4. the weights (:func:`choose_weights`): for two members, every ``w`` on a grid of
   ``step`` (``w * p_1 + (1 - w) * p_2``); for more, Caruana et al. 2004's ensemble selection
   ("Ensemble Selection from Libraries of Models", ICML: greedy forward selection with
   replacement from the best single model, ``round(1 / step)`` rounds, the best ensemble of
   the nested sequence kept; AutoGluon's weighted ensemble does the same). The criterion is
   the dev ``metric``, ties broken by the lower dev log loss. Every member alone is a
   candidate (weight 1), so the chosen ensemble is never below its best member on dev;
5. dev and test scored like a model (:func:`xdpx.metrics.classification_metrics`), with
   the paired comparison against every member (:func:`xdpx.metrics.paired_comparison`:
   the difference, its paired SE and McNemar's p);
6. the directory (:mod:`xdpx.serving.ensemble`: ``members/``, ``report.json``,
   ``confusion.png``, ``ensemble.json`` last) is written to a temporary sibling and moved
   into place whole (:func:`xdpx.io.replace_dir`); before that, the written ensemble is
   loaded back and its probabilities of 64 dev texts must equal the weighted average of its
   source members' on the same texts (1e-5), or nothing is written. Members of weight 0 are
   listed in the report and not copied.

With ``cascade=MAX_DEFER`` (``xdpx ensemble --cascade``) the directory is a cascade
(:mod:`xdpx.serving.ensemble`): member 0 answers alone where its top probability reaches a
threshold, the weighted average of step 4 answers the rest. After step 4 the threshold is
chosen on dev (:func:`choose_threshold`): of the thresholds that defer at most ``MAX_DEFER``
of the dev texts, the one of the best dev ``metric`` (ties: fewer deferred). The report
holds the deferred share of dev and test and the paired comparison of the cascade against
the full average too. Member 0 is kept even at weight 0 (it answers the texts not deferred).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from xdpx import io
from xdpx.serving.ensemble import (
    ENSEMBLE_FILE,
    EnsembleModel,
    cascade_probs,
    deferred_mask,
    label_orders,
    run_cascade,
    weighted_probs,
)
from xdpx.serving.runtime import ServedModel, find_export

__all__ = [
    "ENSEMBLE_BATCH",
    "build_ensemble",
    "choose_threshold",
    "choose_weights",
    "member_export",
    "model_probs",
]

log = logging.getLogger("xdpx.ensemble")

#: Texts per model call when the members score a file (sorted by length first).
ENSEMBLE_BATCH = 64


def member_export(path: str, onnx_file: str = "model.onnx") -> str:
    """The export directory of a member: ``path`` itself when it holds ``onnx_file`` and
    ``report.json``, else ``path/export``.

    Raises:
        FileNotFoundError: neither has them; the message gives the export command.
    """
    path = str(path).rstrip("/")
    found = find_export(path, onnx_file)
    if found is not None:
        return found
    hint = " export.quantize=int8" if onnx_file != "model.onnx" else ""
    raise FileNotFoundError(
        f"{path}: no {onnx_file} with report.json here or under export/; an ensemble serves its "
        f"members' exports: xdpx export export.checkpoint='{path}/<best>' export.out_dir={path}/export{hint}"
    )


def model_probs(
    model: Any, texts: Sequence[str], texts2: Sequence[str] | None = None, desc: str | None = None
) -> np.ndarray:
    """``[n, num_labels]`` probabilities of ``texts`` by a served model, in the texts' order:
    sorted by length and run :data:`ENSEMBLE_BATCH` texts per call (bounded memory for any
    n), with a progress bar named ``desc``."""
    n = len(texts)
    order = np.argsort([len(t) + (len(texts2[i]) if texts2 is not None else 0) for i, t in enumerate(texts)], kind="stable")  # fmt: skip
    out = np.zeros((n, len(model.labels)))
    for s in tqdm(range(0, n, ENSEMBLE_BATCH), desc=desc, unit="batch", disable=desc is None, leave=False):  # fmt: skip
        idx = order[s : s + ENSEMBLE_BATCH]
        t2 = [texts2[i] for i in idx] if texts2 is not None else None
        out[idx] = model.probs(model.encode([texts[i] for i in idx], t2))
    return out


def _score(y: np.ndarray, probs: np.ndarray, metric: str) -> tuple[float, float]:
    """``(metric, -log loss)`` of ``probs``: the lexicographic key the weights maximise."""
    loss = float(-np.log(np.clip(probs[np.arange(len(y)), y], 1e-12, 1.0)).mean())
    if metric == "accuracy":
        value = float((probs.argmax(1) == y).mean())
    else:
        from xdpx.metrics import classification_metrics

        value = classification_metrics(y, probs)[metric]
    return value, -loss


def choose_weights(
    member_probs: Sequence[np.ndarray], y: np.ndarray, metric: str = "accuracy", step: float = 0.05
) -> tuple[list[float], list[dict[str, Any]]]:
    """The members' weights that maximise ``metric`` on dev (see the module docstring).

    Args:
        member_probs: per member ``[n, num_labels]`` dev probabilities, in one class order.
        y: ``[n]`` int gold classes.
        metric: a higher-is-better :func:`xdpx.metrics.classification_metrics` key.
        step: the grid step of two members' weight (0.05: 21 points); more members:
            ``round(1 / step)`` rounds of greedy selection.

    Returns:
        ``(weights, trace)``: weights summing to 1; ``trace`` lists every candidate tried,
        ``{"weights" (6 decimals), metric, "loss"}``, in the order tried.

    Raises:
        ValueError: no members, or ``step`` not in (0, 1].
    """
    if not member_probs:
        raise ValueError("choose_weights: no members")
    if not 0 < step <= 1:
        raise ValueError(f"step must be in (0, 1], got {step}")
    m = len(member_probs)
    trace: list[dict[str, Any]] = []

    def tried(w: np.ndarray) -> tuple[float, float]:
        key = _score(y, weighted_probs(member_probs, w), metric)
        trace.append({"weights": [round(float(x), 6) for x in w], metric: key[0], "loss": -key[1]})
        return key

    if m == 1:
        tried(np.ones(1))
        return [1.0], trace
    if m == 2:
        k = round(1 / step)
        grid = [np.array([i / k, 1 - i / k]) for i in range(k + 1)]
        keys = [tried(w) for w in grid]
        best = max(range(len(grid)), key=lambda i: keys[i])
        return [float(x) for x in grid[best]], trace
    # Caruana et al. 2004: forward selection with replacement from the best single model
    singles = [tried(np.eye(m)[i]) for i in range(m)]
    counts = np.zeros(m)
    counts[max(range(m), key=lambda i: singles[i])] = 1
    best_w, best_key = counts / counts.sum(), max(singles)
    for _ in range(round(1 / step) - 1):
        keys = []
        for i in range(m):
            c = counts.copy()
            c[i] += 1
            keys.append((tried(c / c.sum()), i))
        key, i = max(keys)
        counts[i] += 1
        if key > best_key:
            best_key, best_w = key, counts / counts.sum()
    return [float(x) for x in best_w], trace


def choose_threshold(
    first: np.ndarray,
    combined: np.ndarray,
    y: np.ndarray,
    max_defer: float,
    metric: str = "accuracy",
) -> tuple[float, list[dict[str, Any]]]:
    """A cascade's confidence threshold, chosen on dev (see the module docstring).

    Deferring the ``k`` texts of lowest top probability in ``first`` answers them with
    ``combined`` and the rest with ``first``; every ``k`` from 0 to ``floor(max_defer * n)``
    at which the threshold can fall (between two distinct confidences) is tried.

    Args:
        first: ``[n, num_labels]`` member 0's dev probabilities (the fast model).
        combined: ``[n, num_labels]`` the full ensemble's dev probabilities.
        y: ``[n]`` int gold classes.
        max_defer: the largest share of dev texts deferred, in [0, 1].
        metric: as :func:`choose_weights`.

    Returns:
        ``(threshold, trace)``: texts with top probability ``< threshold`` are deferred
        (0.0: none); ``trace`` lists ``{"threshold", "deferred" (share), metric, "loss"}``
        per candidate, in order of ``k``.

    Raises:
        ValueError: ``max_defer`` outside [0, 1], or the arrays' lengths differ.
    """
    if not 0 <= max_defer <= 1:
        raise ValueError(f"max_defer must be in [0, 1], got {max_defer}")
    n = len(y)
    if len(first) != n or len(combined) != n:
        raise ValueError(f"{len(first)} and {len(combined)} rows of probabilities for {n} labels")
    conf = np.sort(np.asarray(first).max(axis=1))
    trace: list[dict[str, Any]] = []
    best: tuple | None = None
    for k in range(int(np.floor(max_defer * n + 1e-9)) + 1):
        if 0 < k < n and conf[k - 1] == conf[k]:
            continue  # no threshold defers exactly these k texts
        t = 0.0 if k == 0 else float((conf[k - 1] + conf[k]) / 2) if k < n else 1.0 + 1e-9
        mask = deferred_mask(first, t)
        value, neg_loss = _score(y, cascade_probs(first, [combined[mask]], [0.0, 1.0], t), metric)
        trace.append({"threshold": round(t, 6), "deferred": round(k / n, 6), metric: value, "loss": -neg_loss})  # fmt: skip
        if best is None or value > best[0]:  # ties: the fewer deferred, tried first
            best = (value, t)
    return best[1], trace


def _read_split(model: ServedModel, path: str, labels: list[str]) -> tuple[list[str], list[str] | None, np.ndarray]:  # fmt: skip
    """Texts, second texts and ``[n]`` gold class indices of a raw file, read with
    ``model``'s prepro settings.

    Raises:
        DataError: as :func:`xdpx.data.readers.read_examples`; a label outside ``labels``
            (naming the file and line).
    """
    from xdpx.config import PreproConfig
    from xdpx.data.readers import DataError, read_examples

    meta = model.encoder.meta
    prepro = PreproConfig(**(meta.prepro if meta is not None else {}))
    data = read_examples(path, prepro, require_label=True)
    index = {lab: i for i, lab in enumerate(labels)}
    y = []
    for lab, line in zip(data.labels or [], data.line_numbers, strict=True):
        if lab not in index:
            raise DataError(f"{path}:{line}: label {lab!r} is not one of the models' classes {labels}")  # fmt: skip
        y.append(index[lab])
    if not y:
        raise DataError(f"{path}: no labelled rows")
    return data.texts, data.texts2, np.asarray(y)


def _default_file(model: ServedModel, split: str) -> str | None:
    """``data_source/data_files[split]`` of ``model``'s prepro (None: no such split, or a glob)."""
    meta = model.encoder.meta
    prepro = meta.prepro if meta is not None else {}
    name = (prepro.get("data_files") or {}).get(split)
    if not isinstance(name, str) or any(c in name for c in "*?["):
        return None
    return io.join(str(prepro.get("data_source", "data/raw")), name)


def member_names(paths: Sequence[str]) -> list[str]:
    """The members' names: each run directory's base name (``models/minilm/export`` ->
    ``minilm``), with as many parent directories as it takes to tell them apart
    (``a/run``, ``b/run`` -> ``a-run``, ``b-run``)."""
    parts = []
    for path in paths:
        p = [x for x in str(path).rstrip("/").split("/") if x not in ("", ".")]
        parts.append(p[:-1] if len(p) > 1 and p[-1] == "export" else p or ["member"])
    for depth in range(1, max(len(p) for p in parts) + 1):
        names = ["-".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            return names
    return [f"{k}-{n}" for k, n in enumerate(names)]


def build_ensemble(
    members: Sequence[str],
    out_dir: str,
    dev_file: str | None = None,
    test_file: str | None = None,
    metric: str = "accuracy",
    step: float = 0.05,
    onnx_file: str = "model.onnx",
    threads: int | None = None,
    progress: bool = True,
    on_member: Callable[[str, float], None] | None = None,
    names: Sequence[str] | None = None,
    cascade: float | None = None,
) -> dict[str, Any]:
    """Build, score and write an ensemble of ``members`` (see the module docstring).

    Args:
        members: two or more run or export directories (:func:`member_export`).
        out_dir: the ensemble directory to write (replaced whole when it exists).
        dev_file, test_file: raw labelled files (None: member 0's prepro dev / test file;
            no test file: dev only).
        metric: the dev criterion (``accuracy`` or ``macro_f1``).
        step: :func:`choose_weights`' grid step.
        onnx_file: the members' graph (``model.int8.onnx``: their int8 exports).
        threads: onnxruntime intra-op threads per member (None: the library's default).
        progress: progress bars while the members score the files.
        on_member: called with (member name, seconds it took to score dev and test).
        names: the members' names (None: :func:`member_names` of their paths).
        cascade: None: a weighted average; a share in [0, 1]: a cascade that defers at most
            this share of the dev texts from member 0 (:func:`choose_threshold`).

    Returns:
        The report written to ``out_dir/report.json``: ``members`` (name, source, kind,
        weight, per split metrics), ``weights``, ``metric``, ``splits`` (the ensemble's
        metrics per split), ``paired`` (per split, per member: :func:`xdpx.metrics.
        paired_comparison` of the ensemble against it on ``metric``), ``trace`` (the dev
        candidates), ``n`` (texts per split), ``seconds`` (per member, scoring); a cascade's
        also ``cascade``: ``threshold``, ``max_defer``, ``deferred`` (share per split),
        ``trace`` (:func:`choose_threshold`'s), ``vs_average`` (per split, the paired
        comparison against the full weighted average).

    Raises:
        ValueError: fewer than two members, an unknown metric, members of different
            classes or tasks, ``cascade`` outside [0, 1].
        FileNotFoundError: a member has no export; no dev file.
        DataError: a malformed line of a raw file (file:line).
    """
    from xdpx.metrics import classification_metrics, confusion_matrix, paired_comparison

    if len(members) < 2:
        raise ValueError(f"an ensemble needs two or more members, got {len(members)}")
    if metric not in ("accuracy", "macro_f1"):
        raise ValueError(f"metric must be accuracy or macro_f1, got {metric!r}")
    if cascade is not None and not 0 <= cascade <= 1:
        raise ValueError(f"cascade (the largest deferred share of dev) must be in [0, 1], got {cascade}")  # fmt: skip
    exports = [member_export(m, onnx_file) for m in members]
    models = [ServedModel(d, "onnx", threads, onnx_file) for d in exports]
    names = list(names) if names is not None else member_names(members)
    if len(set(names)) != len(names) or len(names) != len(members):
        raise ValueError(f"the members' names must be distinct, one per member: {names}")
    labels = list(models[0].labels)
    orders = label_orders(labels, [m.labels for m in models], exports)
    if len({m.pair for m in models}) != 1:
        raise ValueError(f"{exports}: some members take text pairs and some single texts")
    files = {"dev": dev_file or _default_file(models[0], "dev"), "test": test_file or (None if dev_file else _default_file(models[0], "test"))}  # fmt: skip
    if files["dev"] is None or not io.exists(files["dev"]):
        raise FileNotFoundError(f"dev file {files['dev']} not found: give --dev (a raw labelled file of the members' data)")  # fmt: skip
    files = {s: f for s, f in files.items() if f is not None and io.exists(f)}
    data = {s: _read_split(models[0], f, labels) for s, f in files.items()}
    probs: dict[str, list[np.ndarray]] = {s: [] for s in data}
    seconds: dict[str, float] = {}
    for name, model, order in zip(names, models, orders, strict=True):
        t0 = time.perf_counter()
        for s, (texts, texts2, _) in data.items():
            p = model_probs(model, texts, texts2, f"{name} {s}" if progress else None)
            probs[s].append(p[:, order])
        seconds[name] = round(time.perf_counter() - t0, 3)
        if on_member is not None:
            on_member(name, seconds[name])
    y_dev = data["dev"][2]
    weights, trace = choose_weights(probs["dev"], y_dev, metric, step)
    report: dict[str, Any] = {
        "metric": metric,
        "weights": dict(zip(names, weights, strict=True)),
        "labels": labels,
        "files": files,
        "n": {s: int(len(d[2])) for s, d in data.items()},
        "members": [],
        "splits": {},
        "paired": {},
        "trace": trace,
        "seconds": seconds,
        "method": "grid" if len(members) == 2 else "ensemble selection (Caruana et al. 2004)",
        "step": step,
    }
    ensembled = {s: weighted_probs(probs[s], weights) for s in data}
    threshold = None
    if cascade is not None:
        threshold, steps = choose_threshold(probs["dev"][0], ensembled["dev"], y_dev, cascade, metric)  # fmt: skip
        averaged = ensembled
        ensembled = {}
        masks = {s: deferred_mask(probs[s][0], threshold) for s in data}
        for s in data:
            ensembled[s] = cascade_probs(probs[s][0], [averaged[s][masks[s]]], [0.0, 1.0], threshold)  # fmt: skip
        report["method"] = f"cascade over the {report['method']} average"
        report["cascade"] = {
            "threshold": threshold,
            "max_defer": cascade,
            "deferred": {s: float(masks[s].mean()) for s in data},
            "trace": steps,
            "vs_average": {
                s: paired_comparison(
                    data[s][2],
                    ensembled[s].argmax(1),
                    averaged[s].argmax(1),
                    metric,
                    ensembled[s],
                    averaged[s],
                )  # fmt: skip
                for s in data
            },
        }
    for s, (_, _, y) in data.items():
        p = ensembled[s]
        report["splits"][s] = classification_metrics(y, p)
        report["paired"][s] = {
            name: paired_comparison(y, p.argmax(1), q.argmax(1), metric, p, q)
            for name, q in zip(names, probs[s], strict=True)
        }
    for k, (name, d, model) in enumerate(zip(names, exports, models, strict=True)):
        report["members"].append({
            "name": name, "source": d, "kind": model.kind, "weight": weights[k],
            "splits": {s: classification_metrics(data[s][2], probs[s][k]) for s in data},
        })  # fmt: skip
    kept = [k for k, w in enumerate(weights) if w > 0 or (cascade is not None and k == 0)]
    spec = {
        "labels": labels,
        "pair": models[0].pair,
        "members": [
            {"dir": f"members/{k}-{names[k]}", "name": names[k], "kind": models[k].kind,
             "onnx_file": onnx_file, "weight": weights[k] / sum(weights[j] for j in kept)}
            for k in kept
        ],
    }  # fmt: skip
    if threshold is not None:
        spec["cascade"] = {"threshold": threshold}
    tmp = io.tmp_sibling(out_dir)
    try:
        for k in kept:
            io.copytree(exports[k], io.join(tmp, spec["members"][kept.index(k)]["dir"]))
        io.write_text(io.join(tmp, "report.json"), json.dumps(report, indent=2) + "\n")
        last = "test" if "test" in data else "dev"
        y = data[last][2]
        cm = confusion_matrix(y, ensembled[last].argmax(1), labels=list(range(len(labels))))
        from xdpx.viz import confusion_figure, save_figure

        title = f"ensemble {last}: {metric} {report['splits'][last][metric]:.4f}"
        save_figure(confusion_figure(cm, labels, title), io.join(tmp, "confusion.png"))
        io.write_text(io.join(tmp, ENSEMBLE_FILE), json.dumps(spec, indent=2) + "\n")
        _check_written(tmp, data["dev"], models, orders, weights, threshold, threads)
        io.replace_dir(tmp, out_dir, marker=ENSEMBLE_FILE)
    except BaseException:
        io.rm(tmp, recursive=True) if io.exists(tmp) else None
        raise
    log.info("ensemble %s -> %s: dev %s %.4f", report["weights"], out_dir, metric, report["splits"]["dev"][metric])  # fmt: skip
    return report


def _check_written(
    path: str,
    dev: tuple,
    models: Sequence[ServedModel],
    orders: Sequence[Sequence[int]],
    weights: Sequence[float],
    threshold: float | None,
    threads: int | None,
) -> None:
    """The written ensemble, loaded back, answers the first 64 dev texts as its source
    members combined by the chosen rule do (within 1e-5), each member run on the same texts
    in the same calls as the served ensemble runs them: all 64 at once, or for a cascade
    member 0 on all and the others on the deferred ones. (Dynamically quantised int8 graphs
    quantise each call's activations with that call's own range, so their probabilities
    depend on the batch a text is in: only the same calls can be compared.)

    Args:
        models: the source members (all of them, weight 0 too), in order.
        orders: per member, its class columns in the ensemble's order.
        weights: the chosen weights of all members.
        threshold: the cascade's threshold, or None.

    Raises:
        AssertionError: it does not (nothing is moved into place then).
    """
    texts, texts2, _ = dev
    n = min(64, len(texts))
    texts, texts2 = texts[:n], texts2[:n] if texts2 is not None else None

    def run(k: int) -> np.ndarray:
        m = models[k]
        return m.probs(m.encode(texts, texts2))[:, list(orders[k])]

    if threshold is None:
        want = weighted_probs([run(k) for k in range(len(models))], weights)
    else:
        want, _ = run_cascade(run(0), models, orders, weights, threshold, texts, texts2)
    served = EnsembleModel(path, threads)
    got = served.probs(served.encode(texts, texts2))
    diff = float(np.abs(got - want).max())
    if diff > 1e-5:
        raise AssertionError(f"the written ensemble's probabilities differ from its members' combined by {diff:.3g}")  # fmt: skip
