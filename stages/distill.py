"""The teacher -> student distillation pipeline's steps (``distill/dvc.yaml``'s stages, the
``xdpx_distill`` flow's tasks): each a pure function of its config, calling the stages.

Not a registry stage (a run built on the stages, like ``xdpx cv``): ``distill/dvc.yaml``
runs ``python -m stages.distill <step> <configs_dir>`` and ``flows/distill.py`` calls the
same functions with the same config objects, so the two orchestrators cannot drift. The
plan (params, step configs, k-copy subsets, ship rule) is :mod:`xdpx.distill.plan`.

Each step's outputs (paths from ``distill/params.yaml``, through its step config):

* ``configs``: ``<configs_dir>/<step>.yaml`` per later step (:func:`configs`);
* ``teacher``: ``teacher.data_dir`` (prepro) and ``teacher.save_dir`` (train);
* ``transfer``: ``transfer.out_file``; ``label``: ``transfer.labelled_file``;
* ``students``: ``<student.data_dir>/{gold,k<k>}/`` (prepared data; ``k<k>-subset/labelled.tsv``,
  the subset, when k is below the built copies) and ``<student.save_dir>/{alone,<point>}/``
  (runs; :attr:`xdpx.distill.plan.GridPoint.name`), ``<student.save_dir>/grid.json``;
* ``decide``: ``<report_dir>/{decision.json, decision.md, teacher.json, alone.json,
  student.json}`` (+ their confusion and curve PNGs);
* ``export``: ``ship_dir``: the shipped model's ONNX export and a copy of ``decision.json``.

Usage::

    python -m stages.distill configs [--params distill/params.yaml] [key=value ...]
    python -m stages.distill teacher|transfer|label|students|decide|export CONFIGS_DIR
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from pydantic import BaseModel

from xdpx import io
from xdpx.config import ConfigError
from xdpx.distill.plan import (
    PLAN_FILE,
    STEPS,
    DecideStep,
    ExportStep,
    LabelStep,
    StudentsStep,
    TeacherStep,
    TransferStep,
    decide as ship_rule,
    decision_markdown,
    load_plan,
    read_step_config,
    step_configs,
    write_copies_subset,
    write_step_configs,
)
from xdpx.rundir import RunDir

log = logging.getLogger("xdpx.distill")

__all__ = [
    "configs",
    "teacher",
    "transfer",
    "label",
    "students",
    "decide",
    "export",
    "STEP_FUNCTIONS",
    "STEP_MODULES",
    "BASE_MODULES",
    "gold_dir",
    "copies_dir",
    "student_train_file",
    "paired_rows",
    "main",
]


def _result(result: Any) -> dict[str, Any]:
    if hasattr(result, "model_dump"):
        return result.model_dump(mode="json")
    return dict(vars(result))


def configs(
    plan_file: str = PLAN_FILE, overrides: list[str] | tuple[str, ...] = ()
) -> dict[str, Any]:
    """Step ``configs``: resolve ``plan_file`` + overrides and write one config per later step
    under its ``configs_dir`` (:func:`xdpx.distill.plan.step_configs`).

    Returns:
        ``{"configs_dir": ..., "files": [...]}``.

    Raises:
        ConfigError: a bad plan, params file or override.
    """
    plan = load_plan(plan_file, overrides)
    files = write_step_configs(step_configs(plan, plan_file), plan.configs_dir)
    return {"configs_dir": plan.configs_dir, "files": files}


def teacher(cfg: TeacherStep) -> dict[str, Any]:
    """Step ``teacher``: prepro then train of the teacher (``stages.prepro``, ``stages.train``).

    Returns:
        ``{"prepro": ..., "train": ...}``: the two stages' results as dicts.
    """
    from stages import prepro, train

    pre = prepro.run(cfg.prepro)
    result = train.run(cfg.train)
    return {"prepro": _result(pre), "train": _result(result)}


def transfer(cfg: TransferStep) -> dict[str, Any]:
    """Step ``transfer``: :func:`xdpx.distill.transfer.build_transfer_set` (streamed)."""
    from xdpx.distill.transfer import build_transfer_set

    return _result(build_transfer_set(cfg.distill, cfg.prepro))


def label(cfg: LabelStep) -> dict[str, Any]:
    """Step ``label``: :func:`xdpx.distill.transfer.label_transfer_set` (resumable)."""
    from xdpx.distill.transfer import label_transfer_set

    return _result(label_transfer_set(cfg.distill))


def gold_dir(data_dir: str) -> str:
    """The student's prepared gold train/dev/test under ``student.data_dir``."""
    return io.join(data_dir, "gold")


def copies_dir(data_dir: str, copies: int) -> str:
    """The student's prepared transfer set with ``copies`` copies per text."""
    return io.join(data_dir, f"k{copies}")


def student_train_file(cfg: StudentsStep, copies: int) -> str:
    """The labelled transfer file the students with ``copies`` copies per text train on (and
    take as ``train.distill_from``): the labelled file itself when it was built with that
    many, else its subset ``<data_dir>/k<copies>-subset/labelled.tsv``."""
    if copies == cfg.built_copies:
        return cfg.labelled_file
    return io.join(copies_dir(cfg.data_dir, copies) + "-subset", "labelled.tsv")


def _relative(path: str, start: str) -> str:
    """``path`` as prepro's ``data_files`` entry under ``data_source`` = ``start``."""
    import os

    if not io.is_local(path) or not io.is_local(start):
        raise ConfigError(f"the labelled transfer set {path} and the raw data {start} must be local")  # fmt: skip
    return os.path.relpath(os.path.abspath(path), os.path.abspath(start))


def _best_epoch(run: str, best_update: int | None) -> int | None:
    import pandas as pd

    path = RunDir(run).valid_log
    if best_update is None or not io.exists(path):
        return None
    df = pd.read_csv(io.open(path), sep="\t")
    rows = df[df["update"] == best_update]
    return int(rows["epoch"].iloc[0]) if len(rows) and "epoch" in df else None


def students(cfg: StudentsStep) -> dict[str, Any]:
    """Step ``students``: prepro + train of the student config on the gold train split
    (run ``alone``), then, for each k of the grid, prepro of the labelled transfer set cut
    to k copies per text (:func:`xdpx.distill.plan.write_copies_subset`) as the train split
    (dev and test: the raw ones), and one run per grid point on it with
    ``distill_from`` = that file. Each run keeps its best-of-dev checkpoint (the epochs
    chosen on its per-epoch dev curve). Writes ``<save_dir>/grid.json``.

    With ``grid.layers`` each L also trains ``alone-l<L>`` (the same L-layer model on the
    gold labels: what distillation adds), and with a ``baseline`` (the plan's fast model to
    beat, e.g. the n-gram) that model is prepared and trained on the gold labels as run
    ``baseline``.

    Returns:
        ``{"alone" | "alone-l<L>": {...}, ["baseline": {...},] "grid": [{alpha, temperature,
        copies, layers, run, dev, best_epoch, best_update, alone}, ...]}`` (``dev``: the
        run's best dev ``train.major_metric``; ``alone``: the run of its architecture on
        the gold labels).
    """
    from tqdm.auto import tqdm

    from stages import prepro, train

    raw = cfg.prepro.data_source
    gold = gold_dir(cfg.data_dir)
    prepro.run(cfg.prepro.model_copy(update={"data_dir": gold}))
    points = cfg.grid.points()
    layers = sorted({p.layers for p in points if p.layers is not None})
    alones = (["alone"] if None in cfg.grid.layers else []) + [f"alone-l{n}" for n in layers]
    runs = len(alones) + len(points) + (cfg.baseline_train is not None)
    bar = tqdm(total=runs, desc="students", unit="run")

    def arch(n: int | None) -> dict[str, Any]:
        """The train keys of a student with the first ``n`` layers (None: as configured)."""
        if n is None:
            return {}
        return {"hf_config": {**(cfg.train.hf_config or {}), "num_hidden_layers": n}}

    def fit(name: str, data_dir: str, train_cfg: Any = None, **extra: Any) -> dict[str, Any]:
        run = io.join(cfg.save_dir, name)
        base = train_cfg or cfg.train
        r = train.run(base.model_copy(update={"data_dir": data_dir, "save_dir": run, **extra}))
        bar.update(1)
        return {
            "run": name,
            "dev": r.best_score,
            "best_update": r.best_update,
            "best_epoch": _best_epoch(run, r.best_update),
        }

    out: dict[str, Any] = {}
    for name in alones:
        n = None if name == "alone" else int(name.removeprefix("alone-l"))
        out[name] = fit(name, gold, **arch(n))
    if cfg.baseline_train is not None and cfg.baseline_prepro is not None:
        prepro.run(cfg.baseline_prepro)
        out["baseline"] = fit("baseline", cfg.baseline_prepro.data_dir, cfg.baseline_train)
    out["grid"] = []
    files = dict(cfg.prepro.data_files)
    for k in sorted({p.copies for p in points}):
        data = copies_dir(cfg.data_dir, k)
        labelled = student_train_file(cfg, k)
        if k != cfg.built_copies:
            write_copies_subset(cfg.labelled_file, labelled, cfg.built_copies, k)
        files["train"] = _relative(labelled, raw)
        prepro.run(cfg.prepro.model_copy(update={"data_dir": data, "data_files": dict(files)}))
        for p in (p for p in points if p.copies == k):
            row = fit(
                p.name, data, distill_from=labelled, distill_alpha=p.alpha,
                distill_temperature=p.temperature, **arch(p.layers),
            )  # fmt: skip
            out["grid"].append({**p.model_dump(), **row, "alone": p.alone})
    bar.close()
    order = {p.name: i for i, p in enumerate(points)}
    out["grid"].sort(key=lambda r: order[r["run"]])
    io.write_text(io.join(cfg.save_dir, "grid.json"), json.dumps(out, indent=2) + "\n")
    return out


def _evaluate(cfg: DecideStep, name: str, checkpoint: str, data_dir: str) -> Any:
    """``stages.evaluate`` of ``checkpoint`` on dev and test into ``report_dir/<name>.json``;
    the :class:`stages.evaluate.EvaluateResult` (metrics, and the per-row labels and
    probabilities the paired comparison reads)."""
    from stages import evaluate

    report = cfg.report_dir
    ev = cfg.evaluate.model_copy(
        update={
            "checkpoint": checkpoint,
            "data_dir": data_dir,
            "splits": ["dev", "test"],
            "metrics_file": io.join(report, f"{name}.json"),
            "confusion_png": io.join(report, f"{name}-confusion.png"),
            "curve_png": io.join(report, f"{name}-valid_curve.png"),
        }
    )
    return evaluate.run(ev)


def paired_rows(a: Any, b: Any, metric: str) -> dict[str, dict[str, Any]]:
    """``{split: paired_comparison(a, b)}`` for each split both evaluations hold rows of
    (:func:`xdpx.metrics.paired_comparison`, A minus B), B's classes put in A's index order
    (each prepared data dir numbers the labels in its own target map). A split whose gold
    labels differ between the two (data prepared from other files) is left out with a
    warning: the rows would not be the same texts."""
    import numpy as np

    from xdpx.metrics import paired_comparison

    out: dict[str, dict[str, Any]] = {}
    for split in sorted(set(a.rows) & set(b.rows)):
        ra, rb = a.rows[split], b.rows[split]
        names = list(ra["names"])  # B's classes in A's index order (target maps may differ)
        if sorted(names) != sorted(rb["names"]):
            log.warning("%s: the two models' %s labels differ (%s vs %s): no paired test", metric, split, names, list(rb["names"]))  # fmt: skip
            continue
        order = [list(rb["names"]).index(n) for n in names]
        yb = np.asarray([names.index(n) for n in rb["names"]])[rb["labels"]]
        if len(ra["labels"]) != len(yb) or (ra["labels"] != yb).any():
            log.warning("%s: the two models' %s rows are not the same texts: no paired test", metric, split)  # fmt: skip
            continue
        pb = rb["probs"][:, order]
        out[split] = paired_comparison(
            ra["labels"], ra["probs"].argmax(1), pb.argmax(1), metric, ra["probs"], pb
        )
    return out


def decide(cfg: DecideStep) -> dict[str, Any]:
    """Step ``decide``: evaluate the teacher, ``alone`` and the best grid point on dev and
    test (``stages.evaluate``), compare student and teacher with alone text by text
    (:func:`paired_rows`), apply the ship rule (:func:`xdpx.distill.plan.decide`: on dev
    only, by more than the paired SE) and write ``decision.json`` and ``decision.md`` into
    ``report_dir``.

    Raises:
        FileNotFoundError: ``<save_dir>/grid.json`` is missing (run step students).
    """
    path = io.join(cfg.save_dir, "grid.json")
    if not io.exists(path):
        raise FileNotFoundError(f"{path}: missing; run step students first")
    grid = json.loads(io.read_text(path))["grid"]
    metric = cfg.major_metric
    best = max(grid, key=lambda r: r["dev"]) if grid else None
    own = best.get("alone", "alone") if best else "alone"  # the student's architecture alone
    reference, ref_data = (
        ("baseline", io.join(cfg.data_dir, "baseline"))
        if cfg.baseline
        else (own, gold_dir(cfg.data_dir))  # fmt: skip
    )
    t = _evaluate(cfg, "teacher", RunDir(cfg.teacher_run).best_alias, cfg.teacher_data)
    a = _evaluate(cfg, reference, RunDir(io.join(cfg.save_dir, reference)).best_alias, ref_data)
    s = None
    paired = {f"teacher_{k}": v for k, v in paired_rows(t, a, metric).items()}
    if best is not None:
        run = RunDir(io.join(cfg.save_dir, best["run"])).best_alias
        s = _evaluate(cfg, "student", run, copies_dir(cfg.data_dir, best["copies"]))
        paired.update(paired_rows(s, a, metric))
    decision = ship_rule(
        grid, a.metrics, t.metrics, s.metrics if s else None, metric, paired, reference
    )
    if cfg.baseline and best is not None:  # what distillation adds to the student's own model
        o = _evaluate(cfg, own, RunDir(io.join(cfg.save_dir, own)).best_alias, gold_dir(cfg.data_dir))  # fmt: skip
        decision["own_alone"] = {
            "run": own,
            "dev": o.metrics["dev"][metric],
            "test": o.metrics["test"][metric],
            "paired": paired_rows(s, o, metric),
        }
    chosen = next((r for r in grid if r["run"] == decision["run"]), None)
    decision["checkpoint"] = RunDir(io.join(cfg.save_dir, decision["run"])).best
    decision["data_dir"] = copies_dir(cfg.data_dir, chosen["copies"]) if chosen else ref_data
    io.write_text(io.join(cfg.report_dir, "decision.json"), json.dumps(decision, indent=2) + "\n")  # fmt: skip
    io.write_text(io.join(cfg.report_dir, "decision.md"), decision_markdown(decision))
    log.info("distillation ships %s: %s", decision["shipped"], decision["reason"])
    return decision


def export(cfg: ExportStep) -> dict[str, Any]:
    """Step ``export``: ``stages.export`` of the shipped run's best checkpoint (from
    ``decision.json``) into ``ship_dir``, with ``decision.json`` copied beside it.

    Raises:
        FileNotFoundError: ``decision.json`` is missing (run step decide).
    """
    from stages import export as export_stage

    if not io.exists(cfg.decision_file):
        raise FileNotFoundError(f"{cfg.decision_file}: missing; run step decide first")
    decision = json.loads(io.read_text(cfg.decision_file))
    ex = cfg.export.model_copy(
        update={
            "checkpoint": decision["checkpoint"],
            "data_dir": decision["data_dir"],
            "out_dir": cfg.ship_dir,
        }  # fmt: skip
    )
    result = _result(export_stage.run(ex))
    io.write_text(io.join(cfg.ship_dir, "decision.json"), io.read_text(cfg.decision_file))
    return {"shipped": decision["shipped"], "run": decision["run"], "export": result}


#: step -> the modules it runs besides this one's top-level imports (``xdpx.distill.plan``,
#: ``xdpx.rundir``, ``xdpx.stage``): ``distill/dvc.yaml`` lists the import closure of both as
#: the step's code deps (tests/test_distill_pipeline.py checks it), so a change to export's
#: code re-runs the export step and not the teacher's training.
STEP_MODULES = {
    "configs": (),
    "teacher": ("stages.prepro", "stages.train"),
    "transfer": ("xdpx.distill.transfer",),
    "label": ("xdpx.distill.transfer", "xdpx.checkpoint", "xdpx.inference"),
    "students": ("stages.prepro", "stages.train"),
    "decide": ("stages.evaluate",),
    "export": ("stages.export",),
}
#: The modules every step imports (this module's top level and ``main``).
BASE_MODULES = ("stages.distill", "xdpx.distill.plan", "xdpx.rundir", "xdpx.stage")

#: step -> its function (``configs`` takes the plan file and overrides, the others their
#: step config).
STEP_FUNCTIONS = {
    "configs": configs,
    "teacher": teacher,
    "transfer": transfer,
    "label": label,
    "students": students,
    "decide": decide,
    "export": export,
}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """``python -m stages.distill configs [--params distill/params.yaml] [key=value ...]`` or
    ``python -m stages.distill STEP CONFIGS_DIR`` (STEP: teacher, transfer, label, students,
    decide, export). Prints the step's result as JSON; exits 2 with one ``error:`` line on
    bad input."""
    from xdpx.stage import USER_ERRORS

    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")  # fmt: skip
    if not args or args[0] not in STEPS:
        raise SystemExit(f"usage: python -m stages.distill {{{'|'.join(STEPS)}}} ...")
    step, rest = args[0], args[1:]
    try:
        if step == "configs":
            plan_file = PLAN_FILE
            if rest[:1] in (["--params"], ["-p"]):
                plan_file, rest = rest[1], rest[2:]
            result = configs(plan_file, rest)
        else:
            if len(rest) != 1:
                raise SystemExit(f"usage: python -m stages.distill {step} CONFIGS_DIR")
            cfg: BaseModel = read_step_config(rest[0], step)
            with io.stage(f"distill-{step}"):
                result = STEP_FUNCTIONS[step](cfg)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(result, default=str))
    return result


if __name__ == "__main__":
    main()
