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


def test_each_model_family_declares_exactly_its_constructor_arguments():
    """xdpx.model_configs is the wiring (no signature introspection at run time): a family's
    train keys plus the data facts are the constructor's parameters, nothing more or less."""
    import inspect

    from xdpx.model_configs import DATA_KEYS, FAMILIES, HF_DATA_KEYS

    data_sized = {"ngram_lr": {"num_features"}, "match_ngram": {"num_features"}}  # prepare()
    for name, cls in MODELS.items():
        params = set(inspect.signature(cls.__init__).parameters) - {"self"}
        declared = set(FAMILIES[name].model_fields) | set(DATA_KEYS) | data_sized.get(name, set())
        declared |= set(HF_DATA_KEYS) if name == "hf_classifier" else set()
        assert declared == params, name


def test_a_model_validates_its_own_keys_only():
    from xdpx.config import TrainConfig

    assert TrainConfig(model="ngram_lr", filter_sizes=[0]).model == "ngram_lr"  # not its key
    with pytest.raises(ValueError, match="filter_sizes must be positive"):
        TrainConfig(model="textcnn", filter_sizes=[0])
    with pytest.raises(ValueError, match="ngram_orders must lie in 1..5"):
        TrainConfig(model="ngram_lr", ngram_orders=[6])
    assert TrainConfig(model="textcnn", ngram_orders=[6]).family_args().filter_sizes == [3, 4, 5]
