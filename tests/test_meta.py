"""PreparedMeta: the meta.json prepro writes reads back; a foreign or newer file is refused
with a DataError that names the file and the field (or version)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stages import prepro
from xdpx.config import PreproConfig
from xdpx.data import META_FILE, DataError, PreparedMeta

pytestmark = pytest.mark.unit


@pytest.fixture
def prepared(tmp_path: Path) -> tuple[PreproConfig, str]:
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.tsv").write_text("text\tlabel\n好看\tpos\n太差了\tneg\n还行吧\tpos\n", "utf-8")
    (raw / "dev.tsv").write_text("text\tlabel\n不错\tpos\n很差\tneg\n", "utf-8")
    cfg = PreproConfig(
        data_source=str(raw),
        data_dir=str(tmp_path / "prepared"),
        data_files={"train": "train.tsv", "dev": "dev.tsv"},
    )
    prepro.run(cfg)
    return cfg, cfg.data_dir


def test_prepro_meta_round_trips(prepared):
    cfg, data_dir = prepared
    path = Path(data_dir, META_FILE)
    assert PreparedMeta.path_in(data_dir) == str(path)
    meta = PreparedMeta.read(data_dir)
    assert meta.version == PreparedMeta.VERSION
    assert meta.labels == ["pos", "neg"] and meta.num_labels == 2
    assert meta.split("train").rows == 3 and meta.split("dev").rows == 2
    assert meta.prepro == cfg.model_dump(mode="json")
    assert meta.model_dump(mode="json") == json.loads(path.read_text("utf-8"))
    copy = Path(data_dir).parent / "copy"
    meta.write(str(copy))
    assert PreparedMeta.read(str(copy)) == meta
    with pytest.raises(DataError, match=r"no split 'test'.*\['dev', 'train'\]"):
        meta.split("test")


def test_foreign_json_names_file_and_field(tmp_path):
    (tmp_path / META_FILE).write_text(json.dumps({"foo": 1}))
    with pytest.raises(DataError) as e:
        PreparedMeta.read(str(tmp_path))
    assert str(e.value).startswith(f"{tmp_path / META_FILE}: field 'tokenizer': Field required")
    (tmp_path / META_FILE).write_text(json.dumps(["a list"]))
    with pytest.raises(DataError, match="expected a JSON object, got list"):
        PreparedMeta.read(str(tmp_path))


def test_newer_version_names_file_and_version(prepared):
    _, data_dir = prepared
    path = Path(data_dir, META_FILE)
    raw = json.loads(path.read_text("utf-8"))
    path.write_text(json.dumps({**raw, "version": 2}))
    with pytest.raises(DataError) as e:
        PreparedMeta.read(data_dir)
    assert str(e.value).startswith(f"{path}: meta.json version 2 ")
    assert f"({PreparedMeta.VERSION})" in str(e.value)


def test_missing_and_not_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="run prepro first"):
        PreparedMeta.read(str(tmp_path))
    (tmp_path / META_FILE).write_text("{not json")
    with pytest.raises(DataError, match=rf"^{tmp_path / META_FILE}: not valid JSON"):
        PreparedMeta.read(str(tmp_path))
