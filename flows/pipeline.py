"""Prefect flow ``xdpx_pipeline``: fetch -> prepro -> train -> evaluate -> predict -> export.

The stages and their order are ``stages.registry.STAGES`` (the CLI's and ``xdpx tune``'s
too), and each task calls ``STAGES[name].run(params.<name>)``: the same function that
``dvc repro`` runs, on a config object, so the two orchestrators cannot drift. Task results
are persisted (``persist_result=True``) so retries and the Prefect UI can show them.

Failures and retries:

* every task run is named after its stage; a failing stage raises
  :class:`StageError`, whose one-line message (``stage 'train' failed:
  RemoteIOError: ...``) is what the Prefect UI shows as the task run's and the
  flow run's state message;
* a stage is retried only when it failed with :class:`xdpx.errors.RemoteIOError`
  (a remote store still failing after ``xdpx.io``'s own retries), once per entry
  of ``io_retry_delays`` (default: after 10 s, then after 60 s). Bad input (config,
  missing files, bad data, divergence) fails at once and is never retried;
* a retried ``train`` whose ``save_dir`` was free before its first attempt
  replaces the partial run of that attempt (``overwrite``) instead of stopping
  at the pre-flight "save_dir holds a run" check.

Run locally on Prefect's embedded (ephemeral) server, nothing to start::

    python -m flows.pipeline                              # params.yaml
    python -m flows.pipeline fetch.limit=2000 train.max_epoch=2

Scheduled runs on work pools: see ``prefect.yaml`` and the README
("Scheduling with Prefect").
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run as current_task_run

from stages.registry import STAGES
from xdpx.config import ConfigError, Params, load_params
from xdpx.errors import RemoteIOError
from xdpx.rundir import RunDir

__all__ = ["STAGES", "STAGE_TASKS", "IO_RETRY_DELAYS", "StageError", "xdpx_pipeline", "main"]

#: Default seconds to wait before each retry of a stage that failed with RemoteIOError
#: (xdpx.io has already retried with backoff by then: these cover a longer store outage).
IO_RETRY_DELAYS: tuple[float, ...] = (10.0, 60.0)


class StageError(RuntimeError):
    """A stage of the flow failed; raised from the original error (``__cause__``).

    The message is one line, ``stage '<name>' failed: <ErrorType>: <first line of the
    error>``, so the Prefect UI's state message names the stage and the error.

    Attributes:
        stage: the stage name (a key of ``STAGES``).
        retryable: True when the cause is a :class:`~xdpx.errors.RemoteIOError`.
    """

    def __init__(self, message: str, *, stage: str = "", retryable: bool = False) -> None:
        # Only ``message`` goes to ``args``: pickling (Prefect persists failed results) re-creates
        # the object with cls(message) and then restores ``stage``/``retryable`` from __dict__.
        super().__init__(message)
        self.stage = stage
        self.retryable = retryable

    @classmethod
    def wrap(cls, stage: str, error: BaseException) -> StageError:
        """The StageError for ``error`` raised by stage ``stage`` (only the first message line)."""
        lines = str(error).strip().splitlines()
        detail = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
        return cls(
            f"stage {stage!r} failed: {detail}",
            stage=stage,
            retryable=isinstance(error, RemoteIOError),
        )


def _retry_on_remote_io(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry a failed stage only for remote IO errors.

    Returns:
        True when the task failed with a :class:`StageError` whose cause is a
        :class:`~xdpx.errors.RemoteIOError`; False for anything else (bad input).
    """
    error = state.result(raise_on_failure=False)
    return isinstance(error, StageError) and error.retryable


def _result_dict(result: Any) -> dict:
    if hasattr(result, "model_dump"):
        return result.model_dump(mode="json")
    return dict(vars(result))


# task run id -> whether train.save_dir held no run before that task's first attempt.
_FRESH_SAVE_DIR: dict[str, bool] = {}


def _train_config_for_attempt(cfg: Any) -> Any:
    """The train config of this attempt: on a retry, replace what the failed attempt left.

    The first attempt passed the pre-flight check, so with none of ``overwrite``,
    ``resume``, ``auto_suffix`` set and a save_dir that held no run before it, any run
    found there now is the failed attempt's own partial output.
    """
    if cfg.overwrite or cfg.resume or cfg.resume_from or cfg.auto_suffix:
        return cfg
    key = str(current_task_run.get_id())
    if key not in _FRESH_SAVE_DIR:  # before the first attempt that got this far
        _FRESH_SAVE_DIR[key] = not RunDir(cfg.save_dir).markers()
        return cfg
    if current_task_run.get_run_count() > 1 and _FRESH_SAVE_DIR[key]:
        get_run_logger().warning(
            "train retry: replacing the partial run of the failed attempt in %s", cfg.save_dir
        )
        return cfg.model_copy(update={"overwrite": True})
    return cfg


def _stage_task(name: str):
    # Persisted results (retries, UI); no input-based cache: every stage gets the same Params
    # object and the real state lives in files, which DVC (not Prefect) tracks.
    @task(
        name=name,
        task_run_name=name,
        persist_result=True,
        cache_policy=NO_CACHE,
        retries=len(IO_RETRY_DELAYS),
        retry_delay_seconds=list(IO_RETRY_DELAYS),
        retry_condition_fn=_retry_on_remote_io,
    )
    def run_stage(params: Params) -> dict:
        stage = STAGES[name]
        cfg = getattr(params, name)
        try:
            if name == "train":
                cfg = _train_config_for_attempt(cfg)
            result = stage.run(cfg)
        except Exception as e:
            raise StageError.wrap(name, e) from e
        get_run_logger().info("%s done: %s", name, _result_dict(result))
        return _result_dict(result)

    return run_stage


STAGE_TASKS = {name: _stage_task(name) for name in STAGES}


@task(
    name="prepro-file",
    task_run_name="prepro {job.label}",
    cache_policy=NO_CACHE,
    retries=len(IO_RETRY_DELAYS),
    retry_delay_seconds=list(IO_RETRY_DELAYS),
    retry_condition_fn=_retry_on_remote_io,
)
def prepro_file(job: Any) -> Any:
    """One raw file's pass of prepro (``stages.prepro.CountJob`` / ``EncodeJob``), run
    wherever the flow's task runner puts it (a Dask worker: its chunks in that process)."""
    from stages.prepro import do_job

    try:
        return do_job(job)
    except Exception as e:
        raise StageError.wrap("prepro", e) from e


def _prepro_mapped(cfg: Any, delays: list[float]) -> dict:
    """prepro with its per-file work mapped as ``prepro-file`` task runs on the flow's task
    runner; the rest (tokenizer choice, vocab, meta.json) runs here, in the flow."""
    from prefect.context import FlowRunContext
    from prefect.settings import PREFECT_API_URL, temporary_settings

    file_task = prepro_file.with_options(retries=len(delays), retry_delay_seconds=delays or 0)

    def mapper(jobs: list[Any]) -> list[Any]:
        return file_task.map(jobs).result()

    # Dask workers get the flow's settings; on the ephemeral server they would otherwise
    # each start their own server: point them at this flow's.
    api = str(FlowRunContext.get().client.api_url).rstrip("/")
    with temporary_settings({PREFECT_API_URL: api}):
        try:
            result = STAGES["prepro"].run(cfg, mapper=mapper)
        except StageError:
            raise
        except Exception as e:
            raise StageError.wrap("prepro", e) from e
    get_run_logger().info("prepro done: %s", _result_dict(result))
    return _result_dict(result)


@flow(name="xdpx-pipeline", log_prints=True)
def xdpx_pipeline(
    params: str = "params.yaml",
    overrides: list[str] | None = None,
    io_retry_delays: tuple[float, ...] = IO_RETRY_DELAYS,
    prepro_tasks: bool = False,
    pretrain: str | None = None,
    pretrain_overrides: list[str] | None = None,
) -> dict[str, dict]:
    """Run every stage in DAG order with ``params`` plus ``section.key=value`` overrides.

    Args:
        params: params file (relative to the working directory, or an fsspec URL).
        overrides: ``section.key=value`` strings applied after the file.
        io_retry_delays: seconds to wait before each retry of a stage that failed with
            RemoteIOError (one retry per entry; empty: no retries).
        prepro_tasks: map prepro's per-file work (a counting pass per train file, an
            encoding pass per raw file) as ``prepro-file`` task runs on the flow's task
            runner, e.g. a Dask cluster (:func:`with_dask`); False: one ``prepro`` task.
        pretrain: a params file of a ``train.task: mlm`` run (``params/pretrain-minilm.yaml``)
            plus ``pretrain_overrides``: after prepro, a ``pretrain`` task runs it on the
            flow's prepared data (``train.data_dir`` = ``prepro.data_dir``), and ``train``
            fine-tunes its ``<save_dir>/pretrained`` (``train.pretrained_model``).

    Returns:
        stage name -> that stage's result as a dict.

    Raises:
        xdpx.config.ConfigError: bad params or overrides, or ``pretrain`` not a ``task: mlm``
            config (before any stage runs).
        StageError: a stage failed (after its retries, for remote IO errors).
    """
    cfg = load_params(params, overrides or [])
    pre = _pretrain_params(pretrain, pretrain_overrides or [], cfg) if pretrain else None
    delays = [float(d) for d in io_retry_delays]
    results: dict[str, dict] = {}
    for name in STAGES:
        stage_task = STAGE_TASKS[name].with_options(
            retries=len(delays), retry_delay_seconds=delays or 0
        )
        if name == "prepro" and prepro_tasks:
            results[name] = _prepro_mapped(cfg.prepro, delays)
            continue
        if name == "train" and pre is not None:
            results["pretrain"] = stage_task.with_options(
                name="pretrain", task_run_name="pretrain"
            )(pre)
            init = RunDir(pre.train.save_dir).pretrained
            cfg = cfg.model_copy(
                update={"train": cfg.train.model_copy(update={"pretrained_model": init})}
            )
        results[name] = stage_task(cfg)
    return results


def _pretrain_params(path: str, overrides: list[str], cfg: Params) -> Params:
    """The MLM run's params: ``path`` + ``overrides``, on the flow's prepared data.

    Raises:
        ConfigError: bad params, or not a ``task: mlm`` run.
    """
    pre = load_params(path, overrides)
    if pre.train.task != "mlm":
        raise ConfigError(f"pretrain={path}: train.task is {pre.train.task!r}, expected mlm")
    train = pre.train.model_copy(update={"data_dir": cfg.prepro.data_dir})
    return pre.model_copy(update={"train": train})


def with_dask(address: str | None = None, n_workers: int = 2) -> Any:
    """``xdpx_pipeline`` with prefect-dask's ``DaskTaskRunner``: on the Dask scheduler at
    ``address`` (``tcp://host:8786``: workers on other machines), or on a local cluster of
    ``n_workers`` single-threaded worker processes. Run it with ``prepro_tasks=True`` to
    spread prepro over the workers; with several machines, ``prepro.data_dir`` and the raw
    files must be on storage they all reach (``oss://``, ``s3://``, a shared disk).
    """
    import os

    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")  # before dask is imported
    from prefect_dask import DaskTaskRunner

    if address:
        return xdpx_pipeline.with_options(task_runner=DaskTaskRunner(address=address))
    cluster = {"n_workers": n_workers, "threads_per_worker": 1, "dashboard_address": ":0"}
    return xdpx_pipeline.with_options(task_runner=DaskTaskRunner(cluster_kwargs=cluster))


def main(argv: list[str] | None = None) -> None:
    """``python -m flows.pipeline [--params params.yaml] [--dask ADDRESS|local:N] [--pretrain FILE] [section.key=value ...]``.

    ``--pretrain params/pretrain-minilm.yaml`` runs that ``task: mlm`` config as a
    ``pretrain`` task before ``train``, which then fine-tunes its ``pretrained/``.

    ``--dask tcp://host:8786`` runs the task runs on that Dask scheduler's workers and
    ``--dask local:2`` on a local cluster of 2 worker processes; either maps prepro over
    the raw files (``prepro_tasks``). Exits with status 2 and a one-line ``error: ...``
    when the config is bad or a stage fails (the Prefect logs hold the traceback).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    params, dask, pretrain = "params.yaml", None, None
    while argv[:1] and argv[0] in ("--params", "-p", "--dask", "--pretrain"):
        if len(argv) < 2:
            print(f"error: {argv[0]} needs a value", file=sys.stderr)
            raise SystemExit(2)
        if argv[0] == "--dask":
            dask = argv[1]
        elif argv[0] == "--pretrain":
            pretrain = argv[1]
        else:
            params = argv[1]
        argv = argv[2:]
    pipeline, kw = xdpx_pipeline, {}
    if dask:
        local = dask.startswith("local:")
        pipeline = with_dask(None if local else dask, int(dask[6:]) if local else 2)
        kw = {"prepro_tasks": True}
    try:
        results = pipeline(params=params, overrides=list(argv), pretrain=pretrain, **kw)
    except (ConfigError, StageError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    metrics = results["evaluate"]["metrics"]
    print({split: {k: round(v, 4) for k, v in m.items()} for split, m in metrics.items()})


if __name__ == "__main__":
    main()
