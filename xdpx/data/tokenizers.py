"""Tokenizers: ``char`` and ``whitespace`` (token strings, looked up in a Vocab) and ``hf``.

The keys of :data:`TOKENIZERS` are exactly the values of ``PreproConfig.tokenizer``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CharTokenizer", "WhitespaceTokenizer", "HFTokenizer", "TOKENIZERS", "make_tokenizer"]


class CharTokenizer:
    """Each non-whitespace character is a token (the default for Chinese text).

    Args:
        lower: lower-case the text before splitting.
    """

    name = "char"

    def __init__(self, lower: bool = True) -> None:
        self.lower = lower

    def tokenize(self, text: str) -> list[str]:
        """``"Ab c"`` -> ``["a", "b", "c"]`` (with ``lower``); whitespace is dropped."""
        if self.lower:
            text = text.lower()
        return [c for c in text if not c.isspace()]


class WhitespaceTokenizer:
    """Tokens are the maximal runs of non-whitespace characters (``str.split()``).

    Args:
        lower: lower-case the text before splitting.
    """

    name = "whitespace"

    def __init__(self, lower: bool = True) -> None:
        self.lower = lower

    def tokenize(self, text: str) -> list[str]:
        """``"Good  movie!"`` -> ``["good", "movie!"]`` (with ``lower``)."""
        if self.lower:
            text = text.lower()
        return text.split()


class HFTokenizer:
    """A local Hugging Face *fast* tokenizer; produces ids (special tokens included) directly.

    Lower-casing is left to the tokenizer's own normalizer (``PreproConfig.lower`` does
    not apply). Nothing is downloaded: the directory must hold ``tokenizer.json`` etc.

    Args:
        path: local directory loadable by ``AutoTokenizer.from_pretrained``.
        lower: ignored (kept for a uniform constructor).

    Raises:
        ValueError: ``path`` is not a local directory, cannot be loaded, or is not a
            fast tokenizer, or the tokenizer has no pad token.
    """

    name = "hf"

    def __init__(self, path: str, lower: bool = True) -> None:
        from transformers import AutoTokenizer

        from xdpx.pretrained import quiet_transformers, resolve_pretrained

        del lower
        try:
            local = resolve_pretrained(path)
        except FileNotFoundError as e:
            raise ValueError(f"tokenizer_path {path!r}: {e}") from None
        try:
            with quiet_transformers():  # no "sequence longer than model_max_length" noise
                tok = AutoTokenizer.from_pretrained(local, local_files_only=True)
        except Exception as e:  # noqa: BLE001 - any load failure is a config problem
            raise ValueError(f"tokenizer_path {path!r}: cannot load a tokenizer ({e})") from None
        if not getattr(tok, "is_fast", False):
            raise ValueError(
                f"tokenizer_path {path!r}: not a fast tokenizer (needs tokenizer.json)"
            )
        if tok.pad_token_id is None:
            raise ValueError(f"tokenizer_path {path!r}: the tokenizer has no pad token")
        self.path = path
        self.tok: Any = tok

    @property
    def pad_id(self) -> int:
        return int(self.tok.pad_token_id)

    @property
    def sep_id(self) -> int | None:
        """The separator id (``[SEP]``) placed between the texts of a pair, if any."""
        sep = self.tok.sep_token_id
        return int(sep) if sep is not None else None

    @property
    def unk_id(self) -> int:
        """The unknown-token id, or the pad id when the tokenizer has none."""
        unk = self.tok.unk_token_id
        return int(unk) if unk is not None else self.pad_id

    @property
    def vocab_size(self) -> int:
        """Number of ids (1 + the largest id, added tokens included)."""
        return max(self.tok.get_vocab().values()) + 1

    def vocab_tokens(self) -> list[str]:
        """Tokens in id order (``[unused<i>]`` for unassigned ids; newlines escaped)."""
        out = [f"[unused{i}]" for i in range(self.vocab_size)]
        for token, i in self.tok.get_vocab().items():
            out[i] = token.replace("\n", "\\n").replace("\r", "\\r")
        return out

    def tokenize(self, text: str) -> list[str]:
        """Token strings (without special tokens)."""
        return list(self.tok.tokenize(text))

    def encode(self, text: str, text2: str | None = None, max_len: int | None = None) -> list[int]:
        """Ids with special tokens; a pair goes through the text-pair API (one sequence).

        Args:
            text: first text.
            text2: second text of a pair, or None.
            max_len: truncate to this many ids (``longest_first`` for pairs); None = no limit.
        """
        kwargs: dict[str, Any] = {"add_special_tokens": True}
        if max_len is not None:
            kwargs.update(
                truncation="longest_first" if text2 is not None else True, max_length=max_len
            )
        return list(self.tok(text, text2, **kwargs)["input_ids"])


#: ``PreproConfig.tokenizer`` name -> tokenizer class.
TOKENIZERS: dict[str, type] = {
    "char": CharTokenizer,
    "whitespace": WhitespaceTokenizer,
    "hf": HFTokenizer,
}


def make_tokenizer(
    name: str, lower: bool = True, path: str | None = None
) -> CharTokenizer | WhitespaceTokenizer | HFTokenizer:
    """Instantiate a tokenizer by its config name.

    Raises:
        ValueError: unknown name, or ``hf`` without a usable ``path``.
    """
    if name not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}; choose one of {sorted(TOKENIZERS)}")
    if name == "hf":
        if not path:
            raise ValueError("tokenizer=hf needs tokenizer_path (a local tokenizer directory)")
        return HFTokenizer(path, lower)
    return TOKENIZERS[name](lower)
