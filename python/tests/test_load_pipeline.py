"""The load pipeline: reads overlapped with placement, every source through
it, and loads into the memory of donated targets (Options.donate_target)."""

import dataclasses
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from conftest import make_mesh
from shardkeep import _core
from shardkeep.loading import load_executor, load_plan, load_source, placement

_LEAVES = 12


def _mesh():
    return make_mesh((2, 4), ("data", "model"))


def _state(seed: int) -> dict:
    """Leaves of different layouts, computed by XLA (so JAX owns their memory)."""
    mesh = _mesh()

    def leaf(i):
        sharding = NamedSharding(mesh, [P("data", "model"), P("model"), P(), P("data")][i % 4])
        shape = (64, 32) if i % 4 != 1 else (64,)
        dtype = [jnp.float32, jnp.bfloat16, jnp.int32][i % 3]
        make = jax.jit(lambda: (jnp.arange(np.prod(shape)).reshape(shape) * (seed + 1) + i)
                       .astype(dtype), out_shardings=sharding)
        return make()

    return {f"l{i:02d}": leaf(i) for i in range(_LEAVES)}


def _target(state: dict) -> dict:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding),
                        state)


def _host(state: dict) -> dict:
    return jax.tree.map(lambda a: np.asarray(a).copy(), state)


def _assert_equal(loaded: dict, expected: dict) -> None:
    assert sorted(loaded) == sorted(expected)
    for name, want in expected.items():
        got = loaded[name]
        assert got.sharding == want.sharding, name
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), name


def _pointers(array: jax.Array) -> list[int]:
    return [s.data.unsafe_buffer_pointer() for s in array.addressable_shards]


@pytest.fixture
def small_batches(monkeypatch):
    """Batches of about one leaf, so that a small tree is read in several."""
    monkeypatch.setattr(load_executor, "_MIN_BATCH_BYTES", 1)
    monkeypatch.setattr(load_executor, "_BATCHES", _LEAVES)


def test_placement_overlaps_the_next_reads(tmp_path, monkeypatch, small_batches):
    # Each read of a batch after the first waits until a leaf of the batch
    # before it has been placed. A load that read everything before
    # placing anything would leave every such wait to time out.
    state = _state(0)
    sk.save(tmp_path / "c", state)
    placed: list[str] = []
    changed = threading.Condition()
    place = placement.place

    def recording_place(leaf, buffers, arena):
        result = place(leaf, buffers, arena)
        with changed:
            placed.append(leaf.path)
            changed.notify_all()
        return result

    batches: list[set[str]] = []
    overlapped: list[bool] = []
    read = load_source.CoreSource.read

    def waiting_read(self, requests):
        paths = {self.meta().leaves[r.leaf].path for r in requests}
        if batches:
            before = batches[-1]
            with changed:
                overlapped.append(bool(changed.wait_for(lambda: before & set(placed), timeout=10)))
        batches.append(paths)
        read(self, requests)

    monkeypatch.setattr(placement, "place", recording_place)
    monkeypatch.setattr(load_source.CoreSource, "read", waiting_read)
    loaded = sk.load(tmp_path / "c", _target(state), options=sk.Options(map_files=False))
    assert len(batches) >= 4
    assert overlapped == [True] * (len(batches) - 1)
    assert sorted(placed) == sorted(state)
    _assert_equal(loaded, state)


def _save_orbax(path, state):
    ocp = pytest.importorskip("orbax.checkpoint")
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, state)
    return lambda target: sk.load_orbax(path, target)


def _save_safetensors(path, state):
    from safetensors.numpy import save_file
    path = path.with_suffix(".safetensors")
    save_file(_host(state), str(path))
    return lambda target: sk.load_safetensors(path, target)


def _save_dcp(path, state):
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    tensors = {k: torch.from_numpy(v.astype(np.float32) if v.dtype.itemsize == 2 else v)
               for k, v in _host(state).items()}
    dcp.save(tensors, checkpoint_id=str(path), no_dist=True)
    return lambda target: sk.load_dcp(str(path), target, allow_pickle=True,
                                      options=sk.Options(allow_lossy_cast=True))


def _save_shardkeep(path, state):
    sk.save(path, state)
    return lambda target: sk.load(path, target, options=sk.Options(map_files=False))


def _save_local_tier(path, state):
    with sk.CheckpointManager(path / "persistent", save_interval_steps=100,
                              local_root=str(path / "local{process}"),
                              local_save_interval_steps=1) as manager:
        manager.save(1, state)

    def restore(target):
        with sk.CheckpointManager(path / "persistent", save_interval_steps=100,
                                  local_root=str(path / "local{process}"),
                                  local_save_interval_steps=1) as manager:
            step, value = manager.restore(target)
        assert step == 1
        return value
    return restore


@pytest.mark.parametrize("save", [_save_shardkeep, _save_safetensors, _save_orbax, _save_dcp,
                                  _save_local_tier])
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_every_source_loads_through_the_pipeline(tmp_path, monkeypatch, small_batches, save):
    state = _state(1)
    load = save(tmp_path / "c", state)
    reads, places = [], []
    read, place = load_executor.read_batch, placement.place
    monkeypatch.setattr(load_executor, "read_batch",
                        lambda source, requests: (reads.append(len(requests)),
                                                  read(source, requests)))
    monkeypatch.setattr(placement, "place",
                        lambda leaf, buffers, arena: (places.append(leaf.path),
                                                      place(leaf, buffers, arena))[1])
    loaded = load(_target(state))
    assert len([n for n in reads if n]) >= 4  # batched
    assert len(places) == _LEAVES
    if save is _save_dcp:  # DCP holds no bfloat16 here: compare as saved
        state = {k: v.astype(jnp.float32) if v.dtype == jnp.bfloat16 else v
                 for k, v in state.items()}
        loaded = {k: v.astype(jnp.float32) if v.dtype == jnp.bfloat16 else v
                  for k, v in loaded.items()}
    _assert_equal(loaded, state)


def test_a_box_on_several_devices_gets_memory_of_its_own_on_each(tmp_path):
    mesh = _mesh()
    sk.save(tmp_path / "c", {"v": np.arange(64, dtype=np.float32)})
    sharding = NamedSharding(mesh, P("model"))  # each box on the 2 "data" devices
    loaded = sk.load(tmp_path / "c", {"v": jax.ShapeDtypeStruct((64,), jnp.float32,
                                                                 sharding=sharding)})["v"]
    assert len(set(_pointers(loaded))) == 8
    np.testing.assert_array_equal(np.asarray(loaded), np.arange(64, dtype=np.float32))


@pytest.mark.parametrize("donate", [False, True])
def test_a_plan_is_a_value_that_running_it_leaves_as_it_was(tmp_path, donate):
    """The executor keeps what it chooses (buffers, mapped files, donated
    memory) to itself: a plan's fields are the same after a run, cannot
    be assigned, and the same plan runs again."""
    sk.save(tmp_path / "c", _state(2))
    reader = _core.Reader(str(tmp_path / "c"), sk.Options().to_core())
    source = load_source.CoreSource(reader, "state", "c", sk.Options().to_core(),
                                    map_files=True)
    live = _state(0)
    plan = load_plan.plan("c", source.meta(), live, partial=False, broadcast=False,
                          allow_lossy_cast=False, donate=donate)

    def fields(value):
        return [(f, getattr(value, f)) for f in value.__dataclass_fields__]

    before = [(fields(leaf), [fields(slot) for slot in leaf.slots]) for leaf in plan.leaves]
    first = load_executor.execute(plan, source, timeout_s=10)
    after = [(fields(leaf), [fields(slot) for slot in leaf.slots]) for leaf in plan.leaves]
    assert [[(f, id(v)) for f, v in leaf] for leaf, _ in before] == \
        [[(f, id(v)) for f, v in leaf] for leaf, _ in after]
    assert [slots for _, slots in before] == [slots for _, slots in after]
    assert all((leaf.donor is not None) == donate for leaf in plan.leaves)
    slot = plan.leaves[0].slots[0]
    assert not hasattr(slot, "buffer")  # buffers are the run's
    # Frozen (Python 3.11 reports it as a TypeError for slotted dataclasses).
    with pytest.raises((dataclasses.FrozenInstanceError, TypeError)):
        slot.shape = (1,)  # type: ignore[misc]
    if not donate:  # a donated target is gone once loaded into; the plan is not run twice
        _assert_equal(load_executor.execute(plan, source, timeout_s=10), first)
    _assert_equal(first, _state(2))


# -- donated targets ------------------------------------------------------------

_DONATE = sk.Options(donate_target=True)


@pytest.mark.parametrize("map_files", [True, False])
def test_a_donated_state_is_loaded_into_its_own_memory(tmp_path, map_files):
    for step in range(3):
        sk.save(tmp_path / str(step), _state(step))
    live = _state(9)
    for step in range(3):
        memory = {name: _pointers(a) for name, a in live.items()}
        old = live
        live = sk.load(tmp_path / str(step), live,
                       options=sk.Options(donate_target=True, map_files=map_files))
        _assert_equal(live, _state(step))
        for name, array in live.items():
            assert old[name].is_deleted()  # the caller's arrays cannot see the new bytes
            assert _pointers(array) == memory[name], name  # the same memory, read into
            assert len(set(_pointers(array))) == 8  # replicated boxes: still one per device
        with pytest.raises(RuntimeError, match="deleted"):
            np.asarray(old["l00"])


def test_donation_never_writes_into_memory_the_caller_still_sees(tmp_path):
    sk.save(tmp_path / "c", _state(1))
    live = _state(0)
    seen = np.asarray(live["l00"].addressable_shards[0].data)  # a view of its memory
    seen_before = seen.copy()
    mine = np.arange(64, dtype=np.float32).reshape(64, 1) * np.ones((1, 32), np.float32)
    mine_before = mine.copy()
    # A device_put of a caller's aligned numpy array may adopt its memory.
    live["l03"] = jax.device_put(mine, live["l03"].sharding)
    live["l06"] = live["l00"]  # one array, the target of two leaves
    expected = _state(1)
    expected["l06"] = jax.device_put(expected["l06"], live["l00"].sharding)
    loaded = sk.load(tmp_path / "c", live, options=_DONATE)
    _assert_equal(loaded, expected)
    np.testing.assert_array_equal(seen, seen_before)
    np.testing.assert_array_equal(mine, mine_before)
    assert set(_pointers(loaded["l00"])).isdisjoint(_pointers(loaded["l06"]))


def test_donated_safetensors_load_is_read_into_the_state(tmp_path):
    state = _state(2)
    load = _save_safetensors(tmp_path / "m", state)
    live = _state(0)
    memory = {name: _pointers(a) for name, a in live.items()}
    loaded = sk.load_safetensors(tmp_path / "m.safetensors", live, options=_DONATE)
    _assert_equal(loaded, state)
    assert {name: _pointers(a) for name, a in loaded.items()} == memory
    _assert_equal(load(_target(state)), state)


def test_without_donation_the_target_is_left_alone(tmp_path):
    sk.save(tmp_path / "c", _state(1))
    live = _state(0)
    loaded = sk.load(tmp_path / "c", live)
    _assert_equal(live, _state(0))
    _assert_equal(loaded, _state(1))


@pytest.mark.parametrize("map_files", [True, False])
def test_a_state_a_load_placed_is_donated_by_deleting_it(tmp_path, map_files):
    # Its memory is shardkeep's own (a file mapping or a load's buffers),
    # which XLA cannot give up: it is deleted, and the leaves load anew.
    sk.save(tmp_path / "a", _state(1))
    sk.save(tmp_path / "b", _state(2))
    options = sk.Options(donate_target=True, map_files=map_files)
    first = sk.load(tmp_path / "a", _target(_state(0)), options=options)
    second = sk.load(tmp_path / "b", first, options=options)
    assert all(a.is_deleted() for a in first.values())
    _assert_equal(second, _state(2))
