"""bench/stsb_by_source.py: STS-B's sources held out in turn, from train + dev only."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import stsb_by_source  # noqa: E402


@pytest.mark.unit
def test_each_source_is_held_out_once_and_the_rest_keeps_its_split():
    """On the real STS-B files: each cut's train, dev and held-out parts partition train +
    dev (7,249 pairs); the held-out part is exactly one source's pairs, none of which is in
    that cut's train or dev; a source only dev has (answers-forums) leaves train whole."""
    train, dev = stsb_by_source.read_sources("train"), stsb_by_source.read_sources("dev")
    assert (len(train), len(dev)) == (5749, 1500)
    cuts = stsb_by_source.source_cuts(train, dev, min_pairs=300)
    assert sorted(cuts) == ["MSRpar", "MSRvid", "answers-forums", "deft-forum", "deft-news", "headlines", "images"]  # fmt: skip
    for source, parts in cuts.items():
        held = [r for s, r in train + dev if s == source]
        assert parts["test"] == held and len(held) >= 300
        assert len(parts["train"]) + len(parts["dev"]) + len(held) == 7249
        assert parts["train"] == [r for s, r in train if s != source]
        assert parts["dev"] == [r for s, r in dev if s != source]
        assert {r[2] for r in held} == {"0", "1"}
    assert len(cuts["answers-forums"]["train"]) == 5749  # a dev-only source
    # a source under the minimum is not held out (track5.en-en: 125 dev pairs)
    assert "track5.en-en" not in cuts and "track5.en-en" in stsb_by_source.source_cuts(train, dev, 100)  # fmt: skip
