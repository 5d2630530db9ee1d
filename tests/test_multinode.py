"""Two "nodes" on one machine, launched as on two hosts: ``xdpx train --nnodes 2
--rdzv-endpoint 127.0.0.1:PORT --rdzv-id ID`` started twice, separately, each in its own
working directory with its own copy of the prepared data; they share only the run
directory (shared storage). Gloo, one process per node. The default config as shipped
(``ngram_lr``, sparse gradients: ``xdpx.train.ddp``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
import yaml
from test_distributed import DEFAULT, assert_same_weights, train

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nodes(tmp_path: Path, prepared: str, run: Path, **train) -> list[Path]:
    """Two node directories, each with ``data/prepared`` (a copy) and ``params.yaml``
    whose data_dir is relative (each node reads its own copy) and save_dir the shared run."""
    nodes = []
    for k in (0, 1):
        node = tmp_path / f"node{k}"
        shutil.copytree(prepared, node / "data" / "prepared")
        cfg = {"data_dir": "data/prepared", "save_dir": str(run), **DEFAULT, **train}
        (node / "params.yaml").write_text(yaml.safe_dump({"train": cfg}))
        nodes.append(node)
    return nodes


def _start(node: Path, port: int, rdzv_id: str, *overrides: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "xdpx.cli", "train", *overrides, "--params", "params.yaml"]
    cmd += ["--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv_id]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        cmd, cwd=node, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # a process group per node: kill -9 takes the whole "host"
    )  # fmt: skip


def _finish(procs: list[subprocess.Popen], timeout: float = 300) -> list[str]:
    errs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            _, err = p.communicate()
            err = "TIMEOUT\n" + err
        errs.append(err)
    return errs


def _kill_node(proc: subprocess.Popen) -> None:
    """kill -9 every process of a node, as when its host dies: the CLI, torchrun's agent and
    the agent's workers, which torch's elastic agent starts in sessions of their own (so
    killing the node's process group alone leaves a worker training on)."""
    root = psutil.Process(proc.pid)
    tree = [root, *root.children(recursive=True)]
    assert any("stages.train" in " ".join(p.cmdline()) for p in tree[1:]), "no worker yet"
    for p in tree:
        p.kill()
    psutil.wait_procs(tree[1:], timeout=30)  # the root is ours: Popen reaps it (its -9)


#: The default config for 100 updates, lazily loaded, a full checkpoint every 10 updates
#: (what a resume needs) and the sample ids of every update logged.
LONGER = {"max_update": 100, "save_interval": 10, "save_full_checkpoint": True, "log_sample_ids": True, "lazy_load": True}  # fmt: skip


@pytest.fixture(scope="module")
def whole(real_subset, tmp_path_factory) -> tuple[Path, list[Path]]:
    """Two nodes trained without interruption (:data:`LONGER`, batch 8 each); returns the run
    directory and the node directories."""
    _, prepared = real_subset
    root = tmp_path_factory.mktemp("whole")
    run = root / "shared" / "run"
    nodes = _nodes(root, prepared, run, batch_size=8, **LONGER)
    port = _free_port()
    procs = [_start(node, port, "whole") for node in nodes]
    errs = _finish(procs)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-2000:] for e in errs)
    return run, nodes


def test_two_nodes_equal_one_process_with_twice_the_batch(whole, real_subset, tmp_path):
    _, prepared = real_subset
    run, nodes = whole
    single = train(tmp_path, prepared, "single", 1, batch_size=16, **LONGER)
    assert_same_weights(single, run)
    for log in ("samples.log.tsv", "valid.log.tsv"):
        assert (run / log).read_text() == (single / log).read_text(), log
    a, b = (pd.read_csv(r / "train.log.tsv", sep="\t") for r in (single, run))
    pd.testing.assert_series_equal(a["loss"], b["loss"], rtol=1e-5)
    assert json.loads((run / "repro.json").read_text())["world_size"] == 2
    # the nodes wrote nothing in their own directories but what they were given
    for node in nodes:
        assert sorted(p.name for p in node.iterdir()) == ["data", "params.yaml"]


def test_killing_one_node_then_restarting_both_with_resume_ends_as_uninterrupted(
    whole, real_subset, tmp_path
):
    _, prepared = real_subset
    run = tmp_path / "shared" / "run"
    nodes = _nodes(tmp_path, prepared, run, batch_size=8, **LONGER)
    port = _free_port()
    procs = [_start(node, port, "first") for node in nodes]
    state = run / "last" / "trainer_state.json"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if json.loads(state.read_text())["num_updates"] >= 10:
                break
        except (OSError, ValueError):  # not there yet, or caught between a save's renames
            pass
        time.sleep(0.05)
    assert all(p.poll() is None for p in procs), "the run ended before the kill: make it longer"
    _kill_node(procs[1])  # node 1 dies (its agent and its worker)
    errs = _finish(procs, timeout=180)
    assert procs[1].returncode == -signal.SIGKILL
    assert procs[0].returncode != 0, "node 0 must notice that node 1 is gone"
    assert not (run / "result.json").exists()

    port = _free_port()
    procs = [_start(node, port, "again", "train.resume=true") for node in nodes]
    errs = _finish(procs)
    assert [p.returncode for p in procs] == [0, 0], "\n".join(e[-2000:] for e in errs)
    # the same two nodes, never interrupted
    uninterrupted = whole[0]
    assert_same_weights(uninterrupted, run)
    for log in ("samples.log.tsv", "valid.log.tsv", "train.log.tsv"):
        assert (run / log).read_text() == (uninterrupted / log).read_text(), log
    assert json.loads((run / "repro.json").read_text())["resumed_from"].endswith("last")
