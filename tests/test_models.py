"""Models: output shapes and padding invariance (the FAQ's eval-mismatch check)."""

from __future__ import annotations

import pytest
import torch

from xdpx.models import MODELS, build_model, input_names

pytestmark = pytest.mark.unit

#: Single-text models (pair models: tests/test_pairs.py).
SINGLE = sorted(n for n in MODELS if input_names(n) == ("input_ids",))


@pytest.mark.parametrize("name", SINGLE)
def test_logits_shape_and_padding_invariance(name):
    torch.manual_seed(0)
    model = build_model(name, {"vocab_size": 50, "num_labels": 3}).eval()
    ids = torch.randint(2, 50, (4, 9))
    ids[1, 6:] = 0  # a shorter sequence
    logits = model(ids)
    assert logits.shape == (4, 3)
    padded = torch.cat([ids, torch.zeros(4, 7, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded), logits, atol=1e-5, rtol=1e-5)
    # a sequence alone gives the same logits as inside the batch
    torch.testing.assert_close(model(ids[1:2, :6]), logits[1:2], atol=1e-5, rtol=1e-5)


def test_build_model_unknown_name():
    with pytest.raises(KeyError, match="unknown model 'nope'"):
        build_model("nope", {})
