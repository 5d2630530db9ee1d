"""e2e: DVC remotes on the local object store: `dvc push` of data/prepared and models/, then
`dvc pull` into a fresh `git clone`, bit-identical; dvc-oss (oss://) and dvc-s3 (s3://).

DVC runs as a user's plain `dvc` would, in an interpreter whose site-packages holds the .pth
the xdpx wheel installs (fixture xdpx_site_python), so the aiooss2 fix reaches it the way it
reaches users; with XDPX_AIOOSS2_FIX=0 the same `dvc push` to OSS fails (aiooss2 issue #96).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
TRACKED = ("data/prepared", "models")


@pytest.fixture(scope="module")
def artifacts(real_subset, tmp_path_factory):
    """Real outputs to version: prepro of the corpus subset and a 4-update TextCNN run."""
    from stages import train
    from xdpx.config import TrainConfig

    _, prepared = real_subset
    run_dir = tmp_path_factory.mktemp("models") / "tiny"
    train.run(
        TrainConfig(
            data_dir=prepared,
            save_dir=str(run_dir),
            model="textcnn",
            embedding_dim=16,
            num_filters=8,
            max_update=4,
            batch_size=32,
        )
    )
    return Path(prepared), run_dir


def digests(root: Path) -> dict[str, str]:
    """md5 of every file under the tracked paths, keyed by path relative to ``root``."""
    out = {}
    for top in TRACKED:
        for path in sorted((root / top).rglob("*")):
            if path.is_file():
                out[str(path.relative_to(root))] = hashlib.md5(path.read_bytes()).hexdigest()
    return out


def run(argv: list[str], cwd: Path, env: dict, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if ok:
        assert proc.returncode == 0, f"{argv[-3:]}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def base_env(store) -> dict:
    """No store credentials or endpoints: each test passes them the way its recipe says."""
    env = {k: v for k, v in os.environ.items() if k not in store.env()}
    env.update(
        PYTHONPATH=str(ROOT),  # this checkout's xdpx (the .pth imports xdpx.patches)
        DVC_NO_ANALYTICS="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
    )
    env.pop("XDPX_AIOOSS2_FIX", None)
    return env


def make_repo(root: Path, artifacts, dvc, env) -> None:
    """git + dvc repo tracking a copy of data/prepared and models/<run> with `dvc add`."""
    prepared, run_dir = artifacts
    root.mkdir()
    run(["git", "init", "-q"], root, env)
    run(dvc + ["init", "-q"], root, env)
    shutil.copytree(prepared, root / "data" / "prepared")
    shutil.copytree(run_dir, root / "models" / run_dir.name)
    run(dvc + ["add", *TRACKED], root, env)
    run(["git", "add", "-A"], root, env)
    run(["git", "commit", "-qm", "data and models"], root, env)


def remote_config(protocol: str, store, bucket: str) -> tuple[list[list[str]], list[list[str]]]:
    """README recipe: (committed `dvc remote` commands, --local credential commands)."""
    if protocol == "oss":
        shared = [
            ["remote", "add", "-d", "storage", f"oss://{bucket}/xdpx"],
            ["remote", "modify", "storage", "oss_endpoint", store.oss_endpoint],
        ]
        env = store.env()
        local = [
            ["remote", "modify", "--local", "storage", "oss_key_id", env["OSS_ACCESS_KEY_ID"]],
            [
                "remote",
                "modify",
                "--local",
                "storage",
                "oss_key_secret",
                env["OSS_ACCESS_KEY_SECRET"],
            ],
        ]
    else:  # s3: endpoint in the shared config, keys from the environment (AWS_*)
        shared = [
            ["remote", "add", "-d", "storage", f"s3://{bucket}/xdpx"],
            ["remote", "modify", "storage", "endpointurl", store.s3_endpoint],
        ]
        local = []
    return shared, local


def credential_env(protocol: str, store, env: dict) -> dict:
    if protocol == "oss":
        return env  # keys only in .dvc/config.local
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    keys += ("AWS_EC2_METADATA_DISABLED", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
    return {**env, **{k: store.env()[k] for k in keys}}


def remote_repo(protocol, store_bucket, artifacts, dvc, tmp_path):
    """A committed repo with the README's remote recipe applied; returns (repo, env, local)."""
    store = store_bucket.store
    env = credential_env(protocol, store, base_env(store))
    repo = tmp_path / "repo"
    make_repo(repo, artifacts, dvc, env)
    shared, local = remote_config(protocol, store, store_bucket.name)
    for args in shared + local:
        run(dvc + args, repo, env)
    run(["git", "add", ".dvc/config"], repo, env)
    run(["git", "commit", "-qm", "remote"], repo, env)
    return repo, env, local


def pull_into_clone(repo: Path, clone: Path, dvc, env, local) -> None:
    """`git clone` + the --local credential lines (a clone has no config.local) + `dvc pull`."""
    run(["git", "clone", "-q", str(repo), str(clone)], repo.parent, env)
    assert not (clone / "data" / "prepared").exists()
    for args in local:
        run(dvc + args, clone, env)
    run(dvc + ["pull"], clone, env)


def oid_of(key: str) -> str:
    """The object name of a DVC cache key on the remote: ``.../md5/ab/cdef...`` -> ``abcdef...``
    (``.dir`` kept)."""
    return key.split("/md5/")[1].replace("/", "")


def remote_gaps(store_bucket) -> list[str]:
    """md5 values that a ``.dir`` listing on the remote names but the remote does not hold.

    DVC trusts a ``.dir`` on a remote to mean all its files are there, so a gap is a file no
    later ``dvc push`` uploads and every ``dvc pull`` fails on.
    """
    import json

    keys = store_bucket.keys("xdpx/files/md5/")
    held = {oid_of(key) for key in keys}
    listed = {
        entry["md5"]
        for key in keys
        if key.endswith(".dir")
        for entry in json.loads(store_bucket.get_bytes(key))
    }
    return sorted(listed - held)


def remote_damage(store_bucket) -> list[str]:
    """Keys of the DVC cache on the remote whose bytes do not hash to their name."""
    bad = []
    for key in store_bucket.keys("xdpx/files/md5/"):
        name = oid_of(key).removesuffix(".dir")
        if hashlib.md5(store_bucket.get_bytes(key)).hexdigest() != name:
            bad.append(key)
    return bad


@pytest.mark.parametrize("protocol", ["oss", "s3"])
def test_push_then_pull_into_fresh_clone_is_bit_identical(
    protocol, store_bucket, artifacts, xdpx_site_python, tmp_path
):
    from objstore import SECRET_MARKER

    store = store_bucket.store
    dvc = xdpx_site_python + ["-m", "dvc"]
    repo, env, local = remote_repo(protocol, store_bucket, artifacts, dvc, tmp_path)

    # the secret is in .dvc/config.local (git-ignored) or the env, never in what git tracks
    committed = run(["git", "log", "-p", "--all"], repo, env).stdout
    assert "oss_endpoint" in committed or "endpointurl" in committed
    assert SECRET_MARKER not in committed
    assert SECRET_MARKER not in (repo / ".dvc" / "config").read_text()
    if local:
        assert SECRET_MARKER in (repo / ".dvc" / "config.local").read_text()
        run(["git", "check-ignore", "-q", ".dvc/config.local"], repo, env)

    if protocol == "oss":  # the failure the aiooss2 fix prevents, in a plain `dvc push`
        broken = run(dvc + ["push"], repo, {**env, "XDPX_AIOOSS2_FIX": "0"}, ok=False)
        assert broken.returncode != 0
        assert "abstract method decode" in broken.stdout + broken.stderr
        store.reset_stats()
    pushed = run(dvc + ["push"], repo, env)
    assert store.stats.by_front[protocol] > 0  # went through the front under test
    want = digests(repo)
    assert len(want) >= 8 and any(p.endswith(".parquet") for p in want)
    assert any(p.endswith("model.safetensors") for p in want)
    blobs = [k for k in store_bucket.keys("xdpx/") if not k.endswith(".dir")]
    assert len(blobs) == len(set(want.values())), pushed.stdout
    assert remote_damage(store_bucket) == []

    clone = tmp_path / "clone"
    pull_into_clone(repo, clone, dvc, env, local)
    assert digests(clone) == want
    status = run(dvc + ["status", "-c"], clone, env).stdout
    assert "up to date" in status.lower() or "in sync" in status.lower(), status


@pytest.mark.parametrize("protocol", ["oss", "s3"])
def test_push_and_pull_ride_out_20_percent_transient_faults(
    protocol, store_bucket, artifacts, xdpx_site_python, tmp_path
):
    store = store_bucket.store
    dvc = xdpx_site_python + ["-m", "dvc"]
    repo, env, local = remote_repo(protocol, store_bucket, artifacts, dvc, tmp_path)
    store.fail_rate = 0.2  # HTTP 503s and connection resets, on every request of push and pull
    if protocol == "oss":  # without xdpx's ossfs retries one fault ends the whole push
        broken = run(dvc + ["push"], repo, {**env, "XDPX_OSS_RETRY": "0"}, ok=False)
        assert broken.returncode != 0, broken.stdout
        assert remote_damage(store_bucket) == []  # what did land is whole
    run(dvc + ["push"], repo, env)
    assert remote_damage(store_bucket) == []
    assert remote_gaps(store_bucket) == []
    pull_into_clone(repo, tmp_path / "clone", dvc, env, local)
    assert digests(tmp_path / "clone") == digests(repo)
    assert store.stats.faults >= 10 and store.stats.injected["reset"] > 0


def test_a_failed_upload_of_a_shared_file_keeps_the_next_push_whole(
    store_bucket, artifacts, xdpx_site_python, tmp_path
):
    """vocab.txt is in data/prepared and in both checkpoints of models/: when its every upload
    fails, the first push fails, and the next one (no faults) must upload it. Without
    xdpx.patches.dvc_dir_upload, dvc-data uploads the other directory's .dir anyway, the next
    push exits 0 without the file, and the remote stays broken (treeverse/dvc issue #10977)."""
    store = store_bucket.store
    dvc = xdpx_site_python + ["-m", "dvc"]
    repo, env, local = remote_repo("oss", store_bucket, artifacts, dvc, tmp_path)
    shared = hashlib.md5((repo / "data/prepared/vocab.txt").read_bytes()).hexdigest()
    # the premise: one object in two tracked directories
    assert digests(repo)["models/tiny/best/vocab.txt"] == shared
    fast = {**env, "XDPX_OSS_RETRY": "0"}  # every attempt fails anyway: no need to wait for retries

    def push_twice(environ: dict, bucket) -> None:
        run(dvc + ["remote", "modify", "storage", "url", f"oss://{bucket.name}/xdpx"], repo, env)
        run(["git", "commit", "-qam", f"remote: {bucket.name}", "--allow-empty"], repo, env)
        store.fail_matching("PUT", shared[2:])  # the key is .../md5/<2 hex>/<30 hex>
        failed = run(dvc + ["push"], repo, environ, ok=False)
        assert failed.returncode != 0, failed.stdout
        store.reset_faults()
        run(dvc + ["push"], repo, {k: v for k, v in environ.items() if k != "XDPX_OSS_RETRY"})

    push_twice({**fast, "XDPX_DVC_DIR_FIX": "0"}, store_bucket)  # upstream's behaviour
    assert remote_gaps(store_bucket) == [shared], "dvc-data fixed it: delete the patch"

    from objstore import StoreBucket

    fresh = StoreBucket(store.make_bucket(), store)
    push_twice(fast, fresh)
    assert remote_gaps(fresh) == []
    assert shared in {oid_of(key) for key in fresh.keys("xdpx/files/md5/")}
    pull_into_clone(repo, tmp_path / "clone", dvc, env, local)
    assert digests(tmp_path / "clone") == digests(repo)
