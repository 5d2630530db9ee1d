"""Stage ``train``: build ``train.model`` from the prepared data's meta and run the Trainer.

Writes ``<save_dir>/{best,last}/`` checkpoints, ``train.log.tsv``,
``valid.log.tsv``, ``dvclive/`` and the reproducibility bundle
(``params.yaml``, ``starter.yaml``, ``repro.json``).
"""

from __future__ import annotations

import json
import logging
import platform
import subprocess
import sys

import torch

from xdpx import io
from xdpx.config import TrainConfig, dump_yaml, non_defaults
from xdpx.data import load_split
from xdpx.models import build_model, model_config_from
from xdpx.stage import stage_main
from xdpx.trainer import Trainer, TrainResult

log = logging.getLogger("xdpx.train")

#: Files whose presence means save_dir already holds a run (``export/`` alone does not count).
RUN_MARKERS = ("best", "last", "train.log.tsv", "valid.log.tsv", "params.yaml")


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def write_bundle(cfg: TrainConfig, meta: dict) -> None:
    """Reproducibility bundle: resolved params, non-default starter config, code and library versions."""
    import transformers

    io.write_text(
        io.join(cfg.save_dir, "params.yaml"),
        dump_yaml({"train": cfg, "prepro": meta.get("prepro", {})}),
    )
    io.write_text(io.join(cfg.save_dir, "starter.yaml"), dump_yaml({"train": non_defaults(cfg)}))
    repro = {
        "command": sys.argv,
        "git_commit": _git("rev-parse", "HEAD").strip(),
        "git_dirty_diff": _git("diff", "HEAD"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    io.write_text(io.join(cfg.save_dir, "repro.json"), json.dumps(repro, indent=2))


def run(cfg: TrainConfig) -> TrainResult:
    """Train one model; see the module docstring for the outputs.

    Raises:
        FileNotFoundError: ``data_dir`` has no ``meta.json`` (run prepro first).
        FileExistsError: ``save_dir`` exists and ``overwrite`` is false.
    """
    meta_path = io.join(cfg.data_dir, "meta.json")
    if not io.exists(meta_path):
        raise FileNotFoundError(f"train.data_dir: {meta_path} not found; run prepro first")
    previous = [name for name in RUN_MARKERS if io.exists(io.join(cfg.save_dir, name))]
    if previous:
        if not cfg.overwrite:
            raise FileExistsError(
                f"train.save_dir: {cfg.save_dir} already holds a run ({', '.join(previous)}); "
                "set train.overwrite=true to replace it"
            )
        io.rm(cfg.save_dir, recursive=True)
    meta = json.loads(io.read_text(meta_path))
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    train = load_split(cfg.data_dir, cfg.train_subset)
    has_valid = cfg.valid_subset in meta.get("splits", {})
    valid = load_split(cfg.data_dir, cfg.valid_subset) if has_valid else None
    if valid is None:
        log.warning("no %r split in %s: no evaluation, best = last", cfg.valid_subset, cfg.data_dir)
    torch.manual_seed(cfg.seed)  # parameter init by seed (FAQ)
    model_config = model_config_from(
        cfg.model, cfg, meta["vocab_size"], meta["num_labels"], meta.get("pad_id", 0)
    )
    model = build_model(cfg.model, model_config)
    io.makedirs(cfg.save_dir)
    write_bundle(cfg, meta)
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "model %s: %d parameters; %d train / %d valid samples",
        cfg.model,
        n_params,
        len(train.input_ids),
        len(valid.input_ids) if valid else 0,
    )
    trainer = Trainer(
        model,
        cfg,
        train.input_ids,
        train.labels,
        valid.input_ids if valid else None,
        valid.labels if valid else None,
        model_name=cfg.model,
        model_config=model_config,
        assets_dir=cfg.data_dir,
        pad_id=meta.get("pad_id", 0),
    )
    result = trainer.fit()
    io.write_text(io.join(cfg.save_dir, "result.json"), json.dumps(result.__dict__, indent=2))
    return result


def main(argv: list[str] | None = None) -> TrainResult:
    """``python -m stages.train [--params params.yaml] [train.key=value ...]``."""
    return stage_main(
        "train",
        run,
        lambda r: (
            f"trained {r.num_updates} updates ({r.samples_seen} samples, {r.epochs} epochs); "
            f"best valid {r.major_metric}={r.best_score} at update {r.best_update}"
        ),
        argv,
    )


if __name__ == "__main__":
    main()
