"""Models: output shapes and padding invariance (the FAQ's eval-mismatch check)."""

from __future__ import annotations

import pytest
import torch

from xdpx.models import MODELS, build_model, input_names

pytestmark = pytest.mark.unit

#: Single-text classifiers (pair models: tests/test_pairs.py; hf_mlm: below).
SINGLE = sorted(n for n in MODELS if input_names(n) == ("input_ids",) and n != "hf_mlm")


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


def test_hf_mlm_predicts_every_position_or_only_the_masked_ones():
    torch.manual_seed(0)
    config = {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
    }
    model = build_model("hf_mlm", {"vocab_size": 50, "num_labels": 3, "hf_config": config}).eval()
    ids = torch.randint(2, 50, (4, 9))
    ids[1, 6:] = 0
    logits = model(ids)
    assert logits.shape == (4, 9, 50)
    padded = torch.cat([ids, torch.zeros(4, 7, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded)[:, :9], logits, atol=1e-5, rtol=1e-5)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 5], labels[3, 0] = 7, 8, 9
    torch.testing.assert_close(model(ids, labels), logits[labels != -100], atol=1e-5, rtol=1e-5)


def test_build_model_unknown_name():
    with pytest.raises(KeyError, match="unknown model 'nope'"):
        build_model("nope", {})


def test_each_model_family_declares_exactly_its_constructor_arguments():
    """xdpx.model_configs is the wiring (no signature introspection at run time): a family's
    train keys plus the data facts are the constructor's parameters, nothing more or less."""
    import inspect

    from xdpx.model_configs import DATA_KEYS, FAMILIES, HF_DATA_KEYS, HF_DATA_MODELS

    # set by the model, not by train keys: prepare() (num_features), resolve_config() (the
    # pair cosines and oov_chars, from meta.json; config.json without them loads an older
    # model as it was trained)
    data_sized = {"ngram_lr": {"num_features", "oov_chars"}, "match_ngram": {"num_features", "pair_cosine", "cosine_scale", "oov_chars"}, "static_embed": {"num_vectors"}}  # fmt: skip
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)

    def init_params(cls) -> set[str]:
        """The constructor's named parameters, with its parent's where it passes *args/**kwargs on."""
        found = inspect.signature(cls.__init__).parameters.values()
        names = {p.name for p in found if p.kind not in variadic} - {"self"}
        return names | init_params(cls.__mro__[1]) if any(p.kind in variadic for p in found) else names  # fmt: skip

    for name, cls in MODELS.items():
        params = init_params(cls)
        declared = set(FAMILIES[name].model_fields) | set(DATA_KEYS) | data_sized.get(name, set())
        declared |= set(HF_DATA_KEYS) if name in HF_DATA_MODELS else set()
        declared |= (
            {"carried"} if name == "hf_mlm" else set()
        )  # saved_config(): pretrained weights it keeps
        assert declared == params, name


def test_a_model_validates_its_own_keys_and_refuses_the_others():
    from xdpx.config import TrainConfig

    with pytest.raises(ValueError, match="filter_sizes must be positive"):
        TrainConfig(model="textcnn", filter_sizes=[0])
    with pytest.raises(ValueError, match="ngram_orders must lie in 1..5"):
        TrainConfig(model="ngram_lr", ngram_orders=[6])
    # another family's key would do nothing: refused, whatever its value
    with pytest.raises(ValueError, match=r"train.filter_sizes=\[0\] does nothing for model=ngram_lr"):  # fmt: skip
        TrainConfig(model="ngram_lr", filter_sizes=[0])
    with pytest.raises(ValueError, match=r"train.ngram_orders=\[6\] does nothing for model=textcnn"):  # fmt: skip
        TrainConfig(model="textcnn", ngram_orders=[6])
    assert TrainConfig(model="textcnn").family_args().filter_sizes == [3, 4, 5]


@pytest.mark.unit
def test_only_the_ngram_models_take_spelled_unknown_words(tmp_path):
    """Real STS-B pairs prepared with ``prepro.oov: spell`` (the default): match_ngram fits
    them; siamese and match_esim, which would meet untrained ``##c`` vectors at dev/test
    time, are refused with the fix; prepared with ``oov: unk`` they fit."""
    from stages import prepro
    from studies.corpora import materialize
    from xdpx.config import PreproConfig
    from xdpx.models import check_model_fits_data

    materialize("stsb", str(tmp_path / "raw"), seed=1, limit=80)
    base = {"data_source": str(tmp_path / "raw"), "text_column": "text1", "text2_column": "text2"}
    for oov in ("spell", "unk"):
        prepro.run(PreproConfig(**base, data_dir=str(tmp_path / oov), oov=oov))
    check_model_fits_data("match_ngram", str(tmp_path / "spell"), "train.model")
    for model in ("siamese", "match_esim"):
        with pytest.raises(ValueError, match=f"train.model={model} learns no vector.*prepro.oov=unk"):  # fmt: skip
            check_model_fits_data(model, str(tmp_path / "spell"), "train.model")
        check_model_fits_data(model, str(tmp_path / "unk"), "train.model")


def test_the_table_of_keys_read_by_the_trainer_matches_the_models():
    """xdpx.model_configs.TRAINER_KEYS against the code that reads them: head_learning_rate
    goes to the parameters xdpx.train.optim calls the head (ngram_lr/match_ngram have none),
    layerwise_lr_decay to models with param_depth, FreeLB's keys to models with an embedding
    layer (not hf_mlm: task=mlm refuses adv)."""
    from xdpx.config import MODELS_WITHOUT_EMBEDDINGS
    from xdpx.model_configs import TRAINER_KEYS
    from xdpx.models.contract import ModelContract
    from xdpx.train.optim import _is_head

    def offers(cls, method: str) -> bool:  # the family overrides the contract's default
        return getattr(cls, method) is not getattr(ModelContract, method)

    heads, depths, embedded = set(), set(), set()
    for name, cls in MODELS.items():
        if name in ("hf_classifier", "hf_mlm"):  # not built here: transformers is slow to load
            head = offers(cls, "is_head")
        else:
            model = build_model(name, {"vocab_size": 20, "num_labels": 2})
            head = any(_is_head(model, n) for n, _ in model.named_parameters())
        heads |= {name} if head else set()
        depths |= {name} if offers(cls, "param_depth") else set()
        embedded |= {name} if offers(cls, "get_input_embeddings") else set()
    assert set(TRAINER_KEYS["head_learning_rate"]) == heads == set(MODELS) - {"ngram_lr", "match_ngram"}  # fmt: skip
    assert set(TRAINER_KEYS["layerwise_lr_decay"]) == depths == {"hf_classifier", "hf_mlm"}
    assert embedded == set(MODELS) - set(MODELS_WITHOUT_EMBEDDINGS)
    for key in ("adv", "adv_steps", "adv_lr", "adv_init_mag", "adv_max_norm"):
        assert set(TRAINER_KEYS[key]) == embedded - {"hf_mlm"}, key


@pytest.mark.unit
def test_every_family_is_a_model_contract_and_nothing_probes_one():
    """The model contract (xdpx/models/contract.py) is declared once: every family inherits
    it, and no module outside it probes a model for a contract attribute with getattr or
    hasattr (issue 58: 15 such sites were the contract before)."""
    import re
    from pathlib import Path

    from xdpx.models.contract import CONTRACT_ATTRIBUTES, ModelContract

    assert {"min_len", "param_depth", "prepare", "saved_config", "sparse_grad_tables"} <= set(CONTRACT_ATTRIBUTES)  # fmt: skip
    for name, cls in MODELS.items():
        assert issubclass(cls, ModelContract), name
    root = Path(__file__).resolve().parents[1]
    probe = re.compile(r"\b(?:getattr|hasattr)\([^,()]+,\s*[\"'](" + "|".join(CONTRACT_ATTRIBUTES) + r")[\"']")  # fmt: skip
    found = [
        f"{path.relative_to(root)}:{i}: {line.strip()}"
        for top in ("xdpx", "stages", "flows", "studies")
        for path in sorted((root / top).rglob("*.py"))
        if path.name != "contract.py"
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if probe.search(line)
    ]
    assert not found, "read the contract directly (model.min_len), not by probing:\n" + "\n".join(found)  # fmt: skip
