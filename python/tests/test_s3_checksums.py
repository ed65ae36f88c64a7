"""Bytes damaged on the way to or from S3 (s3_fault_proxy.py's ``flip``).

Uploads: every request body carries its Content-MD5, so the store refuses
a body damaged on the way (BadDigest) instead of storing it, and the save
sends it again. Downloads: a chunk, index or small file whose checksum
fails is read once more before the load fails."""

import dataclasses

import numpy as np
import pytest

import shardkeep as sk
from conftest import assert_same_bits

# Larger than two of the backend's 8 MiB upload parts: a multipart upload.
BIG = 20 << 20


def _through(proxy, s3, **options) -> sk.Options:
    settings = dataclasses.replace(s3.settings, endpoint_url=proxy.endpoint_url)
    return sk.Options(s3=settings, io_threads=1, timeout_s=60.0, **options)


def _small_state() -> dict:
    return {"w": np.arange(300, dtype=np.float32).reshape(30, 10), "n": 4}


def _puts(proxy) -> list:
    return [s for s in proxy.seen if s.method == "PUT"]


def test_each_put_of_a_save_damaged_on_the_way_is_refused_and_sent_again(s3, s3_proxy):
    # A clean save: which PUTs a save makes (data, index, meta.json, and the
    # conditional PUT of _SHARDKEEP last). A file opened for appending is
    # first created empty; its last PUT carries its bytes.
    state = _small_state()
    sk.save(s3.url("clean/ckpt"), state, options=_through(s3_proxy, s3))
    clean = [p.target.rsplit("/", 1)[-1] for p in _puts(s3_proxy)]
    files = ["_SHARDKEEP", "meta.json", "p0.idx", "p0-0.bin"]
    assert set(files) <= set(clean), clean
    for name in files:
        s3_proxy.seen.clear()
        # The PUT that carries the file's bytes: its last.
        s3_proxy.flip(1, method="PUT", path="/" + name, after=clean.count(name) - 1, offset=5)
        url = s3.url(f"flip-{name}/ckpt")
        sk.save(url, state, options=_through(s3_proxy, s3))
        puts = _puts(s3_proxy)
        # Refused by the store (the body did not match its Content-MD5) and
        # sent again, intact.
        assert [p.outcome for p in puts].count("flipped") == 1, puts
        assert [p.target.rsplit("/", 1)[-1] for p in puts].count(name) == \
            clean.count(name) + 1, puts
        out = sk.load(url)
        assert_same_bits(out["w"], state["w"])
        assert out["n"] == 4


def test_a_multipart_part_damaged_on_the_way_is_refused_and_sent_again(s3, s3_proxy):
    # Parts go as UNSIGNED-PAYLOAD: only their Content-MD5 lets the store
    # see the damage.
    rng = np.random.default_rng(0)
    state = {"w": rng.integers(0, 1 << 30, BIG // 4, dtype=np.int32)}
    s3_proxy.flip(1, method="PUT", query="partNumber", offset=1 << 20)
    url = s3.url("parts/ckpt")
    sk.save(url, state, options=_through(s3_proxy, s3))
    parts = [s for s in s3_proxy.seen if s.method == "PUT" and "partNumber" in s.target]
    assert [p.outcome for p in parts].count("flipped") == 1, parts
    assert_same_bits(sk.load(url)["w"], state["w"])


def test_a_download_damaged_once_is_read_again(s3, s3_proxy):
    state = _small_state()
    url = s3.url("get/ckpt")
    sk.save(url, state)
    # Each GET of a load in turn: the record, meta.json, the index, chunks.
    sk.load(url, options=_through(s3_proxy, s3))
    gets = len([s for s in s3_proxy.seen if s.method == "GET"])
    assert gets >= 4
    for k in range(gets):
        s3_proxy.seen.clear()
        s3_proxy.flip(1, method="GET", after=k, offset=3)
        out = sk.load(url, options=_through(s3_proxy, s3))
        assert_same_bits(out["w"], state["w"])
        seen = [s for s in s3_proxy.seen if s.method == "GET"]
        assert [s.outcome for s in seen].count("flipped") == 1 and len(seen) == gets + 1, seen


def test_a_download_damaged_every_time_names_object_and_byte_range(s3, s3_proxy):
    url = s3.url("bad/ckpt")
    sk.save(url, _small_state())
    keys = [k for k in s3.keys("bad/ckpt/") if k.endswith(".bin")]
    assert len(keys) == 1
    # Every GET of the data file damaged: the stored object is blamed.
    s3_proxy.flip(10**6, method="GET", path="/p0-0.bin", offset=0)
    with pytest.raises(sk.CorruptionError) as info:
        sk.load(url, options=_through(s3_proxy, s3))
    message = str(info.value)
    assert keys[0] in message and "read twice, bytes [" in message, message
