"""TensorFlow checkpoints without TensorFlow: the tiny Google-format BERT that TensorFlow 2.21
wrote (tests/data/tf_bert, made by its make_fixture.py, with the values TensorFlow held) read
bit for bit, a corrupted byte named, the checkpoint fine-tuned by ``xdpx train`` as a
``pretrained_model``, and the fine-tuned model exported back to Google's layout and read back
bit for bit. (TensorFlow itself reading xdpx's export, and the SavedModel's logits, are
``bench/tf_roundtrip.py``'s: reports/tf_roundtrip.json.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from xdpx.tf_checkpoint import (
    TFCheckpointError,
    checkpoint_prefix,
    convert_google_bert,
    google_to_hf,
    read_bundle,
    read_entries,
    write_bundle,
)

FIXTURE = Path(__file__).parent / "data" / "tf_bert"
PREFIX = str(FIXTURE / "bert_model.ckpt")


def tf_values() -> dict[str, np.ndarray]:
    """What TensorFlow held when it saved the fixture (``session.run`` of every variable)."""
    with np.load(FIXTURE / "values.npz") as f:
        return {k.replace("|", "/"): f[k] for k in f.files}


@pytest.mark.unit
def test_every_tensor_equals_what_tensorflow_wrote_bit_for_bit():
    want = tf_values()
    got = read_bundle(checkpoint_prefix(str(FIXTURE)))
    assert len(want) == 127 and set(got) == set(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
        assert got[name].tobytes() == value.tobytes(), name
    assert got["global_step"].dtype == np.int64 and int(got["global_step"]) == 1234
    entries, shards = read_entries(PREFIX)
    assert shards == 1 and entries["output_weights"].shape == (3, 32)


@pytest.mark.unit
def test_the_writer_reproduces_tensorflows_data_file_and_reads_back(tmp_path):
    prefix = str(tmp_path / "out.ckpt")
    write_bundle(prefix, tf_values(), block_size=512)  # several index blocks
    assert (tmp_path / "out.ckpt.data-00000-of-00001").read_bytes() == (FIXTURE / "bert_model.ckpt.data-00000-of-00001").read_bytes()  # fmt: skip
    back = read_bundle(prefix)
    ours, theirs = read_entries(prefix)[0], read_entries(PREFIX)[0]
    assert ours == theirs  # dtype, shape, offset, size and CRC32C of every variable
    assert all(back[k].tobytes() == v.tobytes() for k, v in tf_values().items())


@pytest.mark.unit
def test_a_corrupted_byte_names_the_variable_and_the_file(tmp_path):
    for name in ("bert_model.ckpt.index", "bert_model.ckpt.data-00000-of-00001", "bert_config.json", "vocab.txt"):  # fmt: skip
        shutil.copy(FIXTURE / name, tmp_path / name)
    entry = read_entries(PREFIX)[0]["bert/encoder/layer_1/intermediate/dense/kernel"]
    data = tmp_path / "bert_model.ckpt.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[entry.offset + 100] ^= 0x01
    data.write_bytes(bytes(raw))
    with pytest.raises(TFCheckpointError, match=r"data-00000-of-00001: bert/encoder/layer_1/intermediate/dense/kernel: .* fail their CRC32C"):  # fmt: skip
        read_bundle(str(tmp_path / "bert_model.ckpt"))
    out = tmp_path / "converted"
    with pytest.raises(TFCheckpointError, match="layer_1/intermediate/dense/kernel"):
        convert_google_bert(str(tmp_path), str(out))
    assert not out.exists() and not list(tmp_path.glob(".converted*"))  # nothing half-written
    index = tmp_path / "bert_model.ckpt.index"
    raw = bytearray(index.read_bytes())
    raw[40] ^= 0xFF
    index.write_bytes(bytes(raw))
    with pytest.raises(TFCheckpointError, match=r"bert_model.ckpt.index: the block at byte 0 fails its CRC32C"):  # fmt: skip
        read_entries(str(tmp_path / "bert_model.ckpt"))


@pytest.mark.integration
def test_the_converted_directory_and_the_in_place_import_give_the_same_logits(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from xdpx.models.hf import HFClassifier

    record = convert_google_bert(str(FIXTURE), str(tmp_path / "hf"))
    assert record["head"] and record["num_labels"] == 3 and record["kept"] == 41
    assert all(n.endswith(("adam_m", "adam_v")) or n == "global_step" or n.startswith("cls/") for n in record["skipped"])  # fmt: skip
    values = tf_values()
    hf = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "hf"), local_files_only=True).eval()  # fmt: skip
    q = hf.bert.encoder.layer[0].attention.self.query.weight.detach().numpy()
    assert q.tobytes() == np.ascontiguousarray(values["bert/encoder/layer_0/attention/self/query/kernel"].T).tobytes()  # fmt: skip
    assert hf.classifier.weight.detach().numpy().tobytes() == values["output_weights"].tobytes()
    # in place: train.pretrained_model names the TensorFlow directory itself
    inplace = HFClassifier(vocab_size=len((FIXTURE / "vocab.txt").read_text().split()), num_labels=3, pretrained_model=str(FIXTURE)).eval()  # fmt: skip
    assert inplace.loading_info["missing_keys"] == [] and inplace.loading_info["unexpected_keys"] == []  # fmt: skip
    ids = torch.tensor([[5, 8, 12, 17, 14, 10, 6, 0], [5, 23, 22, 9, 6, 0, 0, 0]])
    with torch.no_grad():
        a = hf(input_ids=ids, attention_mask=(ids != 0).long()).logits
        b = inplace(ids)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    # the tokenizer from vocab.txt (do_lower_case True; Chinese characters split)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert tok.convert_ids_to_tokens(tok("The FILM 很好")["input_ids"]) == ["[CLS]", "the", "film", "很", "好", "[SEP]"]  # fmt: skip


@pytest.mark.integration
def test_xdpx_train_fine_tunes_from_it_and_exports_it_back_bit_for_bit(real_subset, tmp_path):
    from safetensors import safe_open

    from stages import prepro, train
    from xdpx.cli import app
    from xdpx.config import PreproConfig, TrainConfig
    from xdpx.tf_checkpoint import hf_to_google

    raw, _ = real_subset
    data = str(tmp_path / "prepared")
    prepro.run(PreproConfig(data_source=raw, data_dir=data, tokenizer="hf", tokenizer_path=str(FIXTURE), max_len=32))  # fmt: skip
    run = tmp_path / "run"
    result = train.run(TrainConfig(data_dir=data, save_dir=str(run), model="hf_classifier", pretrained_model=str(FIXTURE), max_update=4, batch_size=16, eval_interval=4, threads=1, learning_rate=1e-3))  # fmt: skip
    assert result.num_updates == 4
    info = json.loads((run / "loading_info.json").read_text())
    assert info["unexpected_keys"] == []  # every BERT weight found a home
    runner = CliRunner()
    out = tmp_path / "tf"
    done = runner.invoke(app, ["export-tf", f"{run}/<best>", str(out)])
    assert done.exit_code == 0, done.output
    assert {p.name for p in out.iterdir()} == {"bert_model.ckpt.index", "bert_model.ckpt.data-00000-of-00001", "bert_config.json", "vocab.txt", "target_map.txt"}  # fmt: skip
    back = read_bundle(str(out / "bert_model.ckpt"))
    with safe_open(str(run / "best" / "model.safetensors"), "np") as f:
        state = {k.removeprefix("hf."): f.get_tensor(k) for k in f.keys() if k.startswith("hf.")}
    want = hf_to_google(state)
    assert set(back) == set(want) and len(back) == 41
    assert all(back[k].tobytes() == want[k].tobytes() for k in want)  # bit for bit
    assert google_to_hf(back)[0]["classifier.weight"].shape == (2, 32)  # the fine-tuned head
    assert json.loads((out / "bert_config.json").read_text())["num_hidden_layers"] == 2
    # convert-tf of the export gives the fine-tuned model back; --savedmodel without TensorFlow
    done = runner.invoke(app, ["convert-tf", str(out), str(tmp_path / "again")])
    assert done.exit_code == 0 and "41 kept" in done.output, done.output
    done = runner.invoke(app, ["export-tf", f"{run}/<best>", str(tmp_path / "tf2"), "--savedmodel"])
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        assert done.exit_code == 2 and "pip install 'xdpx[tf]'" in done.output
        assert not (tmp_path / "tf2").exists()
