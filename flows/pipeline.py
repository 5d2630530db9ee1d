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

Scheduled runs on work pools: see ``prefect.yaml`` and docs/scheduling.md
("Scheduling with Prefect").
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run as current_task_run

from stages.registry import STAGES
from xdpx.config import ConfigError, Params, load_params
from xdpx.errors import RemoteIOError
from xdpx.rundir import RunDir

__all__ = [
    "STAGES",
    "STAGE_TASKS",
    "IO_RETRY_DELAYS",
    "LATEST",
    "StageError",
    "run_overrides",
    "xdpx_pipeline",
    "main",
]

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
    def run_stage(params: Params, progress_key: str | None = None, nproc: int = 1) -> dict:
        stage = STAGES[name]
        cfg = getattr(params, name)
        try:
            if name == "train":
                cfg = _train_config_for_attempt(cfg)
            if name == "train" and nproc > 1:
                result = _train_under_torchrun(cfg, nproc)
                if progress_key is not None:
                    _Progress(progress_key).done(result)
            elif progress_key is not None:  # train: a progress artifact updated at each evaluation
                progress = _Progress(progress_key)
                result = stage.run(cfg, on_eval=progress)
                progress.done(result)
            else:
                result = stage.run(cfg)
        except Exception as e:
            raise StageError.wrap(name, e) from e
        get_run_logger().info("%s done: %s", name, _result_dict(result))
        return _result_dict(result)

    return run_stage


def _train_under_torchrun(cfg: Any, nproc: int) -> Any:
    """Run the train stage with ``cfg`` as ``nproc`` DDP processes on this node (the same
    ``torchrun`` that ``xdpx train --nproc`` starts: :func:`xdpx.train.launch.launch_torchrun`),
    the resolved train section handed over in a temporary params file; the result is read
    back from the run's ``result.json``.

    Raises:
        RuntimeError: torchrun exited non-zero (its output is in the worker's log).
    """
    from xdpx import io
    from xdpx.config import dump_yaml
    from xdpx.train.launch import launch_torchrun
    from xdpx.train.trainer import TrainResult

    fd, path = io.mkstemp("xdpx-train-", io.cache_dir("tmp"), suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(dump_yaml({"train": cfg.model_dump(mode="json")}))
        get_run_logger().info("train: %d processes under torchrun", nproc)
        status = launch_torchrun(nproc, ["--params", path])
    finally:
        os.unlink(path)
    if status != 0:
        raise RuntimeError(f"train under torchrun ({nproc} processes) exited with {status}; see the worker's output")  # fmt: skip
    result = json.loads(io.read_text(RunDir(cfg.save_dir).result))
    return TrainResult(**result)


STAGE_TASKS = {name: _stage_task(name) for name in STAGES}

#: The pointer file under ``runs_root`` naming the latest completed run (one line: its
#: directory name), written last and atomically.
LATEST = "LATEST"


class _Progress:
    """``on_eval`` for train: a progress artifact (updates done / the run's budget, in %)
    created at the first evaluation, updated at each one, and set to 100 by :meth:`done`
    (an early stop ends training before the budget)."""

    def __init__(self, key: str) -> None:
        self.key, self.id = key, None

    def _set(self, progress: float, what: str) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        if self.id is None:
            self.id = create_progress_artifact(progress, key=self.key, description=what)
        else:
            update_progress_artifact(self.id, progress, description=what)

    def __call__(self, event: Any) -> None:
        total = event.total_updates or event.update
        score = event.metrics.get(event.major_metric, float("nan"))
        what = f"train: {event.update} of {total} updates; valid {event.major_metric} {score:.4f}"
        self._set(min(100.0, 100.0 * event.update / max(total, 1)), what)

    def done(self, result: Any) -> None:
        self._set(100.0, f"train done: {result.num_updates} updates")


def run_dir_name() -> str:
    """``<UTC date>-<time>-<flow run name>`` (``20261126-030000-bright-fox``); ``local`` as
    the name outside a flow run."""
    import datetime

    from prefect.runtime import flow_run

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{flow_run.get_name() or 'local'}"


def run_overrides(params: str, overrides: list[str], run_dir: str) -> list[str]:
    """The overrides that move one flow run's outputs under ``run_dir``.

    Every relative output path of the config (``fetch.out_dir``, ``prepro.data_dir``,
    ``train.save_dir``, evaluate's reports, ``predict.out_file``) is put under ``run_dir``;
    the inputs that are another stage's outputs follow (``prepro.data_source`` when it is
    ``fetch.out_dir``, ``predict.data_file`` when it lies there; ``train.data_dir`` and the
    checkpoints default to their producers' params already). Absolute paths and URLs are
    left alone: they are the user's choice.

    Raises:
        ConfigError: bad params or overrides.
    """
    import posixpath

    cfg = load_params(params, overrides)

    def under(path: str) -> str | None:
        if "://" in path or posixpath.isabs(path):
            return None
        return posixpath.join(run_dir, path)

    out = []
    outputs = {
        "fetch.out_dir": cfg.fetch.out_dir,
        "prepro.data_dir": cfg.prepro.data_dir,
        "train.save_dir": cfg.train.save_dir,
        "evaluate.metrics_file": cfg.evaluate.metrics_file,
        "evaluate.confusion_png": cfg.evaluate.confusion_png,
        "evaluate.curve_png": cfg.evaluate.curve_png,
        "predict.out_file": cfg.predict.out_file,
    }
    for key, path in outputs.items():
        moved = under(path) if path else None
        if moved is not None:
            out.append(f"{key}={moved}")
    raw, moved_raw = cfg.fetch.out_dir.rstrip("/"), under(cfg.fetch.out_dir.rstrip("/"))
    if moved_raw is not None:
        if cfg.prepro.data_source.rstrip("/") == raw:
            out.append(f"prepro.data_source={moved_raw}")
        if cfg.predict.data_file.startswith(raw + "/"):
            out.append(f"predict.data_file={moved_raw}{cfg.predict.data_file[len(raw) :]}")
    return out


def _artifact_key(kind: str) -> str:
    """``xdpx-<deployment>-<kind>``: stable per deployment, so the UI's artifact history
    shows one series per deployment (``local`` outside a deployment); lower-case, dashes."""
    import re

    from prefect.runtime import deployment

    name = re.sub(r"[^a-z0-9-]+", "-", (deployment.name or "local").lower()).strip("-")
    return f"xdpx-{name}-{kind}"


def _publish(cfg: Params, results: dict[str, dict], run_dir: str, overrides: list[str], seconds: float, recorded: dict | None, push: bool) -> None:  # fmt: skip
    """The run's results in the Prefect UI: a metrics table (per split) and a markdown
    summary (data, model, overrides, run directory, DVC experiment, wall time)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    metrics = results["evaluate"]["metrics"]
    base = results.get("baseline") or {}
    base_acc = {"dev": base.get("dev_accuracy_best"), "test": base.get("test_accuracy")}
    table = []
    for split, m in metrics.items():
        row = {"split": split, **{k: round(float(m[k]), 4) for k in ("accuracy", "macro_f1", "loss") if k in m}}  # fmt: skip
        if base_acc.get(split) is not None:
            row["baseline_accuracy"] = round(float(base_acc[split]), 4)
        table.append(row)
    create_table_artifact(table, key=_artifact_key("metrics"), description=f"Final metrics of {run_dir}")  # fmt: skip
    train = results.get("train", {})
    rows = "\n".join(
        f"| {r['split']} | {r.get('accuracy', '')} | {r.get('macro_f1', '')} | {r.get('loss', '')} | {r.get('baseline_accuracy', '')} |"
        for r in table
    )
    baseline = f"`{base['model']}`, C={base['C']}" if base else "not run"
    summary = f"""# xdpx run {run_dir.rstrip("/").rsplit("/", 1)[-1]}

| | |
|---|---|
| run directory | `{run_dir}` |
| data | {", ".join(f"{n} {split}" for split, n in results.get("prepro", {}).get("rows", {}).items()) or "?"} rows |
| model | `{cfg.train.model}` |
| training samples | {train.get("samples_seen", "?")} seen in {train.get("num_updates", "?")} updates ({train.get("epochs", "?")} epochs) |
| best valid {cfg.train.major_metric} | {train.get("best_score", "?")} at update {train.get("best_update", "?")} |
| params that differ from the file | {", ".join(f"`{o}`" for o in overrides) or "none"} |
| checkpoint | `{RunDir(cfg.train.save_dir).best}` |
| DVC experiment | {_experiment_line(recorded, push)} |
| classical baseline | {baseline} |
| wall time | {seconds:.0f} s |

| split | accuracy | macro-F1 | loss | baseline accuracy |
|---|---|---|---|---|
{rows}
"""
    create_markdown_artifact(summary, key=_artifact_key("summary"), description=f"Summary of {run_dir}")  # fmt: skip


@task(name="baseline", task_run_name="baseline", cache_policy=NO_CACHE)
def baseline_task(prepro: Any) -> dict | None:
    """The classical baseline (TF-IDF + LR, :func:`xdpx.baselines.baseline_for`) on the run's
    raw train/dev/test.tsv; None, with a log line, for another raw layout."""
    from xdpx.baselines import baseline_for

    result = baseline_for(prepro)
    if result is None:
        get_run_logger().info("baseline: not run (raw files are not train/dev/test.tsv)")
    else:
        dev, test = result["dev_accuracy_best"], result["test_accuracy"]
        get_run_logger().info("baseline %s: dev %.4f, test %.4f", result["model"], dev, test)
    return result


@task(name="dvc-record", task_run_name="dvc exp save", cache_policy=NO_CACHE)
def record_task(run_dir: str, params: str, overrides: list[str], checkpoint: str) -> dict:
    """The flow run as a DVC experiment named after its run directory
    (:func:`studies.record.record_run`); the run directory itself is not changed."""
    from studies.record import record_run

    name = run_dir.rstrip("/").rsplit("/", 1)[-1]
    recorded = record_run(run_dir, name, params, overrides, checkpoint)
    get_run_logger().info("recorded as DVC experiment %s (%s)", name, recorded.rev[:7])
    return recorded.as_dict()


@task(name="dvc-push", task_run_name="dvc exp push", cache_policy=NO_CACHE)
def push_task(recorded: dict, git_remote: str) -> dict:
    """``dvc exp push``: the experiment's git ref and its data (:func:`studies.record.push_run`),
    then a link artifact to the checkpoint on the DVC remote."""
    from prefect.artifacts import create_link_artifact

    from studies.record import push_run

    remote = push_run(recorded["name"], git_remote)
    url = remote.object_url(recorded["checkpoint_md5"])
    create_link_artifact(
        url,
        link_text=f"{recorded['checkpoint']} on {remote.dvc_remote}",
        key=_artifact_key("checkpoint"),
        description=(
            f"The best checkpoint of experiment {recorded['name']} on DVC remote "
            f"{remote.dvc_remote}; get it back: dvc exp pull {git_remote} {recorded['name']} "
            f"&& dvc exp apply {recorded['name']}"
        ),
    )
    get_run_logger().info("pushed experiment %s: %s", recorded["name"], url)
    return {"git_remote": git_remote, "dvc_remote": remote.dvc_remote, "checkpoint_url": url}


def _experiment_line(recorded: dict | None, push: bool) -> str:
    if recorded is None:
        return "none: the worker's checkout is not a git + DVC repository"
    return f"`{recorded['name']}` ({'pushed' if push else 'on the worker'})"


def _point_latest(runs_root: str, run_dir: str) -> None:
    """Write ``<runs_root>/LATEST`` (the run directory's name), atomically and last."""
    from xdpx import io

    io.write_text(io.join(runs_root, LATEST), run_dir.rstrip("/").rsplit("/", 1)[-1] + "\n")


@task(
    name="prepro-file",
    task_run_name="prepro {job.label}",
    cache_policy=NO_CACHE,
    retries=len(IO_RETRY_DELAYS),
    retry_delay_seconds=list(IO_RETRY_DELAYS),
    retry_condition_fn=_retry_on_remote_io,
)
def prepro_file(job: Any) -> Any:
    """One raw file's pass of prepro (a ``stages.prepro`` ``CountJob``, ``TokenizeJob``,
    ``RemapJob`` or ``EncodeJob``), run wherever the flow's task runner puts it (a Dask
    worker: its chunks in that process)."""
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
    runs_root: str | None = None,
    baseline: bool = False,
    record: bool = True,
    push: bool = False,
    git_remote: str = "origin",
    train_nproc: int = 1,
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
        runs_root: give each flow run its own directory ``<runs_root>/<UTC date>-<time>-<flow
            run name>`` holding all its outputs (:func:`run_overrides`: data, model, reports),
            so no run replaces another's or ``dvc repro``'s; at the end the run's metrics
            table and summary become Prefect artifacts and ``<runs_root>/LATEST`` names it.
            None: write where the params say (like ``dvc repro``). The deployments in
            ``prefect.yaml`` set ``models/runs``.
        baseline: with ``runs_root``, also fit the classical baseline (TF-IDF + LR,
            :func:`xdpx.baselines.baseline_for`) on the run's raw train/dev/test.tsv; its dev
            and test accuracy go into the metrics table and summary. In memory: leave it off
            for corpora larger than memory.
        record: with ``runs_root``, record the run as the DVC experiment named after its
            run directory (:func:`studies.record.record_run`: ``dvc exp show`` lists it with
            its params and metrics) when the working directory is a git + DVC repository;
            elsewhere the run is left unrecorded with a warning.
        push: with ``runs_root``, also ``dvc exp push`` the recorded run to ``git_remote``
            (its git ref) and the default DVC remote (its data), then add a link artifact to
            the checkpoint there. Both remotes are checked before any stage runs; a push that
            fails fails the flow run, naming the remotes, with the run on local disk,
            recorded, and named by ``LATEST``.
        git_remote: the git remote ``push`` sends the experiment's ref to.
        train_nproc: train (and ``pretrain``) as this many DDP processes on the worker
            (``torchrun --nproc-per-node``: one per GPU, NCCL; gloo on CPU); the other
            stages run once, in the flow. 1: in the flow's process. With more, the progress
            artifact is set when training ends (the evaluations happen in the processes).

    Returns:
        stage name -> that stage's result as a dict.

    Raises:
        xdpx.config.ConfigError: bad params or overrides, or ``pretrain`` not a ``task: mlm``
            config (before any stage runs).
        StageError: a stage failed (after its retries, for remote IO errors).
        studies.record.RecordError: ``push`` without a git + DVC repository or without the
            remotes (before any stage runs), or recording/pushing failed (at the end).
    """
    import time

    from studies.record import is_dvc_repo, remote_of

    start = time.perf_counter()
    overrides = list(overrides or [])
    run_dir = None
    if runs_root:
        run_dir = f"{runs_root.rstrip('/')}/{run_dir_name()}"
        moved = run_overrides(params, overrides, run_dir)
        get_run_logger().info("this run's directory: %s (%s)", run_dir, ", ".join(moved))
        cfg = load_params(params, overrides + moved)
        if push:  # before hours of training: a push with nowhere to go fails now
            remote = remote_of(git_remote)
            get_run_logger().info("will push to %s and %s", remote.git_url, remote.dvc_url)
    else:
        cfg = load_params(params, overrides)
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
            )(pre, nproc=train_nproc)
            init = RunDir(pre.train.save_dir).pretrained
            cfg = cfg.model_copy(
                update={"train": cfg.train.model_copy(update={"pretrained_model": init})}
            )
        if name == "train":
            key = _artifact_key("progress") if run_dir is not None else None
            results[name] = stage_task(cfg, progress_key=key, nproc=train_nproc)
        else:
            results[name] = stage_task(cfg)
    if run_dir is not None:
        if baseline:
            results["baseline"] = baseline_task(cfg.prepro)
        recorded = None
        if (record or push) and is_dvc_repo("."):
            home = load_params(params, overrides).train.save_dir  # the experiment's layout
            recorded = record_task(run_dir, params, overrides, RunDir(home).best)
        elif record:
            get_run_logger().warning(
                "run not recorded with DVC: %s is not a git repository with .dvc/", os.getcwd()
            )
        _publish(cfg, results, run_dir, overrides, time.perf_counter() - start, recorded, push)
        _point_latest(runs_root, run_dir)
        results["run"] = {"run_dir": run_dir, "experiment": recorded}
        if push:
            results["push"] = push_task(recorded, git_remote)
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
    """``python -m flows.pipeline [--params params.yaml] [--dask ADDRESS|local:N] [--pretrain FILE] [--train-nproc N] [section.key=value ...]``.

    ``--train-nproc N`` trains with N DDP processes (``train_nproc``; e.g. one per GPU).

    ``--pretrain params/pretrain-minilm.yaml`` runs that ``task: mlm`` config as a
    ``pretrain`` task before ``train``, which then fine-tunes its ``pretrained/``.

    ``--dask tcp://host:8786`` runs the task runs on that Dask scheduler's workers and
    ``--dask local:2`` on a local cluster of 2 worker processes; either maps prepro over
    the raw files (``prepro_tasks``). Exits with status 2 and a one-line ``error: ...``
    when the config is bad or a stage fails (the Prefect logs hold the traceback).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    params, dask, pretrain, nproc = "params.yaml", None, None, 1
    while argv[:1] and argv[0] in ("--params", "-p", "--dask", "--pretrain", "--train-nproc"):
        if len(argv) < 2 or (argv[0] == "--train-nproc" and not argv[1].isdigit()):
            print(f"error: {argv[0]} needs a value", file=sys.stderr)
            raise SystemExit(2)
        if argv[0] == "--dask":
            dask = argv[1]
        elif argv[0] == "--pretrain":
            pretrain = argv[1]
        elif argv[0] == "--train-nproc":
            nproc = int(argv[1])
        else:
            params = argv[1]
        argv = argv[2:]
    pipeline, kw = xdpx_pipeline, {}
    if dask:
        local = dask.startswith("local:")
        pipeline = with_dask(None if local else dask, int(dask[6:]) if local else 2)
        kw = {"prepro_tasks": True}
    try:
        results = pipeline(params=params, overrides=list(argv), pretrain=pretrain, train_nproc=nproc, **kw)  # fmt: skip
    except (ConfigError, StageError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    metrics = results["evaluate"]["metrics"]
    print({split: {k: round(v, 4) for k, v in m.items()} for split, m in metrics.items()})


if __name__ == "__main__":
    main()
