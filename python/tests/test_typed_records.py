"""What the core decodes reaches Python as typed objects: the commit record
as a _core.CommitRecord, a root entry's state as an enum, the local tier's
slice descriptions as named records, and trees from keys built by the
core's one builder."""

import numpy as np
import pytest

import shardkeep as sk
from shardkeep import _core
from shardkeep.manager import local_slices


def test_the_commit_record_is_an_object_with_the_saved_fields(tmp_path):
    path = str(tmp_path / "ckpt")
    sk.save_checkpointables(path, {"z": {"w": np.arange(4)}, "a": sk.JsonValue({"k": 1})},
                            step=7, custom_metadata={"run": "r1"})
    record = _core.Reader(path).commit
    assert (record.step, record.process_count, record.data_folder) == (7, 1, None)
    assert record.custom_metadata == {"run": "r1"} and record.metrics == {}
    assert list(record.checkpointables.items()) == [("z", "pytree"), ("a", "json")]
    assert 0 < record.created_ns <= record.committed_ns
    document = record.document()  # as stored, in file order, checksums included
    assert list(document)[0] == "format" and "checksum" in document
    assert list(document["checkpointables"]) == ["z", "a"]
    assert sk.metadata(path).commit_record == document
    assert _core.read_commit_record(path).created_ns == record.created_ns


def test_root_entries_carry_an_enum_state_and_a_record_only_when_committed(tmp_path):
    sk.save(str(tmp_path / "done"), {"w": np.ones(2)})
    (tmp_path / "done.shardkeep-tmp").mkdir()
    listed = {e.name: e for e in _core.list_checkpoints(str(tmp_path))}
    assert listed["done"].state is _core.EntryState.COMMITTED
    assert listed["done"].commit.checkpointables == {"state": "pytree"}
    assert listed["done.shardkeep-tmp"].state is _core.EntryState.TEMPORARY
    assert listed["done.shardkeep-tmp"].commit is None
    collected = _core.collect_leftovers(str(tmp_path), list(listed.values()))
    assert [(c.name, c.outcome) for c in collected] == [
        ("done.shardkeep-tmp", _core.CollectOutcome.REMOVED)]


def test_a_slice_description_round_trips_with_named_shards_and_refuses_lists():
    shard = local_slices.SliceShard(leaf=3, dtype="float32", origin=(0, 4), shape=(2, 4))
    description = local_slices.Description(
        (local_slices.SlicePart("state", "pytree", "{}", (shard,)),), process=1,
        process_count=2, step=5)
    encoded = description.encoded().tobytes()
    assert b'"leaf": 3' in encoded and b'"origin": [0, 4]' in encoded
    assert local_slices.Description.decode(encoded, "here") == description
    positional = encoded.replace(b'{"leaf": 3, "dtype": "float32", "origin": [0, 4],'
                                 b' "shape": [2, 4]}', b'[3, "float32", [0, 4], [2, 4]]')
    assert positional != encoded
    with pytest.raises(sk.CorruptionError, match="here: not a local slice description"):
        local_slices.Description.decode(positional, "here")


def test_trees_from_keys_are_the_cores_and_name_conflicts_by_key_path():
    leaf, empty = _core.KeyedValue.LEAF, _core.KeyedValue.EMPTY_DICT
    tree = _core.tree_of_keys("ckpt", [([("a/b", False), ("1", True)], leaf),
                                       ([("a/b", False), ("0", True)], leaf),
                                       ([("c", False)], empty)])
    assert tree == {"type": "dict", "keys": ["a/b", "c"], "children": [
        {"type": "list", "children": [{"type": "leaf", "leaf": 1},
                                      {"type": "leaf", "leaf": 0}]},
        {"type": "dict", "keys": [], "children": []}]}
    with pytest.raises(sk.CorruptionError, match=r"^ckpt: 'a~1b' is both a leaf and a node$"):
        _core.tree_of_keys("ckpt", [([("a/b", False)], leaf),
                                    ([("a/b", False), ("x", False)], leaf)])
    assert _core.key_path(["a/b", "~"]) == "a~1b/~0"
    assert _core.unescape_key("a~1b~0") == "a/b~"
