"""The command-line wrapper every stage shares.

``python -m stages.<name> [CONFIG.yaml] [--params F] [--dry] [key=value ...]``
and ``xdpx <name> ...`` both end here: resolve the config(s) (a config file
with ``extends:``/``grid:``, or params.yaml, plus overrides), print them with
``--dry``, run the pre-flight checks of every config before any work, then run.

A stage that reads a checkpoint (evaluate, predict) run on the command line with a
checkpoint other than its config's (params.yaml's: the pipeline's) writes next to that
checkpoint, not over the pipeline's outputs (``adjust``:
:func:`xdpx.checkpoint.beside_checkpoint`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from xdpx import io
from xdpx.config import ConfigError, StageArgs, load_stage_configs, render_tree, stage_argv
from xdpx.errors import DivergenceError, RemoteIOError

R = TypeVar("R")

#: Errors that mean "bad input", reported as one line instead of a traceback:
#: config errors, missing paths/checkpoints (FileNotFoundError), an existing run
#: (FileExistsError), malformed data (DataError and other ValueErrors) and a
#: diverged training run (DivergenceError: NaN loss, max_loss, fp16 loss scale).
USER_ERRORS = (ConfigError, FileNotFoundError, FileExistsError, ValueError, DivergenceError)
#: Exit status of a remote store that kept failing (``RemoteIOError``): sysexits' EX_TEMPFAIL,
#: "a temporary failure; the user is invited to retry".
EXIT_TEMPFAIL = 75


def stage_main(
    name: str,
    run: Callable[[Any], R],
    summary: Callable[[R], str],
    argv: list[str] | None = None,
    check: Callable[[Any], Any] | None = None,
    adjust: Callable[[list[tuple[str, Any]], StageArgs], list[tuple[str, Any]]] | None = None,
) -> R | list[R] | None:
    """Resolve the config(s) of stage ``name``, check them all, run each, print ``summary``.

    ``check`` is the stage's pre-flight (``cfg -> cfg``, raising on a bad input), run on
    every config of a grid before the first run; None: the stage has none. ``adjust``:
    ``(configs, parsed command line) -> configs``, applied to the loaded configs before
    ``--dry`` and the checks (evaluate and predict move an ad-hoc checkpoint's outputs next
    to it: :func:`xdpx.checkpoint.beside_checkpoint`).

    Returns:
        The result; a list of results for a ``grid:`` config; None with ``--dry``.

    Exits with status 2 and a one-line ``error: ...`` on a user error
    (``USER_ERRORS``); with nothing written when the error comes from the
    config or the pre-flight checks. A remote store that kept failing
    (``RemoteIOError``, naming the stage, operation and URL) exits with
    ``EXIT_TEMPFAIL`` (75) and one line, too.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        with io.stage(name):
            return _stage_main(name, run, summary, argv, check, adjust)
    except RemoteIOError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(EXIT_TEMPFAIL) from None


def _stage_main(
    name: str,
    run: Callable[[Any], R],
    summary: Callable[[R], str],
    argv: list[str] | None,
    check: Callable[[Any], Any] | None,
    adjust: Callable[[list[tuple[str, Any]], StageArgs], list[tuple[str, Any]]] | None = None,
) -> R | list[R] | None:
    try:
        args = stage_argv(name, sys.argv[1:] if argv is None else list(argv))
        configs = load_stage_configs(name, args.config_file, args.overrides, args.params)
        if adjust is not None:
            configs = adjust(configs, args)
        if args.dry:
            for label, cfg in configs:
                if label:
                    print(f"# grid run {label}")
                print(render_tree(cfg, name))
            return None
        if check is not None:
            configs = [(label, check(cfg)) for label, cfg in configs]
        results = []
        for label, cfg in configs:
            if label:
                print(f"# grid run {label}", flush=True)
            result = run(cfg)
            print(summary(result), flush=True)
            results.append(result)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    return results[0] if len(results) == 1 else results
