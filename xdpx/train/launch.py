"""Several processes and nodes: the ``torchrun`` command ``xdpx train --nproc/--nnodes``
relaunches itself under, and each process's join of the process group.

``stages.train.main`` calls :func:`relaunch_if_asked` first: with ``--nproc N`` (N > 1) or
``--nnodes M`` (M > 1) it re-runs the same command under ``torchrun`` and exits with its
status; each process started that way then calls :func:`init_distributed`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["init_distributed", "launch_torchrun", "relaunch_if_asked", "torchrun_command"]

log = logging.getLogger("xdpx.train")


def torchrun_command(
    nproc: int,
    argv: list[str],
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "xdpx",
) -> list[str]:
    """The ``torchrun`` command line that runs ``python -m stages.train argv`` with
    ``nproc`` processes on this node: ``--standalone`` on one node; on ``nnodes`` > 1 the
    c10d rendezvous at ``rdzv_endpoint`` (``host:port`` of one of the nodes, the same on
    every node; the node that can bind it hosts the store) with the job id ``rdzv_id``, as
    PyTorch's multi-node recipe launches it on each host. Global ranks come from the
    rendezvous; rank 0 (on whichever node) alone writes the run directory.

    Raises:
        ValueError: ``nnodes`` > 1 without ``rdzv_endpoint``.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes > 1:
        if not rdzv_endpoint:
            raise ValueError("--nnodes > 1 needs --rdzv-endpoint HOST:PORT (the same on every node)")  # fmt: skip
        cmd += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id]
    else:
        cmd += ["--standalone"]
    return cmd + ["--nproc-per-node", str(nproc), "-m", "stages.train", *argv]


def launch_torchrun(nproc: int, argv: list[str], **nodes: Any) -> int:
    """Re-run ``python -m stages.train argv`` under :func:`torchrun_command`.

    Returns:
        torchrun's exit status.
    """
    cmd = torchrun_command(nproc, argv, **nodes)
    log.info("launching %s", " ".join(cmd))
    return subprocess.call(cmd)


def _pop_option(args: list[str], name: str, kind: type, example: str) -> Any:
    """Remove ``name VALUE`` from ``args``; the value as ``kind``, or None when absent."""
    if name not in args:
        return None
    i = args.index(name)
    try:
        value = kind(args[i + 1])
    except (IndexError, ValueError):
        print(f"error: {name} needs a value, e.g. {name} {example}", file=sys.stderr)
        raise SystemExit(2) from None
    del args[i : i + 2]
    return value


def init_distributed(device: str) -> bool:
    """Join the torchrun process group (gloo on CPU, NCCL on CUDA, by ``train.device``: ``cpu``,
    ``cuda`` or ``auto``); False when not under torchrun or already joined."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or dist.is_initialized():
        return False
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return True


def relaunch_if_asked(args: list[str]) -> list[str]:
    """Take ``--nproc N``, ``--nnodes M``, ``--rdzv-endpoint HOST:PORT`` and ``--rdzv-id ID``
    out of ``args``; with N > 1 or M > 1 (and not already under torchrun) re-run
    ``stages.train`` with the rest under :func:`torchrun_command` and exit with its status.

    Returns:
        ``args`` without those options (the run goes on in this process).

    Raises:
        SystemExit: after a relaunch (torchrun's status), or 2 on a bad option.
    """
    args = list(args)
    nproc = _pop_option(args, "--nproc", int, "2") or 1
    nnodes = _pop_option(args, "--nnodes", int, "2") or 1
    endpoint = _pop_option(args, "--rdzv-endpoint", str, "10.0.0.1:29400")
    rdzv_id = _pop_option(args, "--rdzv-id", str, "run1") or "xdpx"
    if (nproc > 1 or nnodes > 1) and "LOCAL_RANK" not in os.environ:
        logging.basicConfig(level=logging.INFO)
        try:
            nodes = {"nnodes": nnodes, "rdzv_endpoint": endpoint, "rdzv_id": rdzv_id}
            raise SystemExit(launch_torchrun(nproc, args, **nodes))
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    return args
