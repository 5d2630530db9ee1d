"""The one list of pipeline stages: ``STAGES[name] -> Stage(name, config, run, check, main)``.

Everything that drives stages goes through this registry and calls them as functions with
config objects: the ``xdpx`` command (``xdpx/cli.py``: each stage sub-command is
``STAGES[name].main(argv)``, the argv entry point), the Prefect flow (``flows/pipeline.py``:
``STAGES[name].run(params.<name>)`` in DAG order), ``xdpx tune`` (``studies/tune.py``) and
``xdpx suite`` (``studies/suite.py``). dvc.yaml runs the same modules as ``python -m
stages.<name>``; ``tests/test_layering.py`` checks that its stages are these, in this order.

A stage module is imported only when its ``run``/``check``/``main`` is first used, so
importing the registry costs no torch (``xdpx --help`` stays fast), and the lookup happens at
each use (a test's ``monkeypatch.setattr(stages.train, "run", ...)`` is seen). This module
is not imported by the stage modules nor by ``stages/__init__.py``: ``python -m
stages.<name>`` (and so each dvc stage's code deps) does not grow with the other stages.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from xdpx.config import SECTIONS

__all__ = ["Stage", "STAGES"]


@dataclass(frozen=True)
class Stage:
    """One pipeline stage.

    Attributes:
        name: the stage name: its ``params.yaml`` section, its dvc.yaml stage and its
            module ``stages.<name>``.
        load: imports and returns the stage module (a literal ``importlib.import_module``
            name, so ``tools/import_closure.py`` follows it).
    """

    name: str
    load: Callable[[], ModuleType]

    @property
    def config(self) -> type:
        """The pydantic class of its params section (``xdpx.config.SECTIONS[name]``)."""
        return SECTIONS[self.name]

    @property
    def module(self) -> ModuleType:
        """The stage module ``stages.<name>`` (imported on first use)."""
        return self.load()

    @property
    def run(self) -> Callable[..., Any]:
        """``run(cfg, ...) -> result``: the stage's work on a config object."""
        return self.module.run

    @property
    def check(self) -> Callable[[Any], Any] | None:
        """``check(cfg) -> cfg``: the pre-flight checks (raise on bad input), returning what
        ``run`` takes (``train``: its :class:`xdpx.train.setup.TrainSetup`); None: it has none."""
        return getattr(self.module, "check", None)

    @property
    def main(self) -> Callable[[list[str] | None], Any]:
        """``main(argv)``: the command line (``python -m stages.<name>``, ``xdpx <command>``)."""
        return self.module.main


def _stages(*stages: Stage) -> dict[str, Stage]:
    return {s.name: s for s in stages}


#: name -> Stage, in DAG order (fetch -> prepro -> train -> evaluate -> predict -> export).
STAGES: dict[str, Stage] = _stages(
    Stage("fetch", lambda: importlib.import_module("stages.fetch")),
    Stage("prepro", lambda: importlib.import_module("stages.prepro")),
    Stage("train", lambda: importlib.import_module("stages.train")),
    Stage("evaluate", lambda: importlib.import_module("stages.evaluate")),
    Stage("predict", lambda: importlib.import_module("stages.predict")),
    Stage("export", lambda: importlib.import_module("stages.export")),
)
