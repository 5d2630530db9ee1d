"""Distillation: teacher file from predict, KL term, alignment checks, student training."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from test_trainer import make_trainer, params_of

from stages import predict, train
from xdpx.config import ConfigError, PredictConfig, TrainConfig, load_params
from xdpx.data import DataError, load_split
from xdpx.distill.teacher import (
    distill_kl,
    distill_loss,
    load_teacher_logits,
    read_teacher_file,
    teacher_rows,
)
from xdpx.train.objectives import Distillation

STUDENT = dict(
    model="textcnn",
    learning_rate=3e-3,
    batch_size=32,
    embedding_dim=64,
    num_filters=32,
    eval_interval=30,
)


@pytest.fixture(scope="module")
def teacher(real_subset, tmp_path_factory):
    """An ngram_lr teacher trained on the subset; predict.distill on the train split's raw file.

    Returns (raw_dir, prepared_dir, teacher_file, PredictResult, checkpoint).
    """
    raw, prepared = real_subset
    root = tmp_path_factory.mktemp("teacher")
    train.run(
        TrainConfig(data_dir=prepared, save_dir=str(root / "run"), ngram_buckets=65536, max_epoch=2)
    )
    out, ckpt = str(root / "teacher.tsv"), str(root / "run" / "<best>")
    result = predict.run(
        PredictConfig(checkpoint=ckpt, data_file=f"{raw}/train.tsv", out_file=out, distill=True)
    )
    return raw, prepared, out, result, ckpt


@pytest.mark.unit
def test_kl_term_on_a_hand_computed_example():
    s = torch.tensor([[1.0, 3.0], [0.5, -0.5]], requires_grad=True)  # student logits
    t = torch.tensor([[2.0, 0.0], [0.0, 0.0]])  # teacher logits
    T, alpha = 2.0, 0.25

    def softmax2(a, b):  # 2 classes: [sigmoid(a - b), sigmoid(b - a)]
        p = 1 / (1 + math.exp(b - a))
        return [p, 1 - p]

    kl = 0.0
    for (s0, s1), (t0, t1) in zip(s.tolist(), t.tolist(), strict=True):
        p, q = softmax2(t0 / T, t1 / T), softmax2(s0 / T, s1 / T)
        kl += sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True))
    # row 1: p = [s(1), s(-1)], q = [s(-1), s(1)] (s = sigmoid): KL = (s(1) - s(-1)) * 1 = 0.462117
    # row 2: p = [.5, .5], q = [s(.5), s(-.5)]: KL = 0.5 * ln(0.25 / (s(.5) s(-.5))) = 0.030929
    assert kl == pytest.approx(0.462117 + 0.030929, abs=1e-5)
    assert distill_kl(s, t, T).item() == pytest.approx(kl, rel=1e-6)
    labels = torch.tensor([1, 0])
    ce = -math.log(softmax2(1.0, 3.0)[1]) - math.log(softmax2(0.5, -0.5)[0])
    loss, ce_t, kl_t = distill_loss(s, labels, t, alpha, T)
    assert ce_t.item() == pytest.approx(ce, rel=1e-6)
    assert loss.item() == pytest.approx((1 - alpha) * ce + alpha * T * T * kl, rel=1e-6)
    # d(T^2 KL)/ds = T (q - p): the T^2 keeps the soft gradient's scale (Hinton et al. 2015)
    (T * T * distill_kl(s, t, T)).backward()
    q = torch.softmax(s.detach() / T, -1)
    p = torch.softmax(t / T, -1)
    torch.testing.assert_close(s.grad, T * (q - p))


@pytest.mark.integration
def test_teacher_file_format(teacher):
    raw, prepared, out, result, _ = teacher
    df = pd.read_csv(out, sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False)
    labels = json.loads(open(f"{prepared}/meta.json").read())["labels"]
    expected = ["id", "text", "label", "pred_label"]
    expected += [f"prob_{x}" for x in labels] + [f"logit_{x}" for x in labels]
    assert list(df.columns) == expected
    train_rows = load_split(prepared, "train")
    assert result.rows == len(df) == len(train_rows)
    assert df["id"].tolist() == list(range(len(df)))
    raw_texts = pd.read_csv(
        f"{raw}/train.tsv", sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False
    )["text"]
    assert df["text"].tolist() == [t.strip() for t in raw_texts]
    logits = df[[f"logit_{x}" for x in labels]].to_numpy()
    probs = df[[f"prob_{x}" for x in labels]].to_numpy()
    z = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(probs, z / z.sum(1, keepdims=True), rtol=1e-6, atol=1e-9)
    assert (df["pred_label"] == np.array(labels)[logits.argmax(1)]).all()
    # the teacher learned something: its train-set predictions beat the majority label
    gold = df["label"].to_numpy()
    assert (df["pred_label"] == gold).mean() > max(np.mean(gold == x) for x in labels) + 0.05


@pytest.mark.unit
def test_texts_with_tabs_quotes_and_newlines_round_trip(tmp_path):
    """No quoting (the tsv convention): '"' stays, a tab or line break becomes a space."""
    texts = [['"他说"好', "a\tb", "line\r\nbreak"], ["x", "y", "z"]]
    logits = np.array([[0.5, -1.0], [2.0, 1.0], [0.0, 0.0]], dtype=np.float32)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    path = tmp_path / "t.tsv"
    path.write_text(teacher_rows(["text1", "text2"], texts, ["neg", "pos"], logits, probs))
    got = read_teacher_file(str(path), ["pos", "neg"], "text1", "text2")  # student's label order
    assert got.texts == ['"他说"好', "a b", "line  break"] and got.texts2 == texts[1]
    assert got.ids == [0, 1, 2] and got.lines == [2, 3, 4] and not got.from_probs
    np.testing.assert_array_equal(got.logits, logits[:, ::-1])


@pytest.mark.integration
def test_student_trains_end_to_end_with_distill_from(teacher, tmp_path):
    raw, prepared, out, _, ckpt = teacher
    cfg = TrainConfig(
        data_dir=prepared,
        save_dir=str(tmp_path / "student"),
        max_epoch=3,
        distill_from=out,
        distill_alpha=0.5,
        distill_temperature=2.0,
        log_interval=5,
        **STUDENT,
    )
    result = train.run(cfg)
    log = pd.read_csv(tmp_path / "student" / "train.log.tsv", sep="\t")
    assert {"distill_ce", "distill_kl"} <= set(log.columns)
    # the logged loss (finite: fit raises otherwise) is the weighted objective of its parts
    np.testing.assert_allclose(
        log["loss"], 0.5 * log["distill_ce"] + 0.5 * 4.0 * log["distill_kl"], rtol=1e-3
    )
    assert (
        log["distill_kl"].iloc[-1] < log["distill_kl"].iloc[0]
    )  # the student moves to the teacher
    dev = load_split(prepared, "dev").labels
    assert result.best_score > np.bincount(dev).max() / len(dev) + 0.05


@pytest.mark.integration
def test_alpha_zero_is_exactly_plain_training(teacher, tmp_path):
    _, prepared, out, _, _ = teacher
    logits = load_teacher_logits(out, prepared, "train", load_split(prepared, "train"))
    common = dict(STUDENT, max_update=6, log_interval=1, dropout=0.3, update_freq=2)
    plain = make_trainer(prepared, str(tmp_path / "plain"), **common)
    zero = make_trainer(prepared, str(tmp_path / "zero"), distill_alpha=0.0, **common)
    zero.objective = Distillation(zero.cfg, logits, len(logits))  # as stages.train builds it
    half = make_trainer(prepared, str(tmp_path / "half"), distill_alpha=0.5, **common)
    half.objective = Distillation(half.cfg, logits, len(logits))
    init = params_of(plain)
    plain.fit(), zero.fit(), half.fit()
    pp, pz, ph = params_of(plain), params_of(zero), params_of(half)
    for k in pp:
        assert torch.equal(pp[k], pz[k]), k
    assert max((pp[k] - init[k]).abs().max().item() for k in pp) > 1e-3
    assert max((pp[k] - ph[k]).abs().max().item() for k in pp) > 1e-5  # alpha matters


@pytest.mark.integration
def test_probabilities_only_file_gives_log_p(teacher, tmp_path):
    """An ordinary predictions.tsv (6-decimal prob_* columns, no id) is usable: logits = log p."""
    raw, prepared, out, _, ckpt = teacher
    plain_out = str(tmp_path / "pred.tsv")
    meta_labels = json.loads(open(f"{prepared}/meta.json").read())["labels"]
    df = pd.read_csv(out, sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False)
    probs = df[[f"prob_{x}" for x in meta_labels]]
    with open(plain_out, "w") as f:  # the layout predict writes without distill
        f.write("text\tlabel\tpred_label\t" + "\t".join(probs.columns) + "\n")
        for i in range(len(df)):
            p = "\t".join(f"{v:.6f}" for v in probs.iloc[i])
            f.write(f"{df['text'][i]}\t{df['label'][i]}\t{df['pred_label'][i]}\t{p}\n")
    logits = load_teacher_logits(plain_out, prepared, "train", load_split(prepared, "train"))
    np.testing.assert_allclose(
        np.exp(logits), np.maximum(probs.to_numpy().round(6), 0), rtol=1e-5, atol=1e-30
    )


@pytest.mark.integration
def test_misaligned_teacher_files_fail_naming_file_and_line(teacher, tmp_path):
    raw, prepared, out, _, ckpt = teacher
    data = load_split(prepared, "train")
    # 1. predictions of another file (the dev split): wrong count
    dev_out = str(tmp_path / "dev_teacher.tsv")
    predict.run(
        PredictConfig(
            checkpoint=ckpt,
            data_file=f"{raw}/dev.tsv",
            out_file=dev_out,
            distill=True,
        )
    )
    with pytest.raises(
        DataError, match=rf"{dev_out}: \d+ teacher rows but split 'train'.*has {len(data)}"
    ):
        load_teacher_logits(dev_out, prepared, "train", data)
    lines = open(out, encoding="utf-8").read().splitlines(keepends=True)
    # 2. two rows swapped (ids travel with them): the id check names line 2
    swapped = tmp_path / "swapped.tsv"
    swapped.write_text("".join([lines[0], lines[2], lines[1], *lines[3:]]), encoding="utf-8")
    with pytest.raises(DataError, match=rf"{swapped}:2: id 1 where sample id 0"):
        load_teacher_logits(str(swapped), prepared, "train", data)
    # 3. ids in order but the texts of rows 5 and 6 swapped: the text check names line 6
    rows = [ln.split("\t") for ln in lines]
    rows[5][1], rows[6][1] = rows[6][1], rows[5][1]
    texts = tmp_path / "texts.tsv"
    texts.write_text("".join("\t".join(r) for r in rows), encoding="utf-8")
    with pytest.raises(
        DataError,
        match=rf"{texts}:6: text .* does not match sample 4 .*2 of {len(data)} rows differ",
    ):
        load_teacher_logits(str(texts), prepared, "train", data)
    # 4. through the train stage: the same error, and nothing written
    save = tmp_path / "student"
    with pytest.raises(DataError, match=rf"{texts}:6:"):
        train.run(
            TrainConfig(data_dir=prepared, save_dir=str(save), distill_from=str(texts), **STUDENT)
        )
    assert not save.exists()
    # 5. a label the student does not know
    bad = tmp_path / "labels.tsv"
    bad.write_text(
        lines[0].replace("prob_pos", "prob_POS").replace("logit_pos", "logit_POS")
        + "".join(lines[1:])
    )
    with pytest.raises(DataError, match=rf"{bad}:1: the teacher's labels"):
        load_teacher_logits(str(bad), prepared, "train", data)


@pytest.mark.integration
def test_config_rules(real_subset, tmp_path):
    with pytest.raises(ConfigError, match="distill=true needs header=true"):
        load_params(str(tmp_path / "none.yaml"), ["predict.distill=true", "predict.header=false"])
    with pytest.raises(ConfigError, match="distill_alpha"):
        load_params(str(tmp_path / "none.yaml"), ["train.distill_alpha=1.5"])
    with pytest.raises(FileNotFoundError, match="train.distill_from: .*nope.tsv not found"):
        cfg = TrainConfig(
            data_dir=real_subset[1], save_dir=str(tmp_path / "s"), distill_from="nope.tsv"
        )
        train.check(cfg)


@pytest.mark.unit
def test_rows_without_a_gold_label_take_the_kl_term_alone_by_hand():
    """loss = (1-a) CE + a T^2 KL on gold rows, T^2 KL on the others (a hand computation)."""
    s = torch.tensor([[1.0, 3.0], [0.5, -0.5], [2.0, 0.0]])
    t = torch.tensor([[2.0, 0.0], [0.0, 0.0], [-1.0, 1.0]])
    y = torch.tensor([1, 0, 0])  # row 2's label is the teacher's: it must not count
    gold = np.array([True, True, False])
    T, a = 2.0, 0.25

    def sm(u, v):
        p = 1 / (1 + math.exp(v - u))
        return [p, 1 - p]

    kl = []
    for (s0, s1), (t0, t1) in zip(s.tolist(), t.tolist(), strict=True):
        p, q = sm(t0 / T, t1 / T), sm(s0 / T, s1 / T)
        kl.append(sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True)))
    ce = [-math.log(sm(1.0, 3.0)[1]), -math.log(sm(0.5, -0.5)[0])]
    want = (1 - a) * sum(ce) + a * T * T * (kl[0] + kl[1]) + T * T * kl[2]
    loss, ce_t, kl_t = distill_loss(s, y, t, a, T, torch.from_numpy(gold))
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert ce_t.item() == pytest.approx(sum(ce), rel=1e-6)
    assert kl_t.item() == pytest.approx(sum(kl), rel=1e-6)
    # all gold: the same as without a mask (the existing path)
    all_gold = distill_loss(s, y, t, a, T, torch.ones(3, dtype=torch.bool))[0]
    assert all_gold.item() == pytest.approx(distill_loss(s, y, t, a, T)[0].item(), rel=1e-6)
    # through the objective: sample ids pick the teacher rows and their gold flags
    cfg = TrainConfig(model="textcnn", distill_from="x", distill_alpha=a, distill_temperature=T)
    obj = Distillation(cfg, np.array([[9.0, 9.0], *t.tolist()]), 4, np.array([True, *gold]))
    got = obj.loss(s, y, np.array([1, 2, 3]))
    assert got.item() == pytest.approx(want, rel=1e-6)
    with pytest.raises(ValueError, match=r"gold must be \[4\]"):
        Distillation(cfg, np.zeros((4, 2)), 4, np.ones(3, dtype=bool))
    # class weights (train.class_weight) weigh each row's both terms by its label's class
    cw = torch.tensor([1.0, 3.0])  # rows' labels 1, 0, 0 -> weights 3, 1, 1
    want_w = (1 - a) * (3 * ce[0] + ce[1]) + a * T * T * (3 * kl[0] + kl[1]) + T * T * kl[2]
    weighted = Distillation(cfg, np.array([[9.0, 9.0], *t.tolist()]), 4, np.array([True, *gold]), cw)  # fmt: skip
    assert weighted.loss(s, y, np.array([1, 2, 3])).item() == pytest.approx(want_w, rel=1e-6)
    plain = distill_loss(s, y, t, a, T, None, torch.tensor([3.0, 1.0, 1.0]))[0]  # no gold mask
    want_all = (1 - a) * (3 * ce[0] + ce[1] - math.log(sm(2.0, 0.0)[0])) + a * T * T * (3 * kl[0] + kl[1] + kl[2])  # fmt: skip
    assert plain.item() == pytest.approx(want_all, rel=1e-6)


@pytest.mark.unit
def test_a_students_class_weights_come_from_the_gold_rows_labels():
    """train.class_weight auto under distillation: the imbalance of the task's gold labels
    decides, not that of the teacher-labelled transfer rows (recombined pairs are mostly
    unrelated: STS-B's 5,749 gold pairs are 64% class 0, its 39,149 transfer rows 87%)."""
    from xdpx.data.lazy import InMemoryData
    from xdpx.train.objectives import build_objective

    cfg = TrainConfig(model="ngram_lr", distill_from="x", class_weight="auto")
    labels = np.array([0] * 20 + [1] * 10 + [0] * 200)  # 30 gold rows (2:1), 200 teacher rows
    gold = np.array([True] * 30 + [False] * 200)
    data = InMemoryData([[1, 2]] * len(labels), labels, 1)
    logits = np.zeros((len(labels), 2), dtype=np.float32)
    obj = build_objective(cfg, None, data, 2, 0, logits, teacher_gold=gold)
    assert isinstance(obj, Distillation) and obj.class_weight is None  # 2:1 < 3: balanced off
    skewed = np.array([0] * 27 + [1] * 3 + [1] * 200)  # gold 9:1, teacher rows all class 1
    obj = build_objective(cfg, None, InMemoryData([[1, 2]] * 230, skewed, 1), 2, 0, logits, teacher_gold=gold)  # fmt: skip
    assert obj.class_weight.tolist() == pytest.approx([30 / (2 * 27), 30 / (2 * 3)])  # gold counts
    all_gold = build_objective(cfg, None, InMemoryData([[1, 2]] * 30, skewed[:30], 1), 2, 0, logits[:30])  # fmt: skip
    assert all_gold.class_weight.tolist() == pytest.approx([30 / 54, 30 / 6])


@pytest.mark.unit
def test_a_gold_value_other_than_0_or_1_names_file_and_line(tmp_path):
    g = tmp_path / "g.tsv"
    g.write_text("id\ttext\tgold\tlogit_a\tlogit_b\n0\tx\t2\t0.1\t0.2\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"g\.tsv:2: gold='2' is not 0 or 1"):
        read_teacher_file(str(g), ["a", "b"], "text")
