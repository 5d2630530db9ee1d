"""``xdpx doctor``: check the environment, the config, the data and the training setup
before a long run.

The data checks follow the debugging checklists users run by hand when a
model does not learn: is the label distribution what you think (majority-class
rate = the accuracy to beat), are test texts also in train (leakage inflates
scores), how much is truncated by ``max_len``, is the validation split usable
for early stopping. Then :mod:`xdpx.doctor.checklist` runs the training checklist on the
configured model and data (first batch decoded, ``num_labels``, NaN/Inf and ranges,
label alignment, learning rate, initial loss, padding invariance, gradient flow, data
order, loss reduction under accumulation, overfitting one batch).
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from xdpx import io
from xdpx.config import ConfigError, Params, load_params
from xdpx.doctor.checklist import Check, run_checklist
from xdpx.doctor.checks import LEARN_SECONDS

if TYPE_CHECKING:
    from xdpx.data.meta import PreparedMeta

__all__ = ["Check", "run_checks", "write_report"]


def _environment() -> list[Check]:
    import torch

    out = [Check("ok", "python", platform.python_version())]
    cuda = (
        f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
        if torch.cuda.is_available()
        else "none (CPU: precision=fp32; bf16 runs but is slow without native bf16 units)"
    )
    out.append(Check("ok", "torch", f"{torch.__version__}, {torch.get_num_threads()} threads"))
    out.append(Check("ok", "cuda", cuda))
    return out


def _data(params: Params) -> list[Check]:
    from xdpx.data import DataError, PreparedMeta, load_split

    out: list[Check] = []
    data_dir = params.train.data_dir
    meta_path = PreparedMeta.path_in(data_dir)
    if not io.exists(meta_path):
        return [
            Check("warn", "data", f"{meta_path} not found: run prepro first (dvc repro prepro)")
        ]
    try:
        meta = PreparedMeta.read(data_dir)
    except DataError as e:
        return [Check("fail", "data", str(e))]
    labels = meta.labels
    splits = meta.splits
    hashes: dict[str, set[bytes]] = {}
    unit = "texts"
    for split, info in splits.items():
        data = load_split(data_dir, split)
        if data.input_ids2 is None:
            hashes[split] = {ids.tobytes() for ids in data.input_ids}
        else:  # a pair leaks when both texts recur together (text1 alone often repeats)
            unit = "pairs"
            hashes[split] = {
                np.int64(len(a)).tobytes() + a.tobytes() + b.tobytes()
                for a, b in zip(data.input_ids, data.input_ids2, strict=True)
            }
        if info.has_labels and len(data):
            counts = np.bincount(data.labels[data.labels >= 0], minlength=len(labels))
            majority = counts.max() / max(counts.sum(), 1)
            dist = ", ".join(f"{lab} {c}" for lab, c in zip(labels, counts, strict=True))
            status = "warn" if majority > 0.9 or (counts == 0).any() else "ok"
            out.append(
                Check(
                    status,
                    f"labels[{split}]",
                    f"{dist}; majority-class rate {majority:.3f} (the accuracy to beat)",
                )
            )
        truncated = info.truncated
        frac = truncated / max(info.rows, 1)
        out.append(
            Check(
                "warn" if frac > 0.05 else "ok",
                f"max_len[{split}]",
                f"{truncated} of {info.rows} texts truncated ({frac:.1%}) "
                f"at max_len {meta.max_len}",
            )
        )
    out += _leakage(hashes, meta, params.train.train_subset, unit)
    if params.train.valid_subset not in splits:
        out.append(
            Check(
                "warn",
                "valid_subset",
                f"no {params.train.valid_subset!r} split: no early stopping, best = last",
            )
        )
    return out


def _leakage(
    hashes: dict[str, set[bytes]], meta: PreparedMeta, train: str, unit: str
) -> list[Check]:
    """Texts shared by every pair of splits, by identical token ids: ``leakage[<split>]``
    for a split against ``train`` (its texts also in train), ``leakage[<a>~<b>]`` for two
    other splits (b's texts also in a). WARN on a shared text, or on near-duplicates that
    prepro found worth a WARN (``meta.json`` ``overlaps``, shown with the count and the first
    file:line pairs); FAIL when the two hold the same texts (the same file twice), naming
    both files."""
    from xdpx.data.overlaps import pair_key, worth_warning

    order = ([train] if train in hashes else []) + [s for s in hashes if s != train]
    recorded = meta.overlaps or {}
    out = []
    for i, a in enumerate(order):
        for b in order[i + 1 :]:
            h, seen = hashes[b], hashes[a]
            if not h:
                continue
            shared = len(h & seen)
            name = f"leakage[{b}]" if a == train else f"leakage[{pair_key(a, b)}]"
            detail = f"{shared} of {len(h)} {b} {unit} also in {a} (identical token ids)"
            entry = recorded.get(pair_key(a, b)) or recorded.get(pair_key(b, a))
            if entry and entry["near"]:
                detail += (
                    f"; {entry['near']} near-duplicate(s) as read (case, whitespace, "
                    f"punctuation), e.g. {'; '.join(e for e in entry['examples'] if ' ~ ' in e)}"
                )
            status = "warn" if shared or (entry is not None and worth_warning(entry)) else "ok"
            if h == seen:
                status = "fail"
                detail = (
                    f"{a} ({_sources(meta, a)}) and {b} ({_sources(meta, b)}) hold the same "
                    f"{len(h)} {unit} (identical token ids): a score on {b} is a score on "
                    f"{a}{', the training data' if a == train else ''}; give "
                    f"prepro.data_files.{b} a file of its own"
                )
            out.append(Check(status, name, detail))
    return out


def _sources(meta: PreparedMeta, split: str) -> str:
    source = meta.splits[split].source
    return ", ".join(source) if isinstance(source, list) else str(source)


def run_checks(
    params_file: str = "params.yaml",
    overrides: list[str] | None = None,
    fast: bool = False,
    on_check: Callable[[Check], None] | None = None,
    learning_seconds: float = LEARN_SECONDS,
) -> list[Check]:
    """Every check, in order: environment, config, DVC setup, data, then the training
    checklist (:func:`xdpx.doctor.checklist.run_checklist`) when the prepared data exists.

    Args:
        params_file: the params file.
        overrides: ``key=value`` overrides as on the command line.
        fast: the checklist's fast subset only (what ``train.preflight_doctor`` runs).
        on_check: called with each finding as it is made (progress output).
        learning_seconds: the learning check's budget (:func:`run_checklist`).

    Returns:
        The findings; a ``fail`` means a run would not start or would not learn.
    """
    out: list[Check] = []

    def emit(checks: list[Check]) -> None:
        for c in checks:
            out.append(c)
            if on_check is not None:
                on_check(c)

    emit(_environment())
    try:
        params = load_params(params_file, overrides or [])
    except ConfigError as e:
        emit([Check("fail", "config", str(e))])
        return out
    emit([Check("ok", "config", f"{params_file} valid")])
    dvc_config = ".dvc/config"
    if io.exists(dvc_config):
        text = io.read_text(dvc_config)
        off = "analytics = false" in text
        emit([Check("ok" if off else "warn", "dvc", "analytics off" if off else "analytics on")])
    else:
        emit([Check("warn", "dvc", "no .dvc/config here: run from the project root")])
    emit(_data(params))
    from xdpx.data import PreparedMeta

    if io.exists(PreparedMeta.path_in(params.train.data_dir)):
        run_checklist(params.train, fast=fast, on_check=lambda c: emit([c]), learning_seconds=learning_seconds)  # fmt: skip
    return out


def write_report(checks: list[Check], path: str, params_file: str, overrides: list[str]) -> None:
    """Write the findings as JSON (atomically): ``{"checks": [...], "counts": {status: n},
    "seconds", "params", "overrides"}``; each check as :meth:`Check.to_json`."""
    counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail", "skip")}
    report = {
        "params": params_file,
        "overrides": overrides,
        "counts": counts,
        "seconds": round(sum(c.seconds for c in checks), 3),
        "checks": [c.to_json() for c in checks],
    }
    io.write_text(path, json.dumps(report, indent=2, ensure_ascii=False) + "\n")


#: Columns of ``xdpx doctor --label-issues FILE``.
LABEL_ISSUE_COLUMNS = ("file", "line", "given", "suggested", "confidence", "text")


def write_label_issues(checks: list[Check], path: str) -> str:
    """Write the label check's flagged train rows (``Check.table`` of ``label_issues``,
    :func:`xdpx.doctor.label_checks.label_issue_rows`) to ``path`` as a TSV with
    :data:`LABEL_ISSUE_COLUMNS` and a header, likeliest mislabelled first, atomically (a
    pair's two texts are two columns, ``text`` and ``text2``). Tabs and newlines inside a
    text become spaces.

    Returns:
        One line saying what was written, or why nothing was (the check did not run).
    """
    found = next((c for c in checks if c.name == "label_issues"), None)
    if found is None or found.status == "skip":
        why = found.detail if found is not None else "the label check did not run (no prepared data, or a FAIL before it)"  # fmt: skip
        return f"--label-issues: nothing written: {why}"
    rows = found.table
    pair = any(r["text"] and "\t" in r["text"] for r in rows)
    header = [*LABEL_ISSUE_COLUMNS, "text2"] if pair else list(LABEL_ISSUE_COLUMNS)

    def cell(v: object) -> str:
        return "" if v is None else str(v).replace("\t", " ").replace("\n", " ").replace("\r", " ")  # fmt: skip

    lines = ["\t".join(header)]
    for r in rows:
        texts = (r["text"] or "").split("\t", 1) if pair else [r["text"]]
        texts += [""] * (2 - len(texts)) if pair else []
        lines.append("\t".join([cell(r[k]) for k in LABEL_ISSUE_COLUMNS[:-1]] + [cell(t) for t in texts]))  # fmt: skip
    io.write_text(path, "\n".join(lines) + "\n")
    return f"wrote {path}: {len(rows)} rows flagged as probably mislabelled (likeliest first)"
