"""gs:// against a GCS emulator (fake-gcs-server, see gcs_server.py): a Flax
NNX model with its Adam state saved by the manager and resumed onto another
mesh, incremental reuse by server-side copies, the command line, and the
per-call settings."""

import json
import threading

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from conftest import assert_same_bits, make_mesh
from shardkeep import _core
from test_cli import kill_a_save, run, run_json
from test_cli_data import files_under
from test_flax_nnx import (AXES, abstract_state, assert_states_equal, batch, new_optimizer,
                           train_step, trained_model)


def test_nnx_training_state_resumes_from_the_manager_onto_another_mesh(gcs):
    mesh = make_mesh((2, 4), AXES)
    model, optimizer = trained_model(mesh)
    manager = sk.CheckpointManager(gcs.url("runs/nnx"), keep_last=2)
    for step in range(3):
        train_step(model, optimizer, *batch(step))
        manager.save(step, {"model": nnx.state(model), "opt": nnx.state(optimizer)},
                     custom_metadata={"lr": 0.01})
    manager.wait()
    assert manager.all_steps() == [1, 2]
    assert manager.custom_metadata(2) == {"lr": 0.01}
    manager.close()
    assert not [n for n in gcs.names("runs/") if ".part-" in n or "/.shardkeep-tmp" in n]

    other = make_mesh((4, 2), AXES)
    resumed = sk.CheckpointManager(gcs.url("runs/nnx"))
    target = {"model": abstract_state(other),
              "opt": nnx.state(new_optimizer(trained_model(other, steps=0)[0], other))}
    loaded = resumed.load(None, target)
    assert_states_equal(loaded["model"], nnx.state(model))
    assert_states_equal(loaded["opt"], nnx.state(optimizer))
    kernel = loaded["model"]["hidden"]["kernel"].get_value()
    assert kernel.sharding.mesh.devices.shape == (4, 2)
    resumed.close()


def test_unchanged_arrays_are_copied_on_the_server(gcs):
    """The base's data files are copied by the server (rewrite), no byte of
    them through this host; the new checkpoint is whole without the base."""
    mesh = make_mesh((8,), ("x",))
    rng = np.random.default_rng(0)
    state = {"frozen": jax.device_put(rng.normal(size=(512, 1024)).astype(np.float32),
                                      NamedSharding(mesh, P("x", None))),
             "adapter": jax.device_put(rng.normal(size=(512, 8)).astype(np.float32),
                                       NamedSharding(mesh, P("x", None)))}
    a, b = gcs.url("ft/a"), gcs.url("ft/b")
    sk.save(a, state)
    state = {**state, "adapter": state["adapter"] - 1}
    read_before = _core.storage_bytes_read()
    sk.save(b, state, base=a)
    assert _core.storage_bytes_read() - read_before < 64 << 10  # metadata only
    _core.delete_checkpoint(a, sk.Options().to_core())
    assert not gcs.names("ft/a/")
    loaded = sk.load(b, jax.tree.map(lambda x: x, state))
    for name in state:
        assert_same_bits(loaded[name], state[name])


def test_racing_saves_to_one_path_commit_exactly_once(gcs):
    url = gcs.url("race/1")
    results = []

    def save(value):
        try:
            sk.save(url, {"x": np.full(1000, value, np.int32)})
            results.append(value)
        except sk.AlreadyExistsError:
            results.append(None)

    threads = [threading.Thread(target=save, args=(v,)) for v in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [r for r in results if r is not None]
    assert len(winners) == 1, results
    np.testing.assert_array_equal(sk.load(url)["x"], np.full(1000, winners[0], np.int32))


def test_ls_info_gc_and_rm_on_gs(gcs):
    root = gcs.url("runs/7")
    with sk.CheckpointManager(root) as mgr:
        mgr.save(10, {"w": np.arange(1024, dtype=np.float32)}, metrics={"acc": 0.5})
    kill_a_save(root, 20)
    entries = run_json("ls", root)["entries"]
    assert [(e["name"], e["state"]) for e in entries] == [("000000010", "committed"),
                                                          ("000000020", "unfinished")]
    assert entries[0]["files"] == len(gcs.names("runs/7/000000010/"))
    info = run_json("info", f"{root}/000000010")
    assert info["step"] == 10 and info["metrics"] == {"acc": 0.5}
    run("verify", f"{root}/000000010")
    assert "removed 1 leftover" in run("gc", root).stdout
    assert gcs.names("runs/7/000000020/") == []
    run("rm", f"{root}/000000010")
    assert gcs.names("runs/7/") == []


def test_cp_between_file_gs_and_s3_is_bit_exact(gcs, s3, tmp_path):
    tree = {"w": np.arange(64 * 128, dtype=np.float32).reshape(64, 128),
            "k": np.arange(1000, dtype=np.int8)}
    local = tmp_path / "ckpt"
    sk.save(str(local), tree, step=5, options=sk.Options(chunk_bytes=4096, compression="zstd"))
    on_gs, on_s3, back = gcs.url("copies/5"), s3.url("copies/5"), tmp_path / "back"
    run("cp", local, on_gs)
    run("cp", on_gs, on_s3)
    run("cp", on_s3, back)
    assert files_under(back) == files_under(local)
    assert "identical" in run("diff", on_gs, str(local)).stdout.lower()
    loaded = sk.load(str(back))
    np.testing.assert_array_equal(loaded["w"], tree["w"])


def test_per_call_settings_reach_the_emulator_without_the_environment(gcs, gcs_server,
                                                                       monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    options = sk.Options(gcs=sk.GcsSettings(endpoint=gcs_server.endpoint, anonymous=True))
    sk.save(gcs.url("settings/1"), {"a": np.arange(5)}, options=options)
    np.testing.assert_array_equal(sk.load(gcs.url("settings/1"), options=options)["a"],
                                  np.arange(5))


def test_settings_check_their_fields(tmp_path):
    with pytest.raises(sk.InvalidArgumentError, match="endpoint must start with http"):
        sk.GcsSettings(endpoint="storage.googleapis.com")
    with pytest.raises(sk.InvalidArgumentError, match="not both"):
        sk.GcsSettings(credentials_file="/k.json", anonymous=True)
    with pytest.raises(sk.InvalidArgumentError, match="Options.gcs"):
        sk.Options(gcs="gs://x")


def test_a_broken_key_file_is_named_and_its_secret_is_not(gcs, tmp_path, monkeypatch):
    key = tmp_path / "key.json"
    key.write_text(json.dumps({"type": "service_account", "client_email": "sk@p.iam",
                               "private_key": "NOT A PEM secret-material-123",
                               "private_key_id": "k1"}))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
    with pytest.raises(sk.ShardkeepError) as raised:
        sk.save(gcs.url("broken/1"), {"a": np.arange(3)})
    assert str(key) in str(raised.value)
    assert "secret-material-123" not in str(raised.value)


def test_bad_gs_urls_are_refused_with_the_rule():
    with pytest.raises(sk.InvalidArgumentError, match="3 to 63"):
        sk.save("gs://ab/run/1", {"a": np.arange(3)})
    with pytest.raises(sk.InvalidArgumentError, match="names a bucket but no path"):
        sk.save("gs://bucket-only", {"a": np.arange(3)})
    with pytest.raises(sk.InvalidArgumentError, match="segment"):
        sk.save("gs://abc/run//1", {"a": np.arange(3)})


def test_data_files_stay_one_upload_each(gcs):
    """On GCS a writer rolls over to a new data file past 16 MiB, so that each
    file goes up in one request and none is composed from parts."""
    state = {f"w{i}": np.full(3 << 20, i, np.float32) for i in range(8)}  # 8 × 12 MiB
    sk.save(gcs.url("files/1"), state, options=sk.Options(io_threads=1))
    sizes = gcs.sizes("files/1/")
    data = {name: size for name, size in sizes.items() if "/data/" in name}
    assert len(data) >= 6, sizes
    assert max(data.values()) <= 16 << 20, data
    assert not [name for name in sizes if ".part-" in name]
    loaded = sk.load(gcs.url("files/1"))
    for i in range(8):
        np.testing.assert_array_equal(loaded[f"w{i}"], state[f"w{i}"])
