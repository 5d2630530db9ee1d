"""The teacher -> student distillation pipeline as a Prefect flow, ``xdpx_distill``
(``xdpx distill``, ``python -m flows.distill``).

The same steps as ``dvc repro distill/dvc.yaml``, in the same order, through the same
functions (``stages.distill.STEP_FUNCTIONS``): the ``configs`` task resolves
``distill/params.yaml`` into one config per step under its ``configs_dir`` and every later
task reads its own (:func:`xdpx.distill.plan.read_step_config`), exactly as the DVC stage's
command does, so the two orchestrators cannot drift. Steps: configs -> teacher (prepro +
train) -> transfer (build) -> label (teacher logits, resumable) -> students (the student
config on the gold labels alone, then the grid) -> decide (teacher, alone and the best
student on dev/test; the ship rule on dev) -> export (the shipped model). The decision
becomes a markdown artifact (teacher / alone / student on dev and test, the share of the
teacher's dev gain the student keeps, the grid, the choice and the reason); it is also
``<report_dir>/decision.md`` beside ``decision.json``.

Unlike DVC, the flow re-runs every step: ``train_teacher=False`` (``--no-teacher``) uses
the teacher run already at ``teacher.save_dir``; a killed labelling resumes on the next run.

Run it::

    python -m flows.distill                                   # distill/params.yaml
    python -m flows.distill --no-teacher grid.alpha=[0.5]
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.pipeline import StageError, _artifact_key
from xdpx.config import ConfigError
from xdpx.distill.plan import PLAN_FILE, STEPS, decision_markdown, load_plan, read_step_config
from xdpx.rundir import RunDir

__all__ = ["xdpx_distill", "publish_decision", "main"]


def _step_task(step: str):
    @task(name=f"distill-{step}", task_run_name=step, cache_policy=NO_CACHE)
    def run_step(configs_dir: str) -> dict[str, Any]:
        from stages.distill import STEP_FUNCTIONS

        try:
            result = STEP_FUNCTIONS[step](read_step_config(configs_dir, step))
        except Exception as e:
            raise StageError.wrap(step, e) from e
        get_run_logger().info("%s done", step)
        return result

    return run_step


@task(name="distill-configs", task_run_name="configs", cache_policy=NO_CACHE)
def configs_task(params: str, overrides: list[str]) -> dict[str, Any]:
    """Step ``configs``: ``stages.distill.configs`` (one config file per later step)."""
    from stages.distill import configs

    try:
        return configs(params, overrides)
    except Exception as e:
        raise StageError.wrap("configs", e) from e


STEP_TASKS = {step: _step_task(step) for step in STEPS if step != "configs"}


def publish_decision(decision: dict[str, Any]) -> str:
    """The decision as a markdown artifact (key ``xdpx-<deployment>-distill``); returns its
    markdown."""
    from prefect.artifacts import create_markdown_artifact

    text = decision_markdown(decision)
    create_markdown_artifact(
        text,
        key=_artifact_key("distill"),
        description=f"Distillation: ships {decision['shipped']} ({decision['run']})",
    )
    return text


@flow(name="xdpx-distill", log_prints=True)
def xdpx_distill(
    params: str = PLAN_FILE, overrides: list[str] | None = None, train_teacher: bool = True
) -> dict[str, Any]:
    """Run the distillation pipeline's steps in order (module docstring).

    Args:
        params: the pipeline's params file (``distill/params.yaml``).
        overrides: ``key.sub=value`` strings on it (``grid.alpha=[0.5]``,
            ``student.overrides=[train.max_epoch=2]``).
        train_teacher: False: skip the teacher step and use the run at ``teacher.save_dir``.

    Returns:
        step -> its result; ``decide``'s is the decision (``decision.json``'s content).

    Raises:
        xdpx.config.ConfigError: a bad params file or override, or no teacher run with
            ``train_teacher=False`` (before any step runs).
        StageError: a step failed (names it).
    """
    overrides = list(overrides or [])
    plan = load_plan(params, overrides)  # fails here, before any task, on a bad plan
    if not train_teacher and not RunDir(plan.teacher.save_dir).markers():
        raise ConfigError(f"train_teacher=False but {plan.teacher.save_dir} holds no run")
    results: dict[str, Any] = {"configs": configs_task(params, overrides)}
    for step, step_task in STEP_TASKS.items():
        if step == "teacher" and not train_teacher:
            get_run_logger().info("teacher: using the run in %s", plan.teacher.save_dir)
            continue
        results[step] = step_task(plan.configs_dir)
    publish_decision(results["decide"])
    return results


def main(argv: list[str] | None = None) -> None:
    """``python -m flows.distill [--params distill/params.yaml] [--no-teacher] [key=value ...]``.

    Exits with status 2 and one ``error: ...`` line on a bad config or a failed step.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    params, train_teacher = PLAN_FILE, True
    while argv[:1] and argv[0] in ("--params", "-p", "--no-teacher"):
        if argv[0] == "--no-teacher":
            train_teacher, argv = False, argv[1:]
        elif len(argv) < 2:
            print(f"error: {argv[0]} needs a value", file=sys.stderr)
            raise SystemExit(2)
        else:
            params, argv = argv[1], argv[2:]
    try:
        results = xdpx_distill(params=params, overrides=argv, train_teacher=train_teacher)
    except (ConfigError, StageError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(decision_markdown(results["decide"]))


if __name__ == "__main__":
    main()
