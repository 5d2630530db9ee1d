"""``xdpx serve --http``: the real server process on 127.0.0.1, on runs trained and exported
from the real corpus subset (a single-text ngram_lr and a pair match_ngram), plus the
dynamic batcher in-process."""

from __future__ import annotations

import asyncio
import csv
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from stages import export, fetch, predict, prepro, train
from xdpx.config import ExportConfig, FetchConfig, PredictConfig, PreproConfig, TrainConfig

ROOT = Path(__file__).resolve().parents[1]


def read_tsv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False, dtype=str)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m xdpx.cli serve RUN --http`` in a child process, ready within 60 s."""

    def __init__(self, run: Path, *options: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "xdpx.cli", "serve", str(run), "--http"]
        cmd += ["--port", str(self.port), "--threads", "1", *options]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while time.time() < deadline:
            assert self.proc.poll() is None, self.proc.stderr.read()
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise AssertionError("the server did not become ready within 60 s")

    def post(self, path: str, **kw) -> httpx.Response:
        return httpx.post(self.url + path, timeout=30, **kw)

    def metric(self, name: str, labels: str = "") -> float:
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        m = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.M)
        assert m, f"{name}{labels} is not in /metrics:\n{text[:2000]}"  # a missing one is no 0
        return float(m.group(1))

    def stop_gracefully(self) -> None:
        """:meth:`stop`, which must end the server cleanly: status 0, or uvicorn re-raising
        SIGTERM after its graceful stop."""
        code = self.stop()
        assert code in (0, -signal.SIGTERM), f"the server exited with {code}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def trained(root: Path, prepared: Path, raw_test: Path, **train_kw) -> dict:
    """train -> export -> predict (on the raw test file) of one model; returns the paths."""
    run = root / "run"
    train.run(
        TrainConfig(data_dir=str(prepared), save_dir=str(run), max_epoch=2, threads=1, **train_kw)
    )
    export.run(
        ExportConfig(
            checkpoint=f"{run}/<best>", data_dir=str(prepared), out_dir=str(run / "export")
        )
    )
    out = root / "predictions.tsv"
    predict.run(PredictConfig(checkpoint=f"{run}/<best>", data_file=str(raw_test), out_file=str(out)))  # fmt: skip
    return {"run": run, "predictions": read_tsv(out)}


def triton_round_trip(server: Server, name: str, columns: list[list[str]], labels: list[str], probs: list) -> None:  # fmt: skip
    """Drive ``server`` with ``tritonclient.http`` (Triton's Python client) as a user would:
    liveness, readiness, metadata, config, and ``infer`` with the client's defaults
    (``set_data_from_numpy`` sends BYTES as binary tensor data; no requested outputs: every
    output comes back binary), then JSON both ways and requested outputs; the answers must
    be ``labels`` and ``probs`` (what ``/predict`` gave). A bad request raises
    ``InferenceServerException`` carrying the server's message."""
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    client = triton.InferenceServerClient(f"127.0.0.1:{server.port}", connection_timeout=10, network_timeout=30)  # fmt: skip
    try:
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(name)
        assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
        meta = client.get_model_metadata(name)
        assert [t["name"] for t in meta["inputs"]] == ["text", "text2"][: len(columns)]
        config = client.get_model_config(name)
        assert config["output"][1]["dims"] == [len(probs[0])]
        assert config["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]

        def inputs(binary: bool = True) -> list:
            out = []
            for n, col in zip(["text", "text2"], columns, strict=False):
                t = triton.InferInput(n, [len(col)], "BYTES")
                t.set_data_from_numpy(np.array(col, dtype=object), binary_data=binary)
                out.append(t)
            return out

        result = client.infer(name, inputs())  # the defaults: binary in, binary out
        assert [b.decode() for b in result.as_numpy("label")] == labels
        assert result.as_numpy("probabilities").dtype == np.float32
        np.testing.assert_allclose(result.as_numpy("probabilities"), probs, atol=1e-6)
        want = [triton.InferRequestedOutput("probabilities", binary_data=False)]
        as_json = client.infer(name, inputs(binary=False), outputs=want, request_id="r7")
        assert as_json.get_response()["id"] == "r7" and as_json.as_numpy("label") is None
        np.testing.assert_allclose(as_json.as_numpy("probabilities"), probs, atol=1e-6)
        nul = inputs()
        nul[0].set_data_from_numpy(np.array(["ok", "a\x00b"] + columns[0][2:], dtype=object))
        with pytest.raises(InferenceServerException, match=r"inputs\[text\]\[1\]: NUL \(U\+0000\)") as e:  # fmt: skip
            client.infer(name, nul)
        assert e.value.status() == "422"
        with pytest.raises(InferenceServerException, match="no model 'other'"):
            client.infer("other", inputs())
        wrong = triton.InferInput("text", [1], "FP32")
        wrong.set_data_from_numpy(np.zeros(1, np.float32))
        with pytest.raises(InferenceServerException, match=r"inputs\[text\]\.datatype: BYTES expected"):  # fmt: skip
            client.infer(name, [wrong, *inputs()[1:]])
    finally:
        client.close()


@pytest.fixture(scope="module")
def single(real_subset, tmp_path_factory) -> dict:
    raw, prepared = real_subset
    return trained(tmp_path_factory.mktemp("serve-single"), Path(prepared), Path(raw) / "test.tsv")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict:
    from test_pairs import make_pairs

    root = tmp_path_factory.mktemp("serve-pairs")
    fetch.run(FetchConfig(out_dir=str(root / "raw"), limit=600, seed=1))
    (root / "pairs").mkdir()
    for split in ("train", "dev", "test"):
        make_pairs(read_tsv(root / "raw" / f"{split}.tsv")).to_csv(
            root / "pairs" / f"{split}.tsv", sep="\t", index=False
        )
    prepro.run(
        PreproConfig(
            data_source=str(root / "pairs"), data_dir=str(root / "prepared"),
            text_column="text1", text2_column="text2", max_len=32,
        )
    )  # fmt: skip
    return trained(root, root / "prepared", root / "pairs" / "test.tsv", model="match_ngram")


def probs_of(pred: pd.DataFrame, labels: list[str]) -> np.ndarray:
    return pred[[f"prob_{x}" for x in labels]].astype(float).to_numpy()


# ---------------------------------------------------------------------------- predictions
@pytest.mark.e2e
def test_single_text_predictions_equal_stages_predict_and_v2_round_trip(single):
    pred = single["predictions"]
    server = Server(single["run"])
    try:
        labels, probs = [], []
        texts = pred["text"].tolist()
        for i in range(0, len(texts), 37):  # several requests, each a batch of its own
            r = server.post("/predict", json={"texts": texts[i : i + 37]})
            assert r.status_code == 200, r.text
            labels += r.json()["labels"]
            probs += r.json()["probabilities"]
        names = r.json()["label_names"]
        assert labels == pred["pred_label"].tolist()
        np.testing.assert_allclose(probs, probs_of(pred, names), atol=2e-6)  # TSV: 6 decimals
        # the Open Inference Protocol
        meta = httpx.get(f"{server.url}/v2/models/run", timeout=10).json()
        assert meta["name"] == "run" and meta["platform"] == "onnxruntime_onnx"
        assert [t["name"] for t in meta["inputs"]] == ["text"]
        assert meta["outputs"][1] == {"name": "probabilities", "datatype": "FP32", "shape": [-1, 2]}
        body = {"id": "q1", "inputs": [{"name": "text", "shape": [5], "datatype": "BYTES", "data": texts[:5]}]}  # fmt: skip
        v2 = server.post("/v2/models/run/infer", json=body).json()
        assert v2["id"] == "q1" and v2["model_name"] == "run"
        out = {o["name"]: o for o in v2["outputs"]}
        assert out["label"]["data"] == labels[:5] and out["probabilities"]["shape"] == [5, 2]
        np.testing.assert_allclose(np.reshape(out["probabilities"]["data"], (5, 2)), probs[:5], atol=1e-6)  # fmt: skip
        assert httpx.get(f"{server.url}/v2/health/live", timeout=5).json() == {"live": True}
        assert server.post("/v2/models/other/infer", json=body).status_code == 404
        # prepro's rules: a NUL is refused naming the text's index, on both APIs (as prepro
        # refuses the line); other control characters are stripped as prepro strips them
        nul = server.post("/predict", json={"texts": [texts[0], "ab\x00c"]})
        assert nul.status_code == 422 and nul.json()["detail"].startswith("texts[1]: NUL (U+0000) at character 3"), nul.text  # fmt: skip
        body["inputs"][0]["data"] = [texts[0], "ab\x00c", texts[2], texts[3], texts[4]]
        v2_nul = server.post("/v2/models/run/infer", json=body)
        assert v2_nul.status_code == 422 and v2_nul.json()["error"].startswith("inputs[text][1]: NUL")  # fmt: skip
        esc = server.post("/predict", json={"texts": [texts[1][:3] + "\x1b" + texts[1][3:]]})
        assert esc.json()["probabilities"][0] == probs[1]
        # Triton's own client, with its defaults (binary tensor data for BYTES in and out)
        triton_round_trip(server, "run", [texts[:23]], labels[:23], probs[:23])
    finally:
        server.stop_gracefully()


@pytest.mark.e2e
def test_pair_predictions_equal_stages_predict(pairs):
    pred = pairs["predictions"]
    server = Server(pairs["run"])
    try:
        body = {"pairs": [list(p) for p in zip(pred["text1"], pred["text2"], strict=True)]}
        r = server.post("/predict", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["labels"] == pred["pred_label"].tolist()
        np.testing.assert_allclose(r.json()["probabilities"], probs_of(pred, r.json()["label_names"]), atol=2e-6)  # fmt: skip
        v2 = {"inputs": [
            {"name": "text", "shape": [2], "datatype": "BYTES", "data": pred["text1"][:2].tolist()},
            {"name": "text2", "shape": [2], "datatype": "BYTES", "data": pred["text2"][:2].tolist()},
        ]}  # fmt: skip
        out = server.post("/v2/models/run/infer", json=v2).json()["outputs"]
        assert out[0]["data"] == pred["pred_label"][:2].tolist()
        columns = [pred["text1"][:17].tolist(), pred["text2"][:17].tolist()]
        want = r.json()
        triton_round_trip(server, "run", columns, want["labels"][:17], want["probabilities"][:17])
        single = server.post("/predict", json={"texts": ["a"]})
        assert single.status_code == 422 and "pair model" in single.text
    finally:
        server.stop_gracefully()


@pytest.mark.e2e
def test_int8_export_scores_like_fp32_and_serves(single, real_subset):
    import json

    _, prepared = real_subset
    run = single["run"]
    out = run / "export-int8"
    export.run(
        ExportConfig(checkpoint=f"{run}/<best>", data_dir=prepared, out_dir=str(out), quantize="int8")
    )  # fmt: skip
    report = json.loads((out / "report.json").read_text())
    q = report["int8"]
    assert q["path"] == str(out / "model.int8.onnx") and q["num_samples"] == 120
    assert q["bytes"] < report["onnx_bytes"]  # int8 weights (the int32 bucket map stays)
    assert abs(q["accuracy_change_points"]) <= 2.5  # 3 of 120 test texts at most
    server = Server(out, "--int8")
    try:
        pred = single["predictions"]
        r = server.post("/predict", json={"texts": pred["text"].tolist()})
        agree = np.mean(np.array(r.json()["labels"]) == pred["pred_label"].to_numpy())
        assert agree >= 0.95, agree
    finally:
        server.stop_gracefully()
    # exported again without quantize: no int8 graph of the earlier export is left behind
    export.run(ExportConfig(checkpoint=f"{run}/<best>", data_dir=prepared, out_dir=str(out)))
    assert not (out / "model.int8.onnx").exists()
    assert "int8" not in json.loads((out / "report.json").read_text())


@pytest.mark.integration
def test_eager_backend_gives_the_onnx_numbers(single):
    from xdpx.serving.server import ServedModel

    texts = single["predictions"]["text"].tolist()
    eager, onnx = ServedModel(str(single["run"]), "eager"), ServedModel(str(single["run"]))
    assert (eager.backend, onnx.backend) == ("eager", "onnx")
    np.testing.assert_allclose(eager.probs(eager.encode(texts)), onnx.probs(onnx.encode(texts)), atol=1e-6)  # fmt: skip
    with pytest.raises(FileNotFoundError, match="run the export stage"):
        ServedModel(str(single["run"] / "best"), "onnx")


# ---------------------------------------------------------------------------- overload, bad input
async def _flood(url: str, texts: list[str]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(texts))
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        return await asyncio.gather(
            *(client.post(f"{url}/predict", json={"texts": [t]}) for t in texts)
        )


@pytest.mark.e2e
def test_flood_bad_bodies_metrics_and_graceful_shutdown(single):
    pred = single["predictions"]
    expected = dict(zip(pred["text"], pred["pred_label"], strict=False))
    texts = pred["text"].tolist()[:150]
    server = Server(
        single["run"], "--max-queue", "8", "--max-batch-size", "4", "--max-wait-ms", "300",
        "--max-body-bytes", "20000",
    )  # fmt: skip
    try:
        responses = asyncio.run(_flood(server.url, texts))
        codes = [r.status_code for r in responses]
        assert set(codes) <= {200, 503} and codes.count(503) > 0 and codes.count(200) >= 8
        for text, r in zip(texts, responses, strict=True):
            if r.status_code == 200:  # every accepted request gets its own answer
                assert r.json()["labels"] == [expected[text]]
            else:
                assert r.headers["retry-after"] == "1" and "busy" in r.json()["detail"]
        assert server.metric("xdpx_rejected_total") == codes.count(503)
        ok = '{endpoint="/predict",status="200"}'
        assert server.metric("xdpx_requests_total", ok) == codes.count(200)
        assert server.metric("xdpx_texts_total") == codes.count(200)
        assert server.metric("xdpx_batch_size_sum") == codes.count(200)
        assert 0 < server.metric("xdpx_batch_size_count") < codes.count(200)  # merged calls
        assert server.metric("xdpx_queue_depth") == 0
        # bad bodies: 413 and 422 naming the field; the server lives on
        big = server.post("/predict", json={"texts": ["好" * 10_000]})
        assert big.status_code == 413 and "max_body_bytes" in big.text
        bad_json = server.post("/predict", content=b'{"texts": [')
        assert bad_json.status_code == 422 and "not valid JSON" in bad_json.text
        wrong = server.post("/predict", json={"text": ["a"]})
        assert wrong.status_code == 422 and wrong.json()["detail"][0]["loc"] == ["body", "text"]
        kind = server.post("/predict", json={"texts": "abc"})
        assert kind.status_code == 422 and kind.json()["detail"][0]["loc"] == ["body", "texts"]
        empty = server.post("/predict", json={"texts": ["ok", " "]})
        assert empty.status_code == 422 and "texts[1]: empty text" in empty.text
        v2 = server.post("/v2/models/run/infer", json={"inputs": [{"name": "txt", "shape": [1], "datatype": "BYTES", "data": ["a"]}]})  # fmt: skip
        assert v2.status_code == 422 and "no tensor named 'text'" in v2.text
        long_text = "很好" * 500  # > max_len 128: truncated as prepro does
        r = server.post("/predict", json={"texts": [long_text, long_text[:128]]})
        assert r.status_code == 200 and r.json()["probabilities"][0] == r.json()["probabilities"][1]
        # graceful shutdown: requests in flight when SIGTERM arrives are answered

        async def in_flight() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as client:
                tasks = [asyncio.create_task(client.post(f"{server.url}/predict", json={"texts": [t]})) for t in texts[:3]]  # fmt: skip
                deadline = time.time() + 10  # queued: they wait max_wait_ms for a 4th text
                while server.metric("xdpx_queue_depth") < 3 and time.time() < deadline:
                    await asyncio.sleep(0.01)
                server.proc.send_signal(signal.SIGTERM)
                return [r.status_code for r in await asyncio.gather(*tasks)]

        assert asyncio.run(in_flight()) == [200, 200, 200]
    finally:
        server.stop_gracefully()


# ---------------------------------------------------------------------------- the batcher
@pytest.mark.unit
def test_batcher_merges_concurrent_texts_in_order_and_isolates_failures():
    from xdpx.serving.server import DynamicBatcher, Overloaded, ServeConfig

    calls: list[list[int]] = []

    def run_batch(samples):
        calls.append([int(s[0]) for s in samples])
        if any(int(s[0]) < 0 for s in samples):
            raise ValueError("bad sample")
        return np.array([[float(s[0]), 1.0] for s in samples])

    async def main():
        b = DynamicBatcher(run_batch, ServeConfig(max_batch_size=4, max_wait_ms=50, max_queue=10))
        b.start()
        reqs = [b.submit([np.array([i]), np.array([i + 100])]) for i in range(5)]
        out = await asyncio.gather(*reqs)
        with pytest.raises(Overloaded):
            await asyncio.gather(b.submit([np.array([1])] * 11))
        bad = await asyncio.gather(b.submit([np.array([-1])]), return_exceptions=True)
        good = await b.submit([np.array([7])])
        await b.stop()
        return out, bad, good

    out, bad, good = asyncio.run(main())
    for i, probs in enumerate(out):  # each request gets its own rows, in order
        assert probs[:, 0].tolist() == [i, i + 100]
    assert [len(c) for c in calls[:3]] == [4, 4, 2]  # 10 texts in calls of <= 4
    assert isinstance(bad[0], ValueError) and good[:, 0].tolist() == [7]


@pytest.mark.unit
def test_batcher_runs_cheap_calls_on_the_event_loop_and_slow_ones_in_its_thread():
    import threading

    from xdpx.serving.server import DynamicBatcher, ServeConfig

    def calls_of(seconds: float, inline_ms: float) -> list[bool]:
        """Which of 4 one-text calls ran on the event loop's thread."""
        on_loop: list[bool] = []

        def run_batch(samples):
            on_loop.append(threading.get_ident() == loop_thread)
            time.sleep(seconds)
            return np.ones((len(samples), 2))

        async def main():
            b = DynamicBatcher(run_batch, ServeConfig(max_wait_ms=0, inline_ms=inline_ms))
            b.start()
            for i in range(4):
                await b.submit([np.array([i])])
            await b.stop()

        loop_thread = threading.get_ident()  # asyncio.run's loop runs in this thread
        asyncio.run(main())
        return on_loop

    # the first call has no estimate: the worker thread; then cheap calls stay on the loop
    assert calls_of(0.0, inline_ms=50) == [False, True, True, True]
    assert calls_of(0.06, inline_ms=50) == [False] * 4  # 60 ms a call: too slow to inline
    assert calls_of(0.0, inline_ms=0) == [False] * 4  # 0 = never


@pytest.mark.unit
def test_batcher_runs_up_to_instances_calls_at_once():
    """Two one-text calls meet at a barrier inside the model call: only two instances let
    both run at once; with one, the first waits alone until the barrier breaks."""
    import threading

    from xdpx.serving.server import DynamicBatcher, ServeConfig

    def answers(instances: int) -> list:
        barrier = threading.Barrier(2, timeout=2.0)
        threads: set[int] = set()

        def run_batch(samples):
            threads.add(threading.get_ident())
            barrier.wait()
            return np.array([[float(s[0]), 1.0] for s in samples])

        async def main():
            cfg = ServeConfig(max_batch_size=1, max_wait_ms=0, inline_ms=0, instances=instances)
            b = DynamicBatcher(run_batch, cfg)
            b.start()
            out = await asyncio.gather(*(b.submit([np.array([i])]) for i in range(2)), return_exceptions=True)  # fmt: skip
            await b.stop()
            return out

        out = asyncio.run(main())
        return [o if isinstance(o, Exception) else o[0, 0] for o in out] + [len(threads)]

    assert answers(2) == [0.0, 1.0, 2]  # both calls at the barrier at once, in two threads
    one = answers(1)
    assert isinstance(one[0], threading.BrokenBarrierError) and one[-1] == 1
    with pytest.raises(ValueError, match="instances"):
        ServeConfig(instances=0)


@pytest.mark.unit
def test_threads_per_instance_share_the_cores_out():
    from xdpx.serving.server import threads_per_instance

    assert [threads_per_instance(i, cores=2) for i in (1, 2, 3)] == [2, 1, 1]
    assert threads_per_instance(2, cores=16) == 8 and threads_per_instance(3, cores=16) == 5
    assert threads_per_instance(2) >= 1  # this process's cores


@pytest.mark.unit
def test_serve_http_gives_each_instance_its_share_of_the_cores_and_warns_past_them(monkeypatch, caplog):  # fmt: skip
    from xdpx.serving import server

    loaded: list = []

    def load(run, backend, threads, onnx_file):
        loaded.append(threads)
        raise KeyboardInterrupt  # stop before uvicorn

    monkeypatch.setattr(server, "load_served", load)
    monkeypatch.setattr(server, "find_export", lambda run, onnx_file: run)  # an export
    for threads in (None, 256):
        with pytest.raises(KeyboardInterrupt):
            server.serve_http("models/x", threads=threads)
    assert loaded == [server.threads_per_instance(2), 256]
    assert "2 instances x 256 threads is more than this machine's" in caplog.text
    with pytest.raises(KeyboardInterrupt):  # the eager backend: the library's own threads
        server.serve_http("models/x", backend="eager")
    assert loaded[-1] is None


@pytest.mark.e2e
def test_an_exported_model_answers_two_instances_at_once_as_one(single):
    """The server's two model instances call one onnxruntime session (no lock) and one
    encoder (locked: the character tokenizer adds each new character to its table) from
    two threads: the answers equal one thread's, text for text."""
    from concurrent.futures import ThreadPoolExecutor

    from xdpx.serving.server import ServedModel

    texts = read_tsv(Path(single["run"]).parent / "predictions.tsv")["text"].astype(str).tolist()
    chunks = [texts[i::8] for i in range(8)]
    alone = ServedModel(str(single["run"] / "export"), "onnx", threads=1)
    expected = [alone.probs(alone.encode(c)) for c in chunks]
    model = ServedModel(str(single["run"] / "export"), "onnx", threads=1)  # a fresh table
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda c: model.probs(model.encode(c)), chunks))
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)


@pytest.mark.unit
def test_length_chunks_keep_long_texts_apart_and_every_index_once():
    from xdpx.serving.server import length_chunks

    lengths = [5, 100, 6, 7, 90, 3000, 8, 1]
    chunks = length_chunks(lengths)
    assert sorted(i for c in chunks for i in c) == list(range(len(lengths)))
    assert [5] in chunks  # the 3,000-token text pads nobody
    for c in chunks:  # padding under half of each chunk's padded area
        longest = max(lengths[i] for i in c)
        assert sum(lengths[i] for i in c) >= 0.5 * len(c) * longest
    assert length_chunks([10] * 5) == [[0, 1, 2, 3, 4]]


@pytest.mark.unit
def test_encoder_calls_are_length_homogeneous_and_rows_come_back_in_order():
    """A transformer encoder's batch is cut at its own padding tolerance (0.1: every padded
    token costs a real one's time); the probabilities still come back in request order."""
    from xdpx.serving.server import ENCODER_MAX_PADDING, ServeConfig, ServedModel, create_app

    widths: list[tuple[int, int]] = []

    def logits(samples):  # one "model call": the logits are the texts' own lengths
        x = np.array([len(s) for s in samples], dtype=np.float32)
        widths.append((len(samples), int(x.max())))
        return np.stack([x, -x], 1)

    model = ServedModel.__new__(ServedModel)  # no files: only probs() and its chunking
    model._logits, model.max_padding = logits, ENCODER_MAX_PADDING
    model.name, model.labels, model.pair, model.backend = "m", ["a", "b"], False, "onnx"
    rng = np.random.default_rng(0)
    samples = [np.ones(n, dtype=np.int64) for n in rng.integers(3, 129, 64)]
    probs = model.probs(samples)
    expected = [np.exp(n) / (np.exp(n) + np.exp(-n)) for n in map(len, samples)]
    np.testing.assert_allclose(probs[:, 0], expected, rtol=1e-6)
    assert sum(r for r, _ in widths) == 64 and len(widths) > 2
    padded = sum(r * w for r, w in widths)
    assert sum(map(len, samples)) >= (1 - ENCODER_MAX_PADDING) * padded
    create_app(model, ServeConfig(max_padding=0.5))  # the option overrides the model's own
    assert model.max_padding == 0.5


@pytest.mark.unit
def test_hot_endpoints_answer_like_fastapi_and_survive_a_failing_model_call():
    """POST /predict and the V2 infer endpoint skip FastAPI's layers (server._Front): their
    errors, statuses and metrics must still be FastAPI's."""
    from starlette.testclient import TestClient

    from xdpx.serving.server import ServeConfig, create_app

    class Stub:  # the parts of ServedModel the app uses; a text "boom" breaks the model call
        name, labels, pair, backend, control_chars = "stub", ["neg", "pos"], False, "onnx", "strip_warn"  # fmt: skip

        def encode(self, texts, texts2=None):
            return [np.array([len(t) if t != "boom" else -1]) for t in texts]

        def probs(self, samples):
            if any(int(s[0]) < 0 for s in samples):
                raise RuntimeError("model call failed")
            return np.array([[0.25, 0.75]] * len(samples))

    app = create_app(Stub(), ServeConfig(max_batch_size=1, max_body_bytes=200))
    with TestClient(app) as client:
        ok = client.post("/predict", json={"texts": ["a", "bb"]})
        assert ok.status_code == 200 and ok.json()["labels"] == ["pos", "pos"]
        broken = client.post("/predict", json={"texts": ["boom"]})
        assert broken.status_code == 500 and broken.json() == {"detail": "Internal Server Error"}
        assert client.post("/predict", json={"texts": ["a"]}).status_code == 200  # lives on
        assert client.get("/predict").status_code == 405  # other methods: FastAPI's answer
        wrong = client.post("/predict", json={"texts": ["a"], "extra": 1})
        assert wrong.status_code == 422 and wrong.json()["detail"][0]["loc"] == ["body", "extra"]
        assert client.post("/predict", content=b"[" * 300).status_code == 413
        v2 = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}
        assert client.post("/v2/models/stub/infer", json=v2).json()["outputs"][0]["data"] == ["pos"]  # fmt: skip
        missing = client.post("/v2/models/other/infer", json=v2)
        assert (
            missing.status_code == 404 and "no model 'other'" in missing.json()["error"]
        )  # V2's body
        metrics = client.get("/metrics").text
    for labels, count in [
        ('endpoint="/predict",status="200"', 2),
        ('endpoint="/predict",status="500"', 1),
        ('endpoint="<unmatched>",status="405"', 1),  # a method no route takes
        ('endpoint="/predict",status="422"', 1),
        ('endpoint="/predict",status="413"', 1),
        ('endpoint="/v2/models/{name}/infer",status="404"', 1),
    ]:
        assert f"xdpx_requests_total{{{labels}}} {float(count)}" in metrics, labels


@pytest.mark.unit
def test_concurrent_requests_are_encoded_in_one_call_per_batch():
    """The batcher queues raw texts and encodes a whole batch in one tokenizer call (an
    encode per request cost the demo's n-gram model 0.075 ms, a batch of 32 0.005 ms a
    text); each request still gets its own rows, pairs their own text2."""
    from concurrent.futures import ThreadPoolExecutor

    from starlette.testclient import TestClient

    from xdpx.serving.server import ServeConfig, create_app

    calls: list[list[tuple[str, str | None]]] = []

    class Stub:  # P(pos) = len(text) / 100 (+ len(text2) / 1000 for a pair)
        name, labels, backend, control_chars = "stub", ["neg", "pos"], "onnx", "strip_warn"

        def __init__(self, pair: bool) -> None:
            self.pair = pair

        def encode(self, texts, texts2=None):
            calls.append(list(zip(texts, texts2 or [None] * len(texts), strict=True)))
            return [len(t) / 100 + (len(b) / 1000 if b else 0) for t, b in calls[-1]]

        def probs(self, samples):
            p = np.asarray(samples, dtype=np.float64)
            return np.stack([1 - p, p], 1)

    texts = ["x" * n for n in range(1, 25)]
    for pair in (False, True):
        calls.clear()
        app = create_app(Stub(pair), ServeConfig(max_wait_ms=300, inline_ms=0))
        with TestClient(app) as client, ThreadPoolExecutor(len(texts)) as pool:

            def post(t: str, pair: bool = pair) -> list[float]:
                body = {"pairs": [[t, t + "yy"]]} if pair else {"texts": [t]}
                return client.post("/predict", json=body).json()["probabilities"][0]

            answers = list(pool.map(post, texts))
        for t, (_, p) in zip(texts, answers, strict=True):
            assert p == pytest.approx(len(t) / 100 + ((len(t) + 2) / 1000 if pair else 0))
        assert sorted(x[0] for c in calls for x in c) == sorted(texts)  # each text once
        assert all(x[1] == (x[0] + "yy" if pair else None) for c in calls for x in c)
        assert len(calls) < len(texts) and max(map(len, calls)) > 1, [len(c) for c in calls]


@pytest.mark.unit
def test_cli_serve_defaults_are_serveconfigs():
    import dataclasses

    import typer

    from xdpx.cli import app
    from xdpx.serving.server import ServeConfig

    serve = typer.main.get_command(app).commands["serve"]
    cli = {p.name: p.default for p in serve.params}
    for field in dataclasses.fields(ServeConfig):
        if field.name in cli:
            assert cli[field.name] == field.default, field.name
    assert {"max_batch_size", "max_wait_ms", "inline_ms", "max_queue"} <= cli.keys()


@pytest.mark.e2e
def test_the_serving_runtime_answers_from_an_export_without_torch(single):
    """The serving runtime and the HTTP app on an export directory import neither torch nor
    xdpx.models (what `pip install 'xdpx[serve]'` relies on), and answer as /predict does."""
    code = f"""
import sys
from starlette.testclient import TestClient
from xdpx.serving.server import ServeConfig, ServedModel, create_app
model = ServedModel({str(single["run"] / "export")!r}, "onnx")
with TestClient(create_app(model, ServeConfig())) as client:
    r = client.post("/predict", json={{"texts": ["质量很好", "太差了"]}})
    assert r.status_code == 200, r.text
    print(r.json()["labels"])
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "torch" or m.startswith("xdpx.models"))
assert not loaded, loaded
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.fullmatch(r"\['(neg|pos)', '(neg|pos)'\]\n", out.stdout), out.stdout
