"""Loading safetensors files written by the safetensors library onto other
shardings: one file, a folder, an index JSON, on s3://; key maps, casts,
and hostile headers."""

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P
from safetensors.flax import save_file

import shardkeep as sk
from conftest import assert_same_bits, make_mesh


def model_tensors():
    """Host arrays of a small model, with the dtypes models ship in."""
    rng = np.random.default_rng(0)
    return {
        "model.embed.weight": rng.standard_normal((16, 8)).astype(ml_dtypes.bfloat16),
        "model.layers.0.attn.weight": rng.standard_normal((8, 8)).astype(np.float32),
        "model.layers.0.attn.scale": rng.standard_normal((8,)).astype(ml_dtypes.float8_e4m3fn),
        "model.layers.1.attn.weight": rng.standard_normal((8, 8)).astype(np.float32),
        "model.layers.1.attn.scale": rng.standard_normal((8,)).astype(ml_dtypes.float8_e5m2),
        "model.norm.bias": np.arange(8, dtype=np.int32),
        # Rows of 512 bytes in each 2x4 box: read straight into place.
        "lm_head.weight": rng.standard_normal((16, 1024)).astype(ml_dtypes.bfloat16),
    }


def write(path, tensors):
    save_file({k: jnp.asarray(v) for k, v in tensors.items()}, str(path))


def write_sharded(folder, tensors, files=2):
    """Hugging Face's layout: model-0000i-of-0000n.safetensors and an index."""
    names = list(tensors)
    weight_map = {}
    for i in range(files):
        file = f"model-{i + 1:05d}-of-{files:05d}.safetensors"
        part = {k: tensors[k] for k in names[i::files]}
        write(folder / file, part)
        weight_map.update({k: file for k in part})
    total = sum(v.nbytes for v in tensors.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return folder / "model.safetensors.index.json"


def target_of(tensors, sharding_of):
    """A nested-dict target for the tensors, leaves placed by sharding_of."""
    root = {}
    for name, value in tensors.items():
        node = root
        *parents, last = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding_of(value))
    return root


def leaf_at(tree, name):
    for part in name.split("."):
        tree = tree[part]
    return tree


def test_one_file_without_a_target_gives_nested_numpy_dicts(tmp_path):
    tensors = model_tensors()
    write(tmp_path / "model.safetensors", tensors)
    loaded = sk.load_safetensors(tmp_path / "model.safetensors")
    assert set(loaded["model"]["layers"]) == {"0", "1"}
    for name, value in tensors.items():
        got = leaf_at(loaded, name)
        assert isinstance(got, np.ndarray)
        assert_same_bits(got, value)


@pytest.mark.parametrize("layout", ["fsdp", "mesh_2x4", "replicated"])
def test_an_index_of_several_files_loads_onto_shardings(tmp_path, layout):
    tensors = model_tensors()
    index = write_sharded(tmp_path, tensors, files=3)
    if layout == "fsdp":
        mesh = make_mesh((8,), ("fsdp",))
        spec = lambda v: P("fsdp") if v.shape[0] % 8 == 0 else P()
    elif layout == "mesh_2x4":
        mesh = make_mesh((2, 4), ("data", "model"))
        spec = lambda v: P("data", "model") if v.ndim == 2 else P("model")
    else:
        mesh = make_mesh((8,), ("x",))
        spec = lambda v: P()
    target = target_of(tensors, lambda v: NamedSharding(mesh, spec(v)))
    for path in (index, tmp_path):  # the index, or the folder
        loaded = sk.load_safetensors(path, target)
        for name, value in tensors.items():
            got = leaf_at(loaded, name)
            assert isinstance(got, jax.Array)
            assert got.sharding == leaf_at(target, name).sharding
            assert_same_bits(np.asarray(got), value)


def test_key_maps_casts_and_subsets(tmp_path):
    tensors = model_tensors()
    write(tmp_path / "m.safetensors", tensors)
    mesh = make_mesh((8,), ("x",))
    target = {"embedding": jax.ShapeDtypeStruct((16, 8), jnp.float32,
                                                 sharding=NamedSharding(mesh, P("x")))}
    by_dict = sk.load_safetensors(tmp_path / "m.safetensors", target,
                                  key_map={"embedding": "model.embed.weight"})
    by_function = sk.load_safetensors(tmp_path / "m.safetensors", target,
                                      key_map=lambda path: "model.embed.weight")
    want = tensors["model.embed.weight"].astype(np.float32)  # bf16 -> f32 is exact
    for loaded in (by_dict, by_function):
        assert loaded["embedding"].dtype == jnp.float32
        assert_same_bits(np.asarray(loaded["embedding"]), want)


def test_a_target_leaf_without_its_tensor_is_named(tmp_path):
    write(tmp_path / "m.safetensors", model_tensors())
    target = {"model": {"head": jax.ShapeDtypeStruct((8,), jnp.float32)}}
    with pytest.raises(sk.IncompatibleError, match="model.head"):
        sk.load_safetensors(tmp_path / "m.safetensors", target)
    shape = {"model": {"norm": {"bias": jax.ShapeDtypeStruct((9,), jnp.int32)}}}
    with pytest.raises(sk.IncompatibleError, match="norm/bias"):
        sk.load_safetensors(tmp_path / "m.safetensors", shape)


def hostile(tmp_path, header: dict, data: bytes, claimed_length=None):
    text = json.dumps(header).encode()
    length = len(text) if claimed_length is None else claimed_length
    path = tmp_path / "bad.safetensors"
    path.write_bytes(length.to_bytes(8, "little") + text + data)
    return path


@pytest.mark.parametrize("header, data, claimed, names", [
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8, 10**6, "past the end"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12, None, "overlap"),
    ({"w": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2, None, "Q7"),
    ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8, None, "does not fill"),
    ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 4, None, "data area"),
])
def test_hostile_headers_are_corruption_naming_the_file(tmp_path, header, data, claimed, names):
    path = hostile(tmp_path, header, data, claimed)
    with pytest.raises(sk.CorruptionError, match=names) as error:
        sk.load_safetensors(path)
    assert "bad.safetensors" in str(error.value)


def test_an_index_naming_a_file_outside_its_folder_is_refused(tmp_path):
    write(tmp_path / "m.safetensors", model_tensors())
    (tmp_path / "index.json").write_text(json.dumps({"weight_map": {"x": "../m.safetensors"}}))
    with pytest.raises(sk.CorruptionError, match="file name"):
        sk.load_safetensors(tmp_path / "index.json")


def test_on_s3(s3, tmp_path):
    tensors = model_tensors()
    write_sharded(tmp_path, tensors, files=2)
    for file in sorted(tmp_path.iterdir()):
        s3.client.upload_file(str(file), s3.name, f"hf/{file.name}")
    options = sk.Options(s3=s3.settings, timeout_s=30.0)
    mesh = make_mesh((2, 4), ("data", "model"))
    target = target_of(tensors, lambda v: NamedSharding(mesh, P("model")))
    loaded = sk.load_safetensors(s3.url("hf/model.safetensors.index.json"), target,
                                 options=options)
    for name, value in tensors.items():
        assert_same_bits(np.asarray(leaf_at(loaded, name)), value)


def test_sources_convert_the_files_chunk_by_chunk(tmp_path):
    from shardkeep.interop.safetensors import safetensors_sources
    tensors = model_tensors()
    tensors["model.big"] = np.arange(256 * 1024, dtype=np.float32).reshape(256, 1024)
    index = write_sharded(tmp_path, tensors, files=2)
    sources = safetensors_sources(index)
    assert isinstance(sources["model"]["big"], sk.ArraySource)
    sk.save(tmp_path / "converted", sources, options=sk.Options(chunk_bytes=64 << 10))
    loaded = sk.load(tmp_path / "converted")
    for name, value in tensors.items():
        assert_same_bits(leaf_at(loaded, name), value)


def test_load_of_safetensors_names_load_safetensors(tmp_path):
    save_file({"w": jnp.arange(4.0)}, str(tmp_path / "model.safetensors"))
    for path in (tmp_path / "model.safetensors", tmp_path):
        with pytest.raises(sk.NotFoundError, match=r"safetensors.*shardkeep\.load_safetensors"):
            sk.load(path)


def test_partial_false_asks_the_target_to_name_every_tensor(tmp_path):
    tensors = model_tensors()
    write(tmp_path / "m.safetensors", tensors)
    whole = target_of(tensors, lambda shape: None)
    loaded = sk.load_safetensors(tmp_path / "m.safetensors", whole, partial=False)
    assert_same_bits(np.asarray(leaf_at(loaded, "model.norm.bias")), tensors["model.norm.bias"])
    subset = {"lm_head": {"weight": None}}
    # The default loads a subset, reading no other tensor.
    loaded = sk.load_safetensors(tmp_path / "m.safetensors", subset)
    assert_same_bits(loaded["lm_head"]["weight"], tensors["lm_head.weight"])
    with pytest.raises(sk.IncompatibleError) as refused:
        sk.load_safetensors(tmp_path / "m.safetensors", subset, partial=False)
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'm.safetensors'}: tensors the target does not name: ")
    assert "'model.embed.weight'" in message and "'lm_head.weight'" not in message
    assert message.endswith("(partial=False; the default, partial=True, loads a subset)")
