"""The command-line wrapper every stage shares: ``python -m stages.<name> [--params F] [k=v ...]``."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from xdpx.config import ConfigError, load_params, stage_argv
from xdpx.errors import DivergenceError

R = TypeVar("R")

#: Errors that mean "bad input", reported as one line instead of a traceback:
#: config errors, missing paths/checkpoints (FileNotFoundError), an existing run
#: (FileExistsError), malformed data (DataError and other ValueErrors) and a
#: diverged training run (DivergenceError: NaN loss, max_loss, fp16 loss scale).
USER_ERRORS = (ConfigError, FileNotFoundError, FileExistsError, ValueError, DivergenceError)


def stage_main(
    name: str,
    run: Callable[[Any], R],
    summary: Callable[[R], str],
    argv: list[str] | None = None,
) -> R:
    """Load ``params.yaml`` + overrides, call ``run(params.<name>)``, print ``summary(result)``.

    Exits with status 2 and a one-line ``error: ...`` on a user error (``USER_ERRORS``).
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        params, overrides = stage_argv(name, sys.argv[1:] if argv is None else list(argv))
        result = run(getattr(load_params(params, overrides), name))
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(summary(result))
    return result
