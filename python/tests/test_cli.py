"""The `shardkeep` command-line tool's ls, info, rm and gc (docs/CLI.md).

The tool is the C++ program `pip install .` puts beside this Python; the
checkpoints it looks at are written by the real Python front (save,
CheckpointManager with Flax NNX and optax state), on a file system and on
the SeaweedFS S3 server of the fixtures.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardkeep as sk
from conftest import make_mesh
from record_checksums import write_record

_TESTS_DIR = pathlib.Path(__file__).parent

# Exit codes (cpp/cli/command.h, docs/CLI.md).
OK, PROBLEMS, USAGE, FAILED = 0, 1, 2, 3


def cli_tool() -> str:
    """The path of the `shardkeep` tool installed beside this Python."""
    tool = pathlib.Path(sys.executable).with_name("shardkeep")
    if not tool.exists():
        pytest.fail(f"the shardkeep command-line tool is not installed beside {sys.executable}"
                    " (pip install --no-build-isolation . installs it)", pytrace=False)
    return str(tool)


def run(*args, expect=OK):
    """Runs the tool; checks its exit code; returns the finished process."""
    proc = subprocess.run([cli_tool(), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == expect, (
        f"shardkeep {' '.join(map(str, args))} exited with {proc.returncode}, expected "
        f"{expect}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


def run_json(*args):
    return json.loads(run(*args, "--json").stdout)


def folder_bytes(path) -> int:
    return sum(f.stat().st_size for f in pathlib.Path(path).rglob("*") if f.is_file())


# -- the tool itself ---------------------------------------------------------


def test_help_is_everywhere_and_names_the_options():
    assert "ls" in run("--help").stdout
    for command, options in {"ls": ["--json"], "info": ["--checkpointable", "--json"],
                             "rm": ["--force"], "gc": ["--older-than", "--dry-run"]}.items():
        text = run(command, "--help").stdout
        for option in options:
            assert option in text, (command, option, text)


def test_bad_arguments_are_usage_errors(tmp_path):
    assert "ROOT" in run("ls", expect=USAGE).stderr
    run("gc", tmp_path, "--older-than", "5 fortnights", expect=USAGE)
    run("gc", tmp_path, "--older-than", "-1h", expect=USAGE)
    run("info", tmp_path, "--no-such-option", expect=USAGE)


# -- ls and info on checkpoints of a training run ------------------------------


class Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        sharded = lambda *names: nnx.with_partitioning(nnx.initializers.lecun_normal(), names)  # noqa: E731
        self.hidden = nnx.Linear(16, 32, kernel_init=sharded(None, "model"), rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(32, 4, kernel_init=sharded("model", None), rngs=rngs)


def _nnx_state():
    """A Flax NNX model's state and its optax (adam) state, sharded on a 4x2 mesh."""
    mesh = make_mesh((4, 2), ("data", "model"))
    with jax.set_mesh(mesh):
        model = Model(nnx.Rngs(params=0, dropout=1))
        optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    return nnx.state(model), nnx.state(optimizer)


def _leaves(checkpointable):
    return {leaf["path"]: leaf for leaf in checkpointable["leaves"]}


def test_ls_lists_the_steps_of_a_manager_with_sizes_and_checkpointables(tmp_path):
    root = tmp_path / "run"
    model, opt = _nnx_state()
    with sk.CheckpointManager(root) as mgr:
        for step in (100, 200):
            mgr.save(step, sk.Checkpointables(model=model, optimizer=opt,
                                              config=sk.JsonValue({"lr": 0.01})),
                     metrics={"loss": 1 / step})
    listing = run_json("ls", root)
    assert listing["root"] == str(root)
    entries = listing["entries"]
    assert [e["name"] for e in entries] == ["000000100", "000000200"]
    for entry, step in zip(entries, (100, 200)):
        assert entry["state"] == "committed" and entry["leftover"] is False
        assert entry["step"] == step
        assert entry["process_count"] == 1
        assert entry["checkpointables"] == [{"name": "model", "kind": "pytree"},
                                            {"name": "optimizer", "kind": "pytree"},
                                            {"name": "config", "kind": "json"}]
        assert entry["bytes"] == folder_bytes(root / entry["name"])
        assert entry["files"] == sum(1 for f in (root / entry["name"]).rglob("*") if f.is_file())
        assert entry["created_ns"] <= entry["committed_ns"] <= time.time_ns()
        assert entry["committed"].endswith("Z") and entry["problem"] is None
    text = run("ls", root).stdout
    assert "000000200" in text and "model:pytree, optimizer:pytree, config:json" in text
    assert "2 checkpoints" in text and "leftover" not in text
    assert "is itself a checkpoint" in run("ls", root / "000000100").stdout


def test_info_shows_the_tree_shardings_sizes_and_the_commit_record(tmp_path):
    model, opt = _nnx_state()
    root = tmp_path / "run"
    with sk.CheckpointManager(root, options=sk.Options(compression="zstd")) as mgr:
        mgr.save(7, sk.Checkpointables(model=model, optimizer=opt, blob=b"\x00" * 1000),
                 metrics={"loss": 0.25})
    ckpt = root / "000000007"
    info = run_json("info", ckpt)
    assert info["step"] == 7 and info["process_count"] == 1
    assert info["metrics"] == {"loss": 0.25}
    assert info["created_ns"] <= info["committed_ns"]
    assert [c["name"] for c in info["checkpointables"]] == ["model", "optimizer", "blob"]
    model_info, _, blob = info["checkpointables"]
    assert blob == {"name": "blob", "kind": "bytes", "bytes": 1000}

    saved = sk.metadata(str(ckpt))  # the Python front's own view of the same tree
    leaves = _leaves(model_info)
    python_leaves = saved.checkpointables["model"].leaves
    assert len(leaves) == model_info["totals"]["leaves"] == len(python_leaves)
    for expected in python_leaves:
        leaf = leaves[expected.path]
        assert (leaf["kind"], leaf["dtype"], leaf["sharding"], leaf["prng_impl"]) == (
            expected.kind, expected.dtype, expected.sharding, expected.prng_impl)
        assert tuple(leaf["shape"]) == expected.shape
        assert leaf["bytes"] == expected.bytes
    kernel = leaves["hidden/kernel/value"]
    assert kernel["kind"] == "array" and kernel["dtype"] == "float32"
    assert kernel["shape"] == [16, 32] and kernel["bytes"] == 16 * 32 * 4
    assert kernel["sharding"]["type"] == "named"
    assert kernel["sharding"]["spec"] == [None, "model"]
    assert kernel["sharding_text"] == "P(None, model) mesh(data=4, model=2)"
    assert _leaves(info["checkpointables"][1])["opt_state/0/mu/out/kernel/value"]["sharding_text"] == \
        "P(model, None) mesh(data=4, model=2)"
    key = next(leaf for path, leaf in leaves.items() if leaf["prng_impl"])
    assert key["dtype"] == "uint32" and key["prng_impl"] == "threefry2x32", key
    # Stored bytes are the chunks as written: zstd shrinks the zero biases.
    bias = leaves["hidden/bias/value"]
    assert bias["bytes"] == 32 * 4 and 0 < bias["stored_bytes"] < bias["bytes"]
    assert bias["ratio"] == pytest.approx(bias["bytes"] / bias["stored_bytes"])
    arrays = [leaf for leaf in leaves.values() if leaf["kind"] == "array"]
    totals = model_info["totals"]
    assert totals["arrays"] == len(arrays)
    assert totals["bytes"] == sum(leaf["bytes"] for leaf in arrays)
    assert totals["stored_bytes"] == sum(leaf["stored_bytes"] for leaf in arrays)
    data_bytes = sum(f.stat().st_size for f in (ckpt / "model" / "data").iterdir())
    assert totals["stored_bytes"] <= data_bytes

    text = run("info", ckpt).stdout
    assert "hidden/kernel/value" in text and "P(None, model) mesh(data=4, model=2)" in text
    assert "blob (bytes): 1000 B" in text and '{"loss":0.25}' in text

    only = run_json("info", ckpt, "--checkpointable", "blob")
    assert [c["name"] for c in only["checkpointables"]] == ["blob"]
    missing = run("info", ckpt, "--checkpointable", "nope", expect=FAILED)
    assert "nope" in missing.stderr and "model" in missing.stderr


def test_info_shows_scalars_strings_custom_metadata_and_a_single_device_sharding(ckpt):
    x = jax.device_put(jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3), jax.devices()[3])
    sk.save(ckpt, {"x": x, "n": 5, "name": "run/a", "nothing": None, "~k/": np.zeros(3)},
            custom_metadata={"owner": "cli-test"})
    info = run_json("info", ckpt)
    assert info["step"] is None and info["custom_metadata"] == {"owner": "cli-test"}
    leaves = _leaves(info["checkpointables"][0])
    assert leaves["x"]["sharding_text"] == "device 3" and leaves["x"]["dtype"] == "bfloat16"
    assert leaves["n"]["kind"] == "scalar" and leaves["n"]["value"] == 5
    assert leaves["name"]["kind"] == "string" and leaves["name"]["value"] == "run/a"
    assert leaves["nothing"]["kind"] == "none" and leaves["nothing"]["bytes"] is None
    assert leaves["~0k~1"]["shape"] == [3]  # key paths escaped as ReadLeaf takes them
    assert leaves["~0k~1"]["sharding"] is None and leaves["~0k~1"]["sharding_text"] == "-"


def test_info_of_a_folder_without_a_checkpoint_fails_naming_it(tmp_path):
    (tmp_path / "junk").mkdir()
    proc = run("info", tmp_path / "junk", expect=FAILED)
    assert str(tmp_path / "junk") in proc.stderr and "no committed checkpoint" in proc.stderr
    run("ls", tmp_path / "missing", expect=FAILED)


# -- rm ------------------------------------------------------------------------


def test_rm_deletes_a_checkpoint_and_refuses_anything_else_without_force(tmp_path):
    ckpt = tmp_path / "ckpt"
    sk.save(str(ckpt), {"w": np.ones(4)})
    data = tmp_path / "data"
    data.mkdir()
    (data / "precious.txt").write_text("not a checkpoint")

    refused = run("rm", data, expect=PROBLEMS)
    assert "not a checkpoint" in refused.stderr and "--force" in refused.stderr
    assert (data / "precious.txt").exists()
    run("rm", tmp_path, expect=PROBLEMS)  # a root of checkpoints is no checkpoint
    assert ckpt.exists()

    # A commit record this build refuses (a newer format version, say).
    newer = tmp_path / "newer"
    sk.save(str(newer), {"w": np.ones(4)})
    record = json.loads((newer / "_SHARDKEEP").read_text())
    write_record(newer, {**record, "version": 99})
    refused = run("rm", newer, expect=PROBLEMS)
    assert "not accepted" in refused.stderr and "version" in refused.stderr
    assert newer.exists()

    assert "deleted" in run("rm", ckpt).stdout
    assert not ckpt.exists() and not list(tmp_path.glob("ckpt.*"))
    run("rm", data, "--force")
    run("rm", newer, "--force")
    assert not data.exists() and not newer.exists()
    missing = run("rm", ckpt, expect=FAILED)
    assert str(ckpt) in missing.stderr


# -- gc after a killed save ------------------------------------------------------

_KILLED_SAVE = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import shardkeep as sk
    from local_coordination import LocalCoordination, stall_at
    root, name = sys.argv[1], sys.argv[2]
    # Killed at the barrier after its data is written, before the commit:
    # the save is left unfinished however fast or slow the machine.
    LocalCoordination(stall_at("written", 0, then=lambda: os.kill(os.getpid(),
                                                                  signal.SIGKILL))).install()
    mgr = sk.CheckpointManager(root, options=sk.Options(chunk_bytes=256 << 10, io_threads=2))
    mgr.save(int(name), {"big": np.ones((64 << 20) // 4, np.float32)})
    mgr.wait()
    sys.exit("the save finished: it was never killed")
""")


def kill_a_save(root: str, step: int) -> None:
    """A child process saves ``step`` under ``root`` and is SIGKILLed once
    its data is written, before the commit."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", _KILLED_SAVE, root, f"{step:09d}"], env=env,
                          cwd=_TESTS_DIR, capture_output=True, timeout=180)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]


def _age(path: pathlib.Path, seconds: float) -> None:
    """Sets every modification time below ``path`` to ``seconds`` ago."""
    then = time.time() - seconds
    for p in [path, *path.rglob("*")]:
        os.utime(p, (then, then))


def test_gc_removes_a_killed_save_but_never_a_checkpoint(tmp_path):
    root = tmp_path / "run"
    with sk.CheckpointManager(root) as mgr:
        mgr.save(1, {"w": np.arange(8.0)})
    kill_a_save(str(root), 2)
    leftover = root / "000000002.shardkeep-tmp"
    assert leftover.is_dir()

    entries = run_json("ls", root)["entries"]
    assert [(e["name"], e["state"], e["leftover"]) for e in entries] == [
        ("000000001", "committed", False), ("000000002.shardkeep-tmp", "temporary", True)]
    assert entries[1]["bytes"] == folder_bytes(leftover) > 0
    assert entries[1]["modified_ns"] >= time.time_ns() - 120e9
    assert entries[1]["step"] is None and entries[1]["checkpointables"] is None
    assert "temporary" in run("ls", root).stdout

    # Its process is gone, so its lease no longer protects it; --older-than
    # adds a condition on the time of its last write.
    kept = run("gc", root, "--older-than", "1h").stdout
    assert "kept" in kept and "newer than --older-than 1h" in kept and leftover.exists()
    dry = run("gc", root, "--dry-run").stdout
    assert f"would remove {leftover}" in dry and leftover.exists()

    _age(leftover, 3 * 3600)
    assert leftover.exists() and "kept" in run("gc", root, "--older-than", "1d").stdout
    removed = run("gc", root, "--older-than", "2h").stdout
    assert f"removed {leftover} (temporary" in removed and "removed 1 leftover" in removed
    assert not leftover.exists()
    assert sorted(p.name for p in root.iterdir()) == ["000000001"]
    np.testing.assert_array_equal(sk.load(str(root / "000000001"))["w"], np.arange(8.0))

    # Nothing is left to remove; committed checkpoints, however old, stay.
    _age(root / "000000001", 30 * 86400)
    assert "removed 0 leftovers" in run("gc", root, "--older-than", "0").stdout
    assert (root / "000000001" / "_SHARDKEEP").exists()


def test_gc_keeps_a_checkpoint_whose_record_it_cannot_read(tmp_path):
    root = tmp_path / "run"
    sk.save(str(root / "000000001"), {"w": np.ones(3)})
    record = root / "000000001" / "_SHARDKEEP"
    write_record(root / "000000001", {**json.loads(record.read_text()), "version": 99})
    (root / "000000003.shardkeep-old").mkdir()
    (root / "000000004.shardkeep-deleting").mkdir()
    (root / "notes").mkdir()
    entries = {e["name"]: e for e in run_json("ls", root)["entries"]}
    assert entries["000000001"]["state"] == "rejected" and not entries["000000001"]["leftover"]
    assert "version" in entries["000000001"]["problem"]
    # No committed 000000003 beside it: the only copy of that step.
    assert entries["000000003.shardkeep-old"]["state"] == "only-copy"
    assert not entries["000000003.shardkeep-old"]["leftover"]
    assert entries["000000004.shardkeep-deleting"]["state"] == "being-deleted"
    assert entries["notes"]["state"] == "other" and entries["notes"]["bytes"] is None

    out = run("gc", root, "--older-than", "0").stdout
    assert "kept" in out and "rejected" in out and "(only-copy): NOT a leftover" in out
    assert sorted(p.name for p in root.iterdir()) == [
        "000000001", "000000003.shardkeep-old", "notes"]
    assert record.exists()


# -- S3 ------------------------------------------------------------------------


def test_ls_info_gc_and_rm_on_s3(s3):
    root = s3.url("runs/7")
    with sk.CheckpointManager(root) as mgr:
        mgr.save(10, {"w": jnp.arange(1024, dtype=jnp.float32)}, metrics={"acc": 0.5})
    kill_a_save(root, 20)
    s3_keys = s3.keys("runs/7/000000010/")
    stored = sum(s3.client.head_object(Bucket=s3.name, Key=k)["ContentLength"] for k in s3_keys)

    entries = run_json("ls", root)["entries"]
    assert [(e["name"], e["state"]) for e in entries] == [("000000010", "committed"),
                                                          ("000000020", "unfinished")]
    assert entries[0]["step"] == 10 and entries[0]["bytes"] == stored
    assert entries[0]["files"] == len(s3_keys)
    assert entries[0]["url"] == f"{root}/000000010"
    assert entries[1]["leftover"] and entries[1]["bytes"] is not None
    assert entries[1]["modified_ns"] is None  # S3 ages are not known

    info = run_json("info", f"{root}/000000010")
    assert info["step"] == 10 and info["metrics"] == {"acc": 0.5}
    assert _leaves(info["checkpointables"][0])["w"]["bytes"] == 4096

    # The age of an S3 leftover is unknown: --older-than keeps it; the
    # default, the expired lease alone, removes it.
    assert "unknown" in run("gc", root, "--older-than", "1h").stdout
    assert s3.keys("runs/7/000000020/")
    assert "removed 1 leftover" in run("gc", root).stdout
    assert s3.keys("runs/7/000000020/") == []
    after = run_json("ls", root)["entries"]
    assert [e["name"] for e in after] == ["000000010"], after

    run("rm", root, expect=PROBLEMS)
    run("rm", f"{root}/000000010")
    assert s3.keys("runs/7/") == []
    assert run_json("ls", root)["entries"] == []
    run("rm", f"{root}/000000010", expect=FAILED)


def test_convert_hands_over_to_the_python_package(tmp_path):
    """`shardkeep convert` runs sk.convert in the environment it is installed in."""
    import safetensors.numpy

    weights = {"layer.w": np.arange(12, dtype=np.float32).reshape(3, 4),
               "layer.b": np.arange(3, dtype=np.int32)}
    safetensors.numpy.save_file(weights, str(tmp_path / "m.safetensors"))
    source, ckpt = tmp_path / "m.safetensors", tmp_path / "ckpt"
    run("convert", source, ckpt, "--from", "safetensors")
    loaded = sk.load(ckpt)
    np.testing.assert_array_equal(loaded["layer"]["w"], weights["layer.w"])
    np.testing.assert_array_equal(loaded["layer"]["b"], weights["layer.b"])
    again = run("convert", source, ckpt, "--from", "safetensors", expect=FAILED)
    assert "already" in again.stderr.lower(), again.stderr  # a checkpoint is there
    run("convert", "a", "b", "--from", "pickles", expect=USAGE)
    run("convert", source, tmp_path / "neg", "--from", "safetensors", "--step", "-1",
        expect=USAGE)


def test_convert_records_the_step_given(tmp_path):
    """`--step` reaches sk.convert: metadata and `shardkeep ls` show it."""
    import safetensors.numpy

    safetensors.numpy.save_file({"w": np.ones(4, np.float32)}, str(tmp_path / "m.safetensors"))
    root = tmp_path / "run"
    run("convert", tmp_path / "m.safetensors", root / "000000042", "--from", "safetensors",
        "--step", "42")
    assert sk.metadata(root / "000000042").step == 42
    [entry] = run_json("ls", root)["entries"]
    assert entry["step"] == 42, entry


def test_diff_reports_each_leaf_and_reads_only_what_changed(tmp_path):
    mesh = make_mesh((8,), ("x",))
    frozen = jax.device_put(jnp.arange(512 * 1024, dtype=jnp.float32).reshape(512, 1024),
                            NamedSharding(mesh, P("x", None)))
    adapter = jax.device_put(jnp.ones((64, 8), jnp.bfloat16), NamedSharding(mesh, P("x", None)))
    a, b, c = (tmp_path / n for n in "abc")
    sk.save(a, {"frozen": frozen, "adapter": adapter, "step": 1})
    changed = adapter.at[3, 2].set(1.5)
    sk.save(b, {"frozen": frozen, "adapter": changed, "step": 2}, base=a)
    sk.save(c, {"frozen": frozen.astype(jnp.bfloat16), "extra": np.zeros(3)})

    same = run_json("diff", a, a)
    assert same["identical"] and same["bytes_read"] == 0
    assert {leaf["change"] for leaf in same["leaves"]} == {"identical"}
    run("diff", a, a)  # exit 0

    report = run("diff", a, b, "--json", expect=PROBLEMS)
    leaves = {leaf["leaf"]: leaf for leaf in json.loads(report.stdout)["leaves"]}
    assert leaves["frozen"]["change"] == "identical" and leaves["frozen"]["bytes_read"] == 0
    assert leaves["adapter"]["change"] == "differs"
    assert leaves["adapter"]["differing_elements"] == 1
    assert leaves["adapter"]["max_abs_diff"] == 0.5
    assert leaves["adapter"]["max_rel_diff"] == pytest.approx(0.5 / 1.5)
    assert leaves["step"]["change"] == "differs"
    # Only the adapter's chunk holding the change was read, from both sides.
    assert json.loads(report.stdout)["bytes_read"] < frozen.nbytes / 8

    text = run("diff", a, c, expect=PROBLEMS).stdout
    assert "state/frozen: changed: float32[512,1024] -> bfloat16[512,1024]" in text
    assert "state/adapter: only in A (bfloat16[64,8])" in text
    assert "state/extra: only in B (float64[3])" in text
    assert text.strip().endswith("bytes read")
    assert "nowhere" in run("diff", a, tmp_path / "nowhere", expect=FAILED).stderr
