"""Run under torchrun by tests/test_distributed.py: join one gloo process group, then train
every params file given on the command line in turn, each through ``stages.train``'s own
entry point (which finds the group joined and keeps it). One launch for many runs saves a
torchrun start (~5 s of imports and rendezvous) per run.

``python -m torch.distributed.run --standalone --nproc-per-node 2 tests/ddp_driver.py A.yaml B.yaml``
"""

from __future__ import annotations

import sys

import torch.distributed as dist

from stages import train


def main(params: list[str]) -> None:
    """Train each params file with ``python -m stages.train --params F``'s code, under DDP."""
    dist.init_process_group(backend="gloo")
    try:
        for path in params:
            # every rank starts a run together: a rank still finishing the previous run must
            # not find this run's directory already made by rank 0 (its pre-flight check
            # refuses a save_dir that holds a run); one torchrun launch per run (xdpx train
            # --nproc) gets this from the rendezvous
            dist.barrier()
            train.main(["--params", path])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
