"""``xdpx serve RUN --http``: an HTTP server for a run, with dynamic batching.

Raw text in, labels and probabilities out: the run's own preprocessing (tokenizer,
transliteration, ``lower``, truncation at ``max_len``, exactly as prepro and ``predict``)
feeds the exported ONNX model on onnxruntime (``<run>/export/model.onnx``), or the eager
PyTorch checkpoint when there is no export (or ``backend="eager"``).

Endpoints (FastAPI):

* ``POST /predict``: ``{"texts": [...]}`` (pair models: ``{"pairs": [[text1, text2], ...]}``)
  -> ``{"model", "labels": [...], "probabilities": [[p_label1, ...], ...], "label_names"}``.
* The Open Inference Protocol (KServe V2): ``GET /v2/health/live``, ``/v2/health/ready``,
  ``GET /v2/models/{name}`` (metadata), ``/v2/models/{name}/ready``, ``POST
  /v2/models/{name}/infer`` with a ``BYTES`` input ``text`` (pairs: ``text`` and ``text2``),
  outputs ``label`` (``BYTES [n]``) and ``probabilities`` (``FP32 [n, num_labels]``).
* ``GET /metrics``: Prometheus text format (``prometheus_client``): requests by endpoint and
  status, request latency, model batch sizes, queue depth, rejected requests; a cascade's
  deferred texts (``xdpx_cascade_deferred``).

**Dynamic batching** (:class:`DynamicBatcher`; Triton's and TorchServe's terms): the texts
of concurrent requests wait in one queue, raw; a worker takes up to ``max_batch_size`` of
them, waiting at most ``max_wait_ms`` after the oldest one arrived, encodes them in one
tokenizer call, pads them to the batch's own longest text, runs one model call in a worker
thread (the event loop keeps accepting), and hands each request its rows in order. Texts
that queue up while a call runs form the next batch without any wait; a single text after a
single-text call (one client at a time) runs at once instead of waiting ``max_wait_ms`` for
company that is not coming. A call expected to take under ``inline_ms`` runs on the event
loop instead: the hand-over to the thread costs more than such a call. ``max_batch_size=1``
turns batching off. Up to ``instances`` calls (2 by default; Triton's ``instance_group``)
run at once, each in its own thread with the cores shared out between them
(:class:`ServeConfig`): on 2 cores two one-thread calls side by side answer more than one
two-thread call.

**Overload and bad input**: the queue holds at most ``max_queue`` texts; a request that
would overflow it gets ``503`` with ``Retry-After`` and is not queued (every accepted text
is answered). A body over ``max_body_bytes`` gets ``413``; malformed JSON or a wrong field
``422`` naming the field (FastAPI's validation errors); an empty text ``422`` naming its
index; an error in the model call ``500`` for that batch's requests only. On SIGTERM
uvicorn stops accepting, lets in-flight requests finish, then the batcher stops.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import time
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Route

from xdpx.batching import length_chunks
from xdpx.data.readers import CONTROL_CHARS, TextError, clean_text
from xdpx.serving.batcher import (
    DynamicBatcher,
    Overloaded,
    ServeConfig,
    available_cores,
    threads_per_instance,
)
from xdpx.serving.ensemble import is_ensemble, load_served
from xdpx.serving.runtime import ENCODER_MAX_PADDING, ServedModel, find_export
from xdpx.serving.v2 import (
    HEADER_LENGTH,
    V2Request,
    V2Tensor,
    error_response,
    infer_response,
    parse_infer,
)

log = logging.getLogger("xdpx.serving.server")

__all__ = [
    "ServeConfig",
    "ServedModel",
    "DynamicBatcher",
    "Overloaded",
    "create_app",
    "length_chunks",
    "serve_http",
    "threads_per_instance",
    "ENCODER_MAX_PADDING",
    "V2Request",
    "V2Tensor",
]


# ---------------------------------------------------------------------------- the app
class PredictRequest(BaseModel):
    """``POST /predict``: ``texts`` for a single-text model, ``pairs`` for a pair model."""

    model_config = ConfigDict(extra="forbid")
    texts: list[str] | None = Field(None, min_length=1)
    pairs: list[tuple[str, str]] | None = Field(None, min_length=1)


def create_app(model: ServedModel, config: ServeConfig | None = None) -> Any:
    """The ASGI application serving ``model`` (see the module docstring).

    Returns:
        A :class:`_Front` over the FastAPI app (its ``.app``); run it with uvicorn
        (:func:`serve_http`).
    """
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        generate_latest,
    )

    cfg = config or ServeConfig()
    if getattr(model, "backend", "onnx") == "eager" and cfg.instances > 1:
        cfg = dataclasses.replace(cfg, instances=1)  # its calls take turns (ServedModel)
    if cfg.max_padding is not None:
        model.max_padding = cfg.max_padding
    registry = CollectorRegistry()
    requests = Counter("xdpx_requests", "HTTP requests by endpoint and status code.", ["endpoint", "status"], registry=registry)  # fmt: skip
    latency = Histogram("xdpx_request_latency_seconds", "Time from request to response, seconds.", ["endpoint"], registry=registry, buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))  # fmt: skip
    sizes = [2**k for k in range(int(math.log2(max(cfg.max_batch_size, 1))) + 1)]
    batch_size = Histogram("xdpx_batch_size", "Texts per model call.", registry=registry, buckets=sorted({*sizes, cfg.max_batch_size}))  # fmt: skip
    texts_total = Counter("xdpx_texts", "Texts answered.", registry=registry)
    rejected = Counter("xdpx_rejected", "Requests refused with 503 (queue full).", registry=registry)  # fmt: skip
    queue_depth = Gauge("xdpx_queue_depth", "Texts waiting for a model call.", registry=registry)  # fmt: skip

    def run_batch(inputs: list[tuple[str, str | None]]) -> np.ndarray:
        """One model call on the raw ``(text, text2)`` of a batch: encoded together (one
        tokenizer call: the per-call cost of the encoder's numpy steps is paid once a batch,
        not once a request: the demo's ngram_lr encodes one text in 0.075 ms alone and in
        0.005 ms a text in a batch of 32), then :meth:`ServedModel.probs`."""
        texts = [t for t, _ in inputs]
        texts2 = [t2 for _, t2 in inputs] if model.pair else None
        return model.probs(model.encode(texts, texts2))

    batcher = DynamicBatcher(run_batch, cfg, on_batch=batch_size.observe)
    queue_depth.set_function(lambda: batcher.depth)
    if getattr(model, "threshold", None) is not None:  # a cascade (xdpx.serving.ensemble)
        deferred = Gauge("xdpx_cascade_deferred", "Texts the cascade sent past its first member (of xdpx_texts).", registry=registry)  # fmt: skip
        deferred.set_function(lambda: model.deferred)
    state = {"ready": False}

    @asynccontextmanager
    async def lifespan(app: Any):
        gc.freeze()  # the loaded model's objects: no more full-GC scans of them per request
        batcher.start()
        state["ready"] = True
        yield
        state["ready"] = False
        await batcher.stop()

    app = FastAPI(title=f"xdpx: {model.name}", lifespan=lifespan)

    def cleaned(texts: list[str], where: str) -> list[str]:
        """``texts`` as prepro keeps a line's text (``prepro.control_chars``); 422 naming
        the index for an empty text or a refused control character (a NUL by default)."""
        out = texts
        for k, t in enumerate(texts):
            if not t.strip():
                raise HTTPException(422, f"{where}[{k}]: empty text")
            if CONTROL_CHARS.search(t) is not None:
                try:
                    text, _ = clean_text(t, model.control_chars, f"{where}[{k}]")
                except TextError as e:
                    raise HTTPException(422, f"{where}[{k}]: {e}") from None
                out = list(texts) if out is texts else out
                out[k] = text
        return out

    async def answer(texts: list[str], texts2: list[str] | None, where: str) -> np.ndarray:
        if texts2 is None:
            texts = cleaned(texts, where)
        if len(texts) > cfg.max_queue:
            raise HTTPException(413, f"{len(texts)} texts in one request; at most {cfg.max_queue} (max_queue)")  # fmt: skip
        inputs = list(
            zip(texts, texts2 if texts2 is not None else [None] * len(texts), strict=True)
        )
        try:
            probs = await batcher.submit(inputs)
        except Overloaded as e:
            rejected.inc()
            raise HTTPException(503, f"server busy ({e}); retry later", headers={"Retry-After": str(cfg.retry_after_s)}) from None  # fmt: skip
        texts_total.inc(len(texts))
        return probs

    async def predict(raw: bytes) -> Response:
        body = _parse(raw, PredictRequest)
        if (body.texts is None) == (body.pairs is None):
            raise HTTPException(422, "give exactly one of 'texts' (a list of strings) or 'pairs' (a list of [text1, text2])")  # fmt: skip
        if model.pair and body.pairs is None:
            raise HTTPException(422, f"{model.name} is a pair model: send 'pairs': [[text1, text2], ...]")  # fmt: skip
        if not model.pair and body.pairs is not None:
            raise HTTPException(422, f"{model.name} takes single texts: send 'texts': [...]")  # fmt: skip
        if body.pairs is not None:
            texts, texts2 = [p[0] for p in body.pairs], [p[1] for p in body.pairs]
            probs = await _pairs(texts, texts2)
        else:
            probs = await answer(body.texts or [], None, "texts")
        return _json(
            {
                "model": model.name,
                "label_names": model.labels,
                "labels": [model.labels[int(i)] for i in probs.argmax(1)],
                "probabilities": probs.tolist(),
            }
        )

    async def _pairs(texts: list[str], texts2: list[str], where: str = "pairs") -> np.ndarray:
        for k, (a, b) in enumerate(zip(texts, texts2, strict=True)):
            if not a.strip() or not b.strip():
                raise HTTPException(422, f"{where}[{k}]: empty text")
        return await answer(cleaned(texts, where), cleaned(texts2, where), where)

    # ---------------------------------------------------------------- Open Inference Protocol
    def metadata() -> dict[str, Any]:
        inputs = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        if model.pair:
            inputs.append({"name": "text2", "datatype": "BYTES", "shape": [-1]})
        return {
            "name": model.name,
            "versions": ["1"],
            "platform": "onnxruntime_onnx" if model.backend == "onnx" else "pytorch_torchscript",
            "inputs": inputs,
            "outputs": [
                {"name": "label", "datatype": "BYTES", "shape": [-1]},
                {"name": "probabilities", "datatype": "FP32", "shape": [-1, len(model.labels)]},
            ],
            "parameters": {"label_names": model.labels, "backend": model.backend},
        }

    def known(name: str, version: str | None = None) -> None:
        if name != model.name:
            raise HTTPException(404, f"no model {name!r}; this server has {model.name!r}")
        if version is not None and version != "1":
            raise HTTPException(404, f"no version {version!r} of {name!r}; it has version '1'")

    def model_config() -> dict[str, Any]:
        """Triton's model configuration (``GET /v2/models/{name}/config``, its
        model-configuration extension): what ``tritonclient``'s ``get_model_config`` reads."""
        inputs = [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]}]
        if model.pair:
            inputs.append({"name": "text2", "data_type": "TYPE_STRING", "dims": [1]})
        return {
            "name": model.name,
            "platform": metadata()["platform"],
            "max_batch_size": cfg.max_batch_size,
            "input": inputs,
            "output": [
                {"name": "label", "data_type": "TYPE_STRING", "dims": [1]},
                {"name": "probabilities", "data_type": "TYPE_FP32", "dims": [len(model.labels)]},
            ],
            "dynamic_batching": {"max_queue_delay_microseconds": int(cfg.max_wait_ms * 1000)},
            "instance_group": [{"count": cfg.instances, "kind": "KIND_CPU"}],
        }

    @app.get("/v2/health/live")
    async def live() -> dict[str, bool]:
        return {"live": True}

    @app.get("/v2/health/ready")
    async def ready() -> Any:
        if not state["ready"]:
            return JSONResponse({"ready": False}, status_code=503)
        return {"ready": True}

    @app.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return {"name": "xdpx", "version": "1", "extensions": ["binary_tensor_data", "model_configuration"]}  # fmt: skip

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> dict[str, Any]:
        known(name, version)
        return metadata()

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> Any:
        known(name, version)
        return await ready()

    @app.get("/v2/models/{name}/config")
    @app.get("/v2/models/{name}/versions/{version}/config")
    async def config_route(name: str, version: str | None = None) -> dict[str, Any]:
        known(name, version)
        return model_config()

    async def infer(raw: bytes, name: str, header_length: str | None = None, version: str | None = None) -> Response:  # fmt: skip
        """``POST /v2/models/{name}[/versions/{version}]/infer``: JSON or binary tensor
        data in and out (:mod:`xdpx.serving.v2`); ``header_length``: the request's
        ``Inference-Header-Content-Length``."""
        known(name, version)
        wanted = ["text", "text2"] if model.pair else ["text"]
        body, columns = parse_infer(raw, header_length, wanted)
        if model.pair:
            probs = await _pairs(columns[0], columns[1], "inputs[text]")
        else:
            probs = await answer(columns[0], None, "inputs[text]")
        labels = [model.labels[int(i)] for i in probs.argmax(1)]
        return infer_response(body, model.name, body.id or str(uuid.uuid4()), labels, probs)

    # The two hot endpoints are answered by _Front before FastAPI (see there); these routes
    # give other methods their 405 and serve the app on its own (e.g. a TestClient of it).
    async def predict_route(request: Request) -> Response:
        return await predict(await request.body())

    async def infer_route(request: Request) -> Response:
        path = request.path_params
        return await infer(await request.body(), path["name"], request.headers.get(HEADER_LENGTH), path.get("version"))  # fmt: skip

    app.router.routes.append(Route("/predict", predict_route, methods=["POST"]))
    app.router.routes.append(Route("/v2/models/{name}/infer", infer_route, methods=["POST"]))
    app.router.routes.append(Route("/v2/models/{name}/versions/{version}/infer", infer_route, methods=["POST"]))  # fmt: skip

    # the protocol's error body on every /v2/ route: {"error": "<message>"}
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if request.url.path.startswith("/v2"):
            return error_response(exc.status_code, exc.detail, getattr(exc, "headers", None))
        return await http_exception_handler(request, exc)

    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        if request.url.path.startswith("/v2"):
            return error_response(422, list(exc.errors()))
        return await request_validation_exception_handler(request, exc)

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.state.batcher = batcher
    return _Front(app, cfg, requests, latency, predict, infer)


def _json(content: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A JSON response serialised by orjson (FastAPI's default walks every value through
    ``jsonable_encoder`` first, a large share of a small request's time)."""
    return Response(orjson.dumps(content), status, headers, media_type="application/json")


class _TooLarge(Exception):
    pass


class _Front:
    """The outermost ASGI app: ``413`` for a body over ``max_body_bytes`` (by
    ``Content-Length``, or counted while it streams in), the request count and latency
    metrics of every response by endpoint and status, and the two hot endpoints (``POST
    /predict`` and ``POST /v2/models/{name}/infer``) answered here; everything else goes
    to the FastAPI app.

    The hot endpoints skip FastAPI's and Starlette's per-request layers (telemetry, error
    and exception middleware, exit stack, router): the event loop's Python work is the
    floor of every request's cost, and those layers were half of it (the loop thread's
    CPU per request at concurrency 64, from ``/proc``: 0.29 -> 0.13 ms). The answers are
    the same: an ``HTTPException``
    becomes ``{"detail": ...}`` with its status and headers, as FastAPI's handler makes
    it; any other error a logged ``500``.

    Args:
        app: the FastAPI app (every other request, and the lifespan).
        config: ``max_body_bytes``.
        requests, latency: the ``xdpx_requests`` counter and latency histogram.
        predict: ``body bytes -> Response`` of ``POST /predict``.
        infer: ``(body bytes, model name) -> Response`` of the V2 infer endpoint.
    """

    def __init__(
        self,
        app: FastAPI,
        config: ServeConfig,
        requests: Any,
        latency: Any,
        predict: Callable[[bytes], Any],
        infer: Callable[[bytes, str], Any],
    ) -> None:
        self.app, self.cfg, self.requests, self.latency = app, config, requests, latency
        self.predict, self.infer = predict, infer

    def _hot(self, scope: dict[str, Any]) -> tuple[str, Callable[[bytes], Any]] | None:
        """``(endpoint, body -> Response)`` of a hot POST, else None."""
        if scope["method"] != "POST":
            return None
        path = scope["path"]
        if path == "/predict":
            return "/predict", self.predict
        parts = path.split("/")  # ['', 'v2', 'models', name, ('versions', v,) 'infer']
        if len(parts) in (5, 7) and parts[:3] == ["", "v2", "models"] and parts[3] and parts[-1] == "infer":  # fmt: skip
            if len(parts) == 7 and (parts[4] != "versions" or not parts[5]):
                return None
            header = dict(scope.get("headers") or []).get(HEADER_LENGTH.lower().encode())
            length = header.decode("latin-1") if header is not None else None
            version = parts[5] if len(parts) == 7 else None
            route = "/v2/models/{name}/versions/{version}/infer" if version else "/v2/models/{name}/infer"  # fmt: skip
            return route, lambda raw: self.infer(raw, parts[3], length, version)
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500, "sent": False}
        limit = self.cfg.max_body_bytes
        size = dict(scope.get("headers") or []).get(b"content-length", b"")
        hot = self._hot(scope)
        seen = 0

        async def counted_receive() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge
            return message

        async def send_status(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["sent"] = message["status"], True
            await send(message)

        try:
            if size.isdigit() and int(size) > limit:
                raise _TooLarge
            if hot is None:
                await self.app(scope, counted_receive, send_status)
            else:
                await _answer(hot[1], counted_receive, send_status, v2=hot[0].startswith("/v2"))
        except _TooLarge:
            if not status["sent"]:
                message = f"request body over the limit of {limit} bytes (max_body_bytes)"
                too_large = error_response(413, message) if scope["path"].startswith("/v2") else _json({"detail": message}, 413)  # fmt: skip
                await too_large(scope, receive, send_status)
        finally:  # an error escaping to Starlette's 500 handler is counted as a 500
            if hot is not None:
                endpoint = hot[0]
            else:
                app = scope.get("app")
                endpoint = _endpoint(app, scope) if app is not None else "<unmatched>"
            self.requests.labels(endpoint, str(status["code"])).inc()
            self.latency.labels(endpoint).observe(time.perf_counter() - start)


async def _answer(handler: Callable[[bytes], Any], receive: Any, send: Any, v2: bool = False) -> None:  # fmt: skip
    """Read the request body, run ``handler`` on it and send its response; an
    ``HTTPException`` is answered as FastAPI answers it (``v2``: as the V2 protocol does,
    ``{"error": ...}``), any other error with a logged 500.

    Raises:
        _TooLarge: from ``receive`` (the caller answers 413).
    """
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return  # the client went away: nobody to answer
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    try:
        response = await handler(b"".join(chunks))
    except HTTPException as e:
        response = error_response(e.status_code, e.detail, e.headers) if v2 else _json({"detail": e.detail}, e.status_code, e.headers)  # fmt: skip
    except Exception:  # noqa: BLE001 - the server lives; the error is in the log
        log.exception("request failed")
        response = error_response(500, "Internal Server Error") if v2 else _json({"detail": "Internal Server Error"}, 500)  # fmt: skip
    start = {"type": "http.response.start", "status": response.status_code}
    await send({**start, "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body})


def _endpoint(app: FastAPI, scope: dict[str, Any]) -> str:
    """The route path of a request (``/v2/models/{name}/infer``), for metric labels;
    ``<unmatched>`` for paths no route serves (their number is unbounded)."""
    route = scope.get("route")
    if route is not None:
        return route.path
    key = (scope.get("method"), scope.get("path"))
    found = _ENDPOINTS.get(key)
    if found is None:
        found = next((r.path for r in app.routes if r.matches(scope)[0] == Match.FULL), "<unmatched>")  # fmt: skip
        if len(_ENDPOINTS) < 1024:  # paths carry model names: bounded
            _ENDPOINTS[key] = found
    return found


#: ``(method, path) -> route path`` of requests seen (metric labels).
_ENDPOINTS: dict[tuple[Any, Any], str] = {}


def _parse(raw: bytes, model: type[BaseModel]) -> Any:
    """The JSON body as ``model``, whatever the content type (``curl -d`` sends a form type).

    Raises:
        HTTPException: 422 with FastAPI's error list (``loc`` names the field), or naming
            where the JSON is malformed.
    """
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise HTTPException(422, f"the body is not valid JSON: {e}") from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = [
            {"loc": ["body", *err["loc"]], "msg": err["msg"], "type": err["type"]}
            for err in e.errors(include_url=False, include_input=False)
        ]
        raise HTTPException(422, errors) from None


def serve_http(
    run: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    config: ServeConfig | None = None,
    backend: str = "auto",
    threads: int | None = None,
    onnx_file: str = "model.onnx",
) -> None:
    """Load ``run`` and serve it with uvicorn until SIGINT/SIGTERM (graceful: in-flight
    requests finish). Logs ``listening on http://HOST:PORT`` once ready.

    ``threads`` None on onnxruntime with ``config.instances`` > 1: each instance gets
    :func:`threads_per_instance` intra-op threads (the cores shared out), not onnxruntime's
    default of every core, which would have the instances fight over them."""
    import uvicorn

    cfg = config or ServeConfig()
    onnx = backend != "eager" and (is_ensemble(run) or find_export(run.rstrip("/"), onnx_file) is not None)  # fmt: skip
    if threads is None and onnx and cfg.instances > 1:
        threads = threads_per_instance(cfg.instances)
    elif threads is not None and onnx and threads > threads_per_instance(cfg.instances):
        log.warning("%d instances x %d threads is more than this machine's %d cores: the calls will fight over them (a first look on 2 cores: 2 instances x 2 threads served 12-30%% fewer requests than 2 x 1); --threads %d or --instances 1 fit", cfg.instances, threads, available_cores(), threads_per_instance(cfg.instances))  # fmt: skip
    model = load_served(run, backend, threads, onnx_file)  # an ensemble directory, or a run's
    app = create_app(model, cfg)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=30)
