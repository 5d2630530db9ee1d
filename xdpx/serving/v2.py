"""The Open Inference Protocol (KServe V2) as its clients speak it: the request and
response bodies of ``POST /v2/models/{name}/infer``, with the binary tensor data
extension, and the protocol's error body.

Sources: the KServe V2 REST protocol (kserve/open-inference-protocol, "REST/HTTP
protocol": error responses are ``{"error": "<message>"}``) and Triton's *binary tensor
data* extension (triton-inference-server/server, ``docs/protocol/extension_binary_data.md``):
a request whose ``Inference-Header-Content-Length`` header is ``N`` carries its JSON in the
body's first ``N`` bytes and, after it, the raw data of every input whose
``parameters.binary_data_size`` is set, in the order the inputs appear in the JSON. A
``BYTES`` tensor's raw data is each element as a 4-byte little-endian length followed by
its bytes; ``FP32`` is the little-endian float32 values, row-major. Outputs come back the
same way when the request asks (``parameters.binary_data_output: true`` for all,
``outputs[i].parameters.binary_data`` for one): the response JSON then gives their
``binary_data_size`` instead of ``data``, and its own length in the response's
``Inference-Header-Content-Length``. ``tritonclient.http`` (Triton's Python client) uses
the extension by default for inputs and outputs; ``tests/test_serve_v2_client.py`` drives
the server with it.

This module is the protocol only (bytes and pydantic models in, bytes out); the routes,
the model and the batcher are :mod:`xdpx.serving.server`'s.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np
import orjson
from fastapi import HTTPException
from fastapi.responses import Response
from pydantic import BaseModel, Field, ValidationError

__all__ = [
    "HEADER_LENGTH",
    "V2Tensor",
    "V2Request",
    "error_message",
    "error_response",
    "parse_infer",
    "infer_response",
    "encode_bytes",
    "decode_bytes",
]

#: The binary tensor data extension's header: the JSON part's length in bytes.
HEADER_LENGTH = "Inference-Header-Content-Length"

#: The outputs every xdpx model gives, in order.
OUTPUTS = ("label", "probabilities")


class V2Tensor(BaseModel):
    """A tensor of a V2 request: ``data`` inline (JSON), or its raw bytes after the JSON
    (``parameters.binary_data_size``, the binary tensor data extension)."""

    name: str
    shape: list[int]
    datatype: str
    data: list[Any] | None = None
    parameters: dict[str, Any] | None = None


class V2Request(BaseModel):
    """``POST /v2/models/{name}/infer``: ``inputs``, the ``outputs`` wanted (default: all)
    and request ``parameters`` (``binary_data_output``)."""

    id: str | None = None
    inputs: list[V2Tensor] = Field(min_length=1)
    outputs: list[dict[str, Any]] | None = None
    parameters: dict[str, Any] | None = None


def error_message(detail: Any) -> str:
    """One line from an ``HTTPException.detail``: a string as it is; pydantic's error list
    as ``"inputs.0.shape: Field required; ..."`` (the field's path, then the message)."""
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(k) for k in e.get('loc', ()) if k != 'body')}: {e.get('msg', '')}"
            if isinstance(e, dict)
            else str(e)
            for e in detail
        )
    return str(detail)


def error_response(status: int, detail: Any, headers: dict[str, str] | None = None) -> Response:
    """The protocol's error body, ``{"error": "<message>"}``, with ``status``."""
    body = orjson.dumps({"error": error_message(detail)})
    return Response(body, status, headers, media_type="application/json")


def decode_bytes(buf: bytes, count: int, where: str) -> list[str]:
    """The ``count`` strings of a ``BYTES`` tensor's raw data (each a 4-byte little-endian
    length, then that many UTF-8 bytes).

    Raises:
        HTTPException: 422 naming ``where`` and the element: a length past the end of the
            data, bytes that are not UTF-8, or another number of elements than ``count``.
    """
    out: list[str] = []
    pos = 0
    while pos < len(buf):
        if pos + 4 > len(buf):
            raise HTTPException(422, f"{where}: element {len(out)}: its 4-byte length is cut off at byte {pos} of {len(buf)}")  # fmt: skip
        (n,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        if pos + n > len(buf):
            raise HTTPException(422, f"{where}: element {len(out)}: length {n} runs past the end of the data ({len(buf) - pos} bytes left)")  # fmt: skip
        try:
            out.append(buf[pos : pos + n].decode("utf-8"))
        except UnicodeDecodeError as e:
            raise HTTPException(422, f"{where}: element {len(out)} is not UTF-8 ({e.reason} at byte {e.start})") from None  # fmt: skip
        pos += n
    if len(out) != count:
        raise HTTPException(422, f"{where}: {len(out)} elements in the binary data, the shape says {count}")  # fmt: skip
    return out


def encode_bytes(values: list[str]) -> bytes:
    """A ``BYTES`` tensor's raw data: each value's UTF-8 bytes after its 4-byte
    little-endian length (what :func:`decode_bytes` reads)."""
    parts = []
    for v in values:
        b = v.encode("utf-8")
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


def parse_infer(raw: bytes, header_length: str | None, wanted: list[str]) -> tuple[V2Request, list[list[str]]]:  # fmt: skip
    """The request and the texts of each input in ``wanted`` (``["text"]``, or ``["text",
    "text2"]`` for a pair model), from JSON ``data`` or the binary data after the JSON.

    Args:
        raw: the request body.
        header_length: the ``Inference-Header-Content-Length`` header, or None (the body is
            all JSON).
        wanted: the input names the model takes, in order.

    Raises:
        HTTPException: 422 naming the field: a bad header length, malformed JSON or a
            wrong field, a missing input, a datatype other than ``BYTES``, data that do not
            match the shape, binary data shorter or longer than the inputs declare.
    """
    json_part, binary = raw, b""
    if header_length is not None:
        if not header_length.strip().isdigit() or int(header_length) > len(raw):
            raise HTTPException(422, f"{HEADER_LENGTH}: {header_length!r} is not a length within the body's {len(raw)} bytes")  # fmt: skip
        n = int(header_length)
        json_part, binary = raw[:n], raw[n:]
    try:
        data = orjson.loads(json_part)
    except orjson.JSONDecodeError as e:
        hint = f" (binary tensor data need the {HEADER_LENGTH} header)" if header_length is None else ""  # fmt: skip
        raise HTTPException(422, f"the body is not valid JSON: {e}{hint}") from None
    try:
        body = V2Request.model_validate(data)
    except ValidationError as e:
        errors = [{"loc": ["body", *err["loc"]], "msg": err["msg"], "type": err["type"]} for err in e.errors(include_url=False, include_input=False)]  # fmt: skip
        raise HTTPException(422, errors) from None
    # the binary data of every input that declares some, in the JSON's order
    blobs: dict[str, bytes] = {}
    pos = 0
    for t in body.inputs:
        size = (t.parameters or {}).get("binary_data_size")
        if size is None:
            continue
        if not isinstance(size, int) or size < 0 or pos + size > len(binary):
            raise HTTPException(422, f"inputs[{t.name}].parameters.binary_data_size: {size!r} bytes, {len(binary) - pos} left after the JSON")  # fmt: skip
        blobs[t.name] = binary[pos : pos + size]
        pos += size
    if pos != len(binary):
        raise HTTPException(422, f"{len(binary) - pos} bytes after the JSON and the inputs' binary data")  # fmt: skip
    by_name = {t.name: t for t in body.inputs}
    columns = []
    for n in wanted:
        t = by_name.get(n)
        if t is None:
            raise HTTPException(422, f"inputs: no tensor named {n!r} (this model takes {wanted})")  # fmt: skip
        if t.datatype != "BYTES":
            raise HTTPException(422, f"inputs[{n}].datatype: BYTES expected, got {t.datatype}")
        count = math.prod(t.shape)
        if n in blobs:
            columns.append(decode_bytes(blobs[n], count, f"inputs[{n}]"))
            continue
        if t.data is None:
            raise HTTPException(422, f"inputs[{n}]: no data (neither 'data' nor parameters.binary_data_size)")  # fmt: skip
        if count != len(t.data) or not all(isinstance(x, str) for x in t.data):
            raise HTTPException(422, f"inputs[{n}]: data must be {count} strings (shape {t.shape})")  # fmt: skip
        columns.append(list(t.data))
    if len(columns) == 2 and len(columns[0]) != len(columns[1]):
        raise HTTPException(422, "inputs: text and text2 differ in length")
    return body, columns


def infer_response(body: V2Request, model_name: str, request_id: str, labels: list[str], probs: np.ndarray) -> Response:  # fmt: skip
    """The ``infer`` response: the outputs ``body`` asks for (default: ``label`` and
    ``probabilities``), each in JSON or as binary data after the JSON as asked.

    Args:
        body: the parsed request.
        model_name: the served model's name.
        request_id: the response's ``id`` (the request's, or one made up).
        labels: ``[n]`` predicted label names.
        probs: ``[n, num_labels]`` probabilities.

    Raises:
        HTTPException: 422 for an output this model does not give, or the classification
            extension (``parameters.classification``), which xdpx does not implement.
    """
    default_binary = bool((body.parameters or {}).get("binary_data_output", False))
    asked = body.outputs if body.outputs else [{"name": n} for n in OUTPUTS]
    n = len(labels)
    outputs, blobs = [], []
    for o in asked:
        name = o.get("name")
        params = o.get("parameters") or {}
        if name not in OUTPUTS:
            raise HTTPException(422, f"outputs: no tensor named {name!r} (this model gives {list(OUTPUTS)})")  # fmt: skip
        if params.get("classification"):
            raise HTTPException(422, f"outputs[{name}].parameters.classification: the classification extension is not supported; read 'probabilities'")  # fmt: skip
        if name == "label":
            tensor = {"name": "label", "datatype": "BYTES", "shape": [n]}
            raw = encode_bytes(labels)
            data: Any = labels
        else:
            tensor = {"name": "probabilities", "datatype": "FP32", "shape": [n, int(probs.shape[1]) if probs.ndim == 2 else 0]}  # fmt: skip
            f32 = np.ascontiguousarray(probs, dtype="<f4")
            raw = f32.tobytes()
            data = f32.ravel().tolist()
        if params.get("binary_data", default_binary):
            tensor["parameters"] = {"binary_data_size": len(raw)}
            blobs.append(raw)
        else:
            tensor["data"] = data
        outputs.append(tensor)
    doc = orjson.dumps({"model_name": model_name, "model_version": "1", "id": request_id, "outputs": outputs})  # fmt: skip
    if not blobs:
        return Response(doc, 200, media_type="application/json")
    headers = {HEADER_LENGTH: str(len(doc))}
    return Response(doc + b"".join(blobs), 200, headers, media_type="application/octet-stream")
