"""The local object store fixture (tests/objstore.py): oss2, ossfs and s3fs round-trips, faults."""

from __future__ import annotations

import hashlib
import os
import socket
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.integration

OSS_PART = 100 * 1024  # OSS minimum part size (bytes)


def oss_bucket(store_bucket):
    import oss2

    env = store_bucket.store.env()
    auth = oss2.Auth(env["OSS_ACCESS_KEY_ID"], env["OSS_ACCESS_KEY_SECRET"])
    return oss2.Bucket(auth, env["OSS_ENDPOINT"], store_bucket.name)


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def test_oss2_put_get_list_multipart_copy_delete(store_bucket):
    import oss2

    bucket = oss_bucket(store_bucket)
    keys = {"a/x.txt": b"hello", "a/b/y.bin": os.urandom(1000), "数据/文件 1.txt": "中文".encode()}
    for key, data in keys.items():
        assert bucket.put_object(key, data).status == 200
    for key, data in keys.items():
        assert bucket.get_object(key).read() == data  # oss2 also checks x-oss-hash-crc64ecma
    assert bucket.head_object("a/x.txt").content_length == 5
    assert bucket.get_object_meta("a/b/y.bin").content_length == 1000
    assert sorted(o.key for o in oss2.ObjectIterator(bucket)) == sorted(keys)
    assert sorted(o.key for o in oss2.ObjectIteratorV2(bucket, prefix="a/")) == [
        "a/b/y.bin",
        "a/x.txt",
    ]
    top = list(oss2.ObjectIterator(bucket, delimiter="/"))
    assert sorted(o.key for o in top) == ["a/", "数据/"] and all(o.is_prefix() for o in top)
    # paged listing (max_keys=1 -> NextMarker / continuation tokens)
    assert len(list(oss2.ObjectIterator(bucket, max_keys=1))) == 3
    assert len(list(oss2.ObjectIteratorV2(bucket, max_keys=1))) == 3

    data = os.urandom(2 * OSS_PART + 123)
    upload_id = bucket.init_multipart_upload("big.bin").upload_id
    assert store_bucket.store.pending_uploads(store_bucket.name) == ["big.bin"]
    parts = []
    for number, start in enumerate(range(0, len(data), OSS_PART + 7), start=1):
        result = bucket.upload_part(
            "big.bin", upload_id, number, data[start : start + OSS_PART + 7]
        )
        parts.append(oss2.models.PartInfo(number, result.etag))
    assert [p.part_number for p in bucket.list_parts("big.bin", upload_id).parts] == [1, 2, 3]
    bucket.complete_multipart_upload("big.bin", upload_id, parts)
    assert bucket.get_object("big.bin").read() == data
    assert bucket.head_object("big.bin").object_type == "Multipart"
    assert store_bucket.get_bytes("big.bin") == data

    bucket.copy_object(store_bucket.name, "a/x.txt", "a/copy.txt")
    assert bucket.get_object("a/copy.txt").read() == b"hello"
    bucket.delete_object("big.bin")
    bucket.batch_delete_objects(["a/x.txt", "a/copy.txt"])
    assert store_bucket.keys() == sorted(["a/b/y.bin", "数据/文件 1.txt"])
    assert bucket.get_bucket_info().name == store_bucket.name
    with pytest.raises(oss2.exceptions.NoSuchKey):
        bucket.get_object("a/x.txt")


def test_oss2_resumable_upload_uses_multipart(store_bucket, tmp_path):
    import oss2

    bucket = oss_bucket(store_bucket)
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(3 * OSS_PART + 5))
    oss2.resumable_upload(
        bucket, "r/big.bin", str(src), multipart_threshold=OSS_PART, part_size=OSS_PART
    )
    assert bucket.head_object("r/big.bin").object_type == "Multipart"
    assert md5(store_bucket.get_bytes("r/big.bin")) == md5(src.read_bytes())


@pytest.mark.parametrize("protocol", ["oss", "s3"])
def test_fsspec_ls_put_get_find(store_bucket, tmp_path, protocol):
    import fsspec

    if protocol == "oss":
        fs = fsspec.filesystem("oss", endpoint=store_bucket.store.oss_endpoint)
    else:
        fs = fsspec.filesystem("s3")  # endpoint and keys from AWS_* set by the fixture
    root = store_bucket.name
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    files = {"a.txt": b"a" * 10, "sub/b.bin": os.urandom(5000), "sub/中文.txt": "中".encode()}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    fs.put(str(src) + "/", f"{root}/tree/", recursive=True)
    assert sorted(fs.find(f"{root}/tree")) == sorted(f"{root}/tree/{rel}" for rel in files)
    listed = {e["name"].rstrip("/"): e for e in fs.ls(f"{root}/tree", detail=True)}
    assert listed[f"{root}/tree/a.txt"]["size"] == 10
    assert listed[f"{root}/tree/sub"]["type"] == "directory"
    assert fs.info(f"{root}/tree/sub/b.bin")["size"] == 5000
    assert fs.exists(f"{root}/tree/a.txt") and not fs.exists(f"{root}/tree/nope.txt")
    fs.get(f"{root}/tree/", str(tmp_path / "back") + "/", recursive=True)
    for rel, data in files.items():
        assert (tmp_path / "back" / rel).read_bytes() == data
    assert fs.cat(f"{root}/tree/sub/中文.txt") == "中".encode()
    fs.rm(f"{root}/tree/a.txt")
    assert store_bucket.keys("tree/") == ["tree/sub/b.bin", "tree/sub/中文.txt"]


def raw_request(endpoint: str, path: str) -> int:
    """One HEAD without any client retry: the HTTP status, or -1 for a dropped connection."""
    import http.client

    url = urlsplit(endpoint)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        conn.request("HEAD", path)
        return conn.getresponse().status
    except (ConnectionError, http.client.RemoteDisconnected):
        return -1
    finally:
        conn.close()


def test_fault_rate_is_honoured_counted_and_seeded(store_bucket):
    store = store_bucket.store
    store.client().put_object(Bucket=store_bucket.name, Key="k", Body=b"v")
    path = f"/{store_bucket.name}/k"

    def run(n=200):
        return [raw_request(store.oss_endpoint, path) for _ in range(n)]

    store.fail_rate = 0.2
    first = run()
    failed = sum(status != 200 for status in first)
    assert store.stats.requests == 200 and store.stats.by_front["oss"] == 200
    assert store.stats.faults == failed  # every injected fault reached the client, nothing else
    assert 20 <= failed <= 60  # binomial(200, 0.2): mean 40, sd 5.7
    assert store.stats.injected["503"] > 0 and store.stats.injected["reset"] > 0
    assert set(first) == {200, 503, -1}
    store.reset_faults()
    store.fail_rate = 0.2
    assert run() == first  # same seed, same request order -> same faults
    store.fail_rate = 0.0
    assert set(run(20)) == {200}


def test_faults_reach_real_clients_as_transient_errors(store_bucket):
    import boto3
    import oss2
    from botocore.config import Config
    from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError

    store = store_bucket.store
    bucket = oss_bucket(store_bucket)
    bucket.put_object("k", b"v")
    s3 = boto3.client("s3", config=Config(retries={"total_max_attempts": 1}))

    store.fault_kinds = ("503",)
    store.fail_rate = 1.0
    with pytest.raises(oss2.exceptions.ServerError) as err:
        bucket.get_object("k")
    assert err.value.status == 503 and err.value.code == "ServiceUnavailable"
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket=store_bucket.name, Key="k")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503

    store.fault_kinds = ("reset",)
    with pytest.raises(oss2.exceptions.RequestError):
        bucket.get_object("k")
    with pytest.raises((ConnectionClosedError, EndpointConnectionError, ConnectionError)):
        s3.get_object(Bucket=store_bucket.name, Key="k")

    # reset_after: the write happens, the client only sees the dropped connection
    store.fault_kinds = ("reset_after",)
    with pytest.raises(oss2.exceptions.RequestError):
        bucket.put_object("done-but-unacknowledged", b"x")
    store.fail_rate = 0.0
    assert store_bucket.get_bytes("done-but-unacknowledged") == b"x"
    assert store.stats.injected == {"503": 2, "reset": 2, "reset_after": 1}


def test_down_refuses_connections_and_up_restores(store_bucket):
    import boto3
    import oss2
    from botocore.config import Config
    from botocore.exceptions import EndpointConnectionError

    store = store_bucket.store
    bucket = oss_bucket(store_bucket)
    bucket.put_object("k", b"kept")  # also leaves a keep-alive connection in oss2's pool
    store.down()
    assert not store.is_up
    for endpoint in (store.oss_endpoint, store.s3_endpoint):
        url = urlsplit(endpoint)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((url.hostname, url.port), timeout=5)
    with pytest.raises(oss2.exceptions.RequestError) as err:
        bucket.get_object("k")
    assert "refused" in str(err.value).lower() or "reset" in str(err.value).lower()
    s3 = boto3.client("s3", config=Config(retries={"total_max_attempts": 1}))
    with pytest.raises(EndpointConnectionError):
        s3.get_object(Bucket=store_bucket.name, Key="k")
    assert store_bucket.get_bytes("k") == b"kept"  # moto itself is untouched
    store.up()
    assert bucket.get_object("k").read() == b"kept"
    assert s3.get_object(Bucket=store_bucket.name, Key="k")["Body"].read() == b"kept"
