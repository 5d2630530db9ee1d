"""The only patches xdpx applies to its dependencies, and the hook that applies them.

Each patch lives in its own module, names the upstream issue it works around, is idempotent,
detects when upstream no longer needs it, and has an environment switch to turn it off:

- ``aiooss2_payload``: aiooss2 issue #96, ``AsyncPayload.decode`` left abstract, which breaks
  every upload of dvc-oss (``dvc push`` to ``oss://``). ``XDPX_AIOOSS2_FIX=0`` disables it.
- ``ossfs_retry``: ossfs/aiooss2 have no retries, so one transient 5xx or connection reset
  aborts a whole ``dvc push``/``dvc pull`` on OSS (dvc-s3 gets them from botocore).
  ``XDPX_OSS_RETRY=0`` disables it.
- ``dvc_dir_upload``: dvc-data uploads a directory's ``.dir`` even when a file it shares with
  another tracked directory failed to upload, and every later push then skips that file
  (treeverse/dvc issue #10977). ``XDPX_DVC_DIR_FIX=0`` disables it.

How they reach a plain ``dvc push``: installing xdpx (``pip install .`` or ``pip install -e .``)
puts ``xdpx-patches.pth`` into site-packages (see setup.py). Python runs its one line,
``xdpx.patches.install()``, at every interpreter start in that environment. ``install()``
imports nothing: it adds a meta-path finder that applies a patch right after its target
module is first imported (``aiooss2.adapter``, ``ossfs.async_oss``,
``dvc_data.hashfile.transfer``), in any process -- ``dvc``,
``python -m stages.*``, Prefect workers. DVC has no plugin hook of its own, so a ``.pth`` file is
the one mechanism that fixes the user's own ``dvc`` command.
"""

from __future__ import annotations

import importlib
import os
import sys

#: values of a patch's environment switch that turn the patch off
OFF_VALUES = ("0", "false", "no", "off")

#: target module -> (patch module, function called with the freshly executed target module)
HOOKS = {
    "aiooss2.adapter": ("xdpx.patches.aiooss2_payload", "apply_to_module"),
    "ossfs.async_oss": ("xdpx.patches.ossfs_retry", "apply_to_module"),
    "dvc_data.hashfile.transfer": ("xdpx.patches.dvc_dir_upload", "apply_to_module"),
}


def switched_off(env: str) -> bool:
    """True when the environment variable ``env`` is one of :data:`OFF_VALUES` (any case):
    each patch's ``disabled()``, e.g. ``switched_off("XDPX_OSS_RETRY")``."""
    return os.environ.get(env, "").strip().lower() in OFF_VALUES


def _run_hook(module) -> None:
    patch_module, func = HOOKS[module.__name__]
    getattr(importlib.import_module(patch_module), func)(module)


class _PatchingLoader:
    """Wraps a target module's loader: executes the module, then its patch."""

    def __init__(self, loader) -> None:
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        _run_hook(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._loader, name)


class _AfterImportFinder:
    """Meta-path finder that only intercepts the ``HOOKS`` targets, to wrap their loaders."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in HOOKS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def install(forget: bool = False) -> None:
    """Apply every patch when its target is imported (at once for targets already imported).

    Cheap enough for interpreter start (stdlib only, imports no target); idempotent. Called by
    the ``xdpx-patches.pth`` line that installing xdpx puts in site-packages.

    Args:
        forget: drop ``xdpx`` and ``xdpx.patches`` from ``sys.modules`` afterwards (the
            ``.pth`` line does), so that a later ``import xdpx`` resolves through ``sys.path``
            as if nothing had been imported: a checkout in the current directory wins over
            the installed copy, as it does without the ``.pth`` file.
    """
    for name in HOOKS:
        if name in sys.modules:
            _run_hook(sys.modules[name])
    if not any(type(f).__name__ == "_AfterImportFinder" for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImportFinder())
    if forget and not any(m.startswith("xdpx.") and m != __name__ for m in sys.modules):
        sys.modules.pop(__name__, None)
        sys.modules.pop("xdpx", None)
