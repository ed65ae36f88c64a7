"""On accelerators a save's device-to-host copies go into pinned host memory
(``Options.pinned_host_staging``): one batched ``jax.device_put`` into each
device's ``pinned_host`` memory, started before any copy is waited for.

CI has no accelerator, so these tests make the CPU devices' arrays count
as device memory (``shardings.on_cpu`` answers False): the save then
stages them as it would a GPU's. The CPU devices have a ``pinned_host``
memory too, and a ``device_put`` into it is a copy, as on a GPU. Shapes
are unusual so that no plan another test kept (keyed by structure and
shapes) is reused."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from shardkeep.base import shardings
from conftest import assert_same_bits, make_mesh, sample_array


@pytest.fixture
def on_accelerator(monkeypatch):
    """Arrays count as device memory; returns the memory kinds of every
    array that ``jax.device_put`` placed, call by call."""
    monkeypatch.setattr(shardings, "on_cpu", lambda sharding: False)
    calls = []
    device_put = jax.device_put

    def recording(x, device=None, **kwargs):
        targets = device if isinstance(device, (list, tuple)) else [device]
        calls.append([getattr(t, "memory_kind", None) for t in targets])
        return device_put(x, device, **kwargs)

    monkeypatch.setattr(jax, "device_put", recording)
    return calls


def _tree(rows):
    mesh = make_mesh((4, 2), ("x", "y"))
    tree = {"step": 7}
    for i, name in enumerate(["bfloat16", "float32", "int32", "float32"]):
        spec = [P("x", "y"), P("x"), P(), P(None, "y")][i]
        values = jnp.asarray(sample_array(name, shape=(rows, 6), seed=i))
        tree[f"w{i}"] = jax.device_put(values, NamedSharding(mesh, spec))
    return tree


def _boxes_written(tree):
    """The device shards a save of ``tree`` stages: replica 0 of each box."""
    return sum(1 for leaf in jax.tree.leaves(tree) if isinstance(leaf, jax.Array)
               for shard in leaf.addressable_shards if shard.replica_id == 0)


def _pinned_calls(calls):
    return [kinds for kinds in calls if "pinned_host" in kinds]


def _assert_loads_back(path, tree):
    loaded = sk.load(path, jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        if isinstance(x, jax.Array) else x, tree))
    for key, value in tree.items():
        if isinstance(value, jax.Array):
            assert_same_bits(loaded[key], value)
            assert loaded[key].sharding == value.sharding
    assert loaded["step"] == tree["step"]


def test_a_save_stages_every_box_through_pinned_memory_in_one_batch(on_accelerator, tmp_path):
    tree = _tree(rows=44)
    sk.save(str(tmp_path / "ckpt"), tree, options=sk.Options(pinned_host_staging=True))
    pinned = _pinned_calls(on_accelerator)
    # One device_put for the whole tree, every box in it, all pinned: the
    # copies are started together.
    assert len(pinned) == 1
    assert pinned[0] == ["pinned_host"] * _boxes_written(tree)
    _assert_loads_back(str(tmp_path / "ckpt"), tree)


def test_an_async_save_owns_its_pinned_copies(on_accelerator, tmp_path):
    """The pinned arrays are the save's own: the caller may donate its
    arrays as soon as save_async returns, as a training step does."""
    tree = _tree(rows=52)
    expected = {key: np.asarray(value).copy() for key, value in tree.items()
                if isinstance(value, jax.Array)}
    future = sk.save_async(str(tmp_path / "ckpt"), tree,
                           options=sk.Options(pinned_host_staging=True))
    step = jax.jit(lambda t: jax.tree.map(lambda x: x + 1, t), donate_argnums=0)
    tree = jax.block_until_ready(step(tree))
    future.result()
    assert len(_pinned_calls(on_accelerator)) == 1
    loaded = sk.load(str(tmp_path / "ckpt"))
    for key, value in expected.items():
        assert_same_bits(loaded[key], value)


def test_off_and_on_cpu_devices_by_default_the_copies_are_pageable(on_accelerator, tmp_path):
    """False never pins; None pins on GPUs only, and these devices are CPUs."""
    tree = _tree(rows=36)
    sk.save(str(tmp_path / "off"), tree, options=sk.Options(pinned_host_staging=False))
    sk.save(str(tmp_path / "default"), tree)
    assert _pinned_calls(on_accelerator) == []
    _assert_loads_back(str(tmp_path / "off"), tree)
    _assert_loads_back(str(tmp_path / "default"), tree)


def test_refused_pinned_copies_fall_back_to_pageable_ones(on_accelerator, monkeypatch,
                                                          tmp_path, caplog):
    """A runtime that refuses the pinned copies (its pinned pool exhausted)
    costs speed, not the save; the fallback is logged."""
    recording = jax.device_put

    def refusing(x, device=None, **kwargs):
        targets = device if isinstance(device, (list, tuple)) else [device]
        if any(getattr(t, "memory_kind", None) == "pinned_host" for t in targets):
            raise RuntimeError("RESOURCE_EXHAUSTED: out of pinned host memory")
        return recording(x, device, **kwargs)

    monkeypatch.setattr(jax, "device_put", refusing)
    tree = _tree(rows=60)
    with caplog.at_level(logging.WARNING, logger="shardkeep"):
        sk.save(str(tmp_path / "ckpt"), tree, options=sk.Options(pinned_host_staging=True))
    assert any("pinned host memory failed" in r.getMessage() and "RESOURCE_EXHAUSTED"
               in r.getMessage() for r in caplog.records)
    _assert_loads_back(str(tmp_path / "ckpt"), tree)
