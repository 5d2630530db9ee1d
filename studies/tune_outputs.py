"""What a tuning study writes (:mod:`studies.tune`): the trials table, the best trial's params file
(every override kept, so training from it reads the tuned data), and Optuna's plots."""

from __future__ import annotations

import io as _bytes_io
import os
from typing import Any

import yaml

from studies.tune import RESERVED_KEYS, TuneConfig, _decode_choice, _prepared_dir, _yaml_value
from xdpx import io


# ------------------------------------------------------------------ outputs
def _trials_table(study: Any, space_keys: list[str]) -> str:
    keys = list(space_keys)
    for t in study.trials:
        keys += [k for k in t.params if k not in keys]
    cols = ["number", "state", "value", "duration_s", "last_samples_seen", "last_value"]
    cols += keys + ["save_dir"]
    lines = ["\t".join(cols)]
    for t in study.trials:
        last = t.last_step
        row = [
            t.number,
            t.state.name,
            "" if t.value is None else f"{t.value:.6g}",
            "" if t.duration is None else f"{t.duration.total_seconds():.1f}",
            "" if last is None else last,
            "" if last is None else f"{t.intermediate_values[last]:.6g}",
        ]
        row += [_yaml_value(_decode_choice(t.params[k])) if k in t.params else "" for k in keys]
        row.append(t.user_attrs.get("save_dir", ""))
        lines.append("\t".join(str(v) for v in row))
    return "\n".join(lines) + "\n"


#: Keys each trial gets from xdpx tune (its own run and data directories), left out of
#: ``best_params.yaml``; every other override the tune command received is kept.
TRIAL_KEYS = RESERVED_KEYS - {"prepro.data_source", "prepro.data_files", "train.major_metric", "train.valid_subset"}  # fmt: skip


def _best_params_yaml(cfg: TuneConfig, study: Any, out_path: str, metric: str) -> str | None:
    """The best trial as a params file: ``extends:`` the base, then every override the tune
    command received (any section: ``prepro.data_source=/my/data`` too), the tuned values,
    and ``prepro.data_dir``: the prepared data the best trial trained on (the study's, or
    the trial's own when the space tunes ``prepro.*``), so ``xdpx train best_params.yaml``
    trains on the same data."""
    from xdpx.config import parse_override

    try:
        best = study.best_trial
    except ValueError:  # no completed trial yet
        return None
    body: dict[str, dict[str, Any]] = {}
    for item in cfg.overrides:
        section, key, value = parse_override(item)
        if f"{section}.{key}" not in TRIAL_KEYS:
            body.setdefault(section, {})[key] = value
    for name, value in best.params.items():
        section, _, key = name.partition(".")
        body.setdefault(section, {})[key] = _decode_choice(value)
    body.setdefault("prepro", {})["data_dir"] = _prepared_dir(cfg, best.user_attrs.get("save_dir"))  # fmt: skip
    doc: dict[str, Any] = {}
    if io.exists(cfg.params):
        base = cfg.params
        if io.is_local(base) and io.is_local(out_path):
            base = os.path.relpath(
                os.path.abspath(base), os.path.dirname(os.path.abspath(out_path))
            )
        doc["extends"] = base
    doc.update(body)
    head = (
        f"# xdpx tune: best trial {best.number} of study {study.study_name!r}: "
        f"dev {metric} = {best.value:.6g} (trial dir {best.user_attrs.get('save_dir', '?')})\n"
        f"# train it: xdpx train {out_path} train.save_dir=models/best\n"
    )
    return head + yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


def _plot(fn: Any, study: Any, path: str, title: str, xlabel: str, ylabel: str) -> None:
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
        ax = fn(study)
    fig = ax.figure
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    fig.set_size_inches(8, 5)
    fig.tight_layout()
    buf = _bytes_io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    io.write_bytes(path, buf.getvalue())


def _write_outputs(cfg: TuneConfig, study: Any, metric: str, plots: bool) -> dict[str, str]:
    from optuna.trial import TrialState

    study_dir = io.join(cfg.out_dir, cfg.study)
    paths = {"trials": io.join(study_dir, "trials.tsv")}
    io.write_text(paths["trials"], _trials_table(study, list(cfg.space)))
    best_path = io.join(study_dir, "best_params.yaml")
    text = _best_params_yaml(cfg, study, best_path, metric)
    if text is not None:
        io.write_text(best_path, text)
        paths["best_params"] = best_path
    if plots and study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        import optuna.visualization.matplotlib as ovm

        paths["history"] = io.join(study_dir, "history.png")
        _plot(
            ovm.plot_optimization_history,
            study,
            paths["history"],
            f"study {cfg.study}: value of each finished trial",
            "trial",
            f"best dev {metric}",
        )
        if any(t.intermediate_values for t in study.trials):
            paths["intermediate"] = io.join(study_dir, "intermediate.png")
            _plot(
                ovm.plot_intermediate_values,
                study,
                paths["intermediate"],
                f"study {cfg.study}: every evaluation (pruned trials stop early)",
                "training samples seen",
                f"dev {metric}",
            )
    return paths
