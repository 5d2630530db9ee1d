"""bench/scale.py: the corpus copies and a --quick run on the real subset."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scale import build_corpus  # noqa: E402


@pytest.mark.unit
def test_copies_are_distinct_raw_shards_with_headers(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "train.tsv").write_text("text\tlabel\na b\tpos\nc\tneg\n", encoding="utf-8")
    for split in ("dev", "test"):
        (raw / f"{split}.tsv").write_text("text\tlabel\nd\tpos\n", encoding="utf-8")
    n = build_corpus(raw, tmp_path / "x5", scale=5, per_file=2)
    files = sorted((tmp_path / "x5").glob("train-*.tsv"))
    assert [f.name for f in files] == ["train-00000.tsv", "train-00001.tsv", "train-00002.tsv"]
    rows = []
    for f in files:
        header, *lines = f.read_text(encoding="utf-8").splitlines()
        assert header == "text\tlabel"
        rows += lines
    assert len(rows) == 10 == len(set(rows)) and n == 12
    assert rows[:2] == ["a b\tpos", "c\tneg"] and rows[-1] == "c #4\tneg"


@pytest.mark.e2e
def test_quick_run_measures_every_figure(real_subset, tmp_path):
    raw, _ = real_subset
    out = tmp_path / "scale.json"
    cmd = [sys.executable, "bench/scale.py", "--quick", "--raw", raw, "--json", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    result = json.loads(out.read_text())
    # the table prints each scale's measured figures, and the ratios are of the best runs
    for scale in ("1", "3"):
        p, t = result["scales"][scale]["prepro"], result["scales"][scale]["train"]
        row = next(
            line for line in done.stdout.splitlines() if line.strip().startswith(f"x{scale} ")
        )
        assert f"{p['peak_rss_mb']:,.0f} (" in row and f"{t['wall_s']:.1f}" in row, row
    w, lz = result["workers"], result["lazy"]
    assert w["ratio"] == w["w2"]["texts_per_s"] / w["w1"]["texts_per_s"]
    assert lz["ratio"] == lz["lazy"]["samples_per_s"] / lz["memory"]["samples_per_s"]
    assert "target >= 1.6x" in done.stdout and "lazy train" in done.stdout
    # the raw tokenizer pass read exactly the texts prepro prepared, in both languages
    for lang, tokenizer in (("zh", "char"), ("en", "word")):
        r = result["raw_pass"][lang]
        assert r["tokenizer"] == tokenizer and r["raw"]["texts"] == r["prepro"]["texts"]
        assert r["ratio"] == r["prepro"]["texts_per_s"] / r["raw"]["texts_per_s"]
    assert result["raw_pass"]["zh"]["prepro"]["texts"] == result["scales"]["3"]["texts"]
    assert "one raw word tokenizer pass" in done.stdout
