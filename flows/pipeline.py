"""Prefect flow ``xdpx_pipeline``: fetch -> prepro -> train -> evaluate -> predict -> export.

Each task calls the same ``stages.<name>.run`` function that ``dvc repro``
runs, so the two orchestrators cannot drift. Task results are persisted
(``persist_result=True``) so retries and the Prefect UI can show them.

Run locally on Prefect's embedded (ephemeral) server, nothing to start::

    python -m flows.pipeline                              # params.yaml
    python -m flows.pipeline fetch.limit=2000 train.max_epoch=2
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from xdpx.config import Params, load_params

# DAG order; each name is a params.yaml section and a module stages/<name>.py.
STAGES = ("fetch", "prepro", "train", "evaluate", "predict", "export")


def _result_dict(result: Any) -> dict:
    if hasattr(result, "model_dump"):
        return result.model_dump(mode="json")
    return dict(vars(result))


def _stage_task(name: str):
    # Persisted results (retries, UI); no input-based cache: every stage gets the same Params
    # object and the real state lives in files, which DVC (not Prefect) tracks.
    @task(name=name, persist_result=True, cache_policy=NO_CACHE, task_run_name=name)
    def run_stage(params: Params) -> dict:
        import importlib

        module = importlib.import_module(f"stages.{name}")
        result = module.run(getattr(params, name))
        get_run_logger().info("%s done: %s", name, _result_dict(result))
        return _result_dict(result)

    return run_stage


STAGE_TASKS = {name: _stage_task(name) for name in STAGES}


@flow(name="xdpx-pipeline", log_prints=True)
def xdpx_pipeline(
    params: str = "params.yaml", overrides: list[str] | None = None
) -> dict[str, dict]:
    """Run every stage in DAG order with ``params`` plus ``section.key=value`` overrides.

    Returns:
        stage name -> that stage's result as a dict.

    Raises:
        xdpx.config.ConfigError: bad params or overrides (before any stage runs).
    """
    cfg = load_params(params, overrides or [])
    results: dict[str, dict] = {}
    for name in STAGES:
        results[name] = STAGE_TASKS[name](cfg)
    return results


def main(argv: list[str] | None = None) -> None:
    """``python -m flows.pipeline [--params params.yaml] [section.key=value ...]``."""
    argv = sys.argv[1:] if argv is None else argv
    params = "params.yaml"
    if argv[:1] in (["--params"], ["-p"]):
        params, argv = argv[1], argv[2:]
    results = xdpx_pipeline(params=params, overrides=list(argv))
    metrics = results["evaluate"]["metrics"]
    print({split: {k: round(v, 4) for k, v in m.items()} for split, m in metrics.items()})


if __name__ == "__main__":
    main()
