"""Refactors change no number: runs of fixed configs match fingerprints recorded before.

tests/data/fingerprints.json was written by ``tools/fingerprint.py`` before issue 21's
refactor of the trainer (default ngram_lr; textcnn with update_freq=2). On the machine
that recorded it (same CPU model, torch and CPU capability) weights and logs must be
bit-identical; elsewhere fp32 kernels may differ in the last bits, so the logged numbers
are compared within 1e-4 and the hashes are not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import fingerprint  # noqa: E402

pytestmark = pytest.mark.integration

RECORDED = json.loads((ROOT / "tests" / "data" / "fingerprints.json").read_text())


@pytest.fixture(scope="module")
def current(tmp_path_factory):
    return fingerprint.run_all(tmp_path_factory.mktemp("fingerprint"))


def test_configs_are_the_recorded_ones():
    assert fingerprint.CONFIGS == RECORDED["configs"]


@pytest.mark.parametrize("name", sorted(fingerprint.CONFIGS))
def test_run_matches_recorded_fingerprint(current, name):
    want, got = RECORDED["runs"][name], current["runs"][name]
    assert len(got["valid_rows"]) == len(want["valid_rows"]) > 0
    for w, g in zip(want["valid_rows"], got["valid_rows"], strict=True):
        assert g == pytest.approx(w, abs=1e-4), f"{name}: valid.log.tsv row {w['update']}"
    assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-4)
    if current["machine"] != RECORDED["machine"]:
        pytest.skip(f"hashes recorded on {RECORDED['machine']!r}, this is {current['machine']!r}")
    for key in ("best_weights", "last_weights", "valid_log", "train_log"):
        assert got[key] == want[key], f"{name}: {key} differs from the recorded run"
