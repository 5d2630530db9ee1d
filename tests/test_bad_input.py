"""Inputs that used to pass silently, on real corpus lines: a NUL inside a text, one text
under two labels (within train; in train and dev), a label that only train has."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from stages import prepro
from xdpx.config import PreproConfig
from xdpx.data import load_split
from xdpx.data.readers import DataError

pytestmark = pytest.mark.integration


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _flip(line: str) -> str:
    text, label = line.rsplit("\t", 1)
    return f"{text}\t{'pos' if label == 'neg' else 'neg'}"


@pytest.fixture
def raw(real_subset, tmp_path) -> Path:
    src, _ = real_subset
    out = tmp_path / "raw"
    shutil.copytree(src, out)
    return out


def _prepro(raw: Path, out: Path, **kw) -> dict:
    prepro.run(PreproConfig(data_source=str(raw), data_dir=str(out), max_len=64, **kw))
    return json.loads((out / "meta.json").read_text())


def test_a_nul_in_a_text_names_file_line_and_character_or_is_stripped_and_counted(
    raw, tmp_path, caplog
):
    lines = _lines(raw / "train.tsv")
    text, label = lines[5].rsplit("\t", 1)
    # other control characters (C0 ESC, C1 U+009D) are noise: stripped, counted, one WARN
    lines[5] = f"{text[:4]}\x1b{text[4:]}\x9d\t{label}"  # a real review (line 6)
    _write(raw / "train.tsv", lines)
    with caplog.at_level("WARNING", logger="xdpx.prepro"):
        meta = _prepro(raw, tmp_path / "w")  # the default: control_chars=strip_warn
    warns = [r.getMessage() for r in caplog.records if "control character" in r.getMessage()]
    assert len(warns) == 1 and f"{raw / 'train.tsv'}:6: U+001B at character 5" in warns[0], warns
    assert meta["splits"]["train"]["control_stripped"] == 1
    assert meta["splits"]["train"]["rows"] == len(lines) - 1  # kept (one line is the header)
    assert len(load_split(str(tmp_path / "w"), "train")) == len(lines) - 1
    vocab = (tmp_path / "w" / "vocab.txt").read_text(encoding="utf-8")
    assert "\x1b" not in vocab and "\x9d" not in vocab  # removed before tokenizing
    lines[5] = f"{text[:4]}\x00{text[4:]}\t{label}"  # a NUL: a binary or UTF-16 file
    _write(raw / "train.tsv", lines)
    with pytest.raises(DataError, match=r"train\.tsv:6: NUL \(U\+0000\) at character 5 .*UTF-16.*control_chars=strip"):  # fmt: skip
        _prepro(raw, tmp_path / "p")
    assert not (tmp_path / "p").exists()  # nothing half-written
    meta = _prepro(raw, tmp_path / "p", control_chars="strip")
    assert meta["splits"]["train"]["control_stripped"] == 1
    assert meta["splits"]["train"]["rows"] == len(lines) - 1  # kept, without the NUL
    meta = _prepro(raw, tmp_path / "q", skip_bad_lines=True)  # error + skip: the line goes
    assert meta["splits"]["train"]["skipped"] == 1
    assert "NUL" in meta["splits"]["train"]["bad_lines"][0]


def test_a_lone_surrogate_in_jsonl_names_file_line_and_key(raw, tmp_path):
    """JSON's "\\ud800" escape without its pair decodes to a lone surrogate, which no
    tokenizer or UTF-8 writer accepts: a bad line (file:line, key), not a crash; a proper
    pair (an emoji) is kept."""
    for split in ("train", "dev", "test"):
        rows = [line.rsplit("\t", 1) for line in _lines(raw / f"{split}.tsv")[1:]]
        objs = [json.dumps({"text": t, "label": y}, ensure_ascii=False) for t, y in rows]
        if split == "train":
            objs[2] = objs[2].replace('"text": "', '"text": "\\ud83d\\ude00 ', 1)  # a pair
            objs[6] = objs[6].replace('"text": "', '"text": "ok \\uD800', 1)  # line 7
        (raw / f"{split}.jsonl").write_text("\n".join(objs) + "\n", encoding="utf-8")
    files = {s: f"{s}.jsonl" for s in ("train", "dev", "test")}
    with pytest.raises(DataError, match=r"train\.jsonl:7: lone surrogate U\+D800 at character 4 \(key 'text'\)"):  # fmt: skip
        _prepro(raw, tmp_path / "p", format="jsonl", data_files=files)
    meta = _prepro(raw, tmp_path / "p", format="jsonl", data_files=files, skip_bad_lines=True)
    assert meta["splits"]["train"]["skipped"] == 1
    assert meta["splits"]["train"]["rows"] == len(_lines(raw / "train.tsv")) - 2


def test_conflicting_labels_are_reported_kept_dropped_or_refused(raw, tmp_path):
    train, dev = _lines(raw / "train.tsv"), _lines(raw / "dev.tsv")
    n_train, n_dev = len(train) - 1, len(dev) - 1
    train.append(_flip(train[10]))  # within train: line 11 and the last line
    dev.append(_flip(train[20]))  # train line 21's text in dev with the other label
    dev.append(train[30])  # a plain duplicate, same label: not a conflict
    _write(raw / "train.tsv", train)
    _write(raw / "dev.tsv", dev)

    meta = _prepro(raw, tmp_path / "keep")  # default: keep + report
    c = meta["conflicts"]
    assert c["action"] == "keep" and c["texts"] == 2
    assert c["within"]["train"] == 1 and c["across_train"] == {"dev": 1, "test": 0}
    assert c["rows"] == {"train": 3, "dev": 1, "test": 0}
    assert any("train.tsv:11 (" in e and f"train.tsv:{n_train + 2} (" in e for e in c["examples"])  # fmt: skip
    assert any("train.tsv:21 (" in e and f"dev.tsv:{n_dev + 2} (" in e for e in c["examples"])
    assert meta["splits"]["train"]["rows"] == n_train + 1

    meta = _prepro(raw, tmp_path / "drop", conflicts="drop")
    assert meta["conflicts"]["action"] == "drop"
    assert meta["splits"]["train"]["rows"] == n_train + 1 - 3
    assert meta["splits"]["dev"]["rows"] == n_dev + 2 - 1
    split = load_split(str(tmp_path / "drop"), "train")
    assert len(split) == n_train - 2 and sum(meta["splits"]["train"]["label_counts"]) == len(split)
    assert sorted(split.ids.tolist()) == list(range(len(split)))  # ids renumbered

    meta = _prepro(raw, tmp_path / "off", conflicts="off")  # not looked for: nothing recorded
    assert meta["conflicts"] is None and meta["splits"]["train"]["rows"] == n_train + 1

    with pytest.raises(DataError, match=r"2 text\(s\) under two labels \(1 within train, 1 in train and dev\).*train\.tsv:11"):  # fmt: skip
        _prepro(raw, tmp_path / "error", conflicts="error")
    assert not (tmp_path / "error").exists()


def test_a_label_only_train_has_is_reported(raw, tmp_path, caplog):
    train = _lines(raw / "train.tsv")
    for i in (3, 4, 5):
        train[i] = train[i].rsplit("\t", 1)[0] + "\tneutral"
    _write(raw / "train.tsv", train)
    meta = _prepro(raw, tmp_path / "p")
    assert meta["train_only_labels"] == ["neutral"]
    assert meta["labels_missing"] == {"dev": ["neutral"], "test": ["neutral"]}
    assert "occur in train only" in caplog.text


def _overlap_warns(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "deduplicate across splits" in r.getMessage()]


def test_dev_and_test_the_same_file_is_a_prepro_warn_and_a_doctor_fail(raw, tmp_path, caplog):
    """The slip of issue 50: prepro.data_files={train: train.tsv, dev: test.tsv, test:
    test.tsv} selects the model on its test set. prepro says so (meta.json and one WARN
    naming both files) and the doctor fails naming both paths."""
    from xdpx.config import Params, TrainConfig
    from xdpx.doctor.report import _data

    files = {"train": "train.tsv", "dev": "test.tsv", "test": "test.tsv"}
    with caplog.at_level("WARNING", logger="xdpx.prepro"):
        meta = _prepro(raw, tmp_path / "p", data_files=files)
    test = str(raw / "test.tsv")
    rows = meta["splits"]["test"]["rows"]
    same = meta["overlaps"]["dev~test"]
    assert same["identical"] and same["exact"] == same["distinct"]["test"] > 100
    assert same["rows"] == {"dev": rows, "test": rows} and same["near"] == 0
    assert same["examples"][0] == f"{test}:2 = {test}:2"
    assert not meta["overlaps"]["train~dev"]["identical"]
    warns = _overlap_warns(caplog)
    assert len(warns) == 1, warns
    assert warns[0].startswith(f"dev and test hold the same texts ({test} and {test})")
    checks = {c.name: c for c in _data(Params(train=TrainConfig(data_dir=str(tmp_path / "p"))))}
    fail = checks["leakage[dev~test]"]
    assert fail.status == "fail", fail.line()
    assert f"dev ({test}) and test ({test}) hold the same {rows} texts" in fail.detail
    assert checks["leakage[test]"].status == "ok"  # test vs train: nothing shared


def test_texts_shared_by_two_splits_exactly_or_once_normalised_are_counted(
    raw, real_subset, tmp_path, caplog
):
    """Every pair of splits, not only against train: a dev review copied into test is an
    exact match (WARN, file:line of both); a train review re-cased, re-spaced and
    re-punctuated in dev is a near-duplicate (counted, shown with ~). The corpus as fetched
    shares a few short generic reviews once normalised: recorded, no WARN."""
    base = json.loads((Path(real_subset[1]) / "meta.json").read_text())["overlaps"]
    assert set(base) == {"train~dev", "train~test", "dev~test"}
    assert all(e["exact"] == 0 and e["near"] < 0.01 * min(e["distinct"].values()) for e in base.values())  # fmt: skip
    train, dev, test = (_lines(raw / f"{s}.tsv") for s in ("train", "dev", "test"))
    text, label = train[1].rsplit("\t", 1)  # a real review, its first line (line 2)
    dev.append(f"{text.upper()}  !!!\t{label}")
    test.append(dev[1])  # dev.tsv:2 again, as test's last line
    _write(raw / "dev.tsv", dev)
    _write(raw / "test.tsv", test)
    with caplog.at_level("WARNING", logger="xdpx.prepro"):
        meta = _prepro(raw, tmp_path / "p")
    found = meta["overlaps"]
    assert found["dev~test"]["exact"] == base["dev~test"]["exact"] + 1
    assert f"{raw / 'dev.tsv'}:2 = {raw / 'test.tsv'}:{len(test)}" in found["dev~test"]["examples"]
    assert found["train~dev"]["near"] == base["train~dev"]["near"] + 1
    assert found["train~dev"]["exact"] == 0
    near = f"{raw / 'train.tsv'}:2 ~ {raw / 'dev.tsv'}:{len(dev)}"
    assert near in found["train~dev"]["examples"]
    warns = _overlap_warns(caplog)
    assert len(warns) == 1 and warns[0].startswith("dev and test share 1 text(s)"), warns
