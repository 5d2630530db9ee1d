"""What every ``xdpx`` command shares: bad input as one ``error:`` line and an exit status."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import typer

from xdpx.errors import RemoteIOError
from xdpx.stage import EXIT_TEMPFAIL, USER_ERRORS


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    """Bad input -> one line ``error: ...`` on stderr and exit status 2 (75: a remote store kept failing)."""
    try:
        yield
    except USER_ERRORS as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except RemoteIOError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_TEMPFAIL) from None
