"""CheckpointManager on an s3:// root against a real server: retention,
resuming after a restart, preemption, per-call settings, and the cleanup
of what failed saves leave behind."""

import dataclasses
import os
import signal

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from conftest import assert_same_bits, make_mesh

LOSSES = {1: 5.0, 2: 1.0, 3: 4.0, 4: 3.0, 5: 6.0, 6: 2.0, 7: 7.0, 8: 8.0, 9: 9.0}


def _state(step: int, mesh) -> sk.Checkpointables:
    value = np.arange(16 * 8, dtype=np.float32).reshape(16, 8) + step
    w = jax.make_array_from_callback(value.shape, NamedSharding(mesh, P("a", "b")),
                                     lambda index: value[index])
    return sk.Checkpointables(params={"w": w}, data=sk.JsonValue({"next": step}))


def _steps_stored(s3, prefix: str) -> list[str]:
    """The names directly under ``prefix`` that hold any object."""
    return sorted({key[len(prefix):].split("/")[0] for key in s3.keys(prefix)})


def test_retention_and_resume_after_a_restart(s3):
    mesh = make_mesh((2, 4), ("a", "b"))
    root = s3.url("run")
    policy = dict(keep_last=1, keep_every_steps=4, keep_best=2, best_metric="loss",
                  step_width=1)
    with sk.CheckpointManager(root, **policy) as mgr:
        assert mgr.all_steps() == []
        for step, loss in LOSSES.items():
            mgr.save(step, _state(step, mesh), metrics={"loss": loss})
        mgr.wait()
        assert mgr.all_steps() == [2, 4, 6, 8, 9]  # best 2, 6; every 4th; last 9
        assert mgr.step_path(9) == f"{root}/9"
    assert _steps_stored(s3, "run/") == ["2", "4", "6", "8", "9"]
    # A new manager (the restarted job) finds the steps and their metrics.
    with sk.CheckpointManager(root, **policy) as mgr:
        assert mgr.all_steps() == [2, 4, 6, 8, 9]
        assert mgr.best_step() == 2 and mgr.metrics(6) == {"loss": 2.0}
        other = NamedSharding(make_mesh((4, 2), ("a", "b")), P("b", "a"))
        target = {"params": {"w": jax.ShapeDtypeStruct((16, 8), np.float32, sharding=other)}}
        loaded = mgr.load(None, sk.Checkpointables(target))["params"]["w"]
        assert loaded.sharding == other
        expected = np.arange(16 * 8, dtype=np.float32).reshape(16, 8) + 9
        for shard in loaded.addressable_shards:
            assert_same_bits(shard.data, expected[shard.index])
        assert mgr.load(4, sk.Checkpointables(data=None)) == {"data": {"next": 4}}
        mgr.save(10, _state(10, mesh), metrics={"loss": 0.5})
        mgr.wait()
        assert mgr.all_steps() == [2, 4, 8, 10]  # 6 is no longer among the best 2
    assert _steps_stored(s3, "run/") == ["10", "2", "4", "8"]


def test_a_preemption_notice_saves_the_current_step(s3):
    root = s3.url("preempted")
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with sk.CheckpointManager(root, save_interval_steps=100) as mgr:
            assert mgr.save(1, {"w": np.full(4, 1.0)}) is False
            os.kill(os.getpid(), signal.SIGTERM)
            assert mgr.save(2, {"w": np.full(4, 2.0)}) is True  # not due, but preempted
            assert mgr.reached_preemption(2)
    finally:
        signal.signal(signal.SIGTERM, previous)
    with sk.CheckpointManager(root) as mgr:  # the job restarted elsewhere
        assert mgr.all_steps() == [2]
        assert_same_bits(mgr.load()["w"], np.full(4, 2.0))


def test_per_call_settings_for_every_manager_call(s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "environment-secret")
    options = sk.Options(s3=s3.settings, timeout_s=30.0)
    root = s3.url("override-run")
    with sk.CheckpointManager(root, keep_last=1, options=options) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, {"w": np.full(3, float(step))})
        mgr.wait()
        assert mgr.all_steps() == [3]
        # Load options without s3 settings read from the manager's store.
        assert_same_bits(mgr.load(3, options=sk.Options(timeout_s=30.0))["w"], np.full(3, 3.0))
    assert _steps_stored(s3, "override-run/") == ["000000003"]
    with sk.CheckpointManager(root, options=options) as mgr:
        assert mgr.all_steps() == [3]


def test_what_a_failed_save_leaves_is_removed(s3, s3_proxy):
    settings = dataclasses.replace(s3.settings, endpoint_url=s3_proxy.endpoint_url)
    options = sk.Options(s3=settings, timeout_s=30.0)
    root = s3.url("failing-run")
    with sk.CheckpointManager(root, options=options, step_width=1) as mgr:
        mgr.save(1, {"w": np.full(3, 1.0)})
        mgr.wait()
        # The first objects of step 2 go up, then the server refuses.
        s3_proxy.fail(10**6, status=403, code="AccessDenied", method="PUT", after=2)
        mgr.save(2, {"w": np.full(3, 2.0), "v": np.arange(5)})
        try:
            mgr.wait()
            raise AssertionError("the save of step 2 did not fail")
        except sk.ShardkeepError as e:
            assert "AccessDenied" in str(e) and "step 2" in str(e)
        s3_proxy.disarm()
        mgr.save(3, {"w": np.full(3, 3.0)})
        mgr.wait()
        assert mgr.all_steps() == [1, 3]
    assert _steps_stored(s3, "failing-run/") == ["1", "3"]
    with sk.CheckpointManager(root, options=options) as mgr:
        assert mgr.all_steps() == [1, 3]
        assert_same_bits(mgr.load(3)["w"], np.full(3, 3.0))
