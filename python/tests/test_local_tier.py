"""The CheckpointManager's local tier (docs/MANAGER.md, "Local tier").

One-process tests run in this process (8 CPU devices); the multi-process
ones run real 4-process jobs (harness.run_job) that are killed with SIGKILL
mid-training and restarted, with local roots wiped in between.
"""

from __future__ import annotations

import os
import random
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import shardkeep as sk
from shardkeep import _core
from shardkeep.manager import local_slices

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "multiprocess"))
from harness import run_job  # noqa: E402

PROCESSES = 4


# -- one process ------------------------------------------------------------

def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()).reshape(2, 4), ("a", "b"))


def _state(step: int, mesh: Mesh) -> dict:
    w = jnp.arange(64 * 8, dtype=jnp.float32).reshape(64, 8) + step
    return {"w": jax.device_put(w, NamedSharding(mesh, P("a", "b"))),
            "r": jax.device_put(jnp.full((16,), step, jnp.int32), NamedSharding(mesh, P())),
            "n": np.full((3,), step, np.int16), "s": step, "name": "x"}


def _equal(a: dict, b: dict) -> bool:
    return all(jax.tree.leaves(jax.tree.map(
        lambda x, y: bool(np.array_equal(np.asarray(x), np.asarray(y))), a, b)))


def _manager(tmp_path, **kw) -> sk.CheckpointManager:
    args = dict(save_interval_steps=4, keep_last=1, local_root=str(tmp_path / "local{process}"),
                local_save_interval_steps=1, local_keep_last=2)
    args.update(kw)
    return sk.CheckpointManager(tmp_path / "persistent", **args)


def _committed(folder) -> list[int]:
    return sorted(int(n) for n in os.listdir(folder) if n.isdigit()
                  and os.path.exists(os.path.join(folder, n, "_SHARDKEEP")))


def test_restore_takes_the_newest_local_step_bit_exact(tmp_path):
    mesh = _mesh()
    with _manager(tmp_path) as mgr:
        for step in range(1, 7):
            mgr.save(step, _state(step, mesh))
    with _manager(tmp_path) as mgr:
        step, value = mgr.restore(_state(0, mesh))
        assert mgr.restore()[0] == 6
        _, whole = mgr.restore()  # no target: "state", as numpy
    assert step == 6
    assert _equal(value, _state(6, mesh))
    assert value["w"].sharding == NamedSharding(mesh, P("a", "b"))
    assert sorted(whole) == ["n", "name", "r", "s", "w"]
    assert isinstance(whole["w"], np.ndarray) and _equal(whole, _state(6, mesh))


def test_custom_metadata_stays_with_the_persistent_step(tmp_path):
    # The local tier marks its slices in their custom metadata: a user's
    # custom metadata goes to the persistent step alone, and cannot take
    # the mark's key ("shardkeep_" keys are refused).
    mesh = _mesh()
    with _manager(tmp_path) as mgr:
        for step in range(1, 6):
            mgr.save(step, _state(step, mesh), custom_metadata={"step": step})
        mgr.wait()
        assert mgr.all_steps() == [4]
        assert mgr.custom_metadata(4) == {"step": 4}
        slice_record = sk.metadata(tmp_path / "local0" / "p0" / "000000005")
        assert slice_record.custom_metadata == {
            local_slices.LOCAL_MARK: {"process": 0, "process_count": 1}}
    with _manager(tmp_path) as mgr:
        step, value = mgr.restore(_state(0, mesh))
    assert step == 5 and _equal(value, _state(5, mesh))


def test_restoring_one_tree_from_named_parts_says_what_to_call(tmp_path):
    mesh = _mesh()
    with _manager(tmp_path) as mgr:
        mgr.save(1, sk.Checkpointables(params=_state(1, mesh), data=sk.JsonValue({"i": 1})))
    with _manager(tmp_path) as mgr:
        with pytest.raises(sk.NotFoundError) as e:
            mgr.restore(_state(0, mesh))
        assert str(e.value) == (
            f"local step 1 under {tmp_path / 'local0'} holds the named checkpointables"
            " ['data', 'params'], not one tree 'state': load them with"
            " manager.restore(sk.Checkpointables(data=..., params=...)), or an empty"
            " sk.Checkpointables() for all")
        step, parts = mgr.restore(sk.Checkpointables(params=_state(0, mesh)))
    assert step == 1 and _equal(parts["params"], _state(1, mesh))


def test_local_and_persistent_retention_are_independent(tmp_path):
    mesh = _mesh()
    with _manager(tmp_path, keep_last=2, local_keep_last=3) as mgr:
        for step in range(1, 14):
            mgr.save(step, _state(step, mesh))
        mgr.wait()
        assert mgr.all_steps() == [8, 12]
        assert mgr.local_steps() == {0: [11, 12, 13]}
    assert _committed(tmp_path / "persistent") == [8, 12]
    assert _committed(tmp_path / "local0" / "p0") == [11, 12, 13]


def test_a_local_slice_is_a_checkpoint_of_its_own(tmp_path):
    """What the slice records is enough to load it alone: every stored box,
    whole, with the original meta.json and the box's place in its leaf."""
    mesh = _mesh()
    with _manager(tmp_path) as mgr:
        mgr.save(1, sk.Checkpointables(_state(1, mesh)))
    path = tmp_path / "local0" / "p0" / "000000001"
    record = _core.read_commit_record(str(path))
    assert record.custom_metadata == {"shardkeep_local": {"process": 0, "process_count": 1}}
    slice_info = sk.load_checkpointables(path, {local_slices.SLICE_PART: None})
    parts = {p["name"]: p for p in slice_info[local_slices.SLICE_PART]["parts"]}
    boxes = sk.load_checkpointables(path, {"w": None})["w"]
    expected = np.asarray(_state(1, mesh)["w"])
    assert len(boxes) == len(parts["w"]["shards"]) == 8
    for box, shard in zip(boxes, parts["w"]["shards"]):
        index = tuple(slice(o, o + n) for o, n in zip(shard["origin"], shard["shape"]))
        assert shard["leaf"] == 0 and shard["dtype"] == "float32"
        assert np.array_equal(box, expected[index])


def _new_bytes(slice_path) -> int:
    """Bytes of the slice's data files that no other name shares."""
    files = [os.path.join(d, f) for d, _, names in os.walk(slice_path) if d.endswith("data")
             for f in names]
    return sum(os.stat(f).st_size for f in files if os.stat(f).st_nlink == 1)


@pytest.mark.parametrize("reuse", [True, False])
def test_local_steps_link_the_boxes_that_did_not_change(tmp_path, reuse):
    """The slices cross the peer exchange as bytes, so the tier compares
    each box with its previous step's: a frozen array rebuilt every step
    (equal values, a new array) is linked, and every kept step loads."""
    mesh = _mesh()
    frozen = jax.device_put(jnp.arange(1 << 20, dtype=jnp.float32).reshape(1024, 1024),
                            NamedSharding(mesh, P()))
    states = {step: {"frozen": frozen + 0, "w": _state(step, mesh)["w"]} for step in (1, 2, 3)}
    with _manager(tmp_path, reuse_unchanged=reuse) as mgr:
        for step, state in states.items():
            mgr.save(step, state)
            mgr.wait()
        assert mgr.local_steps() == {0: [2, 3]}
    later = _new_bytes(tmp_path / "local0" / "p0" / "000000003")
    if reuse:
        assert later < frozen.nbytes / 4
    else:
        assert later >= frozen.nbytes
    with _manager(tmp_path) as mgr:
        step, value = mgr.restore(states[1])
    assert step == 3 and _equal(value, states[3])


def test_restore_reshards_and_casts_from_the_local_tier(tmp_path):
    mesh = _mesh()
    with _manager(tmp_path) as mgr:
        for step in range(1, 4):
            mgr.save(step, _state(step, mesh))
    target = _state(0, mesh)
    target["w"] = jax.ShapeDtypeStruct((64, 8), jnp.float64 if jax.config.x64_enabled
                                       else jnp.bfloat16,
                                       sharding=NamedSharding(mesh, P("b", None)))
    target["r"] = np.zeros((16,), np.int64)
    with _manager(tmp_path) as mgr:
        step, value = mgr.restore(target, options=sk.Options(allow_lossy_cast=True))
    assert step == 3
    assert value["w"].sharding == NamedSharding(mesh, P("b", None))
    assert np.array_equal(np.asarray(value["w"]),
                          np.asarray(_state(3, mesh)["w"]).astype(target["w"].dtype))
    assert value["r"].dtype == np.int64 and np.array_equal(value["r"], np.full(16, 3))


def test_restore_falls_back_to_persistent_and_to_nothing(tmp_path):
    mesh = _mesh()
    with _manager(tmp_path) as mgr:
        assert mgr.restore(_state(0, mesh)) is None
        for step in range(1, 7):
            mgr.save(step, _state(step, mesh))
    shutil.rmtree(tmp_path / "local0")  # a replaced host
    with _manager(tmp_path) as mgr:
        step, value = mgr.restore(_state(0, mesh))
    assert step == 4 and _equal(value, _state(4, mesh))


def test_a_gs_persistent_root_behind_a_local_tier(tmp_path, gcs):
    mesh = _mesh()

    def manager():
        return sk.CheckpointManager(gcs.url("persistent"), save_interval_steps=4, keep_last=1,
                                    local_root=str(tmp_path / "local{process}"),
                                    local_save_interval_steps=1, local_keep_last=2)

    with manager() as mgr:
        for step in range(1, 7):
            mgr.save(step, _state(step, mesh))
        mgr.wait()
        assert mgr.all_steps() == [4] and mgr.local_steps() == {0: [5, 6]}
    with manager() as mgr:
        step, value = mgr.restore(_state(0, mesh))
    assert step == 6 and _equal(value, _state(6, mesh))
    shutil.rmtree(tmp_path / "local0")  # a replaced host
    with manager() as mgr:
        step, value = mgr.restore(_state(0, mesh))
    assert step == 4 and _equal(value, _state(4, mesh))


def test_persistent_step_wins_over_an_older_local_one(tmp_path):
    mesh = _mesh()
    with _manager(tmp_path, local_save_interval_steps=3) as mgr:
        for step in range(1, 5):
            mgr.save(step, _state(step, mesh))
        mgr.wait()
        assert mgr.all_steps() == [4] and mgr.local_steps() == {0: [3]}
    with _manager(tmp_path, local_save_interval_steps=3) as mgr:
        step, value = mgr.restore()
    assert step == 4 and np.array_equal(value["w"], np.asarray(_state(4, mesh)["w"]))


def test_a_failed_local_save_surfaces_and_the_tier_goes_on(tmp_path):
    mesh = _mesh()
    with _manager(tmp_path) as mgr:
        mgr.save(1, _state(1, mesh))
        mgr.wait()
        # Step 2's local save fails at its first data write.
        _core.testing.arm_storage_faults([("Append", "p0/000000002", 1, -1, "fail", 0)])
        try:
            mgr.save(2, _state(2, mesh))
            with pytest.raises(sk.StorageError,
                               match="local save of step 2 .*injected failure of Append"):
                mgr.wait()
        finally:
            _core.testing.disarm_storage_faults()
        mgr.save(3, _state(3, mesh))
        mgr.wait()
        assert mgr.local_steps() == {0: [1, 3]}
        step, value = mgr.restore(_state(0, mesh))
    assert step == 3 and _equal(value, _state(3, mesh))
    assert sorted(os.listdir(tmp_path / "local0" / "p0")) == ["000000001", "000000003"]


def test_a_resumed_run_drops_the_later_local_steps_of_the_run_before(tmp_path):
    mesh = _mesh()
    with _manager(tmp_path, save_interval_steps=100) as mgr:
        for step in range(1, 7):
            mgr.save(step, _state(step, mesh))
    # Resumed from step 3 (say, the persistent tier): its step 4 differs.
    with _manager(tmp_path, save_interval_steps=100) as mgr:
        mgr.save(4, _state(40, mesh))
        mgr.wait()
        assert mgr.local_steps() == {0: [4]}
    assert _committed(tmp_path / "local0" / "p0") == [4]
    with _manager(tmp_path, save_interval_steps=100) as mgr:
        step, value = mgr.restore(_state(0, mesh))
    assert step == 4 and _equal(value, _state(40, mesh))


def test_local_arguments_are_checked(tmp_path):
    with pytest.raises(sk.InvalidArgumentError, match="local_save_interval_steps"):
        sk.CheckpointManager(tmp_path / "a", local_root=str(tmp_path / "l"))
    with pytest.raises(sk.InvalidArgumentError, match="local_root"):
        sk.CheckpointManager(tmp_path / "a", local_save_interval_steps=2)
    with pytest.raises(sk.InvalidArgumentError, match="own storage"):
        sk.CheckpointManager(tmp_path / "a", local_root="s3://bucket/x",
                             local_save_interval_steps=1)


# -- four processes -----------------------------------------------------------

def _newest_rebuildable(local_roots: list[str]) -> int | None:
    """The newest step whose every slice p<q> is committed in some root."""
    held: dict[int, set[int]] = {}
    for root in local_roots:
        if not os.path.isdir(root):
            continue
        for folder in os.listdir(root):
            for step in _committed(os.path.join(root, folder)):
                held.setdefault(step, set()).add(int(folder[1:]))
    full = [s for s, slices in held.items() if slices == set(range(PROCESSES))]
    return max(full, default=None)


def test_killed_job_resumes_from_local_then_peer_copies_then_persistent(tmp_path):
    root, template = str(tmp_path / "persistent"), str(tmp_path / "local{process}")
    roots = [template.format(process=p) for p in range(PROCESSES)]
    kill_at = random.Random().choice([9, 10])
    run_job(PROCESSES, 2, "local_tier_scenarios:train",
            dict(root=root, local_root=template, last_step=20, kill_at=kill_at),
            expect_killed=tuple(range(PROCESSES)), timeout=180)
    newest = _newest_rebuildable(roots)
    assert newest in (kill_at - 1, kill_at), (kill_at, newest)

    # Restart: the newest local step, bit for bit, then one more step.
    results = run_job(PROCESSES, 2, "local_tier_scenarios:train",
                      dict(root=root, local_root=template, last_step=newest + 1), timeout=180)
    for r in results:
        assert r["restored"] == newest and r["exact"], (kill_at, results)
    newest += 1
    persistent = max(_committed(root))
    assert persistent < newest
    # Local retention: at most two steps per slice folder (own slice and
    # peer copy), the new one last. (The step before may be missing from
    # one copy: the job was killed while saving it.)
    for p, r in enumerate(results):
        assert sorted(r["local_steps"]) == sorted([str(p), str((p - 1) % PROCESSES)])
        for steps in r["local_steps"].values():
            assert len(steps) <= 2 and steps[-1] == newest and steps[0] >= newest - 2, results
        assert r["persistent_steps"][-1] == persistent

    # A replaced host: process 2's root is empty; its slice comes from
    # process 3's peer copy. Loaded onto another layout.
    shutil.rmtree(roots[2])
    results = run_job(PROCESSES, 2, "local_tier_scenarios:restore_only",
                      dict(root=root, local_root=template), timeout=180)
    assert [r["restored"] for r in results] == [newest] * PROCESSES, results
    assert all(r["exact"] for r in results)

    # Another process count: two processes whose roots hold every slice
    # between them (process 0 only its own and its old peer copy), and no
    # persistent step. They resume and save two steps; the slices of the
    # four-process job are then dropped.
    two = str(tmp_path / "two{process}")
    shutil.copytree(roots[0], two.format(process=0))
    for r in (roots[1], roots[3]):
        shutil.copytree(r, two.format(process=1), dirs_exist_ok=True)
    results = run_job(2, 2, "local_tier_scenarios:train",
                      dict(root=str(tmp_path / "persistent-two"), local_root=two,
                           last_step=newest + 2), timeout=180)
    assert [r["restored"] for r in results] == [newest] * 2, results
    assert all(r["exact"] for r in results)
    for p, r in enumerate(results):
        assert r["local_steps"] == {"0": [newest + 1, newest + 2],
                                    "1": [newest + 1, newest + 2]}
    assert _committed(os.path.join(two.format(process=0), "p3")) == []
    assert _committed(os.path.join(two.format(process=1), "p2")) == []

    # Two adjacent roots gone: slice 1 (kept by processes 1 and 2) is lost,
    # so the persistent step is restored.
    shutil.rmtree(roots[1])
    results = run_job(PROCESSES, 2, "local_tier_scenarios:restore_only",
                      dict(root=root, local_root=template, variant="train"), timeout=180)
    assert [r["restored"] for r in results] == [persistent] * PROCESSES, results
    assert all(r["exact"] for r in results)
