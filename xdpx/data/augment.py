"""Text augmentation for a distillation transfer set (Tang et al. 2019, section 3.2).

Tang, Lu, Liu, Mou, Vechtomova and Lin (2019), "Distilling Task-Specific Knowledge from BERT
into Simple Neural Networks", section 3.2: each synthetic copy of a text is made by drawing,
for every token ``w_i``, ``X_i ~ U[0, 1]``; with ``X_i < p_mask`` the token becomes the mask
token (``[MASK]``: the teacher's masked token, an unknown token for the student); then, with
probability ``p_ng``, the copy is cut to a random n-gram of itself, ``n ~ U{1, ..., 5}``.
Their defaults: ``p_mask = 0.1``, ``p_ng = 0.25`` (:data:`P_MASK`, :data:`P_NG`,
:data:`NGRAM_MAX`). Their POS-guided word replacement (``p_pos``) needs a part-of-speech
tagger, which the project does not ship: it is not implemented.

Tokens are those of prepro's tokenizers (:mod:`xdpx.data.tokenizers`), case kept:

* ``word`` (scripts written with spaces): BERT's words and punctuation; a copy is its
  tokens joined by one space (so ``"It's great!"`` may come back as ``"It ' s [MASK] !"``,
  which the ``word`` tokenizer splits into the same tokens);
* ``char`` (Chinese and other scripts written without spaces): every non-whitespace
  character; a copy is its characters joined without spaces. Besides masking, each
  character may be dropped (``p_drop``) or swapped with the next one (``p_swap``); both
  default to 0.1 for ``char`` (EDA's random deletion and swap rate, Wei and Zou 2019,
  "EDA: Easy Data Augmentation Techniques ...", alpha = 0.1) and to 0 for ``word`` (Tang et
  al. use neither). N-gram sampling then runs over characters.

``auto`` resolves as prepro does (:func:`xdpx.data.tokenizers.detect_tokenizer`).

**Recombined pairs** (pair tasks; :func:`neighbour_pairs`): each text of a training pair
with its nearest other training texts by TF-IDF cosine, as new pairs for the teacher to label.
This is the "BM25 sampling" of Thakur, Reimers, Daxenberger and Gurevych (2021), "Augmented
SBERT: Data Augmentation Method for Improving Bi-Encoders for Pairwise Sentence Scoring
Tasks" (NAACL), section 3: pairs drawn from the training sentences' lexical neighbours, so
that many of them are paraphrases or near-misses, where random pairings are almost all
unrelated. Unlike the masked copies, every text in these pairs is a text somebody wrote.

**Determinism.** Copy ``c`` of text ``i`` (side ``s`` of a pair: 0 or 1) draws from
``numpy.random.default_rng([seed, i, c, s])``, and nothing else: the output depends on
``(seed, i, c, s)`` and the text only, not on which chunk or order the texts come in, so a
streamed run and an in-memory run give the same copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xdpx.data.tokenizers import CharTokenizer, WordTokenizer

__all__ = [
    "P_MASK",
    "P_NG",
    "NGRAM_MAX",
    "CHAR_P_DROP",
    "CHAR_P_SWAP",
    "MASK_TOKEN",
    "Augmenter",
    "augment_tokens",
    "neighbour_pairs",
]

#: Tang et al. 2019, section 3.2 / 4.2: masking probability per token.
P_MASK = 0.1
#: Tang et al. 2019: probability that a copy is cut to an n-gram.
P_NG = 0.25
#: Tang et al. 2019: n of the n-gram drawn uniformly from 1..NGRAM_MAX.
NGRAM_MAX = 5
#: ``char`` defaults of the character drop / swap rates (EDA's alpha, Wei and Zou 2019).
CHAR_P_DROP = 0.1
CHAR_P_SWAP = 0.1
#: BERT's mask token (Tang et al.: "[MASK]").
MASK_TOKEN = "[MASK]"


def augment_tokens(
    tokens: Sequence[str],
    rng: np.random.Generator,
    p_mask: float = P_MASK,
    p_ng: float = P_NG,
    ngram_max: int = NGRAM_MAX,
    p_drop: float = 0.0,
    p_swap: float = 0.0,
    mask_token: str = MASK_TOKEN,
) -> list[str]:
    """One synthetic copy of a token sequence (Tang et al. 2019, section 3.2; module docstring).

    For each token ``X_i ~ U[0, 1)``: ``X_i < p_mask`` masks it; ``p_mask <= X_i < p_mask +
    p_drop`` drops it; the next ``p_swap`` of the range swaps it with the following token
    (which then takes no operation of its own; the last token has none to swap with and is
    kept). Then with probability ``p_ng`` the result is cut to a contiguous n-gram,
    ``n ~ U{1..ngram_max}`` (at most the result's length), its start uniform. A copy that
    drops every token keeps the first one. The draws are made in a fixed order (``len(tokens)``
    uniforms, then one uniform, one n, one start), so equal generators give equal copies.

    Args:
        tokens: ``[n]`` tokens, ``n >= 1``.
        rng: the copy's generator.
        p_mask, p_ng, p_drop, p_swap: probabilities in [0, 1]; ``p_mask + p_drop + p_swap <= 1``.
        ngram_max: largest n of n-gram sampling (>= 1).
        mask_token: what a masked token becomes.

    Returns:
        The copy's tokens (``1 <= len <= n``, ``<= ngram_max`` after n-gram sampling).

    Raises:
        ValueError: no tokens, probabilities out of range, ``ngram_max < 1``.
    """
    if not tokens:
        raise ValueError("augment_tokens needs at least one token")
    probs = {"p_mask": p_mask, "p_ng": p_ng, "p_drop": p_drop, "p_swap": p_swap}
    bad = {k: v for k, v in probs.items() if not 0.0 <= v <= 1.0}
    if bad or p_mask + p_drop + p_swap > 1.0 + 1e-12:
        raise ValueError(
            f"probabilities must lie in [0, 1] with p_mask + p_drop + p_swap <= 1: {probs}"
        )
    if ngram_max < 1:
        raise ValueError(f"ngram_max must be >= 1, got {ngram_max}")
    x = rng.random(len(tokens))
    out: list[str] = []
    i = 0
    while i < len(tokens):
        if x[i] < p_mask:
            out.append(mask_token)
        elif x[i] < p_mask + p_drop:
            pass
        elif x[i] < p_mask + p_drop + p_swap and i + 1 < len(tokens):
            out += [tokens[i + 1], tokens[i]]
            i += 1
        else:
            out.append(tokens[i])
        i += 1
    if not out:
        out = [tokens[0]]
    cut = rng.random() < p_ng
    n = min(int(rng.integers(1, ngram_max + 1)), len(out))
    start = int(rng.integers(0, len(out) - n + 1))
    return out[start : start + n] if cut else out


class Augmenter:
    """Synthetic copies of texts, deterministic by ``(seed, text index, copy index, side)``.

    Args:
        tokenizer: ``char`` or ``word`` (resolve ``auto`` first with
            :func:`xdpx.data.tokenizers.detect_tokenizer`).
        seed: the run's seed.
        p_mask, p_ng, ngram_max: Tang et al.'s operations (defaults: theirs).
        p_drop, p_swap: character drop / swap rates; None = 0.1 for ``char``, 0 for ``word``.
        mask_token: the mask token.

    Raises:
        ValueError: an unknown tokenizer (a bad probability: on the first copy).
    """

    def __init__(
        self,
        tokenizer: str,
        seed: int = 1,
        p_mask: float = P_MASK,
        p_ng: float = P_NG,
        ngram_max: int = NGRAM_MAX,
        p_drop: float | None = None,
        p_swap: float | None = None,
        mask_token: str = MASK_TOKEN,
    ) -> None:
        if tokenizer not in ("char", "word"):
            raise ValueError(f"augmentation tokenizer must be 'char' or 'word', got {tokenizer!r}")
        char = tokenizer == "char"
        self.tokenizer, self.seed, self.mask_token = tokenizer, seed, mask_token
        self.p_mask, self.p_ng, self.ngram_max = p_mask, p_ng, ngram_max
        self.p_drop = (CHAR_P_DROP if char else 0.0) if p_drop is None else p_drop
        self.p_swap = (CHAR_P_SWAP if char else 0.0) if p_swap is None else p_swap
        self._tok = CharTokenizer(lower=False) if char else WordTokenizer(lower=False)
        self._join = "" if char else " "

    def tokens(self, text: str) -> list[str]:
        """The tokens the operations act on (prepro's tokenizer, case kept)."""
        return self._tok.tokenize(text)

    def plain(self, text: str) -> str:
        """The text as a copy without any operation gives it (its tokens joined)."""
        return self._join.join(self.tokens(text))

    def copy(self, text: str, index: int, copy: int, side: int = 0) -> str:
        """Copy ``copy`` of text number ``index`` (``side`` 1: the second text of a pair).

        Args:
            text: the text (at least one non-whitespace character).
            index: the text's 0-based index in its file (what makes copies of equal texts
                differ).
            copy: 0-based copy number; side: 0, or 1 for a pair's second text.

        Returns:
            The copy as text (tokens joined by a space for ``word``, by nothing for ``char``).

        Raises:
            ValueError: the text has no token.
        """
        tokens = self.tokens(text)
        if not tokens:
            raise ValueError(f"text {index} has no token to augment: {text!r}")
        rng = np.random.default_rng([self.seed, index, copy, side])
        out = augment_tokens(
            tokens, rng, self.p_mask, self.p_ng, self.ngram_max, self.p_drop, self.p_swap,
            self.mask_token,
        )  # fmt: skip
        return self._join.join(out)


def neighbour_pairs(
    first: Sequence[str], second: Sequence[str], k: int, chunk_rows: int = 4096
) -> list[tuple[int, int, str, str]]:
    """Recombined pairs of a pair task's training texts (module docstring; Thakur et al. 2021).

    The pool is the distinct texts of both sides. They are embedded as TF-IDF vectors of
    character 2-4-grams inside words (scikit-learn ``TfidfVectorizer(analyzer="char_wb",
    ngram_range=(2, 4), sublinear_tf=True)``, lower-cased: close to the n-gram models' own
    sub-word features; for text without spaces, character n-grams of the whole text), and
    for side ``s`` of pair ``i`` (text ``a``, partner ``b``), in the order ``i = 0, 1, ...``,
    ``s = 0, 1``, the ``k`` nearest pool texts ``t`` by cosine become the pairs ``(a, t)``,
    skipping ``t`` equal to ``a`` (case ignored) or to ``b``, and any pair already made or
    in the training set (either order). Ties are broken by the pool order (first
    appearance), so the output depends on the texts and ``k`` only.

    Memory and time: the pool and its sparse TF-IDF matrix are held in memory (STS-B's
    11,498 train texts: ~10 MB), and the search scores every pool text against every other,
    ``chunk_rows`` at a time (a dense ``[chunk_rows, pool]`` float32 block): quadratic in
    the pool, ~10 s for STS-B on one core.

    Args:
        first, second: ``[n]`` the pairs' texts (side 0 and side 1), ``n >= 1``.
        k: neighbours per text (``>= 1``).
        chunk_rows: query texts scored per block.

    Returns:
        ``[(i, s, a, t), ...]``: the pair's index, the side its text ``a`` came from, and the
        new pair ``(a, t)``; at most ``2 * n * k`` pairs (fewer where a text has fewer
        neighbours than ``k`` after the skips).

    Raises:
        ValueError: ``k < 1``, no pairs, or sides of different lengths.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    if k < 1:
        raise ValueError(f"neighbour_pairs: k must be >= 1, got {k}")
    if not first or len(first) != len(second):
        raise ValueError(f"neighbour_pairs: {len(first)} and {len(second)} texts: need equal, >= 1")
    pool = list(dict.fromkeys([*first, *second]))
    index = {t: j for j, t in enumerate(pool)}
    x = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), sublinear_tf=True).fit_transform(
        pool
    )
    x = x.astype(np.float32)
    take = min(k + 8, len(pool))  # candidates: the skips (itself, its partner, repeats) need spares
    near = np.empty((len(pool), take), dtype=np.int64)
    for lo in range(0, len(pool), chunk_rows):
        sim = (x[lo : lo + chunk_rows] @ x.T).toarray()
        # each row's take-th largest similarity; every text at or above it is a candidate
        # (ties included), ordered by similarity, ties by pool order (a stable sort)
        cuts = -np.partition(-sim, take - 1, axis=1)[:, take - 1]
        for r in range(sim.shape[0]):
            cand = np.flatnonzero(sim[r] >= cuts[r])
            near[lo + r] = cand[np.argsort(-sim[r, cand], kind="stable")[:take]]
    seen = {(a, b) for a, b in zip(first, second, strict=True)}
    seen |= {(b, a) for a, b in seen}
    out: list[tuple[int, int, str, str]] = []
    for i, pair in enumerate(zip(first, second, strict=True)):
        for s in (0, 1):
            a, partner = pair[s], pair[1 - s]
            made = 0
            for j in near[index[a]]:
                t = pool[j]
                if t.lower() == a.lower() or t == partner or (a, t) in seen:
                    continue
                seen.add((a, t))
                seen.add((t, a))
                out.append((i, s, a, t))
                made += 1
                if made == k:
                    break
    return out
