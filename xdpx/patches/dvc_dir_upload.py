"""Never let ``dvc push`` upload a directory's ``.dir`` while one of its files failed to upload.

Why (found with the fault mode of tests/objstore.py; treeverse/dvc issue #10977 reports the
symptom, "push says up to date, pull fails", without a cause): dvc-data's ``_do_transfer``
(``dvc_data.hashfile.transfer``, 3.18) uploads the files of each tracked directory and then its
``.dir`` listing, but only checks the files it *bound* to that directory. A file that two
tracked directories share is bound to the first one only. xdpx has such files by design:
``vocab.txt`` and ``target_map.txt`` sit in ``data/prepared`` and in every checkpoint under
``models/``. When the shared file's upload fails, the second directory's ``.dir`` still goes up.
DVC takes a ``.dir`` on a remote to mean "every file it lists is there" (``_indexed_dir_hashes``
in ``dvc_data.hashfile.status``), so from then on:

- every later ``dvc push`` exits 0 without uploading the file, and ``dvc status -c`` says in sync;
- ``dvc pull`` into a fresh clone fails with ``failed to transfer '<md5>' - <remote path>``.

One transient fault in one push leaves the remote broken for good. Reproduced by failing every
upload of one shared file in a first push (``tests/test_dvc_remote.py``).

What: within one transfer, this patch remembers the objects whose upload failed. Before a
``.dir`` is uploaded, it loads that directory's listing and checks it against them. If a listed
file failed, the ``.dir`` is reported failed instead of uploaded, as DVC already does for the
directory's own files. The push still fails. The next push uploads the file and then the
``.dir``. Nothing is loaded or checked while no upload has failed.

A remote already in that state is not repaired by this. Delete the affected ``.dir`` object on
the remote and push again (DVC's advice in treeverse/dvc issue #4164).

Off with ``XDPX_DVC_DIR_FIX=0``. Applied by ``xdpx.patches.install()`` when
``dvc_data.hashfile.transfer`` is first imported. Remove once dvc-data checks every file of a
directory before uploading its ``.dir``: the test that runs without the patch will then fail.
"""

from __future__ import annotations

import contextvars
import functools
import logging

from xdpx.patches import switched_off

logger = logging.getLogger(__name__)

__all__ = ["apply", "apply_to_module", "disabled"]

DISABLE_ENV = "XDPX_DVC_DIR_FIX"
UPSTREAM_ISSUE = "https://github.com/treeverse/dvc/issues/10977"
_MARK = "__xdpx_dir_fix__"
#: md5 values of the objects that failed to transfer in the current ``_do_transfer`` call
_failed: contextvars.ContextVar[set[str] | None] = contextvars.ContextVar(
    "xdpx_dvc_failed", default=None
)


def disabled() -> bool:
    """True when ``XDPX_DVC_DIR_FIX=0`` (or ``false``/``no``/``off``) is set."""
    return switched_off(DISABLE_ENV)


def _scoped(do_transfer):
    """Wrap ``_do_transfer``: a fresh record of failed objects for each transfer."""

    @functools.wraps(do_transfer)
    def scoped(*args, **kwargs):
        token = _failed.set(set())
        try:
            return do_transfer(*args, **kwargs)
        finally:
            _failed.reset(token)

    return scoped


def _failed_entries(module, src, dest, dir_hash, failed: set[str]) -> list[str]:
    """The md5 values listed in ``dir_hash``'s ``.dir`` that failed earlier in this transfer.

    The listing is read from whichever side is local first (the cache), then the other one.
    A listing that cannot be read gives ``[]``, which leaves the decision to DVC.
    """
    odbs = sorted((src, dest), key=lambda odb: odb.fs.protocol != "local")
    try:
        tree = module.find_tree_by_obj_id(odbs, dir_hash)
    except Exception as exc:  # a remote read that failed: never fail a push for the check
        logger.debug("could not read the listing of '%s': %s", dir_hash, exc)
        return []
    if tree is None:
        return []
    return sorted({oid.value for _, _, oid in tree} & failed)


def _guarded(add, module):
    """Wrap ``_add``: record failures, and refuse a ``.dir`` that lists a failed file."""

    @functools.wraps(add)
    def guarded(src, dest, hash_infos, **kwargs):
        failed = _failed.get()
        hash_infos = list(hash_infos)
        if failed and len(hash_infos) == 1 and hash_infos[0].isdir:
            broken = _failed_entries(module, src, dest, hash_infos[0], failed)
            if broken:
                logger.debug(
                    "not uploading '%s': %d of its files failed to upload (%s), see %s",
                    hash_infos[0],
                    len(broken),
                    ", ".join(broken[:3]),
                    UPSTREAM_ISSUE,
                )
                return {hash_infos[0]}
        out = add(src, dest, hash_infos, **kwargs)
        if failed is not None:
            failed.update(hash_info.value for hash_info in out)
        return out

    return guarded


def apply(module=None) -> bool:
    """Wrap ``_do_transfer`` and ``_add`` of ``dvc_data.hashfile.transfer`` (or ``module``).

    Idempotent. Does nothing when disabled, or when the module no longer has both functions
    or ``find_tree_by_obj_id`` (a dvc-data that moved them needs a fresh look, not this patch).

    Returns:
        True if this call patched the module; False otherwise.

    Raises:
        ImportError: when ``module`` is not given and dvc-data is not installed.
    """
    if disabled():
        return False
    if module is None:
        from dvc_data.hashfile import transfer as module
    names = ("_do_transfer", "_add", "find_tree_by_obj_id")
    if not all(callable(getattr(module, name, None)) for name in names):
        return False
    if getattr(module._add, _MARK, False):
        return False
    module._do_transfer = _scoped(module._do_transfer)
    module._add = _guarded(module._add, module)
    setattr(module._add, _MARK, True)
    return True


def apply_to_module(module) -> bool:
    """Post-import hook for ``dvc_data.hashfile.transfer`` (see xdpx.patches)."""
    return apply(module)
