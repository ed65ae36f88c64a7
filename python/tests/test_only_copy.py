"""A forced replace killed between its two renames leaves a step's only copy.

Where the file system cannot exchange two folders atomically (NFS), a
forced save replaces ``<step>`` by two renames: ``<step>`` to
``<step>.shardkeep-old``, then ``<step>.shardkeep-tmp`` to ``<step>``. Killed
between them, ``<step>`` does not exist and ``<step>.shardkeep-old`` holds
the only copy of that step. The core classifies it "only-copy" and nothing
removes it: not ``shardkeep gc`` (whatever ``--older-than``), not the
manager, not the local tier. Renamed back, it loads. (The C++ test
checkpoint_root_test.cc produces the same state with an injected kill.)
"""

from __future__ import annotations

import logging
import os
import shutil

import numpy as np
import pytest

import shardkeep as sk
from shardkeep import _core
from test_cli import run, run_json


def _state(step: int) -> dict:
    return {"state": {"w": np.arange(8.0) + step}}


def _kill_between_renames(folder, name: str) -> None:
    """The state a forced save of ``name`` under ``folder`` killed between its
    two renames leaves: the committed checkpoint moved aside, the new one
    complete in its temporary folder, nothing at ``name``."""
    path = os.path.join(folder, name)
    shutil.copytree(path, path + ".shardkeep-tmp")  # the new copy, never renamed
    os.rename(path, path + ".shardkeep-old")        # the first rename


State = _core.EntryState


def _states(folder) -> dict[str, _core.EntryState]:
    return {e.name: e.state for e in _core.list_checkpoints(str(folder))}


def test_gc_and_the_manager_keep_the_only_copy_and_it_loads_renamed_back(tmp_path, caplog):
    root = tmp_path / "run"
    with sk.CheckpointManager(root) as mgr:
        for step in (1, 2, 3):
            mgr.save(step, _state(step))
    _kill_between_renames(root, "000000003")
    old = root / "000000003.shardkeep-old"
    assert _states(root) == {"000000001": State.COMMITTED, "000000002": State.COMMITTED,
                             "000000003.shardkeep-old": State.ONLY_COPY,
                             "000000003.shardkeep-tmp": State.TEMPORARY}

    listed = {e["name"]: e for e in run_json("ls", root)["entries"]}
    assert listed[old.name]["state"] == "only-copy" and not listed[old.name]["leftover"]
    text = run("ls", root).stdout
    assert "only-copy" in text and f"rename {old} back to {root / '000000003'}" in text

    for args in ((), ("--older-than", "0")):
        out = run("gc", root, *args).stdout
        assert f"kept {old} (only-copy): NOT a leftover" in out, out
        assert old.is_dir() and (old / "_SHARDKEEP").exists()
    assert not (root / "000000003.shardkeep-tmp").exists()  # removed by --older-than 0

    with pytest.raises(sk.InvalidArgumentError, match="only copy of .*000000003"):
        _core.remove_leftover(str(old))

    with caplog.at_level(logging.WARNING, logger="shardkeep"):
        with sk.CheckpointManager(root) as mgr:
            assert mgr.all_steps() == [1, 2]
    assert old.is_dir() and f"rename {old} back to" in caplog.text

    os.rename(old, root / "000000003")
    with sk.CheckpointManager(root) as mgr:
        assert mgr.all_steps() == [1, 2, 3]
        step, value = mgr.restore()
    assert step == 3
    np.testing.assert_array_equal(np.asarray(value["state"]["w"]), np.arange(8.0) + 3)


def test_the_local_tier_keeps_the_only_copy_of_a_slice(tmp_path):
    def manager():
        return sk.CheckpointManager(tmp_path / "persistent", save_interval_steps=100,
                                    local_root=str(tmp_path / "local{process}"),
                                    local_save_interval_steps=1, local_keep_last=5)

    with manager() as mgr:
        for step in (1, 2):
            mgr.save(step, _state(step))
    folder = tmp_path / "local0" / "p0"
    name = max(n for n in os.listdir(folder) if n.isdigit())
    _kill_between_renames(folder, name)
    assert _states(folder)[name + ".shardkeep-old"] == State.ONLY_COPY

    with manager() as mgr:
        assert mgr.restore()[0] != 2
    assert (folder / (name + ".shardkeep-old") / "_SHARDKEEP").exists()
    assert not (folder / (name + ".shardkeep-tmp")).exists()  # a leftover: removed

    os.rename(folder / (name + ".shardkeep-old"), folder / name)
    with manager() as mgr:
        step, value = mgr.restore()
    assert step == 2
    np.testing.assert_array_equal(np.asarray(value["state"]["w"]), np.arange(8.0) + 2)
