"""Refactors change no number: runs of fixed configs match fingerprints recorded before.

tests/data/fingerprints.json was written by ``tools/fingerprint.py`` before issue 21's
refactor of the trainer (default ngram_lr; textcnn with update_freq=2). Three checks:

* on any machine, the logged numbers equal the recorded ones within 1e-4 (fp32 kernels of
  another CPU may differ in the last bits);
* on the machine that recorded them (same CPU model, torch and CPU capability), weights and
  logs are the recorded bits;
* on any machine, each config trained a second time in this session gives the first run's
  bits (weights, valid and train logs): what a refactor must keep wherever it is tested.
  (``tests/test_resume.py`` checks a run killed and resumed against an uninterrupted one,
  bit for bit.)
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


HASHES = ("best_weights", "last_weights", "valid_log", "train_log")


@pytest.mark.parametrize("name", sorted(fingerprint.CONFIGS))
def test_logged_numbers_match_the_recorded_run_on_any_machine(current, name):
    want, got = RECORDED["runs"][name], current["runs"][name]
    assert len(got["valid_rows"]) == len(want["valid_rows"]) > 0
    for w, g in zip(want["valid_rows"], got["valid_rows"], strict=True):
        assert g == pytest.approx(w, abs=1e-4), f"{name}: valid.log.tsv row {w['update']}"
    assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-4)


@pytest.mark.parametrize("name", sorted(fingerprint.CONFIGS))
def test_bits_match_the_recorded_run_on_the_recording_machine(current, name):
    if current["machine"] != RECORDED["machine"]:
        pytest.skip(f"hashes recorded on {RECORDED['machine']!r}, this is {current['machine']!r}")
    want, got = RECORDED["runs"][name], current["runs"][name]
    for key in HASHES:
        assert got[key] == want[key], f"{name}: {key} differs from the recorded run"


def test_a_second_run_in_this_session_has_the_same_bits(current, tmp_path):
    """Runs on every machine (CI's included): each config trained again on the same data."""
    again = fingerprint.run_all(tmp_path, prepared=current["prepared"])
    for name, first in current["runs"].items():
        for key in HASHES:
            assert again["runs"][name][key] == first[key], f"{name}: {key} differs between runs"
