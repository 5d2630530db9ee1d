"""Version a flow run with DVC: its run directory becomes a DVC experiment, pushed on request.

A flow run with ``runs_root`` (``flows.pipeline.xdpx_pipeline``) writes everything it makes
under its run directory ``models/runs/<name>/``, laid out like the checkout (``data/raw``,
``models/default``, ``reports/metrics.json``: ``flows.pipeline.run_overrides``).
:func:`record_run` records it as the DVC experiment ``<name>``: the experiment that
``dvc exp run -S <override> ...`` with the run's overrides would have made, its outputs in
the standard places. So ``dvc exp show`` lists the flow run beside ``dvc exp run`` sweeps and
the workspace, in the same params and metrics columns, and ``dvc exp apply <name>`` +
``dvc pull`` on any clone put its model in ``models/default/`` (``train.save_dir``).

How, without touching the checkout the worker runs in (a ``dvc repro`` may be running
there, and its ``params.yaml``/``dvc.lock`` are the user's):

1. a temporary git worktree of HEAD under ``.dvc/tmp/`` gets the checkout's uncommitted
   changes to tracked files (the code that ran), a ``params.yaml`` holding the run's values
   (:func:`xdpx.config.read_params_raw` of the flow's params file and its overrides), the
   checkout's ``.dvc/config.local`` with the checkout's cache directory, the run
   directory's files at their standard places, and any other dep of the stages (a user's
   own data directory) from the checkout: hard links (copies across file systems);
2. ``dvc commit -f`` + ``dvc exp save -n <name>`` there hash every stage's deps and outs
   into ``dvc.lock``, put the outs in the checkout's DVC cache (hard links: the cache and
   the run directory share the files, no copy; DVC makes them read-only) and commit ``params.yaml``, ``dvc.lock`` and
   the ``cache: false`` outputs (metrics, plots, logs) as the experiment's git commit
   (``refs/exps/...``, which the worktree shares with the checkout);
3. the worktree is removed.

:func:`push_run` then runs ``dvc exp push <git remote> <name>``: the experiment's git ref
to the git remote and its data to the default DVC remote.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from xdpx.config import dump_yaml, read_params_raw

__all__ = ["RecordError", "Recorded", "Remote", "is_dvc_repo", "record_run", "remote_of", "push_run"]  # fmt: skip

#: Bounded waits for the git/DVC commands (seconds): a worktree of a large repo, a commit of
#: a big checkpoint into the cache, an upload of it.
GIT_TIMEOUT_S = 300
SAVE_TIMEOUT_S = 3600
PUSH_TIMEOUT_S = 6 * 3600


class RecordError(RuntimeError):
    """Recording or pushing a flow run failed; the message names the command, the remote
    and the last lines of its output. The run directory itself is never changed."""


@dataclass(frozen=True)
class Recorded:
    """A flow run recorded as a DVC experiment.

    Attributes:
        name: the experiment's name (the run directory's name).
        rev: the experiment commit's sha.
        checkpoint: the run's best checkpoint directory (``<train.save_dir>/best``).
        checkpoint_md5: its DVC hash (``<md5>.dir``), the key of its object in a remote's
            ``files/md5/`` tree.
    """

    name: str
    rev: str
    checkpoint: str
    checkpoint_md5: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Remote:
    """The remotes a push goes to: the git remote (the experiment's ref) and the default
    DVC remote (its data); URLs as configured (credentials live in ``config.local`` or the
    environment, never in a URL that is printed)."""

    git_remote: str
    git_url: str
    dvc_remote: str
    dvc_url: str

    def object_url(self, md5: str) -> str:
        """The URL of a DVC object on the DVC remote (DVC 3 layout: ``files/md5/ab/cdef...``)."""
        return f"{self.dvc_url.rstrip('/')}/files/md5/{md5[:2]}/{md5[2:]}"


def _env() -> dict[str, str]:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    # A worker without a git identity can still commit the experiment.
    env.setdefault("GIT_AUTHOR_NAME", "xdpx flow")
    env.setdefault("GIT_AUTHOR_EMAIL", "xdpx@localhost")
    env.setdefault("GIT_COMMITTER_NAME", env["GIT_AUTHOR_NAME"])
    env.setdefault("GIT_COMMITTER_EMAIL", env["GIT_AUTHOR_EMAIL"])
    return env


def _run(argv: list[str], cwd: Path, what: str, timeout: float = GIT_TIMEOUT_S) -> str:
    """Run a command; its stdout, or :class:`RecordError` naming ``what`` with the output's
    last lines."""
    try:
        proc = subprocess.run(
            argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise RecordError(f"{what}: no answer in {timeout:.0f} s") from None
    if proc.returncode != 0:
        lines = [
            line
            for line in (proc.stdout + proc.stderr).strip().splitlines()
            if line.strip() and "dvc.org/support" not in line  # DVC's sign-off
        ]
        tail = "\n".join(lines[-8:])
        raise RecordError(f"{what} failed (exit {proc.returncode}): {tail}")
    return proc.stdout


def _git(args: list[str], cwd: Path, what: str) -> str:
    return _run(["git", *args], cwd, what)


def _dvc(args: list[str], cwd: Path, what: str, timeout: float = SAVE_TIMEOUT_S) -> str:
    return _run([sys.executable, "-m", "dvc", *args], cwd, what, timeout)


def is_dvc_repo(root: str | Path = ".") -> bool:
    """True when ``root`` is the top of a git repository with a commit and holds ``.dvc/``."""
    root = Path(root).resolve()
    if not (root / ".dvc").is_dir():
        return False
    try:
        top = _git(["rev-parse", "--show-toplevel"], root, "git rev-parse").strip()
        _git(["rev-parse", "--verify", "-q", "HEAD"], root, "git rev-parse HEAD")
    except (RecordError, OSError):
        return False
    return Path(top).resolve() == root


def _require_repo(root: Path, what: str) -> None:
    """Raise :class:`RecordError` (``<what>: <root> is not ...``) unless :func:`is_dvc_repo`."""
    if not is_dvc_repo(root):
        raise RecordError(f"{what}: {root} is not a git repository with a commit and .dvc/ (git init && dvc init)")  # fmt: skip


def _link(src: Path, target: Path) -> None:
    """Hard-link file ``src`` at ``target``, replacing a file there (a copy where links
    cannot be made)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists() or target.is_symlink():
        target.unlink()
    try:
        os.link(src, target)
    except OSError:
        shutil.copy2(src, target)


def _link_tree(src: Path, dest: Path) -> None:
    """:func:`_link` every file under ``src`` (a file or a directory) to the same relative
    place under ``dest``."""
    if src.is_file():
        _link(src, dest)
        return
    for path in src.rglob("*"):
        if path.is_file() and not path.is_symlink():
            _link(path, dest / path.relative_to(src))


def _copy_uncommitted(root: Path, tree: Path) -> None:
    """The checkout's uncommitted changes to tracked files (staged or not) into ``tree``."""
    out = _git(["diff", "--name-only", "-z", "HEAD"], root, "git diff")
    for rel in filter(None, out.split("\0")):
        src, dest = root / rel, tree / rel
        if src.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)
        elif dest.exists():
            dest.unlink()


def _prepare_dvc(root: Path, tree: Path) -> list[str]:
    """The worktree's DVC config (the checkout's local config and cache) and the stages'
    deps that only the checkout has (linked in); returns the ``cache: false`` outputs that
    exist (relative paths), which the experiment commits."""
    from dvc.repo import Repo

    local = root / ".dvc" / "config.local"
    if local.exists():
        shutil.copy2(local, tree / ".dvc" / "config.local")
    with Repo(str(root)) as repo:
        cache_dir = repo.cache.local_cache_dir
    with Repo(str(tree)) as repo:
        with repo.config.edit("local") as conf:
            conf["cache"]["dir"] = cache_dir
            conf["cache"]["type"] = "hardlink,copy"
    with Repo(str(tree)) as repo:
        stages = repo.index.stages
        deps = {os.path.relpath(d.fs_path, tree) for s in stages for d in s.deps if d.is_in_repo}
        plain = {os.path.relpath(o.fs_path, tree) for s in stages for o in s.outs if not o.use_cache}  # fmt: skip
    for dep in sorted(deps):
        if not (tree / dep).exists() and (root / dep).exists():
            _link_tree(root / dep, tree / dep)
    return sorted(p for p in plain if (tree / p).exists())


def _checkpoint_md5(lock: Path, checkpoint: str) -> str:
    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
    for out in stages.get("train", {}).get("outs", []):
        if out.get("path") == checkpoint:
            return str(out.get("md5", ""))
    raise RecordError(f"dvc.lock of the experiment has no out {checkpoint} in stage train")


def record_run(
    run_dir: str,
    name: str,
    params: str,
    overrides: list[str],
    checkpoint: str,
    root: str | Path = ".",
) -> Recorded:
    """Record the flow run in ``run_dir`` as the DVC experiment ``name`` (module docstring).

    Args:
        run_dir: the run directory, relative to ``root`` (``models/runs/<name>``), laid out
            like the checkout (its ``models/default`` is ``train.save_dir``'s run).
        name: the experiment's name (a valid git ref component; the run directory's name).
        params: the flow's params file, relative to ``root`` or a URL.
        overrides: the user's ``section.key=value`` overrides of the run (not the moved
            paths: the experiment holds the outputs at the params' own paths).
        checkpoint: ``<train.save_dir>/best`` of those params, relative to ``root``.
        root: the checkout (a git + DVC repository: :func:`is_dvc_repo`).

    Returns:
        the :class:`Recorded` experiment.

    Raises:
        RecordError: ``root`` is not a git + DVC repository, an experiment of that name
            exists, or a git/DVC command failed (its message and output's tail).
        xdpx.config.ConfigError: bad params or overrides.
    """
    root = Path(root).resolve()
    _require_repo(root, "record")
    if not (root / run_dir).is_dir():
        raise RecordError(f"run directory {run_dir} not found under {root}")
    values = read_params_raw(str(root / params) if "://" not in params else params, overrides)
    tmp_base = root / ".dvc" / "tmp"
    tmp_base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="record-", dir=tmp_base))
    tree = tmp / name
    _git(["worktree", "add", "--detach", "-q", str(tree), "HEAD"], root, "git worktree add")
    try:
        _copy_uncommitted(root, tree)
        (tree / "params.yaml").write_text(dump_yaml(values))
        _link_tree(root / run_dir, tree)
        plain = _prepare_dvc(root, tree)
        include = [arg for path in plain for arg in ("-I", path)]
        # dvc.lock first: exp save resolves the plots' directories through it, and HEAD's
        # hashes may not be in this checkout's cache (a worker that never ran dvc repro)
        _dvc(["commit", "-f", "-q"], tree, "dvc commit")
        _dvc(
            ["exp", "save", "-n", name, "-m", f"xdpx flow run {name}", *include],
            tree,
            f"dvc exp save -n {name}",
        )
        md5 = _checkpoint_md5(tree / "dvc.lock", checkpoint)
        refs = _git(["for-each-ref", "--format=%(objectname)", f"refs/exps/*/*/{name}"], root, "git for-each-ref").split()  # fmt: skip
        rev = refs[0] if refs else ""
    finally:
        try:
            _git(["worktree", "remove", "--force", str(tree)], root, "git worktree remove")
        except RecordError:
            pass
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True, timeout=GIT_TIMEOUT_S)  # fmt: skip
    return Recorded(name=name, rev=rev, checkpoint=checkpoint, checkpoint_md5=md5)


def remote_of(git_remote: str, root: str | Path = ".") -> Remote:
    """The remotes :func:`push_run` would push to.

    Raises:
        RecordError: ``root`` is not a git + DVC repository, no git remote ``git_remote``,
            or no default DVC remote (each message says how to add what is missing).
    """
    from dvc.repo import Repo

    root = Path(root).resolve()
    _require_repo(root, "push")
    try:
        git_url = _git(["remote", "get-url", git_remote], root, f"git remote get-url {git_remote}").strip()  # fmt: skip
    except RecordError:
        raise RecordError(
            f"push: git remote {git_remote!r} not found in {root}: the experiment's git ref "
            f"needs one (git remote add {git_remote} URL, or the flow parameter git_remote)"
        ) from None
    with Repo(str(root)) as repo:
        config = repo.config
        name = config["core"].get("remote")
        url = config["remote"].get(name, {}).get("url", "") if name else ""
    if not name or not url:
        raise RecordError(
            "push: no default DVC remote (dvc remote add -d storage oss://BUCKET/PATH; "
            "docs/remote-storage.md, 'DVC remotes')"
        )
    return Remote(git_remote=git_remote, git_url=git_url, dvc_remote=name, dvc_url=url)


def push_run(name: str, git_remote: str = "origin", root: str | Path = ".") -> Remote:
    """``dvc exp push -r <default DVC remote> <git_remote> <name>``: the experiment's git ref
    and its data.

    Returns:
        the :class:`Remote` pushed to.

    Raises:
        RecordError: missing remote (:func:`remote_of`), or the push failed; the message
            names both remotes and the output's tail.
    """
    root = Path(root).resolve()
    remote = remote_of(git_remote, root)
    try:
        # -r: the remote named here, not the one in the experiment commit's .dvc/config
        argv = ["exp", "push", "-r", remote.dvc_remote, git_remote, name]
        _dvc(argv, root, f"dvc exp push {git_remote} {name}", PUSH_TIMEOUT_S)
    except RecordError as e:
        raise RecordError(
            f"push of experiment {name} to DVC remote {remote.dvc_remote!r} ({remote.dvc_url}) "
            f"and git remote {git_remote!r} failed; the run is recorded locally (dvc exp push "
            f"{git_remote} {name} retries it): {e}"
        ) from None
    return remote
