"""The tokenizer side of vocabulary trimming (:mod:`xdpx.trim`): a ``tokenizer.json`` read with
the ``tokenizers`` backend, the corpus's words and scripts, WordPiece traces, the special
tokens' ids, and the spec and ``config.json`` rewritten with the kept ids renumbered."""

from __future__ import annotations

import json
import logging
import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Any

from xdpx.pretrained import (
    quiet_transformers,
    resolve_pretrained,
)

log = logging.getLogger("xdpx.trim")


# ------------------------------------------------------------------ the tokenizer side
def _load_backend(directory: str) -> tuple[Any, dict[str, Any]]:
    """``(tokenizers.Tokenizer, its JSON as a dict)`` that ``AutoTokenizer`` runs for
    ``directory`` (what prepro tokenizes with), with truncation and padding off."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    try:
        with quiet_transformers():
            tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any load failure is the directory's problem
        raise ValueError(f"{directory}: cannot load its tokenizer ({e})") from None
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"{directory}: not a fast tokenizer (needs tokenizer.json)")
    spec = json.loads(tok.backend_tokenizer.to_str())
    backend = Tokenizer.from_str(json.dumps(spec))
    backend.no_truncation()
    backend.no_padding()
    return backend, spec


def _encode_all(backend: Any, texts: list[str], batch_size: int, progress: bool, what: str):
    """``[n]`` encodings (no special tokens), in batches of ``batch_size``, a tqdm bar."""
    from tqdm.auto import tqdm

    out = []
    with tqdm(total=len(texts), desc=what, unit="text", disable=not progress) as bar:
        for i in range(0, len(texts), batch_size):
            chunk = texts[i : i + batch_size]
            out += backend.encode_batch(chunk, add_special_tokens=False)
            bar.update(len(chunk))
    return out


def _words(backend: Any, texts: list[str]) -> tuple[set[str], Counter]:
    """``(words, chars)``: the distinct pre-tokenized words of ``texts`` as the model sees
    them (normalized, split by the pre-tokenizer; Unigram's ``▁`` included) and how often
    each character occurs in the normalized texts."""
    norm, pre = backend.normalizer, backend.pre_tokenizer
    words: set[str] = set()
    chars: Counter = Counter()
    for text in texts:
        s = norm.normalize_str(text) if norm is not None else text
        chars.update(s)
        if pre is None:
            words.add(s)
        else:
            words.update(w for w, _ in pre.pre_tokenize_str(s))
    return words, chars


def _script(char: str) -> str:
    """The first word of ``char``'s Unicode name (``CJK``, ``LATIN``, ``HIRAGANA``, ``DIGIT``,
    ``COMMA``, ...): a coarse script; ``?`` for an unnamed character."""
    return unicodedata.name(char, "?").split(" ", 1)[0]


def _corpus_scripts(chars: Counter, min_share: float) -> set[str]:
    """The scripts covering at least ``min_share`` of the characters counted in ``chars``."""
    by_script: Counter = Counter()
    for c, n in chars.items():
        if not c.isspace():
            by_script[_script(c)] += n
    total = sum(by_script.values())
    return {s for s, n in by_script.items() if total and n / total >= min_share}


def _wordpiece_trace(word: str, vocab: dict[str, int], prefix: str, max_chars: int) -> list[str]:
    """The pieces WordPiece's greedy longest-match-first takes on ``word`` (all of them when
    it succeeds; those before the failure when the word becomes ``[UNK]``)."""
    if len(word) > max_chars:
        return []
    pieces: list[str] = []
    start = 0
    while start < len(word):
        end, cur = len(word), None
        while start < end:
            sub = word[start:end] if start == 0 else prefix + word[start:end]
            if sub in vocab:
                cur = sub
                break
            end -= 1
        if cur is None:
            return pieces
        pieces.append(cur)
        start = end
    return pieces


def _special_ids(spec: dict[str, Any], pieces: list[str]) -> set[int]:
    """Ids the tokenizer itself names: added tokens, unk, the post-processor's, padding's."""
    ids = {int(t["id"]) for t in spec.get("added_tokens") or []}
    model = spec["model"]
    if model["type"] == "Unigram" and model.get("unk_id") is not None:
        ids.add(int(model["unk_id"]))
    if model["type"] == "WordPiece" and model.get("unk_token") in pieces:
        ids.add(pieces.index(model["unk_token"]))

    def walk(proc: dict[str, Any] | None) -> None:
        if not proc:
            return
        for sub in proc.get("processors") or []:
            walk(sub)
        for tok in (proc.get("special_tokens") or {}).values():
            ids.update(int(i) for i in tok["ids"])
        for key in ("sep", "cls"):  # BertProcessing / RobertaProcessing: [token, id]
            if isinstance(proc.get(key), list):
                ids.add(int(proc[key][1]))

    walk(spec.get("post_processor"))
    if spec.get("padding"):
        ids.add(int(spec["padding"]["pad_id"]))
    return ids


def _remap_spec(spec: dict[str, Any], new_of: dict[int, int], kept_model: list[int]) -> dict:
    """The tokenizer JSON restricted to the kept ids (``new_of``: old id -> new id)."""
    spec = json.loads(json.dumps(spec))
    model = spec["model"]
    if model["type"] == "Unigram":
        vocab = model["vocab"]
        model["vocab"] = [vocab[i] for i in kept_model]
        if model.get("unk_id") is not None:
            model["unk_id"] = new_of[int(model["unk_id"])]
    else:
        by_id = {i: p for p, i in model["vocab"].items()}
        model["vocab"] = {by_id[i]: new_of[i] for i in kept_model}
    for tok in spec.get("added_tokens") or []:
        tok["id"] = new_of[int(tok["id"])]

    def walk(proc: dict[str, Any] | None) -> None:
        if not proc:
            return
        for sub in proc.get("processors") or []:
            walk(sub)
        for tok in (proc.get("special_tokens") or {}).values():
            tok["ids"] = [new_of[int(i)] for i in tok["ids"]]
        for key in ("sep", "cls"):
            if isinstance(proc.get(key), list):
                proc[key][1] = new_of[int(proc[key][1])]

    walk(spec.get("post_processor"))
    if spec.get("padding"):
        spec["padding"]["pad_id"] = new_of[int(spec["padding"]["pad_id"])]
    return spec


def _remap_config(config: dict[str, Any], new_of: dict[int, int], rows: int) -> dict:
    config = dict(config)
    config["vocab_size"] = rows
    for key, value in list(config.items()):
        if not key.endswith("_token_id") or value is None:
            continue
        values = value if isinstance(value, list) else [value]
        mapped = [new_of.get(int(v)) for v in values]
        if any(m is None for m in mapped):
            log.warning("config.json %s=%s is not a kept id: set to null", key, value)
            config[key] = None
        else:
            config[key] = mapped if isinstance(value, list) else mapped[0]
    return config


def _config_token_ids(config: dict[str, Any]) -> set[int]:
    ids: set[int] = set()
    for key, value in config.items():
        if key.endswith("_token_id") and value is not None:
            ids.update(int(v) for v in (value if isinstance(value, list) else [value]))
    return ids


def _count_changed(
    encodings: list[Any],
    texts: list[str],
    directory: str,
    new_of: dict[int, int],
    batch_size: int,
    progress: bool,
    what: str,
) -> int:
    """Texts whose pieces (or remapped ids) under ``directory``'s tokenizer differ from
    ``encodings`` (the source's, same order)."""
    backend, _ = _load_backend(directory)
    trimmed = _encode_all(backend, texts, batch_size, progress, what)
    changed = 0
    for a, b in zip(encodings, trimmed, strict=True):
        if a.tokens != b.tokens or [new_of.get(i, -1) for i in a.ids] != b.ids:
            changed += 1
    return changed


def compare_segmentation(
    source: str, trimmed: str, texts: Sequence[str], batch_size: int = 1000
) -> dict[str, Any]:
    """How ``trimmed``'s tokenizer segments ``texts`` against ``source``'s.

    Args:
        source, trimmed: any forms :func:`xdpx.pretrained.resolve_pretrained` accepts.
        texts: ``[n]`` texts (for a held-out split: texts the trim never saw).

    Returns:
        ``texts`` (n), ``changed_texts`` (pieces differ) and ``changed_share``; ``tokens``
        (the trimmed tokenizer's, no special tokens), ``unk_tokens`` and ``unk_share`` (its
        ``<unk>``/``[UNK]`` tokens), ``source_tokens``, ``source_unk_tokens`` and
        ``source_unk_share`` (the source's), ``new_unk_share`` (``unk_share`` minus the
        source's ``<unk>`` per trimmed token: the share that *became* unknown).
    """
    a_backend, a_spec = _load_backend(resolve_pretrained(source))
    b_backend, b_spec = _load_backend(resolve_pretrained(trimmed))
    texts = list(texts)

    def unk_id(backend: Any, spec: dict[str, Any]) -> int | None:
        model = spec["model"]
        if model["type"] == "Unigram":
            return model.get("unk_id")
        return backend.token_to_id(model.get("unk_token") or "[UNK]")

    ua, ub = unk_id(a_backend, a_spec), unk_id(b_backend, b_spec)
    a = _encode_all(a_backend, texts, batch_size, False, "source")
    b = _encode_all(b_backend, texts, batch_size, False, "trimmed")
    changed = sum(x.tokens != y.tokens for x, y in zip(a, b, strict=True))
    tokens = sum(len(y.ids) for y in b)
    unk = sum(y.ids.count(ub) for y in b) if ub is not None else 0
    src_tokens = sum(len(x.ids) for x in a)
    src_unk = sum(x.ids.count(ua) for x in a) if ua is not None else 0
    return {
        "texts": len(texts),
        "changed_texts": changed,
        "changed_share": changed / max(1, len(texts)),
        "tokens": tokens,
        "unk_tokens": unk,
        "unk_share": unk / max(1, tokens),
        "source_tokens": src_tokens,
        "source_unk_tokens": src_unk,
        "source_unk_share": src_unk / max(1, src_tokens),
        "new_unk_share": (unk - src_unk) / max(1, tokens),
    }
