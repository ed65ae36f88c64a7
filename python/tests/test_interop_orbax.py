"""Orbax checkpoints written by orbax-checkpoint itself, in each layout it
has, loaded onto other shardings and converted: bit-exact, every shard."""

import json
import os
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from conftest import assert_same_bits, make_mesh
from shardkeep.interop import orbax as orbax_reader

ocp = pytest.importorskip("orbax.checkpoint")

ODD_KEY = "odd/key~"  # '/' and '~' need escaping in shardkeep key paths


def _host_tree():
    rng = np.random.default_rng(7)
    return {
        "params": {
            "w": rng.normal(size=(16, 8)).astype(np.float32),
            "b": rng.normal(size=(16,)).astype(ml_dtypes.bfloat16),
            "emb": rng.integers(-2**31, 2**31 - 1, (8, 4), dtype=np.int32),
            ODD_KEY: rng.normal(size=(8, 2)).astype(np.float32),
        },
        "layers": [
            {"k": rng.normal(size=(8, 8)).astype(ml_dtypes.bfloat16)},
            {"k": rng.normal(size=(8, 8)).astype(np.float32)},
        ],
    }


def _saved_sharding(shape):
    """How the saved tree is spread over the 8 devices: a 2x4 mesh."""
    mesh = make_mesh((2, 4), ("a", "b"))
    spec = [None] * len(shape)
    if shape[0] % 2 == 0:
        spec[0] = "a"
    if len(shape) > 1 and shape[1] % 4 == 0:
        spec[1] = "b"
    return NamedSharding(mesh, P(*spec))


def _device_tree(host):
    return jax.tree.map(lambda a: jax.device_put(a, _saved_sharding(a.shape)), host)


def _save_standard(path, tree):
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, tree)


def _save_per_array(path, tree):
    checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler(use_ocdbt=False))
    checkpointer.save(path, tree)
    checkpointer.close()


def _save_manager_default(path, tree):
    with ocp.CheckpointManager(path) as manager:
        manager.save(5, args=ocp.args.StandardSave(tree))
        manager.wait_until_finished()
    return os.path.join(path, "5")


def _save_manager_named(path, tree):
    with ocp.CheckpointManager(path, item_names=("state", "config")) as manager:
        manager.save(9, args=ocp.args.Composite(state=ocp.args.StandardSave(tree),
                                                config=ocp.args.JsonSave({"lr": 0.1})))
        manager.wait_until_finished()
    return os.path.join(path, "9", "state")


def _save_v1(path, tree):
    from orbax.checkpoint.experimental import v1
    v1.save(path, tree)  # the pytree goes to <path>/state


# Layout name -> saver. Savers return the path to load when it is not the
# saved path itself.
_LAYOUTS = {
    "standard_ocdbt": _save_standard,
    "per_array_zarr2": _save_per_array,
    "manager_step": _save_manager_default,
    "manager_named_item": _save_manager_named,
    "v1_save": _save_v1,
}


def _has_v1():
    try:
        from orbax.checkpoint.experimental import v1  # noqa: F401
    except ImportError:
        return False
    return hasattr(v1, "save")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each layout saved once from the same tree: {layout: path}, host tree."""
    host = _host_tree()
    tree = dict(_device_tree(host), step=3)
    root = tmp_path_factory.mktemp("orbax")
    paths = {}
    for layout, saver in _LAYOUTS.items():
        if layout == "v1_save" and not _has_v1():
            continue
        path = str(root / layout)
        paths[layout] = saver(path, tree) or path
    return paths, host


def _fsdp(shape):
    return NamedSharding(make_mesh((8,), ("fsdp",)), P("fsdp" if shape[0] % 8 == 0 else None))


def _mesh_2x4(shape):
    mesh = make_mesh((4, 2), ("x", "y"), jax.devices()[::-1])  # another device order
    spec = [None] * len(shape)
    if len(shape) > 1 and shape[1] % 4 == 0:
        spec[1] = "x"
    if shape[0] % 2 == 0:
        spec[0] = "y"
    return NamedSharding(mesh, P(*spec))


def _replicated(shape):
    return NamedSharding(make_mesh((2, 4), ("a", "b")), P())


_TARGETS = {"fsdp_rows": _fsdp, "mesh_2x4": _mesh_2x4, "replicated": _replicated}


def _target(host, sharding_of):
    arrays = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding_of(a.shape)), host)
    return dict(arrays, step=0)


def _assert_shards_exact(array, expected):
    """Every addressable shard holds the expected bytes of its box."""
    assert array.shape == expected.shape
    for shard in array.addressable_shards:
        assert_same_bits(np.asarray(shard.data), expected[shard.index])


def _layout_available(saved, layout):
    paths, _ = saved
    if layout not in paths:
        pytest.skip("this orbax-checkpoint has no v1 save")
    return paths[layout]


@pytest.mark.parametrize("layout", list(_LAYOUTS))
@pytest.mark.parametrize("sharding", list(_TARGETS))
def test_loads_onto_other_shardings_bit_exact(saved, layout, sharding):
    path = _layout_available(saved, layout)
    host = saved[1]
    target = _target(host, _TARGETS[sharding])
    loaded = sk.load_orbax(path, target)
    assert loaded["step"] == 3
    for got, want, struct in zip(jax.tree.leaves(dict(loaded, step=None)),
                                 jax.tree.leaves(host), jax.tree.leaves(dict(target, step=None))):
        assert got.sharding == struct.sharding
        _assert_shards_exact(got, want)


@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_loads_without_target_as_saved(saved, layout):
    path = _layout_available(saved, layout)
    host = saved[1]
    loaded = sk.load_orbax(path)
    assert sorted(loaded) == ["layers", "params", "step"]
    assert isinstance(loaded["layers"], list) and len(loaded["layers"]) == 2
    assert loaded["step"] == 3 and type(loaded["step"]) is int
    jax.tree.map(assert_same_bits, {"params": loaded["params"], "layers": loaded["layers"]},
                 host)


def test_replicated_boxes_are_read_once_and_fsdp_reads_only_own_rows(saved, monkeypatch):
    path = saved[0]["standard_ocdbt"]
    reads = []
    original = orbax_reader.OrbaxSource.read

    def counting_read(source, requests):
        leaves = source.meta().leaves
        reads.extend((leaves[r.leaf].path, tuple(r.origin), tuple(r.shape)) for r in requests)
        return original(source, requests)

    monkeypatch.setattr(orbax_reader.OrbaxSource, "read", counting_read)
    host = saved[1]
    sk.load_orbax(path, _target(host, _replicated))
    w_reads = [r for r in reads if r[0] == "params/w"]
    assert w_reads == [("params/w", (0, 0), (16, 8))]
    reads.clear()
    sk.load_orbax(path, _target(host, _fsdp))
    w_reads = sorted(r for r in reads if r[0] == "params/w")
    assert w_reads == [("params/w", (2 * i, 0), (2, 8)) for i in range(8)]


def test_a_job_saved_by_two_processes_loads_on_four_reading_own_boxes(tmp_path):
    sys.path.insert(0, str(pathlib.Path(__file__).with_name("multiprocess")))
    import harness

    path = str(tmp_path / "ckpt")
    harness.run_job(2, 4, "interop_scenarios:save_orbax", {"path": path}, timeout=240)
    results = harness.run_job(4, 2, "interop_scenarios:load_orbax", {"path": path},
                              timeout=240)
    # w (16x8) on the 2x4 ("data", "model") mesh as P("model", "data"):
    # each process's two devices hold two distinct 4x4 boxes; r (replicated)
    # is read once by each process. The processes' boxes tile w exactly.
    w_boxes = []
    for result in results:
        reads = result["reads"]
        assert [r for r in reads if r[0] == "r"] == [["r", [0], [8]]]
        mine = [tuple(map(tuple, r[1:])) for r in reads if r[0] == "w"]
        assert len(mine) == 2 and all(extent == (4, 4) for _, extent in mine)
        w_boxes += mine
    assert sorted(w_boxes) == [((r, c), (4, 4)) for r in (0, 4, 8, 12) for c in (0, 4)]


def test_key_paths_escape_like_shardkeep(saved):
    loaded = sk.load_orbax(saved[0]["standard_ocdbt"])
    assert ODD_KEY in loaded["params"]
    info_paths = []
    sk.convert(saved[0]["standard_ocdbt"], os.path.join(os.path.dirname(
        saved[0]["standard_ocdbt"]), "escaped"), source_format="orbax")
    for leaf in sk.metadata(os.path.join(os.path.dirname(saved[0]["standard_ocdbt"]),
                                         "escaped")).checkpointables["state"].leaves:
        info_paths.append(leaf.path)
    assert "params/odd~1key~0" in info_paths and "layers/1/k" in info_paths


def test_cast_only_when_the_target_asks_and_lossy_only_when_allowed(saved):
    path = saved[0]["standard_ocdbt"]
    host = saved[1]
    target = _target(host, _replicated)
    target["params"]["w"] = jax.ShapeDtypeStruct((16, 8), jnp.bfloat16,
                                                 sharding=_replicated((16, 8)))
    with pytest.raises(sk.IncompatibleError, match=r"params/w.*float32 to bfloat16.*lossy"):
        sk.load_orbax(path, target)
    loaded = sk.load_orbax(path, target, options=sk.Options(allow_lossy_cast=True))
    assert_same_bits(loaded["params"]["w"], host["params"]["w"].astype(ml_dtypes.bfloat16))
    widened = _target(host, _fsdp)
    widened["params"]["emb"] = jax.ShapeDtypeStruct((8, 4), jnp.int64, sharding=_fsdp((8, 4)))
    with jax.enable_x64(True):
        loaded = sk.load_orbax(path, widened)
        assert_same_bits(loaded["params"]["emb"], host["params"]["emb"].astype(np.int64))


def test_shape_and_tree_mismatches_name_the_leaf(saved):
    path = saved[0]["standard_ocdbt"]
    host = saved[1]
    target = _target(host, _replicated)
    target["params"]["b"] = jax.ShapeDtypeStruct((8,), jnp.bfloat16)
    with pytest.raises(sk.IncompatibleError, match=r"params/b.*shape \(16,\).*\(8,\)"):
        sk.load_orbax(path, target)
    target = _target(host, _replicated)
    del target["params"]["emb"]
    target["extra"] = jax.ShapeDtypeStruct((1,), jnp.float32)
    with pytest.raises(sk.IncompatibleError, match=r"'extra'.*'params/emb'"):
        sk.load_orbax(path, target)


def test_numpy_and_python_targets(saved):
    host = saved[1]
    target = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), host)
    loaded = sk.load_orbax(saved[0]["per_array_zarr2"], dict(target, step=0))
    assert isinstance(loaded["params"]["w"], np.ndarray)
    jax.tree.map(assert_same_bits, {"params": loaded["params"], "layers": loaded["layers"]},
                 host)
    assert loaded["step"] == 3 and type(loaded["step"]) is int


@pytest.mark.parametrize("layout", ["standard_ocdbt", "per_array_zarr2"])
def test_convert_then_load_bit_exact(saved, layout, tmp_path):
    dst = str(tmp_path / "converted")
    sk.convert(saved[0][layout], dst, source_format="orbax")
    host = saved[1]
    loaded = sk.load(dst, _target(host, _mesh_2x4))
    assert loaded["step"] == 3
    for got, want in zip(jax.tree.leaves({"p": loaded["params"], "l": loaded["layers"]}),
                         jax.tree.leaves({"p": host["params"], "l": host["layers"]})):
        _assert_shards_exact(got, want)
    plain = sk.load(dst)
    assert isinstance(plain["layers"], list)
    jax.tree.map(assert_same_bits, plain["params"], host["params"])


def test_strings_none_and_empty_containers(tmp_path):
    tree = {"note": "hello", "nothing": None, "empty": {}, "none_yet": [],
            "x": np.arange(3, dtype=np.int16), "rate": 0.25}
    with ocp.PyTreeCheckpointer() as checkpointer:
        checkpointer.save(str(tmp_path / "ckpt"), tree)
    loaded = sk.load_orbax(tmp_path / "ckpt")
    assert loaded == {"note": "hello", "nothing": None, "empty": {}, "none_yet": [],
                      "x": loaded["x"], "rate": 0.25}
    assert_same_bits(loaded["x"], tree["x"])
    dst = str(tmp_path / "converted")
    sk.convert(tmp_path / "ckpt", dst)
    again = sk.load(dst)
    assert again["note"] == "hello" and again["nothing"] is None and again["rate"] == 0.25
    assert_same_bits(again["x"], tree["x"])
    target = {"note": "", "nothing": None, "x": np.zeros(3, np.int16), "rate": 0.0}
    assert sk.load_orbax(tmp_path / "ckpt", target)["note"] == "hello"


def test_optax_state_loads_into_its_own_classes(tmp_path):
    optax = pytest.importorskip("optax")
    params = {"w": jnp.arange(16.0).reshape(8, 2), "b": jnp.ones(2, jnp.bfloat16)}
    optimizer = optax.adam(1e-2)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
    _, opt_state = optimizer.update(grads, optimizer.init(params), params)
    state = {"params": params, "opt": opt_state}  # (ScaleByAdamState, EmptyState)
    _save_standard(str(tmp_path / "ckpt"), state)
    target = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=_fsdp(a.shape or (1,))
                                       if a.ndim else _replicated(())), state)
    loaded = sk.load_orbax(tmp_path / "ckpt", target)
    assert jax.tree.structure(loaded) == jax.tree.structure(state)
    jax.tree.map(lambda got, want: assert_same_bits(got, want), loaded, state)


def test_a_checkpoint_manager_root_or_several_items_ask_for_one(saved):
    step = saved[0]["manager_named_item"]  # <root>/9/state
    step_dir, root = os.path.dirname(step), os.path.dirname(os.path.dirname(step))
    assert sk.load_orbax(step_dir)["step"] == 3  # the only pytree item of step 9
    with pytest.raises(sk.InvalidArgumentError, match=r"CheckpointManager.*9"):
        sk.load_orbax(root)
    with pytest.raises(sk.NotFoundError, match="no Orbax checkpoint"):
        sk.load_orbax(os.path.join(root, "nowhere"))


def test_several_pytree_items_are_listed(tmp_path):
    with ocp.CheckpointManager(str(tmp_path), item_names=("a", "b")) as manager:
        manager.save(1, args=ocp.args.Composite(a=ocp.args.StandardSave({"x": np.ones(2)}),
                                                b=ocp.args.StandardSave({"y": np.ones(3)})))
        manager.wait_until_finished()
    with pytest.raises(sk.InvalidArgumentError, match=r"several Orbax items \(a, b\)"):
        sk.load_orbax(tmp_path / "1")
    assert_same_bits(sk.load_orbax(tmp_path / "1" / "b")["y"], np.ones(3))


def test_v1_checkpointables_are_items_to_choose_from(tmp_path):
    if not _has_v1():
        pytest.skip("this orbax-checkpoint has no v1 API")
    from orbax.checkpoint.experimental import v1
    v1.save_checkpointables(str(tmp_path / "ckpt"), {"params": {"w": np.arange(3.0)},
                                                      "opt": {"m": np.zeros(3, np.int8)}})
    with pytest.raises(sk.InvalidArgumentError, match=r"several Orbax items \(opt, params\)"):
        sk.load_orbax(tmp_path / "ckpt")
    assert_same_bits(sk.load_orbax(tmp_path / "ckpt" / "params")["w"], np.arange(3.0))


def _fresh_per_array_checkpoint(tmp_path):
    path = str(tmp_path / "ckpt")
    _save_per_array(path, {"w": np.arange(64, dtype=np.float32).reshape(8, 8),
                           "v": np.arange(4, dtype=np.int32)})
    return path


def test_missing_array_is_named(tmp_path):
    path = _fresh_per_array_checkpoint(tmp_path)
    import shutil
    shutil.rmtree(os.path.join(path, "w"))
    with pytest.raises(sk.NotFoundError, match=r"leaf 'w' \(array 'w'\).*does not exist"):
        sk.load_orbax(path)


def test_missing_chunk_is_named_not_zero_filled(tmp_path):
    path = _fresh_per_array_checkpoint(tmp_path)
    chunks = [f for f in os.listdir(os.path.join(path, "w")) if not f.startswith(".")]
    os.remove(os.path.join(path, "w", chunks[0]))
    with pytest.raises(sk.NotFoundError, match=r"leaf 'w' \(array 'w'\).*chunk.*is missing"):
        sk.load_orbax(path)


def test_truncated_chunk_is_corruption_naming_the_leaf(tmp_path):
    path = _fresh_per_array_checkpoint(tmp_path)
    chunks = [f for f in os.listdir(os.path.join(path, "w")) if not f.startswith(".")]
    chunk = os.path.join(path, "w", chunks[0])
    with open(chunk, "r+b") as f:
        f.truncate(os.path.getsize(chunk) // 2)
    with pytest.raises(sk.CorruptionError, match=r"leaf 'w' \(array 'w'\)"):
        sk.load_orbax(path)


def test_truncated_ocdbt_data_is_corruption(tmp_path):
    path = str(tmp_path / "ckpt")
    _save_standard(path, {"w": np.arange(4096, dtype=np.float32)})
    data = [os.path.join(d, f) for d, _, files in os.walk(path) for f in files
            if os.sep + "d" + os.sep in os.path.join(d, f) + os.sep and "process" in d]
    assert data
    for file in data:
        with open(file, "r+b") as f:
            f.truncate(os.path.getsize(file) // 2)
    with pytest.raises(sk.CorruptionError, match=r"leaf 'w'"):
        sk.load_orbax(path)


def test_unreadable_metadata_is_corruption(tmp_path):
    path = _fresh_per_array_checkpoint(tmp_path)
    with open(os.path.join(path, "_METADATA"), "w") as f:
        f.write("{not json")
    with pytest.raises(sk.CorruptionError, match=r"_METADATA is not valid JSON"):
        sk.load_orbax(path)


def test_a_list_with_a_gap_in_metadata_is_corruption(tmp_path):
    path = str(tmp_path / "ckpt")
    _save_per_array(path, {"layers": [np.zeros(2, np.int8), np.ones(2, np.int8)]})
    with open(os.path.join(path, "_METADATA")) as f:
        meta = json.load(f)
    del meta["tree_metadata"]["('layers', '0')"]
    with open(os.path.join(path, "_METADATA"), "w") as f:
        json.dump(meta, f)
    with pytest.raises(sk.CorruptionError, match=r"list 'layers' has positions \['1'\]"):
        sk.load_orbax(path)


def test_missing_tensorstore_is_a_clear_import_error(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "tensorstore", None)
    with pytest.raises(ImportError, match=r"tensorstore.*shardkeep\[orbax\]"):
        sk.load_orbax(tmp_path)


@pytest.fixture(scope="module")
def trainer_step(tmp_path_factory):
    """A CheckpointManager step as a trainer writes it: typed PRNG keys
    (stored by Orbax as uint32 key data with random_key_impl recorded)
    beside parameters and a Python step count."""
    root = str(tmp_path_factory.mktemp("trainer") / "run")
    keys = jax.random.split(jax.random.key(42), 2)
    state = {"rng": keys, "params": {"w": jnp.arange(12.0).reshape(3, 4)}, "step": 7}
    with ocp.CheckpointManager(root) as manager:
        manager.save(7, args=ocp.args.StandardSave(state))
        manager.wait_until_finished()
    return os.path.join(root, "7"), keys


def _assert_same_keys(got, want):
    assert jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key)
    assert jax.random.key_impl(got) == jax.random.key_impl(want)
    assert_same_bits(np.asarray(jax.random.key_data(got)), np.asarray(jax.random.key_data(want)))


def test_typed_keys_load_onto_a_typed_key_target_and_without_one(trainer_step):
    path, keys = trainer_step
    target = {"rng": jax.ShapeDtypeStruct(keys.shape, keys.dtype,
                                          sharding=_replicated(keys.shape)),
              "params": {"w": jax.ShapeDtypeStruct((3, 4), jnp.float32)}, "step": 0}
    loaded = sk.load_orbax(path, target)
    _assert_same_keys(loaded["rng"], keys)
    assert loaded["rng"].sharding.is_equivalent_to(target["rng"].sharding, 1)
    _assert_same_keys(sk.load_orbax(path)["rng"], keys)
    # Key data as it is stored still loads onto a uint32 target.
    target["rng"] = jax.ShapeDtypeStruct((2, 2), jnp.uint32)
    assert_same_bits(np.asarray(sk.load_orbax(path, target)["rng"]),
                     np.asarray(jax.random.key_data(keys)))


def test_convert_keeps_typed_keys_and_the_step(trainer_step, tmp_path):
    path, keys = trainer_step
    dst = str(tmp_path / "converted")
    sk.convert(path, dst)
    assert sk.metadata(dst).step == 7
    loaded = sk.load(dst)
    _assert_same_keys(loaded["rng"], keys)
    assert loaded["step"] == 7
    explicit = str(tmp_path / "explicit")
    sk.convert(os.path.join(path, "default"), explicit, step=100)
    assert sk.metadata(explicit).step == 100


def test_convert_of_an_item_outside_a_step_folder_has_no_step(saved, tmp_path):
    dst = str(tmp_path / "converted")
    sk.convert(saved[0]["standard_ocdbt"], dst)
    assert sk.metadata(dst).step is None


def test_load_of_an_orbax_folder_names_load_orbax(trainer_step):
    path, _ = trainer_step
    for folder in (path, os.path.dirname(path), os.path.join(path, "default")):
        with pytest.raises(sk.NotFoundError, match=r"Orbax .*shardkeep\.load_orbax"):
            sk.load(folder)


def test_metadata_of_an_orbax_folder_says_what_it_is_and_names_load_orbax(trainer_step):
    path, _ = trainer_step
    for folder in (path, os.path.join(path, "default")):
        with pytest.raises(sk.NotFoundError) as caught:
            sk.metadata(folder)
        message = str(caught.value)
        assert "_SHARDKEEP" not in message
        assert f"{folder} is an Orbax checkpoint, not a shardkeep checkpoint" in message
        assert f"shardkeep.load_orbax({folder!r}, target)" in message


def _suggested_load_orbax(message):
    """The path of the first load_orbax call a message suggests."""
    match = re.search(r"shardkeep\.load_orbax\('([^']+)', target\)", message)
    assert match, message
    return match.group(1)


def _save_steps(root, steps, **options):
    with ocp.CheckpointManager(root, options=ocp.CheckpointManagerOptions(**options)) as manager:
        for step in steps:
            manager.save(step, args=ocp.args.StandardSave({"w": np.full(3, float(step))}))
        manager.wait_until_finished()


@pytest.mark.parametrize("prefix", [None, "ckpt"])
def test_a_root_where_a_step_is_wanted_names_its_steps_and_a_call_that_works(tmp_path, prefix):
    root = str(tmp_path / "run")
    _save_steps(root, [0, 2, 10], step_prefix=prefix)
    latest = os.path.join(root, f"{prefix}_10" if prefix else "10")
    for call, error in ((sk.load, sk.NotFoundError), (sk.metadata, sk.NotFoundError),
                        (sk.load_orbax, sk.InvalidArgumentError)):
        with pytest.raises(error) as caught:
            call(root)
        message = str(caught.value)
        assert f"{root} is the root of an Orbax CheckpointManager" in message
        assert "3 step(s): 0, 2, 10" in message
        assert f"shardkeep.CheckpointManager({root!r})" in message
        suggested = _suggested_load_orbax(message)
        assert suggested == latest
        assert_same_bits(sk.load_orbax(suggested)["w"], np.full(3, 10.0))


def test_a_root_of_many_steps_names_the_first_and_last(tmp_path):
    root = str(tmp_path / "run")
    _save_steps(root, range(10))
    with pytest.raises(sk.InvalidArgumentError, match=r"10 step\(s\): 0, 1, 2, \.\.\., 7, 8, 9\."):
        sk.load_orbax(root)


def test_a_step_of_several_items_suggests_one_item(tmp_path):
    with ocp.CheckpointManager(str(tmp_path), item_names=("a", "b")) as manager:
        manager.save(1, args=ocp.args.Composite(a=ocp.args.StandardSave({"x": np.ones(2)}),
                                                b=ocp.args.StandardSave({"y": np.ones(3)})))
        manager.wait_until_finished()
    with pytest.raises(sk.NotFoundError) as caught:
        sk.load(tmp_path / "1")
    assert "item by item (it has a, b)" in str(caught.value)
    suggested = _suggested_load_orbax(str(caught.value))
    assert_same_bits(sk.load_orbax(suggested)["x"], np.ones(2))


def test_casts_are_refused_as_native_loads_refuse_them(saved, tmp_path):
    """The same rule (the core's) and words as a shardkeep checkpoint's."""
    path = saved[0]["standard_ocdbt"]
    native = str(tmp_path / "native")
    sk.save(native, {"w": saved[1]["params"]["w"]})
    for dtype in (jnp.int32, jnp.bfloat16):
        target = jax.ShapeDtypeStruct((16, 8), dtype)
        with pytest.raises(sk.IncompatibleError) as native_error:
            sk.load(native, {"w": target})
        orbax_target = _target(saved[1], _replicated)
        orbax_target["params"]["w"] = target
        with pytest.raises(sk.IncompatibleError) as orbax_error:
            sk.load_orbax(path, orbax_target)
        native_message = str(native_error.value)
        reason = native_message[native_message.index("cannot cast float32"):]
        assert str(orbax_error.value).endswith(reason)
        assert "'params/w'" in str(orbax_error.value)


def test_params_only_onto_a_new_mesh_with_partial(tmp_path, monkeypatch):
    """The params of a Flax NNX + optax state saved by Orbax's
    CheckpointManager, alone, onto another mesh: no other array is read."""
    pytest.importorskip("flax")
    import orbax_trainer

    root = tmp_path / "run"
    saved_mesh = make_mesh((2, 4), ("data", "model"))
    _, states = orbax_trainer.orbax_steps(root, saved_mesh, [5])
    new_mesh = make_mesh((4, 2), ("data", "model"))
    target = orbax_trainer.abstract_training_state(new_mesh)
    path = f"{root}/5"
    with pytest.raises(sk.IncompatibleError, match=r"tree mismatch; checkpoint leaves not in"
                                                   r" the target: 'opt/opt_state/0/count/value'.*"
                                                   r"\(pass partial=True to load a subset\)"):
        sk.load_orbax(path, {"params": target["params"]})
    read = set()
    original = orbax_reader.OrbaxSource.read

    def recording_read(source, requests):
        read.update(source.meta().leaves[r.leaf].path for r in requests)
        return original(source, requests)

    monkeypatch.setattr(orbax_reader.OrbaxSource, "read", recording_read)
    loaded = sk.load_orbax(path, {"params": target["params"]}, partial=True)
    assert list(loaded) == ["params"]
    assert read and all(leaf.startswith("params/") for leaf in read)
    kernel = loaded["params"]["hidden"]["kernel"].get_value()
    assert kernel.sharding == NamedSharding(new_mesh, P(None, "model"))
    assert not kernel.sharding.is_equivalent_to(NamedSharding(saved_mesh, P(None, "model")), 2)
    for got, want in zip(jax.tree.leaves(loaded["params"]), jax.tree.leaves(states[5]["params"])):
        assert_same_bits(np.asarray(got), want)
