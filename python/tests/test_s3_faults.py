"""Failures on s3:// against a real server: bad credentials, a missing
bucket, the server stopping mid-save, two jobs committing one path, and
transient errors injected by a proxy (s3_fault_proxy.py)."""

import dataclasses
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import shardkeep as sk
from conftest import assert_same_bits
from shardkeep import _core
from s3_fault_proxy import Fault
from s3_server import ACCESS_KEY_ID, SECRET_ACCESS_KEY

# Larger than two of the backend's 8 MiB upload parts, so that a data file
# written by one thread goes up as a multipart upload.
BIG = 20 << 20


def _big_state(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"w": rng.integers(0, 1 << 30, BIG // 4, dtype=np.int32),
            "b": np.arange(10, dtype=np.float64)}


def _through(proxy, s3, **options) -> sk.Options:
    """Options whose s3:// requests go through ``proxy``."""
    settings = dataclasses.replace(s3.settings, endpoint_url=proxy.endpoint_url)
    return sk.Options(s3=settings, **options)


def _committed(s3, prefix: str) -> bool:
    return any(key.endswith("_SHARDKEEP") for key in s3.keys(prefix))


def test_a_wrong_secret_names_the_access_key_but_never_the_secret(s3, monkeypatch):
    sk.save(s3.url("auth/ckpt"), {"v": np.arange(4)})
    wrong_secret = "wrong-secret-0123456789"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong_secret)
    for attempt in (lambda: sk.save(s3.url("auth/other"), {"v": np.arange(4)}),
                    lambda: sk.load(s3.url("auth/ckpt")),
                    lambda: sk.metadata(s3.url("auth/ckpt"))):
        with pytest.raises(sk.ShardkeepError) as excinfo:
            attempt()
        message = str(excinfo.value)
        assert ACCESS_KEY_ID in message and "SignatureDoesNotMatch" in message, message
        assert wrong_secret not in message and SECRET_ACCESS_KEY not in message, message
        # A retried request's error says after how many attempts it failed.
        assert "attempts" not in message, "a refused signature is not retried"
    # Per-call settings with a wrong secret fail alike.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
    bad = dataclasses.replace(s3.settings, secret_access_key=wrong_secret)
    with pytest.raises(sk.ShardkeepError) as excinfo:
        sk.load(s3.url("auth/ckpt"), options=sk.Options(s3=bad))
    assert ACCESS_KEY_ID in str(excinfo.value) and wrong_secret not in str(excinfo.value)
    assert not _committed(s3, "auth/other")


def test_a_missing_bucket_is_named(s3):
    missing = s3.name + "-missing"
    with pytest.raises(sk.ShardkeepError, match=missing):
        sk.save(f"s3://{missing}/ckpt", {"v": np.arange(4)})
    with pytest.raises(sk.ShardkeepError, match=missing):
        sk.load(f"s3://{missing}/ckpt")
    with pytest.raises(sk.ShardkeepError, match=missing):
        sk.metadata(f"s3://{missing}/ckpt")


def test_a_manager_on_a_missing_bucket_fails_at_once_naming_it(s3):
    # Not an empty run: a resumed job with a mistyped bucket must not start
    # training from scratch.
    missing = s3.name + "-missing"
    with pytest.raises(sk.InvalidArgumentError, match=f"{missing}.*does not exist"):
        sk.CheckpointManager(f"s3://{missing}/run")


@pytest.mark.parametrize("upload", ["single", "multipart"])
def test_the_server_stopping_mid_save_fails_it_in_time_and_a_restart_recovers(
        s3, s3_server, s3_proxy, upload):
    timeout_s = 3.0
    url = s3.url("stop/ckpt")
    if upload == "single":
        state = {"w": np.arange(4096, dtype=np.float32), "n": np.arange(7)}
        s3_proxy.hold(1, method="PUT")
    else:  # the server stops while parts of a multipart upload are in flight
        state = _big_state()
        s3_proxy.hold(1, method="PUT", query="partNumber")
    future = sk.save_async(url, state, options=_through(s3_proxy, s3, timeout_s=timeout_s,
                                                        io_threads=1))
    s3_proxy.wait_held()
    try:
        s3_server.stop()
        s3_proxy.release()
        with pytest.raises(sk.ShardkeepError) as excinfo:
            future.result()
    finally:
        s3_server.start()
    # The failing request retries until its budget, timeout_s, is spent
    # (each of the two cleanup requests that follow, aborting the upload
    # and listing the generation to delete it, has one too: docs/S3.md).
    assert f"timeout_s is {timeout_s:.1f})" in str(excinfo.value), str(excinfo.value)
    assert not _committed(s3, "stop/")
    with pytest.raises(sk.NotFoundError):
        sk.load(url)
    sk.save(url, state)  # the next save to the same path succeeds
    out = sk.load(url)
    for name, value in state.items():
        assert_same_bits(out[name], value)
    # It also removed what the failed save left, uploads it could not abort included.
    assert s3.open_uploads() == []
    generations = {key.split("/")[2] for key in s3.keys("stop/ckpt/") if key.count("/") > 2}
    assert len(generations) == 1, generations


_RACER = textwrap.dedent("""
    import sys
    import numpy as np
    import shardkeep as sk

    url, value = sys.argv[1], int(sys.argv[2])
    state = {"w": np.full((1 << 18,), value, np.int32), "who": value}
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        sk.save(url, state, options=sk.Options(chunk_bytes=64 << 10))
        print("RESULT committed", flush=True)
    except sk.AlreadyExistsError as e:
        print("RESULT AlreadyExistsError", e, flush=True)
""")


def test_two_jobs_committing_one_path_at_once_one_wins(s3):
    url = s3.url("race/ckpt")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, url, str(value)], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for value in (1, 2)]
    try:
        for racer in racers:
            assert racer.stdout.readline().strip() == "ready", racer.stderr.read()
        for racer in racers:  # both start at once
            racer.stdin.write("go\n")
            racer.stdin.flush()
        outputs = [racer.communicate(timeout=120) for racer in racers]
    finally:
        for racer in racers:
            racer.kill()
    results = [next((line for line in out.splitlines() if line.startswith("RESULT")), err)
               for out, err in outputs]
    won = [i for i, r in enumerate(results) if r == "RESULT committed"]
    lost = [i for i, r in enumerate(results) if r.startswith("RESULT AlreadyExistsError")]
    assert len(won) == 1 and len(lost) == 1, results
    assert "race/ckpt" in results[lost[0]]
    winner = won[0] + 1
    out = sk.load(url)
    assert out["who"] == winner
    assert_same_bits(out["w"], np.full((1 << 18,), winner, np.int32))


def test_saves_racing_to_one_path_in_one_process_one_wins(s3):
    url = s3.url("threads/ckpt")
    racers = 4
    start = threading.Barrier(racers)
    outcomes = [None] * racers

    def save(i):
        state = {"w": np.full((1 << 16,), i, np.int32), "who": i}
        start.wait()
        try:
            sk.save(url, state, options=sk.Options(chunk_bytes=16 << 10))
            outcomes[i] = "committed"
        except sk.AlreadyExistsError as e:
            outcomes[i] = str(e)

    threads = [threading.Thread(target=save, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert outcomes.count("committed") == 1, outcomes
    assert all(o == "committed" or "threads/ckpt" in o for o in outcomes), outcomes
    winner = outcomes.index("committed")
    out = sk.load(url)
    assert out["who"] == winner
    assert_same_bits(out["w"], np.full((1 << 16,), winner, np.int32))


@pytest.mark.parametrize("store", ["s3", "memory-objects"])
def test_a_save_overtaken_by_another_commit_fails_with_already_exists(store, request):
    # The winner's cleanup removes the loser's generation (aborts its
    # uploads) while the loser still writes; the loser must still be told
    # that another save committed, not that its files went missing.
    # memory-objects:// is the memory backend with object-store semantics
    # (no rename, conditional creation): the same protocol without a server.
    # A large save still writing when a small one to the same path commits:
    # on S3 its multipart upload is held at the proxy meanwhile, on the
    # memory store it makes many small appends.
    if store == "s3":
        s3, proxy = request.getfixturevalue("s3"), request.getfixturevalue("s3_proxy")
        url = s3.url("overtaken/ckpt")
        options = _through(proxy, s3, io_threads=1)
        proxy.hold(1, method="PUT", query="partNumber")
    else:
        url = f"memory-objects://{request.node.name}/ckpt"
        options = sk.Options(chunk_bytes=64 << 10, io_threads=1, compression="zstd")
        # A plan that matches nothing, to count the storage calls.
        _core.testing.arm_storage_faults([("Append", "^never$", 1, 1, "fail", 0)])
        request.addfinalizer(_core.testing.disarm_storage_faults)
    slow = sk.save_async(url, _big_state(), options=options)
    if store == "s3":
        proxy.wait_held()
    else:  # the slow save has begun writing its generation
        deadline = time.monotonic() + 30
        while _core.testing.storage_call_counts().get("Append", 0) == 0:
            if time.monotonic() > deadline:
                pytest.fail("the slow save wrote nothing")
            time.sleep(0.001)
    sk.save(url, {"w": np.zeros(4, np.int32)})
    if store == "s3":
        proxy.release()
    try:
        slow.result()
        outcome = "committed"
    except sk.ShardkeepError as e:
        outcome = e
    assert_same_bits(sk.load(url)["w"], np.zeros(4, np.int32))  # the winner's, intact
    assert isinstance(outcome, sk.AlreadyExistsError), outcome


def test_transient_errors_and_dropped_connections_are_retried(s3, s3_proxy):
    state = _big_state()
    options = _through(s3_proxy, s3, timeout_s=60.0, io_threads=1)
    s3_proxy.fail(1, status=500, code="InternalError", method="POST", query="uploads")
    s3_proxy.fail(2, status=503, code="SlowDown", method="PUT", query="partNumber")
    s3_proxy.drop(1, method="PUT", query="partNumber")
    s3_proxy.fail(1, status=503, code="SlowDown", method="POST", query="uploadId")
    s3_proxy.fail(1, status=503, code="SlowDown", method="PUT")
    s3_proxy.drop(1, method="PUT")
    url = s3.url("retry/ckpt")
    sk.save(url, state, options=options)
    assert s3_proxy.injected() == 7, s3_proxy.seen
    s3_proxy.fail(2, status=503, code="SlowDown", method="GET")
    s3_proxy.drop(2, method="GET")
    s3_proxy.fail(1, status=500, code="InternalError", method="HEAD")
    out = sk.load(url, options=options)
    assert s3_proxy.injected() >= 11, s3_proxy.seen
    assert_same_bits(out["w"], state["w"])
    assert_same_bits(out["b"], state["b"])


def test_a_failed_save_aborts_its_multipart_uploads(s3, s3_proxy):
    s3_proxy.fail(10**6, status=403, code="AccessDenied", method="PUT", query="partNumber")
    url = s3.url("abort/ckpt")
    with pytest.raises(sk.ShardkeepError, match="AccessDenied"):
        sk.save(url, _big_state(), options=_through(s3_proxy, s3, io_threads=1))
    assert s3_proxy.injected() >= 1
    assert s3.open_uploads() == []
    assert not _committed(s3, "abort/")
    s3_proxy.disarm()
    sk.save(url, _big_state(1), options=_through(s3_proxy, s3, io_threads=1))
    assert_same_bits(sk.load(url)["w"], _big_state(1)["w"])


def test_errors_that_persist_fail_the_save_within_the_timeout(s3, s3_proxy):
    timeout_s = 3.0
    s3_proxy.fail(10**6, status=503, code="SlowDown", method="PUT", query="partNumber")
    with pytest.raises(sk.ShardkeepError, match="SlowDown") as excinfo:
        sk.save(s3.url("slow/ckpt"), _big_state(),
                options=_through(s3_proxy, s3, io_threads=1, timeout_s=timeout_s))
    # It gave up because the retries spent the budget the options gave.
    assert f"timeout_s is {timeout_s:.1f})" in str(excinfo.value), str(excinfo.value)
    assert s3_proxy.injected() > 1  # retried before giving up
    assert s3.open_uploads() == []
    assert not _committed(s3, "slow/")


@pytest.mark.parametrize("fault", [Fault("lost"), Fault("cut", at=0.5)], ids=["lost", "cut"])
def test_an_upload_created_for_an_answer_that_never_arrived_is_not_left_open(
        s3, s3_proxy, fault):
    # The server creates the multipart upload, but its answer (the upload's
    # id) never reaches the client, which asks again and gets another. The
    # save commits with the second; the first, whose id shardkeep never
    # learned, must not stay open (its parts are stored and billed), nor
    # survive `shardkeep gc`, which removes nothing under a committed
    # checkpoint. Found by the chaos suite (test_chaos.py).
    s3.expect_open_uploads = True  # checked below, where a failure says more
    s3_proxy.inject(fault, method="POST", query="uploads")
    url = s3.url("orphan/ckpt")
    sk.save(url, _big_state(), options=_through(s3_proxy, s3, io_threads=1))
    assert s3_proxy.tally()[fault.kind] == 1, s3_proxy.seen
    assert_same_bits(sk.load(url)["w"], _big_state()["w"])
    assert s3.open_uploads() == []


@pytest.mark.parametrize("name", ["data/p0-0.bin", "index/p0.idx"])
def test_a_file_whose_creation_answer_was_lost_does_not_fail_the_save(s3, s3_proxy, name):
    # Each file of a generation is created with a conditional PUT. Its
    # answer is lost (the server created it); the PUT sent again gets 412.
    # That 412 is the save's own file, not another writer's: the save must
    # commit. Found by the chaos suite (test_chaos.py), where it raised
    # AlreadyExistsError ("another writer created it first"). The second
    # PUT may be libcurl's own: it sends a request again by itself when a
    # reused connection closes before any answer.
    s3_proxy.inject(Fault("lost"), method="PUT", path="/" + name)
    url = s3.url("lost-answer/ckpt")
    state = {"w": np.arange(1000, dtype=np.float32), "step": 3}
    sk.save(url, state, options=_through(s3_proxy, s3, io_threads=1))
    assert s3_proxy.tally()["lost"] == 1, s3_proxy.seen
    out = sk.load(url)
    assert_same_bits(out["w"], state["w"])
    assert out["step"] == 3
