"""``xdpx io`` (files on any filesystem) and ``xdpx script`` (result scripts over run directories)."""

from __future__ import annotations

import typer

from xdpx import io as xio
from xdpx.cli.common import _user_errors

io_app = typer.Typer(
    help="Files on local disk, oss://, s3:// or any fsspec URL, with progress bars.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)
script_app = typer.Typer(
    help="Result scripts over run directories.", no_args_is_help=True, rich_markup_mode="markdown"
)


# ------------------------------------------------------------------ io
def _predicate(name: str, what: str, example: str) -> None:
    def cmd(path: str) -> None:
        with _user_errors():
            found = bool(getattr(xio, name)(path))
        typer.echo(str(found).lower())
        raise typer.Exit(0 if found else 1)

    cmd.__doc__ = f"Print true/false; exit status 0 if PATH {what}, 1 if not. Example: `{example}`"
    io_app.command(name)(cmd)


_predicate("exists", "exists", "xdpx io exists oss://bucket/key")
_predicate("isdir", "is a directory", "xdpx io isdir models/default")
_predicate("isfile", "is a file", "xdpx io isfile data/raw/train.tsv")


@io_app.command("ls")
def io_ls(path: str) -> None:
    """List a directory, one entry per line. Example: `xdpx io ls s3://bucket/models/`"""
    with _user_errors():
        if not xio.exists(path):
            raise FileNotFoundError(f"{path} not found")
        for entry in xio.ls(path):
            typer.echo(entry)


@io_app.command("size")
def io_size(path: str) -> None:
    """Bytes of a file (or every file under a directory). Example: `xdpx io size models/default`"""
    with _user_errors():
        typer.echo(xio.size(path))


@io_app.command("md5")
def io_md5(path: str) -> None:
    """MD5 of a file, streamed with a progress bar. Example: `xdpx io md5 oss://b/model.onnx`"""
    with _user_errors():
        typer.echo(xio.md5(path, progress=True))


@io_app.command("copy")
def io_copy(src: str, dst: str) -> None:
    """Copy a file across filesystems (atomic at DST). Example: `xdpx io copy model.onnx oss://b/m.onnx`"""
    with _user_errors():
        xio.copy(src, dst, progress=True)


@io_app.command("copytree")
def io_copytree(src: str, dst: str) -> None:
    """Copy a directory tree. Example: `xdpx io copytree models/default oss://b/models/default`"""
    with _user_errors():
        typer.echo(f"copied {xio.copytree(src, dst, progress=True)} files")


@io_app.command("move")
def io_move(src: str, dst: str) -> None:
    """Move a file or directory (copy + delete across filesystems). Example: `xdpx io move a.tsv b.tsv`"""
    with _user_errors():
        xio.move(src, dst, progress=True)


@io_app.command("rm")
def io_rm(path: str) -> None:
    """Remove a file (refuses directories: use rmtree). Example: `xdpx io rm reports/old.tsv`"""
    with _user_errors():
        if xio.isdir(path):
            raise FileExistsError(f"{path} is a directory; use `xdpx io rmtree`")
        if not xio.exists(path):
            raise FileNotFoundError(f"{path} not found")
        xio.rm(path)


@io_app.command("rmtree")
def io_rmtree(path: str) -> None:
    """Remove a directory and everything under it. Example: `xdpx io rmtree models/tmp`"""
    with _user_errors():
        if not xio.exists(path):
            raise FileNotFoundError(f"{path} not found")
        xio.rm(path, recursive=True)


@io_app.command("makedirs")
def io_makedirs(path: str) -> None:
    """Create a directory and its parents. Example: `xdpx io makedirs models/new`"""
    with _user_errors():
        xio.makedirs(path)


# ------------------------------------------------------------------ script
@script_app.command("aggregate_results")
def aggregate_results(
    root: str = typer.Argument(..., help="Directory searched for training runs."),
    include: list[str] = typer.Option([], "--include", "-include", "-i", help="Keep runs whose path contains all these words."),
    out: str = typer.Option(None, "--out", "-o", help="Write the TSV here instead of stdout."),
) -> None:  # fmt: skip
    """A TSV of every run under ROOT: best step, best valid metrics, the params that differ.

    **Examples:**

    `xdpx script aggregate_results models/`

    `x-script aggregate_results models/ -include textcnn -include lr -o reports/runs.tsv`
    """
    from xdpx import scripts

    with _user_errors():
        if out:
            scripts.write_aggregate(root, out, include)
            typer.echo(out)
        else:
            typer.echo(
                scripts.aggregate_results(root, include).to_csv(sep="\t", index=False), nl=False
            )


@script_app.command("diff_params")
def diff_params(
    a: str = typer.Argument(..., help="Run directory or config file."),
    b: str = typer.Argument(..., help="Run directory or config file."),
) -> None:
    """The train keys whose values differ between two runs/configs.

    **Examples:**

    `xdpx script diff_params models/default models/lr3e-3`

    `x-script diff_params models/default my_train.yaml`
    """
    from xdpx import scripts

    with _user_errors():
        for key, (va, vb) in scripts.diff_params(a, b).items():
            typer.echo(f"{key}\t{va!r}\t{vb!r}")


@script_app.command("clean_checkpoints")
def clean_checkpoints(
    root: str = typer.Argument(..., help="Directory searched for training runs."),
    dry: bool = typer.Option(False, "--dry", help="List what would be removed; remove nothing."),
) -> None:
    """Remove every `checkpoint-<update>/` but each run's best and last (by its metric direction).

    **Examples:**

    `xdpx script clean_checkpoints models/ --dry`

    `x-script clean_checkpoints models/`
    """
    from xdpx import scripts

    with _user_errors():
        for path in scripts.clean_checkpoints(root, dry=dry):
            typer.echo(("would remove " if dry else "removed ") + path)
