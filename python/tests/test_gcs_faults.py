"""Failures on gs:// against the emulator, through the fault proxy
(s3_fault_proxy.py, which forwards any HTTP): throttling, server errors and
dropped connections retried within the timeout, answers lost after they
took effect, damaged downloads read again, and a store that loses a save's
lease under it."""

import threading

import numpy as np
import pytest

import shardkeep as sk
from conftest import assert_same_bits
from local_coordination import LocalCoordination
from s3_fault_proxy import Fault, FaultProxy

# More than two 16 MiB data files' worth: a writer rolls over to others.
BIG = 40 << 20


def _big_state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"w": rng.integers(0, 1 << 30, BIG // 4, dtype=np.int32),
            "b": np.arange(10, dtype=np.float64)}


@pytest.fixture
def gcs_proxy(gcs_server):
    proxy = FaultProxy(gcs_server.endpoint)
    yield proxy
    proxy.close()


def _through(proxy, **kwargs) -> sk.Options:
    return sk.Options(gcs=sk.GcsSettings(endpoint=proxy.endpoint_url, anonymous=True), **kwargs)


def _committed(gcs, prefix: str) -> bool:
    return any(name.endswith("/_SHARDKEEP") for name in gcs.names(prefix))


def test_throttling_errors_and_dropped_connections_are_retried(gcs, gcs_proxy):
    state = _big_state()
    options = _through(gcs_proxy, timeout_s=60.0, io_threads=1)
    gcs_proxy.fail(2, status=503, method="POST", query="uploadType")
    gcs_proxy.fail(1, status=429, method="POST", query="uploadType")
    gcs_proxy.drop(1, method="POST", query="uploadType")
    gcs_proxy.fail(1, status=408, code="RequestTimeout", method="POST", query="uploadType")
    url = gcs.url("retry/ckpt")
    sk.save(url, state, options=options)
    assert gcs_proxy.injected() == 5, gcs_proxy.seen
    gcs_proxy.fail(2, status=503, method="GET")
    gcs_proxy.drop(2, method="GET")
    out = sk.load(url, options=options)
    assert gcs_proxy.injected() == 9, gcs_proxy.seen
    assert_same_bits(out["w"], state["w"])
    assert not [n for n in gcs.names("retry/") if ".part-" in n]


def test_errors_that_persist_fail_the_save_within_the_timeout(gcs, gcs_proxy):
    timeout_s = 3.0
    gcs_proxy.fail(10**6, status=503, method="POST", query="uploadType")
    with pytest.raises(sk.StorageError) as raised:
        sk.save(gcs.url("slow/ckpt"), _big_state(),
                options=_through(gcs_proxy, io_threads=1, timeout_s=timeout_s))
    assert f"timeout_s is {timeout_s:.1f})" in str(raised.value), str(raised.value)
    assert "objects.insert gs://" in str(raised.value)
    assert gcs_proxy.injected() > 1
    assert not _committed(gcs, "slow/")


def test_a_permission_error_is_not_retried_and_names_who_asked(gcs, gcs_proxy):
    gcs_proxy.fail(10**6, status=403, code="AccessDenied", method="POST", query="uploadType")
    with pytest.raises(sk.InvalidArgumentError, match="anonymous lacks permission"):
        sk.save(gcs.url("denied/ckpt"), {"a": np.arange(4)}, options=_through(gcs_proxy))
    assert gcs_proxy.injected() == 1


@pytest.mark.parametrize("after", [0, 1, 2])
def test_a_create_only_upload_whose_answer_was_lost_does_not_fail_the_save(
        gcs, gcs_proxy, after):
    # The emulator creates the object, the answer never arrives, the upload
    # is sent again and answered 412: that 412 is the save's own object, not
    # another writer's, and the save must commit.
    gcs_proxy.inject(Fault("lost"), method="POST", query="ifGenerationMatch", after=after)
    url = gcs.url(f"lost-answer/{after}")
    state = {"w": np.arange(1000, dtype=np.float32), "step": 3}
    sk.save(url, state, options=_through(gcs_proxy, io_threads=1))
    assert gcs_proxy.tally()["lost"] == 1, gcs_proxy.seen
    out = sk.load(url)
    assert_same_bits(out["w"], state["w"])
    assert out["step"] == 3


def test_a_download_damaged_once_is_read_again(gcs, gcs_proxy):
    url = gcs.url("flip/ckpt")
    state = {"w": np.arange(4096, dtype=np.float32)}
    sk.save(url, state)
    # Whole-object reads (commit record, metadata, index) are checked
    # against GCS's CRC32C; data by the chunks' checksums.
    # The first read (the commit record) and then a later one.
    for after in (0, 3):
        gcs_proxy.flip(1, method="GET", after=after)
        out = sk.load(url, options=_through(gcs_proxy))
        assert_same_bits(out["w"], state["w"])
    assert gcs_proxy.tally()["flipped"] == 2, gcs_proxy.seen


def test_a_save_whose_lease_the_store_lost_does_not_commit(gcs, monkeypatch):
    """Another job's collector that ignores leases (or a lifecycle rule)
    deletes a save's objects while it is written: the lease check before
    the commit refuses it."""
    reached, release = threading.Event(), threading.Event()

    def hook(key: str) -> None:
        if key.endswith("/written"):
            reached.set()
            assert release.wait(120), "the test never released the save"

    LocalCoordination(hook).install(monkeypatch)
    future = sk.save_async(gcs.url("leased/ckpt"), _big_state())
    try:
        assert reached.wait(120)
        leases = [n for n in gcs.names("leased/") if ".shardkeep-lease-" in n]
        assert leases, gcs.names("leased/")
        for name in gcs.names("leased/"):
            gcs.delete(name)
    finally:
        release.set()
    with pytest.raises(sk.LeaseLostError, match="lease"):
        future.result()
    assert not _committed(gcs, "leased/")
