"""A synchronous save streams: its shards reach the core's writers through a
``_core.ShardFeed`` a group of leaves at a time, so writing starts while
later leaves are still being staged. Tests that the writers really start
early, that the bytes come back whole, and that a failure on either side
(staging, or the save itself) ends both and leaves nothing behind."""

import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from shardkeep import _core
from shardkeep.errors import AlreadyExistsError, InvalidArgumentError
from shardkeep.saving import staging
from conftest import assert_same_bits, make_mesh, sample_array


def _tree(leaves=12):
    """Sharded bf16 and f32 leaves, a strided numpy leaf and scalars."""
    mesh = make_mesh((4, 2), ("x", "y"))
    tree = {"step": 3, "lr": 0.5,
            "host": sample_array("float32", shape=(40, 30), seed=99)[::2, 1::3]}
    for i in range(leaves):
        name = "bfloat16" if i % 2 else "float32"
        spec = P("x", "y") if i % 3 else P("x")
        values = jnp.asarray(sample_array(name, shape=(64, 48), seed=i))
        tree[f"w{i:02d}"] = jax.device_put(values, NamedSharding(mesh, spec))
    return tree


def _data_files(data_dir):
    """How many data files the writers have opened (each is opened for its
    first chunk; appends are buffered, so sizes would say little)."""
    try:
        return len(os.listdir(data_dir))
    except FileNotFoundError:
        return 0


def _carve_a_leaf_at_a_time(monkeypatch, before_group):
    """Stages a leaf per group, calling ``before_group(n)`` before the n-th
    group (from 1) is carved; returns the list of groups carved."""
    monkeypatch.setattr(staging, "FEED_GROUP_BYTES", 1)
    carve = _core.carve_shards
    carved = []

    def carving(layouts, views, copies=None):
        before_group(len(carved) + 1)
        carved.append(layouts)
        return carve(layouts, views, copies)

    monkeypatch.setattr(_core, "carve_shards", carving)
    return carved


def test_writing_starts_before_the_last_leaf_is_staged(ckpt, monkeypatch):
    tree = _tree()
    last_array = len(jax.tree_util.tree_leaves(tree)) - 2  # the scalars are not carved
    data_dir = ckpt + ".shardkeep-tmp/state/data"
    written_meanwhile = []

    def watch(group):
        if group == last_array:
            # The earlier leaves were fed: the writers write them now, while
            # this one is still being staged.
            deadline = time.monotonic() + 30
            while _data_files(data_dir) == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
            written_meanwhile.append(_data_files(data_dir))

    _carve_a_leaf_at_a_time(monkeypatch, watch)
    sk.save(ckpt, tree)
    assert written_meanwhile and written_meanwhile[0] > 0
    loaded = sk.load(ckpt, tree)
    for key, value in tree.items():
        if isinstance(value, (int, float)):
            assert loaded[key] == value
        else:
            assert_same_bits(loaded[key], value)


@pytest.mark.parametrize("group_bytes", [1, 20_000, 1 << 30])
def test_any_grouping_saves_the_same_bits(ckpt, monkeypatch, group_bytes):
    monkeypatch.setattr(staging, "FEED_GROUP_BYTES", group_bytes)
    tree = _tree(leaves=7)
    sk.save(ckpt, tree)
    loaded = sk.load(ckpt, tree)
    assert_same_bits(loaded["host"], tree["host"])
    for key in [k for k in tree if k.startswith("w")]:
        assert_same_bits(loaded[key], tree[key])
        assert loaded[key].sharding == tree[key].sharding


def test_a_staging_failure_fails_the_save_and_leaves_nothing(ckpt, monkeypatch, caplog):
    tree = _tree()

    def fail_at_the_fourth(group):
        if group == 4:
            raise RuntimeError("device lost while copying leaf 4")

    _carve_a_leaf_at_a_time(monkeypatch, fail_at_the_fourth)
    with caplog.at_level(logging.ERROR, logger="shardkeep"):
        with pytest.raises(RuntimeError, match="device lost"):
            sk.save(ckpt, tree)
    assert not os.path.exists(ckpt)
    assert not os.path.exists(ckpt + ".shardkeep-tmp")
    # The save's own failure was collected, not logged as a dropped one.
    assert not [r for r in caplog.records if r.name == "shardkeep"]
    monkeypatch.undo()
    sk.save(ckpt, tree)  # the path is free for the next save
    assert_same_bits(sk.load(ckpt, tree)["w03"], tree["w03"])


def test_a_save_the_core_refuses_stops_staging_and_keeps_the_checkpoint(ckpt, monkeypatch):
    old = {"w": np.arange(12, dtype=np.float32)}
    sk.save(ckpt, old)

    def pause_at_the_second(group):
        if group == 2:
            time.sleep(0.5)  # the core has refused the save by now

    carved = _carve_a_leaf_at_a_time(monkeypatch, pause_at_the_second)
    tree = _tree()
    with pytest.raises(AlreadyExistsError):
        sk.save(ckpt, tree)
    assert len(carved) < len([k for k in tree if k.startswith("w")])  # staging stopped early
    assert_same_bits(sk.load(ckpt)["w"], old["w"])


def test_a_feed_takes_no_shards_of_an_earlier_checkpoint():
    feed = _core.ShardFeed("state")
    stored = _core.StoredIn("/tmp/elsewhere", "state", "w", 1)
    with pytest.raises(InvalidArgumentError, match="earlier checkpoint"):
        feed.add([_core.Shard(0, "float32", [0], [4], stored)])
    with pytest.raises(TypeError, match="SavePart.feed must be a ShardFeed"):
        _core.SavePart("state", "pytree", "{}", feed=[])
