"""save_async in a training loop: donation-safe copies, staging memory kept
between saves (shardkeep.saving.staging_pool), and the plan reused for a tree
saved again."""

import os
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_same_bits, make_mesh

import shardkeep as sk
from shardkeep.saving import background_saves, staging, staging_pool
from shardkeep.base import host_memory


@pytest.fixture(autouse=True)
def no_kept_staging():
    sk.release_staging_memory()
    yield
    sk.release_staging_memory()


@pytest.fixture
def fresh_buffers(monkeypatch):
    """Counts the staging buffers allocated (rather than borrowed)."""
    calls = []
    real = host_memory.empty

    def counting(shape, dtype):
        calls.append(shape)
        return real(shape, dtype)

    monkeypatch.setattr(staging_pool.host_memory, "empty", counting)
    return calls


def training_state():
    mesh = make_mesh((4, 2), ("data", "model"))
    named = lambda *spec: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec))
    return {
        "fsdp": jax.device_put(np.arange(64 * 96, dtype=np.float32).reshape(64, 96),
                               named("data", "model")),
        # Replicated over 8 devices: replica-parallel saves slices of it.
        "replicated": jax.device_put(np.linspace(0, 1, 256 * 16, dtype=np.float32)
                                     .reshape(256, 16), named()),
        "bf16": jax.device_put(np.ones((32, 40), jnp.bfloat16), named(None, "model")),
        "single": jnp.arange(1000, dtype=jnp.int32),
        "key": jax.random.key(7),
        "host": np.full(10, 3.0),
        "step": 0,
    }


def update_fn():
    def update(state):
        out = dict(state)
        for name in ("fsdp", "replicated", "bf16", "single"):
            out[name] = state[name] * 2 + 1
        out["key"] = jax.random.split(state["key"], 1)[0]
        return out

    # Donating: XLA writes the outputs into the inputs' buffers.
    return jax.jit(update, donate_argnums=0)


def host_values(state):
    return {k: (np.asarray(jax.random.key_data(v)) if k == "key" else np.array(v))
            for k, v in state.items() if k != "step"}


def test_saved_values_are_those_of_the_call_when_the_next_update_donates(tmp_path):
    update = update_fn()
    state = update(training_state())
    expected, futures = {}, []
    for step in range(1, 5):
        state["step"] = step
        expected[step] = host_values(state)
        before = state["fsdp"].addressable_data(0).unsafe_buffer_pointer()
        futures.append(sk.save_async(tmp_path / str(step), state))
        donated = state
        state = update(dict(state, step=step))  # runs while the save writes
        assert donated["fsdp"].is_deleted()
        # The update reused the saved array's memory: without a copy the
        # checkpoint would hold the new values.
        assert state["fsdp"].addressable_data(0).unsafe_buffer_pointer() == before
        futures[-1].result()
    for step, values in expected.items():
        loaded = sk.load(tmp_path / str(step))
        assert loaded["step"] == step
        for name, value in values.items():
            got = jax.random.key_data(loaded[name]) if name == "key" else loaded[name]
            assert_same_bits(got, value)


def test_the_staging_buffer_is_kept_and_reused_by_the_next_save(tmp_path, fresh_buffers):
    update = update_fn()
    state = update(training_state())
    sk.save_async(tmp_path / "1", state).result()
    assert len(fresh_buffers) == 1
    kept = staging_pool.kept_bytes()
    assert kept >= state["fsdp"].nbytes + state["single"].nbytes
    for step in (2, 3):
        state = update(state)
        sk.save_async(tmp_path / str(step), state).result()
    assert len(fresh_buffers) == 1  # both later saves borrowed it
    assert staging_pool.kept_bytes() == kept


def test_a_buffer_is_lent_to_one_save_at_a_time_and_one_is_kept():
    first = staging_pool.lease(1 << 20, reuse=True)
    second = staging_pool.lease(1 << 20, reuse=True)  # the first still writes
    assert second.buffer is not first.buffer
    big = staging_pool.lease(4 << 20, reuse=True)
    second.give_back()
    big.give_back()
    assert staging_pool.kept_bytes() == 4 << 20  # the largest, alone
    first.give_back()  # its save has finished writing
    assert staging_pool.kept_bytes() == 4 << 20
    reused = staging_pool.lease(2 << 20, reuse=True)
    assert reused.buffer.size == 4 << 20 and staging_pool.kept_bytes() == 0
    # The save carves its copies out of the buffer (test_host_staging).
    assert staging_pool.bytes_needed([3, 100]) == 64 + 100


def test_overlapping_saves_each_hold_the_values_of_their_call(tmp_path):
    state = {"a": jnp.arange(1 << 20, dtype=jnp.float32)}
    first = sk.save_async(tmp_path / "1", state,
                          options=sk.Options(chunk_bytes=64 << 10, io_threads=1))
    second = sk.save_async(tmp_path / "2", {"a": state["a"] + 1})
    first.result()
    second.result()
    assert staging_pool.kept_bytes() == state["a"].nbytes
    assert_same_bits(sk.load(tmp_path / "1")["a"], np.arange(1 << 20, dtype=np.float32))
    assert_same_bits(sk.load(tmp_path / "2")["a"], np.arange(1 << 20, dtype=np.float32) + 1)


def test_release_frees_the_kept_buffer_and_those_of_running_saves(tmp_path):
    state = {"a": jnp.ones(1 << 20)}
    sk.save_async(tmp_path / "1", state).result()
    assert staging_pool.kept_bytes() > 0
    sk.release_staging_memory()
    assert staging_pool.kept_bytes() == 0
    running = sk.save_async(tmp_path / "2", state,
                            options=sk.Options(chunk_bytes=64 << 10, io_threads=1))
    sk.release_staging_memory()
    running.result()
    sk.save_async(tmp_path / "3", {"small": jnp.ones(3)}).result()
    assert staging_pool.kept_bytes() < 1 << 10  # only the last, small save's buffer


def test_reuse_can_be_turned_off(tmp_path, fresh_buffers):
    options = sk.Options(reuse_staging_memory=False)
    for step in (1, 2):
        sk.save_async(tmp_path / str(step), {"a": jnp.ones(1 << 16)}, options=options).result()
    assert len(fresh_buffers) == 2
    assert staging_pool.kept_bytes() == 0


def test_closing_the_manager_frees_the_kept_buffer(tmp_path):
    with sk.CheckpointManager(tmp_path) as mgr:
        mgr.save(1, {"a": jnp.ones(1 << 16)})
        mgr.wait()
        assert staging_pool.kept_bytes() > 0
    assert staging_pool.kept_bytes() == 0


def test_a_kept_plan_follows_changed_values_shapes_and_shardings(tmp_path):
    mesh = make_mesh((8,), ("x",))
    sharded = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    trees = [
        {"w": jnp.zeros(16), "n": 1, "name": "a", "f": 0.5},
        {"w": jnp.ones(16), "n": 2, "name": "b", "f": float("nan")},    # values only
        {"w": jnp.ones(24), "n": 2, "name": "b", "f": 1.0},             # another shape
        {"w": jax.device_put(jnp.arange(16.0), sharded), "n": 3, "name": "c", "f": 2.0},
        {"w": np.arange(16.0), "n": True, "name": "c", "f": 2.0},        # other leaf types
    ]
    for i, tree in enumerate(trees):
        sk.save_async(tmp_path / str(i), tree).result()
    for i, tree in enumerate(trees):
        loaded = sk.load(tmp_path / str(i))
        assert_same_bits(loaded["w"], np.asarray(tree["w"]))
        assert type(loaded["n"]) is type(tree["n"]) and loaded["n"] == tree["n"]
        assert loaded["name"] == tree["name"]
        np.testing.assert_equal(loaded["f"], tree["f"])
    (w,) = [leaf for leaf in sk.metadata(tmp_path / "3").checkpointables["state"].leaves
            if leaf.path == "w"]
    assert w.sharding["type"] == "named"


def test_a_donated_leaf_is_named_also_when_the_plan_is_kept(tmp_path):
    tree = {"a": jnp.ones(4), "b": jnp.ones(4)}
    sk.save_async(tmp_path / "1", tree).result()
    tree["b"].delete()
    with pytest.raises(sk.InvalidArgumentError, match="leaf 'b' is a deleted"):
        sk.save_async(tmp_path / "2", tree)
    assert staging.kept_plans() >= 1


def test_an_error_of_the_core_start_comes_from_result(tmp_path):
    sk.save(tmp_path / "1", {"a": np.ones(2)})
    future = sk.save_async(tmp_path / "1", {"a": np.ones(2)})  # exists, no force
    with pytest.raises(sk.AlreadyExistsError):
        future.result()
    assert future.done()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")
def test_async_saves_start_and_write_at_a_lower_cpu_priority(tmp_path):
    sk.save_async(tmp_path / "1", {"a": jnp.ones(4)}).result()
    starter = background_saves.starter_thread_id()

    def nice(tid):  # field 19 of /proc/<pid>/task/<tid>/stat
        with open(f"/proc/self/task/{tid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[16])

    # Linux caps nice values at 19 (the tests may themselves run niced).
    lowered = os.getpriority(os.PRIO_PROCESS, 0) + background_saves.BACKGROUND_NICE
    assert nice(starter) == min(19, lowered)
    assert nice(threading.get_native_id()) == os.getpriority(os.PRIO_PROCESS, 0)


def test_a_save_queued_behind_a_slow_start_times_out_without_being_cancelled(tmp_path):
    release = threading.Event()

    def slow_start():
        release.wait(30)
        raise sk.ShardkeepError("the slow start")

    background_saves.start(slow_start, "slow", 60.0)
    future = sk.save_async(tmp_path / "1", {"a": np.arange(5)})
    with pytest.raises(sk.TimeoutError):
        future.result(timeout=0.05)
    assert not future.done()
    release.set()
    future.result(timeout=60)  # the timeout did not cancel it
    assert_same_bits(sk.load(tmp_path / "1")["a"], np.arange(5))


def test_a_kept_plan_maps_shared_and_unsorted_leaves_by_their_paths(tmp_path):
    shared = jnp.arange(3)
    # Insertion order differs from JAX's sorted order, and leaves share
    # objects (the int 1, None, one array in two places).
    first = {"b": 1, "a": 1, "z": None, "y": None, "q": shared, "p": shared}
    second = {"b": 1, "a": 2, "z": None, "y": None, "q": shared, "p": shared + 1}
    for name, tree in (("1", first), ("2", second)):
        sk.save_async(tmp_path / name, tree).result()
    loaded = sk.load(tmp_path / "2")
    assert list(loaded) == ["b", "a", "z", "y", "q", "p"]
    assert (loaded["a"], loaded["b"], loaded["z"], loaded["y"]) == (2, 1, None, None)
    assert_same_bits(loaded["q"], np.arange(3, dtype=np.int32))
    assert_same_bits(loaded["p"], np.arange(3, dtype=np.int32) + 1)


def test_no_garbage_collection_runs_in_the_blocking_phase(tmp_path):
    # Staging a tree of many leaves allocates thousands of tracked objects
    # (a buffer view per leaf until its copy replaces it); a collection set
    # off among them would walk the training script's whole heap while
    # training waits.
    import gc
    tree = {f"leaf_{i}": jnp.full(64, i, jnp.float32) for i in range(1500)}
    collections = []

    def note(phase, info):
        if phase == "start":
            collections.append(info["generation"])

    sk.save_async(tmp_path / "warm", tree).result()  # plans and leases once
    gc.collect()
    gc.callbacks.append(note)
    try:
        for i in range(3):
            future = sk.save_async(tmp_path / f"ckpt_{i}", tree)
            blocked = list(collections)
            future.result()
            assert blocked == [], f"save {i}: collections of generations {blocked}"
    finally:
        gc.callbacks.remove(note)


def test_shards_are_located_once_per_sharding_and_shape(tmp_path, monkeypatch):
    """A first save builds JAX's Shard objects for one leaf per (sharding,
    shape), not for every leaf (about 15 µs per shard otherwise), and each
    leaf still gets its own bytes."""
    mesh = make_mesh((4, 2), ("a", "b"))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("a"))
    cols = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "b"))
    tree = {f"r{i}": jax.device_put(jnp.full((8, 4), float(i)), rows) for i in range(20)}
    tree |= {f"c{i}": jax.device_put(jnp.full((8, 4), -float(i)), cols) for i in range(20)}
    built = []
    shards_of = type(tree["r0"]).addressable_shards

    def counted(arr):
        built.append(arr)
        return shards_of.fget(arr)
    monkeypatch.setattr(type(tree["r0"]), "addressable_shards", property(counted))
    sk.save(tmp_path / "a", tree, options=sk.Options(replica_parallel=False))
    sk.save(tmp_path / "b", tree, options=sk.Options(replica_parallel=True))
    assert len(built) <= 4  # two layouts, each planned for the two modes
    monkeypatch.undo()
    for name in ("a", "b"):
        loaded = sk.load(tmp_path / name)
        for key, value in tree.items():
            assert_same_bits(loaded[key], np.asarray(value))


def test_a_manager_prepares_staging_memory_before_its_first_save(tmp_path, fresh_buffers):
    # Its first step that does not save makes the buffer ready in the
    # background; the first save then borrows it instead of fresh memory.
    update = update_fn()
    state = update(training_state())
    with sk.CheckpointManager(tmp_path, save_interval_steps=3) as manager:
        assert not manager.save(1, state)
        deadline = time.monotonic() + 60
        while staging_pool.kept_bytes() == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        prepared = staging_pool.kept_bytes()
        assert prepared >= state["fsdp"].nbytes + state["single"].nbytes
        assert len(fresh_buffers) == 1  # the prepared one
        for step in (2, 3):
            state = update(state)
            manager.save(step, state)
        manager.wait()
        assert manager.all_steps() == [3]
        assert len(fresh_buffers) == 1  # the save at step 3 borrowed it
        path = manager.step_path(3)
    restored = sk.load(path)
    for name in ("fsdp", "single"):
        assert_same_bits(restored[name], np.asarray(state[name]))


def test_a_save_waits_for_the_buffer_being_prepared(fresh_buffers):
    staging_pool.prepare(64 << 20)
    lease = staging_pool.lease(32 << 20, reuse=True)  # joins the preparation
    assert lease.buffer.size == 64 << 20 and len(fresh_buffers) == 1
    lease.give_back()
    assert staging_pool.kept_bytes() == 64 << 20


def test_a_preparation_from_before_a_release_is_dropped_not_waited_for():
    staging_pool.prepare(256 << 20)
    sk.release_staging_memory()  # e.g. a manager closed meanwhile
    staging_pool.prepare(8 << 20)
    lease = staging_pool.lease(4 << 20, reuse=True)  # joins the second only
    assert lease.buffer.size == 8 << 20
    lease.give_back()
    deadline = time.monotonic() + 60
    while any(t.name == "shardkeep-staging-prepare" for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert staging_pool.kept_bytes() == 8 << 20  # the first one's buffer was not kept
