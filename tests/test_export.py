"""Tests of ``xdpx.serving.export`` and ``stages.export``: ONNX export, onnxruntime parity, report."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from stages import export as export_stage
from xdpx.checkpoint import load_checkpoint, save_checkpoint
from xdpx.config import ExportConfig
from xdpx.data import PreparedMeta, write_split
from xdpx.inference import pad_batch
from xdpx.models import MODELS, build_model, input_names
from xdpx.serving.export import (
    ExportParityError,
    build_example,
    check_parity,
    export_onnx,
    parity_batches,
)

pytestmark = pytest.mark.unit

VOCAB_SIZE = 30
LABELS = ["neg", "pos", "neutral"]
NUM_SAMPLES = 32
#: Tiny constructor arguments per single-text model (on top of vocab_size/num_labels/pad_id);
#: pair models are exported in tests/test_pairs.py.
TINY: dict[str, dict] = {
    "textcnn": {"embedding_dim": 8, "num_filters": 4, "filter_sizes": [2, 3]},
    "bilstm": {"embedding_dim": 8, "hidden_size": 4},
    "ngram_lr": {"ngram_orders": [1, 2, 3], "ngram_buckets": 97},
    "static_embed": {"static_dim": 8},
}


def _sequences(n: int, seed: int = 0) -> list[np.ndarray]:
    """``n`` id arrays of lengths 1..20 (ids 1..VOCAB_SIZE-1, no padding inside)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB_SIZE, size=int(rng.integers(1, 21))) for _ in range(n)]


def _write_split(data_dir: Path, split: str, seqs: list[np.ndarray], labels: list[int]) -> None:
    write_split(str(data_dir), split, np.arange(len(seqs)), seqs, labels)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared data dir: assets + a ``test`` split of 40 variable-length samples."""
    root = tmp_path_factory.mktemp("prepared")
    vocab = ["[PAD]", "[UNK]"] + [f"t{i}" for i in range(2, VOCAB_SIZE)]
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (root / "target_map.txt").write_text("\n".join(LABELS) + "\n", encoding="utf-8")
    seqs = _sequences(40)
    PreparedMeta(
        tokenizer="char",
        lower=True,
        max_len=20,
        vocab_size=VOCAB_SIZE,
        num_labels=len(LABELS),
        labels=LABELS,
        splits={"test": {"rows": len(seqs)}},
        prepro={},
    ).write(str(root))
    _write_split(root, "test", seqs, [i % len(LABELS) for i in range(len(seqs))])
    return root


def _checkpoint(tmp_path: Path, data_dir: Path, name: str) -> Path:
    """Save a tiny randomly initialised ``name`` model as ``tmp_path/run/best``."""
    torch.manual_seed(0)
    config = {"vocab_size": VOCAB_SIZE, "num_labels": len(LABELS), "pad_id": 0, **TINY[name]}
    model = build_model(name, config)
    with torch.no_grad():  # ngram_lr starts at zero: randomise so parity compares real logits
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.5)
    path = tmp_path / "run" / "best"
    info = {"update": 1, "epoch": 1, "samples_seen": 0, "valid": {}}
    save_checkpoint(str(path), model, name, config, info, str(data_dir))
    return path


def _cfg(tmp_path: Path, data_dir: Path, **kwargs) -> ExportConfig:
    return ExportConfig(
        checkpoint=str(tmp_path / "run" / "<best>"),
        data_dir=str(data_dir),
        split="test",
        out_dir=str(tmp_path / "export"),
        num_samples=NUM_SAMPLES,
        **kwargs,
    )


def test_tiny_configs_cover_every_model() -> None:
    # hf_classifier needs ids from a transformers tokenizer: exported in test_hf / test_pairs;
    # hf_mlm has no labels to export (refused: test_mlm)
    single = {n for n in MODELS if input_names(n) == ("input_ids",)} - {"hf_classifier", "hf_mlm"}
    assert set(TINY) == single


def test_parity_batches_mix_sizes() -> None:
    assert parity_batches(40, 16) == [(0, 1), (1, 4), (4, 20), (20, 36), (36, 40)]
    assert parity_batches(1, 64) == [(0, 1)]
    assert parity_batches(3, 64) == [(0, 1), (1, 3)]
    with pytest.raises(ValueError):
        parity_batches(3, 0)


@pytest.mark.parametrize("name", sorted(TINY))
def test_export_stage(tmp_path: Path, data_dir: Path, name: str) -> None:
    ckpt_dir = _checkpoint(tmp_path, data_dir, name)
    result = export_stage.run(_cfg(tmp_path, data_dir))
    out = tmp_path / "export"

    # Files: a self-contained serving directory.
    assert result.onnx_path == str(out / "model.onnx")
    assert result.report_path == str(out / "report.json")
    assert result.checkpoint == str(ckpt_dir)
    for asset in ("vocab.txt", "target_map.txt", "meta.json"):
        assert (out / asset).read_bytes() == (data_dir / asset).read_bytes()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # no temp leftovers
    assert not list(out.glob("*.data"))  # weights inside the .onnx file

    # Parity on the first NUM_SAMPLES samples, in batches of several sizes and widths.
    parity = result.parity
    assert parity["max_abs_diff"] <= 1e-4
    assert parity["mean_abs_diff"] <= parity["max_abs_diff"]
    assert parity["num_samples"] == NUM_SAMPLES
    assert parity["argmax_agreement"] == 1.0
    shapes = parity["batch_shapes"]
    assert [b for b, _ in shapes] == [1, 3, NUM_SAMPLES - 4]
    assert len({t for _, t in shapes}) > 1

    # report.json
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["status"] == "ok"
    assert report["checkpoint"] == str(ckpt_dir)
    assert report["model"] == name
    assert report["num_labels"] == len(LABELS)
    assert report["opset"] == 17
    assert report["input_names"] == ["input_ids"]
    assert report["output_names"] == ["logits"]
    assert report["parity"]["max_abs_diff"] == parity["max_abs_diff"]
    assert report["parity"]["atol"] == 1e-4
    assert report["samples"] == {"data_dir": str(data_dir), "split": "test", "num_samples": 32}
    for key in ("torch", "onnx", "onnxruntime"):
        assert report["versions"][key]
    assert "latency" not in report  # timings change with the machine: latency.json
    latency = json.loads((out / "latency.json").read_text(encoding="utf-8"))["onnx"]
    assert set(latency["batches"]) == {"1", "64"}
    for row in latency["batches"].values():
        assert row["eager_ms"] > 0 and row["onnxruntime_ms"] > 0
        assert row["speedup"] == pytest.approx(row["eager_ms"] / row["onnxruntime_ms"])
    assert latency["seq_len"] >= 1 and latency["runs"] == 20
    assert report["onnx_bytes"] == (out / "model.onnx").stat().st_size

    # The graph: named input/output, symbolic batch and sequence axes, valid ONNX.
    proto = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(proto)
    (inp,), (outp,) = proto.graph.input, proto.graph.output
    assert inp.name == "input_ids" and outp.name == "logits"
    assert inp.type.tensor_type.elem_type == onnx.TensorProto.INT64
    dims = [d.dim_param for d in inp.type.tensor_type.shape.dim]
    assert dims == ["batch", "seq_len"]
    assert outp.type.tensor_type.shape.dim[0].dim_param == "batch"

    # onnxruntime on batches unlike the export example (other sizes and widths).
    model = load_checkpoint(str(ckpt_dir)).model
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    fresh = _sequences(12, seed=7) + [np.arange(1, 29) % (VOCAB_SIZE - 1) + 1]
    for batch in (fresh[:1], fresh[1:6], fresh[:13]):
        x = pad_batch(batch, 0, model.min_len)
        want = model(x).detach().numpy()
        got = session.run(["logits"], {"input_ids": x.numpy()})[0]
        assert got.shape == (len(batch), len(LABELS))
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_padding_width_does_not_change_onnx_logits(tmp_path: Path, data_dir: Path) -> None:
    ckpt_dir = _checkpoint(tmp_path, data_dir, "bilstm")
    export_stage.run(_cfg(tmp_path, data_dir))
    session = ort.InferenceSession(
        str(tmp_path / "export" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    seqs = _sequences(4, seed=3)
    narrow = pad_batch(seqs, 0, 1).numpy()
    wide = pad_batch(seqs, 0, narrow.shape[1] + 9).numpy()
    a = session.run(["logits"], {"input_ids": narrow})[0]
    b = session.run(["logits"], {"input_ids": wide})[0]
    np.testing.assert_allclose(a, b, atol=1e-5)
    assert ckpt_dir.exists()


def test_parity_violation_fails_and_leaves_no_model(
    tmp_path: Path, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _checkpoint(tmp_path, data_dir, "textcnn")
    out = tmp_path / "export"
    out.mkdir()
    # A previous successful run's files must not survive a failed export.
    (out / "model.onnx").write_bytes(b"old")
    (out / "report.json").write_text('{"status": "ok"}', encoding="utf-8")
    (out / "unrelated.txt").write_text("keep me", encoding="utf-8")

    real_export = export_stage.export_onnx

    def export_then_perturb(model, path, opset, example_input):  # type: ignore[no-untyped-def]
        real_export(model, path, opset, example_input)
        with torch.no_grad():  # eager model now differs from the exported graph
            model.classifier.bias.add_(1e-2)

    monkeypatch.setattr(export_stage, "export_onnx", export_then_perturb)
    with pytest.raises(ExportParityError, match=r"max 1\.0\d*e-02.*atol=1\.0e-04"):
        export_stage.run(_cfg(tmp_path, data_dir))
    assert not (out / "model.onnx").exists()
    assert not (out / "report.json").exists()
    assert (out / "unrelated.txt").read_text(encoding="utf-8") == "keep me"
    assert sorted(p.name for p in out.iterdir()) == ["unrelated.txt"]


def test_check_parity_tolerance(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model("textcnn", {"vocab_size": VOCAB_SIZE, "num_labels": 2, **TINY["textcnn"]})
    seqs = _sequences(10, seed=1)
    path = str(tmp_path / "m.onnx")
    export_onnx(model, path, 17, build_example(seqs, model.min_len))
    ok = check_parity(path, model, seqs, atol=1e-4, batch_size=4)
    assert ok["num_samples"] == 10 and ok["max_abs_diff"] <= 1e-4
    assert [b for b, _ in ok["batch_shapes"]] == [1, 3, 4, 2]
    with torch.no_grad():
        model.classifier.weight.mul_(1.5)
    with pytest.raises(ExportParityError, match="tolerance atol=1.0e-04"):
        check_parity(path, model, seqs, atol=1e-4)
    with pytest.raises(ValueError):
        check_parity(path, model, [], atol=1e-4)


def test_main_with_params_file(tmp_path: Path, data_dir: Path, capsys) -> None:
    _checkpoint(tmp_path, data_dir, "ngram_lr")
    params = tmp_path / "params.yaml"
    params.write_text(
        "export:\n"
        f"  checkpoint: {tmp_path / 'run' / '<last>'}\n"
        f"  data_dir: {data_dir}\n"
        f"  out_dir: {tmp_path / 'export'}\n",
        encoding="utf-8",
    )
    # <last> does not exist: the alias must resolve and fail with one clear line, exit status 2.
    with pytest.raises(SystemExit) as exit_info:
        export_stage.main(["--params", str(params)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: checkpoint") and "run/last" in err and "Traceback" not in err
    result = export_stage.main(
        ["--params", str(params), f"checkpoint={tmp_path / 'run' / '<best>'}", "num_samples=5"]
    )
    assert result.parity["num_samples"] == 5
    assert (tmp_path / "export" / "report.json").exists()
