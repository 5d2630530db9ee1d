"""A local object store on 127.0.0.1 for tests: S3 (moto) and an OSS-compatible front, with faults.

``LocalObjectStore`` starts moto's ``ThreadedMotoServer`` as the one storage backend and two
small loopback HTTP proxies in front of it:

- the **S3 front** (``store.s3_endpoint``) forwards requests unchanged; boto3, s3fs and dvc-s3
  talk to it;
- the **OSS front** (``store.oss_endpoint``) translates the Alibaba Cloud OSS protocol, as spoken
  by oss2, ossfs (``oss://`` in fsspec) and dvc-oss/aiooss2, into S3 for moto and back:
  ``Authorization: OSS ak:sig`` is replaced by a SigV4-shaped header naming the ``s3`` service
  (moto routes by it and checks no signatures), ``x-oss-*`` request headers (meta, copy source,
  ACL, metadata directive) become ``x-amz-*`` and the reverse on responses, the S3 XML namespace
  is dropped (oss2 looks elements up without one), listing entries get the OSS-only ``Type``
  element and second-resolution ``LastModified`` (``...T12:00:00.000Z``, the only form oss2
  parses), bucket listings get ``Location``/endpoint elements, ``?bucketInfo`` and ``?objectMeta``
  are answered, and object responses carry ``x-oss-object-type`` and ``x-oss-hash-crc64ecma``
  (so oss2's CRC check really verifies the bytes).

Both fronts share the fault mode: ``store.fail_rate = 0.2`` makes that fraction of requests fail
transiently, drawn from a ``random.Random(seed)`` (same seed and request order => same faults),
as an HTTP 503 with a proper error body or an abrupt TCP reset (``store.fault_kinds``);
``store.fail_next(n, kind)`` fails exactly the next ``n`` requests and
``store.fail_matching(method, fragment)`` every such request for one key; ``store.down()`` closes
both fronts so clients get "connection refused" until ``store.up()``.
``store.stats`` counts requests and injected faults so tests can assert faults really happened.
The helpers ``make_bucket``, ``keys`` and ``get_bytes`` talk to moto directly and are never
faulted, so a test can inspect the store while clients are failing.

OSS limits kept: multipart parts must be at least 100 KiB (OSS's minimum; S3's 5 MiB would
make small multipart tests impossible), set on moto's module constant.

Example::

    with LocalObjectStore() as store:
        store.make_bucket("data")
        env = store.env()          # OSS_*, AWS_* credentials and endpoints for clients
        store.fail_rate = 0.2      # from now on ~20% of requests fail transiently
"""

from __future__ import annotations

import http.client
import logging
import random
import re
import socket
import struct
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

#: Every fake secret the store hands out contains this marker: grep run outputs for it.
SECRET_MARKER = "xdpxFAKEsecret"
OSS_KEY_ID = "LTAIxdpxlocaltestkey"
OSS_KEY_SECRET = f"oss-{SECRET_MARKER}-5f0c2a9e"
AWS_KEY_ID = "AKIAXDPXLOCALTEST000"
AWS_KEY_SECRET = f"aws-{SECRET_MARKER}-9b41d7c3"
OSS_MIN_PART_SIZE = 100 * 1024  # bytes; OSS UploadPart minimum for all but the last part
FAULT_KINDS = ("503", "reset", "reset_after")

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "expect",
}
_S3_NS = re.compile(rb'\s+xmlns="http://s3\.amazonaws\.com/doc/2006-03-01/?"')
_MILLIS = re.compile(rb"(<(?:LastModified|CreationDate|Initiated)>[0-9T:-]+)\.\d+Z<")
_VALUE_PARAMS = {
    "prefix",
    "delimiter",
    "marker",
    "max-keys",
    "continuation-token",
    "start-after",
    "fetch-owner",
    "key-marker",
    "upload-id-marker",
    "part-number-marker",
    "max-uploads",
    "max-parts",
    "encoding-type",
}
# x-oss-* request headers with an S3 twin; other x-oss-* headers are dropped (moto ignores them).
_OSS_TO_AMZ = {
    "x-oss-copy-source": "x-amz-copy-source",
    "x-oss-copy-source-range": "x-amz-copy-source-range",
    "x-oss-copy-source-if-match": "x-amz-copy-source-if-match",
    "x-oss-copy-source-if-none-match": "x-amz-copy-source-if-none-match",
    "x-oss-metadata-directive": "x-amz-metadata-directive",
    "x-oss-object-acl": "x-amz-acl",
    "x-oss-acl": "x-amz-acl",
}


@dataclass
class StoreStats:
    """Request counters of both fronts (requests that reached a front; refused ones never do).

    Attributes:
        requests: requests received, faulted or not.
        by_front: requests per front, ``{"s3": n, "oss": n}``.
        injected: faults injected per kind (``"503"``, ``"reset"``, ``"reset_after"``).
    """

    requests: int = 0
    by_front: dict[str, int] = field(default_factory=lambda: {"s3": 0, "oss": 0})
    injected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULT_KINDS, 0))

    @property
    def faults(self) -> int:
        """Total number of injected faults of any kind."""
        return sum(self.injected.values())


def _crc64(data: bytes) -> int:
    """CRC-64/ECMA-182 as OSS computes it (``x-oss-hash-crc64ecma``), via oss2's own helper."""
    from oss2.utils import Crc64

    crc = Crc64()
    crc.update(data)
    return crc.crc


class _Front(ThreadingHTTPServer):
    """One listening front (``"s3"`` or ``"oss"``); tracks live connections so down() can cut them."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, store: LocalObjectStore, kind: str, port: int) -> None:
        self.store, self.kind = store, kind
        self.live: set[socket.socket] = set()
        self.live_lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _Handler)

    def process_request(self, request, client_address):  # noqa: D102 (socketserver API)
        with self.live_lock:
            self.live.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):  # noqa: D102 (socketserver API)
        with self.live_lock:
            self.live.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):  # noqa: D102 (socketserver API)
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)  # a client hanging up is no error

    def cut_connections(self) -> None:
        """Reset every open client connection (keep-alive pools must not outlive an outage)."""
        with self.live_lock:
            socks, self.live = list(self.live), set()
        for sock in socks:
            try:  # wakes the handler thread blocked in recv(); close() alone would not
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            _reset(sock)


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with an RST instead of a FIN (SO_LINGER 0): the peer sees a connection reset."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Front

    def log_message(self, format, *args):  # noqa: A002 - silence per-request logging
        pass

    def do_GET(self):  # noqa: N802
        self._handle()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET  # noqa: N815

    # -- plumbing -------------------------------------------------------------------------
    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes, length=None) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def _handle(self) -> None:
        store, kind = self.server.store, self.server.kind
        body = self._read_body()
        fault = store._draw_fault(kind, self.command, self.path)
        if fault == "reset":
            self.close_connection = True
            _reset(self.connection)
            return
        if fault == "503":
            self.close_connection = True
            rid = uuid.uuid4().hex.upper()[:24]
            err = _error_xml(
                "ServiceUnavailable", "Injected transient fault (test store).", kind, rid
            )
            head = [("Content-Type", "application/xml"), ("Connection", "close")]
            head.append(("x-oss-request-id" if kind == "oss" else "x-amz-request-id", rid))
            self._send(503, head, err)
            return
        if kind == "oss":
            status, headers, out, length = _oss_exchange(store, self, body)
        else:
            status, headers, out, length = _forward(
                store, self.command, self.path, self.headers, body
            )
        if fault == "reset_after":  # the store did the work, the client never hears of it
            self.close_connection = True
            _reset(self.connection)
            return
        self._send(status, headers, out, length)


def _error_xml(code: str, message: str, kind: str, rid: str | None = None) -> bytes:
    rid = rid or uuid.uuid4().hex.upper()[:24]
    host = "<HostId>127.0.0.1</HostId>" if kind == "oss" else ""
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message><RequestId>{rid}</RequestId>{host}</Error>"
    ).encode()


def _forward(store, method, path, headers, body):
    """Send one request to moto; returns (status, headers without hop-by-hop, body, length)."""
    conn = http.client.HTTPConnection("127.0.0.1", store._moto_port, timeout=60)
    try:
        out_headers = {
            k: v
            for k, v in headers.items()
            if k.lower() not in _HOP_BY_HOP and k.lower() not in ("host", "content-length")
        }
        out_headers["Host"] = f"127.0.0.1:{store._moto_port}"
        out_headers["Content-Length"] = str(len(body))
        # http.server decoded the request line as latin-1; re-escape raw non-ASCII bytes.
        raw = path.encode("latin-1", "replace")
        path = re.sub(rb"[^\x21-\x7e]", lambda m: b"%%%02X" % m.group()[0], raw).decode()
        conn.request(method, path, body=body, headers=out_headers)
        resp = conn.getresponse()
        data = resp.read()
        back = [
            (k, v)
            for k, v in resp.getheaders()
            if k.lower() not in _HOP_BY_HOP
            and k.lower() not in ("content-length", "date", "server")
        ]  # send_response() writes its own Date and Server
        length = resp.getheader("Content-Length") if method == "HEAD" else None
        return resp.status, back, data, length
    finally:
        conn.close()


# -- OSS <-> S3 translation -----------------------------------------------------------------
def _oss_exchange(store, handler: _Handler, body: bytes):
    """Translate one OSS request to S3, forward it to moto, translate the answer back."""
    method, raw_path = handler.command, handler.path
    parts = urlsplit(raw_path)
    # raw (still percent-encoded) pairs: decoding and re-encoding would mangle non-ASCII keys
    query = [(k, v) for k, _, v in (p.partition("=") for p in parts.query.split("&") if p)]
    qkeys = {k for k, _ in query}
    segments = parts.path.lstrip("/").split("/", 1)
    bucket = segments[0]
    key = segments[1] if len(segments) > 1 else ""

    if "bucketInfo" in qkeys and method == "GET":
        return _bucket_info(store, handler, bucket)
    if "objectMeta" in qkeys:  # GetObjectMeta == HEAD without the subresource
        method, query = "HEAD", [(k, v) for k, v in query if k != "objectMeta"]
    # OSS sends unset listing parameters as blanks ("marker=", "continuation-token="); S3 rejects
    # a blank continuation token, so drop blank values that are not sub-resource flags.
    query = [(k, v) for k, v in query if v or k not in _VALUE_PARAMS]
    path = parts.path + ("?" + "&".join(f"{k}={v}" if v else k for k, v in query) if query else "")

    headers = {}
    ak = OSS_KEY_ID
    for name, value in handler.headers.items():
        low = name.lower()
        if low == "authorization":
            m = re.match(r"OSS\d?\s+(?:Credential=)?([^:/,\s]+)", value)
            ak = m.group(1) if m else ak
        elif low.startswith("x-oss-meta-"):
            headers["x-amz-meta-" + low[len("x-oss-meta-") :]] = value
        elif low in _OSS_TO_AMZ:
            headers[_OSS_TO_AMZ[low]] = value
        elif not low.startswith("x-oss-"):
            headers[name] = value
    headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={ak}/20000101/us-east-1/s3/aws4_request, "
        "SignedHeaders=host, Signature=" + "0" * 64
    )
    status, resp_headers, data, length = _forward(store, method, path, headers, body)

    out_headers = []
    for name, value in resp_headers:
        low = name.lower()
        if low.startswith("x-amz-meta-"):
            out_headers.append(("x-oss-meta-" + name[len("x-amz-meta-") :], value))
        elif low == "x-amz-request-id":
            out_headers.append(("x-oss-request-id", value))
        elif not low.startswith("x-amz-"):
            out_headers.append((name, value))
    if not any(k.lower() == "x-oss-request-id" for k, _ in out_headers):
        out_headers.append(("x-oss-request-id", uuid.uuid4().hex.upper()[:24]))
    is_object = bool(key) and not (qkeys & {"uploads", "uploadId", "acl", "delete"})
    if is_object and status < 300:
        etag = dict((k.lower(), v) for k, v in resp_headers).get("etag", "")
        if method in ("GET", "HEAD"):
            out_headers.append(("x-oss-object-type", "Multipart" if "-" in etag else "Normal"))
            out_headers.append(("x-oss-storage-class", "Standard"))
        full_get = method == "GET" and status == 200 and "range" not in handler.headers
        if full_get:
            out_headers.append(("x-oss-hash-crc64ecma", str(_crc64(data))))
        elif method == "PUT" and "x-oss-copy-source" not in handler.headers:
            out_headers.append(("x-oss-hash-crc64ecma", str(_crc64(body))))
    if data.lstrip().startswith(b"<?xml") or data.lstrip().startswith(b"<"):
        data = _oss_xml(data)
    return status, out_headers, data, length


def _oss_xml(data: bytes) -> bytes:
    """S3 XML -> what oss2 parses: no namespace, second-resolution dates, OSS-only elements."""
    data = _S3_NS.sub(b"", data)
    data = _MILLIS.sub(rb"\1.000Z<", data)
    if b"<ListBucketResult" in data:

        def add_type(m: re.Match) -> bytes:
            entry = m.group(0)
            etag = re.search(rb"<ETag>([^<]*)</ETag>", entry)
            typ = b"Multipart" if etag and b"-" in etag.group(1) else b"Normal"
            extra = b"<Type>" + typ + b"</Type>"
            if b"<StorageClass>" not in entry:
                extra += b"<StorageClass>Standard</StorageClass>"
            return entry.replace(b"</Contents>", extra + b"</Contents>")

        data = re.sub(rb"<Contents>.*?</Contents>", add_type, data, flags=re.S)
    if b"<ListAllMyBucketsResult" in data:
        extra = (
            b"<Location>oss-local</Location><ExtranetEndpoint>127.0.0.1</ExtranetEndpoint>"
            b"<IntranetEndpoint>127.0.0.1</IntranetEndpoint><StorageClass>Standard</StorageClass>"
        )
        data = data.replace(b"</Bucket>", extra + b"</Bucket>")
    return data


def _bucket_info(store, handler: _Handler, bucket: str):
    """Answer OSS GetBucketInfo from moto's HeadBucket (404 when the bucket does not exist)."""
    status, _, _, _ = _forward(store, "HEAD", f"/{bucket}", {}, b"")
    rid = [("x-oss-request-id", uuid.uuid4().hex.upper()[:24]), ("Content-Type", "application/xml")]
    if status != 200:
        return (
            404,
            rid,
            _error_xml("NoSuchBucket", "The specified bucket does not exist.", "oss"),
            None,
        )
    created = store._created.get(bucket, time.time())
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(created))
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<BucketInfo><Bucket>'
        f"<CreationDate>{stamp}</CreationDate><ExtranetEndpoint>127.0.0.1</ExtranetEndpoint>"
        "<IntranetEndpoint>127.0.0.1</IntranetEndpoint><Location>oss-local</Location>"
        f"<Name>{bucket}</Name><StorageClass>Standard</StorageClass>"
        "<Owner><DisplayName>local</DisplayName><ID>local</ID></Owner>"
        "<AccessControlList><Grant>private</Grant></AccessControlList>"
        "<DataRedundancyType>LRS</DataRedundancyType>"
        "</Bucket></BucketInfo>"
    )
    return 200, rid, xml.encode(), None


@dataclass(frozen=True)
class StoreBucket:
    """A bucket of a running store, as the ``store_bucket`` fixture hands it out.

    Attributes:
        name: bucket name.
        store: the ``LocalObjectStore`` holding it.
    """

    name: str
    store: LocalObjectStore

    @property
    def oss_url(self) -> str:
        """``oss://<name>`` (append ``/key``)."""
        return f"oss://{self.name}"

    @property
    def s3_url(self) -> str:
        """``s3://<name>`` (append ``/key``)."""
        return f"s3://{self.name}"

    def keys(self, prefix: str = "") -> list[str]:
        """Keys under ``prefix`` (direct, unfaulted)."""
        return self.store.keys(self.name, prefix)

    def get_bytes(self, key: str) -> bytes:
        """Content of ``key`` (direct, unfaulted)."""
        return self.store.get_bytes(self.name, key)


# -- the store --------------------------------------------------------------------------------
class LocalObjectStore:
    """moto S3 + an OSS front + fault injection, all on 127.0.0.1 with free ports.

    Use as a context manager (``with LocalObjectStore() as store:``) or call ``start()``/``stop()``.

    Args:
        seed: seed of the fault draws; same seed and request order give the same faults.

    Attributes:
        fail_rate: fraction in [0, 1] of requests (both fronts) failed transiently; default 0.
        fault_kinds: kinds drawn uniformly for a failed request: ``"503"`` (HTTP 503
            ServiceUnavailable with an XML error body, request not executed), ``"reset"`` (TCP RST
            after reading the request, not executed), ``"reset_after"`` (executed, then RST: the
            client never sees the answer). Default ``("503", "reset")``.
        stats: ``StoreStats`` counters; ``reset_stats()`` zeroes them.
    """

    def __init__(self, seed: int = 0) -> None:
        self.fail_rate = 0.0
        self.fault_kinds: tuple[str, ...] = ("503", "reset")
        self.stats = StoreStats()
        self._seed = seed
        self._rng = random.Random(seed)
        self._forced: list[str] = []
        self._matching: list[tuple[str, str, str]] = []
        self._lock = threading.Lock()
        self._moto = None
        self._moto_port = 0
        self._fronts: dict[str, _Front | None] = {"s3": None, "oss": None}
        self._ports: dict[str, int] = {"s3": 0, "oss": 0}
        self._threads: dict[str, threading.Thread] = {}
        self._created: dict[str, float] = {}

    # lifecycle
    def start(self) -> LocalObjectStore:
        """Start moto and both fronts (bounded: raises RuntimeError if moto is not up in 30 s)."""
        import moto.s3.models
        from moto.server import ThreadedMotoServer

        moto.s3.models.S3_UPLOAD_PART_MIN_SIZE = OSS_MIN_PART_SIZE
        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        self._moto_port = self._moto.get_host_and_port()[1]
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self._moto_port), timeout=1).close()
                break
            except OSError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"moto did not start on port {self._moto_port}") from exc
                time.sleep(0.05)
        self.up()
        return self

    def stop(self) -> None:
        """Stop both fronts and moto; safe to call twice."""
        self.down()
        if self._moto is not None:
            self._moto.stop()
            self._moto = None

    def __enter__(self) -> LocalObjectStore:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # outage
    def down(self) -> None:
        """Simulate an outage: close both fronts and cut open connections (clients: refused)."""
        for kind, front in self._fronts.items():
            if front is None:
                continue
            front.shutdown()
            front.server_close()
            front.cut_connections()
            self._threads.pop(kind).join(timeout=10)
            self._fronts[kind] = None

    def up(self) -> None:
        """End an outage (or start): serve both fronts again on the same ports."""
        for kind in ("s3", "oss"):
            if self._fronts[kind] is not None:
                continue
            front = _Front(self, kind, self._ports[kind])
            self._ports[kind] = front.server_address[1]
            thread = threading.Thread(
                target=front.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
            )
            thread.start()
            self._fronts[kind], self._threads[kind] = front, thread

    @property
    def is_up(self) -> bool:
        """True while the fronts accept connections."""
        return self._fronts["s3"] is not None

    # faults
    def reset_faults(self) -> None:
        """fail_rate 0, default kinds, no pending fail_next or fail_matching, RNG reseeded,
        counters zeroed, up."""
        self.fail_rate = 0.0
        self.fault_kinds = ("503", "reset")
        self._rng = random.Random(self._seed)
        with self._lock:
            self._forced.clear()
            self._matching.clear()
        self.reset_stats()
        self.up()

    def reset_stats(self) -> None:
        """Zero the request and fault counters."""
        with self._lock:
            self.stats = StoreStats()

    def fail_next(self, n: int = 1, kind: str = "reset") -> None:
        """Fail the next ``n`` requests (either front) with ``kind``, before any rate draw.

        Raises:
            ValueError: for a kind not in FAULT_KINDS.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {kind!r} is not one of {FAULT_KINDS}")
        with self._lock:
            self._forced.extend([kind] * n)

    def fail_matching(self, method: str, fragment: str, kind: str = "reset") -> None:
        """Fail every ``method`` request (either front) whose path contains ``fragment``.

        Until ``reset_faults()``; checked before ``fail_next`` and the rate draw. Lets a test
        fail one object's uploads however often a client retries them.

        Raises:
            ValueError: for a kind not in FAULT_KINDS.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"fault kind {kind!r} is not one of {FAULT_KINDS}")
        with self._lock:
            self._matching.append((method.upper(), fragment, kind))

    def _draw_fault(self, kind: str, method: str = "", path: str = "") -> str | None:
        with self._lock:
            self.stats.requests += 1
            self.stats.by_front[kind] += 1
            matched = [k for m, frag, k in self._matching if m == method and frag in path]
            if matched:
                fault = matched[0]
            elif self._forced:
                fault = self._forced.pop(0)
            elif self.fail_rate <= 0 or self._rng.random() >= self.fail_rate:
                return None
            else:
                fault = self.fault_kinds[self._rng.randrange(len(self.fault_kinds))]
            self.stats.injected[fault] += 1
            return fault

    # endpoints and credentials
    @property
    def s3_endpoint(self) -> str:
        """``http://127.0.0.1:<port>`` of the S3 front (faultable)."""
        return f"http://127.0.0.1:{self._ports['s3']}"

    @property
    def oss_endpoint(self) -> str:
        """``http://127.0.0.1:<port>`` of the OSS front (faultable)."""
        return f"http://127.0.0.1:{self._ports['oss']}"

    @property
    def moto_endpoint(self) -> str:
        """moto itself: never faulted, never down (for setup and inspection only)."""
        return f"http://127.0.0.1:{self._moto_port}"

    @property
    def secrets(self) -> tuple[str, str]:
        """The fake secrets handed out (both contain ``SECRET_MARKER``)."""
        return (OSS_KEY_SECRET, AWS_KEY_SECRET)

    def env(self) -> dict[str, str]:
        """Environment variables for oss2/ossfs/dvc-oss and boto3/s3fs/dvc-s3 clients of this store.

        ``AWS_ENDPOINT_URL`` is honoured by botocore (>= 1.31), hence boto3, s3fs and dvc-s3;
        dvc-oss reads only its ``oss_endpoint`` remote option (use ``OSS_ENDPOINT`` for it).
        ``AWS_CONFIG_FILE``/``AWS_SHARED_CREDENTIALS_FILE`` point nowhere so a developer's
        ``~/.aws`` cannot leak into tests.
        """
        return {
            "OSS_ACCESS_KEY_ID": OSS_KEY_ID,
            "OSS_ACCESS_KEY_SECRET": OSS_KEY_SECRET,
            "OSS_ENDPOINT": self.oss_endpoint,
            "AWS_ACCESS_KEY_ID": AWS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": AWS_KEY_SECRET,
            "AWS_ENDPOINT_URL": self.s3_endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": "/nonexistent/xdpx-test-aws-config",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/xdpx-test-aws-credentials",
        }

    # direct (never faulted) helpers
    def client(self):
        """A boto3 S3 client talking to moto directly (bypasses faults and outages)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.moto_endpoint,
            aws_access_key_id=AWS_KEY_ID,
            aws_secret_access_key=AWS_KEY_SECRET,
            region_name="us-east-1",
            config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
        )

    def make_bucket(self, name: str | None = None) -> str:
        """Create bucket ``name`` (default: a fresh ``test-<hex>`` name); returns the name."""
        name = name or f"test-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        self._created[name] = time.time()
        return name

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """All object keys under ``prefix`` in ``bucket``, sorted (direct, unfaulted)."""
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def get_bytes(self, bucket: str, key: str) -> bytes:
        """The content of one object (direct, unfaulted); raises botocore's NoSuchKey if absent."""
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def pending_uploads(self, bucket: str) -> list[str]:
        """Keys of multipart uploads started and neither completed nor aborted."""
        out = self.client().list_multipart_uploads(Bucket=bucket)
        return sorted(u["Key"] for u in out.get("Uploads", []))
