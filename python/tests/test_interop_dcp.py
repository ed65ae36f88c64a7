"""PyTorch DCP checkpoints written by torch itself, converted to shardkeep
and loaded onto several shardings: bit-exact, pickles only on request."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from conftest import assert_same_bits, make_mesh

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

# DCP warns on every save outside a process group; these tests save that way.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _as_numpy(tensor):
    """The tensor's bits as numpy (bfloat16 through an int16 view)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _state_dict():
    gen = torch.Generator().manual_seed(3)
    return {
        "model": {  # a module's state dict: its keys are dotted FQNs
            "layers.0.weight": torch.randn(16, 8, generator=gen).to(torch.bfloat16),
            "layers.0.bias": torch.randn(16, generator=gen),
            "embed.weight": torch.randint(-2**62, 2**62, (8, 4), generator=gen),
        },
        "optim": {
            "step": 7, "lr": 0.5, "name": "adamw",
            "buffers": [torch.randn(8, generator=gen),
                        torch.randn(2, 2, generator=gen).to(torch.float16)],
        },
        "top": torch.randn(8, 8, generator=gen, dtype=torch.float64),
    }


def _expected(sd):
    """The shardkeep tree a conversion gives: DCP's nesting, FQNs as keys."""
    model = {k: _as_numpy(v) for k, v in sd["model"].items()}
    optim = dict(sd["optim"], buffers=[_as_numpy(t) for t in sd["optim"]["buffers"]])
    return {"model": model, "optim": optim, "top": _as_numpy(sd["top"])}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("dcp") / "ckpt")
    sd = _state_dict()
    expected = _expected(sd)  # before saving: DCP may not touch the tensors, but be sure
    dcp.save(sd, checkpoint_id=path, no_dist=True)
    return path, expected


def test_refuses_without_allow_pickle_and_says_why(saved, tmp_path):
    with pytest.raises(sk.InvalidArgumentError,
                       match=r"unpickling its \.metadata.*allow_pickle=True.*trust"):
        sk.convert(saved[0], str(tmp_path / "out"), source_format="dcp")
    assert not os.path.exists(tmp_path / "out")


def test_convert_keeps_nesting_values_and_bits(saved, tmp_path):
    path, expected = saved
    dst = str(tmp_path / "out")
    sk.convert(path, dst, source_format="dcp", allow_pickle=True)
    loaded = sk.load(dst)
    assert sorted(loaded) == ["model", "optim", "top"]
    assert sorted(loaded["model"]) == sorted(expected["model"])
    assert loaded["optim"]["step"] == 7 and loaded["optim"]["lr"] == 0.5
    assert loaded["optim"]["name"] == "adamw"
    assert isinstance(loaded["optim"]["buffers"], list)
    jax.tree.map(assert_same_bits, loaded["model"], expected["model"])
    jax.tree.map(assert_same_bits, loaded["optim"]["buffers"], expected["optim"]["buffers"])
    assert_same_bits(loaded["top"], expected["top"])
    paths = [leaf.path for leaf in sk.metadata(dst).checkpointables["state"].leaves]
    assert "model/layers.0.weight" in paths and "optim/buffers/1" in paths


def _fsdp(shape):
    return NamedSharding(make_mesh((8,), ("fsdp",)), P("fsdp" if shape[0] % 8 == 0 else None))


def _mesh_2x4(shape):
    spec = ["x" if shape[0] % 2 == 0 else None] + [None] * (len(shape) - 1)
    if len(shape) > 1 and shape[1] % 4 == 0:
        spec[1] = "y"
    return NamedSharding(make_mesh((2, 4), ("x", "y")), P(*spec))


def _replicated(shape):
    return NamedSharding(make_mesh((2, 4), ("x", "y")), P())


@pytest.fixture(scope="module")
def converted(saved, tmp_path_factory):
    dst = str(tmp_path_factory.mktemp("dcp_converted") / "out")
    sk.convert(saved[0], dst, source_format="dcp", allow_pickle=True)
    return dst


@pytest.mark.parametrize("sharding_of", [_fsdp, _mesh_2x4, _replicated],
                         ids=["fsdp_rows", "mesh_2x4", "replicated"])
def test_converted_loads_onto_shardings_bit_exact(saved, converted, sharding_of):
    expected = saved[1]
    arrays = {"model": expected["model"], "top": expected["top"],
              "optim": {"buffers": expected["optim"]["buffers"]}}
    target = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding_of(a.shape)), arrays)
    with jax.enable_x64(True):  # int64 and float64 leaves stay themselves
        loaded = sk.load(converted, target, partial=True)
        for got, want, struct in zip(jax.tree.leaves(loaded), jax.tree.leaves(arrays),
                                     jax.tree.leaves(target)):
            assert got.sharding == struct.sharding
            for shard in got.addressable_shards:
                assert_same_bits(np.asarray(shard.data), want[shard.index])


def test_every_torch_dtype_with_a_numpy_form_keeps_its_bits(tmp_path):
    gen = torch.Generator().manual_seed(5)
    raw = torch.randint(0, 256, (6, 4), dtype=torch.uint8, generator=gen)
    names = ["bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
             "uint64", "float16", "bfloat16", "float32", "float64", "complex64",
             "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
             "float8_e5m2fnuz", "float8_e8m0fnu"]
    sd = {}
    for name in names:  # arbitrary bit patterns (NaNs included), 6x4 elements each
        dtype = getattr(torch, name)
        size = torch.empty((), dtype=dtype).element_size()
        sd[name] = raw.repeat(1, size).view(dtype) if name != "bool" else raw > 127
    path = str(tmp_path / "ckpt")
    dcp.save(sd, checkpoint_id=path, no_dist=True)
    dst = str(tmp_path / "out")
    sk.convert(path, dst, source_format="dcp", allow_pickle=True)
    loaded = sk.load(dst)
    for name in names:
        want = sd[name]
        assert loaded[name].dtype.name == name
        assert loaded[name].shape == tuple(want.shape)
        bits = want.view(torch.uint8) if name != "bool" else want.to(torch.uint8)
        assert loaded[name].tobytes() == bits.numpy().tobytes(), name


_SHARDED_SAVE = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    rank, path, init = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    full = torch.arange(12 * 6, dtype=torch.float32).reshape(12, 6).to(torch.bfloat16)
    dcp.save({"w": distribute_tensor(full, mesh, [Shard(0)]),
              "v": distribute_tensor(torch.arange(10), mesh, [Shard(0)])}, checkpoint_id=path)
    dist.destroy_process_group()
    # Skip the interpreter's teardown, where gloo's threads can abort the
    # process after its work is done (a known race of gloo's shutdown).
    sys.stdout.flush()
    os._exit(0)
""")


def test_chunks_written_by_two_ranks_are_assembled(tmp_path):
    path, init = str(tmp_path / "ckpt"), f"file://{tmp_path / 'rendezvous'}"
    script = tmp_path / "save.py"
    script.write_text(_SHARDED_SAVE)
    ranks = [subprocess.Popen([sys.executable, str(script), str(r), path, init])
             for r in range(2)]
    assert [p.wait(timeout=120) for p in ranks] == [0, 0]
    assert sorted(f for f in os.listdir(path) if f.endswith(".distcp")) == [
        "__0_0.distcp", "__1_0.distcp"]
    dst = str(tmp_path / "out")
    sk.convert(path, dst, source_format="dcp", allow_pickle=True)
    loaded = sk.load(dst)
    full = torch.arange(12 * 6, dtype=torch.float32).reshape(12, 6).to(torch.bfloat16)
    assert_same_bits(loaded["w"], _as_numpy(full))
    assert_same_bits(loaded["v"], np.arange(10, dtype=np.int64))


def _small_checkpoint(tmp_path):
    path = str(tmp_path / "ckpt")
    dcp.save({"w": torch.arange(64, dtype=torch.float32)}, checkpoint_id=path, no_dist=True)
    return path


def test_convert_reads_each_key_once_through_the_source(tmp_path, monkeypatch):
    """Conversion asks the source as a load does (``Source.read``), each
    DCP key once, whole, however many boxes the writers cut it into."""
    from shardkeep.interop import dcp as dcp_reader

    path = str(tmp_path / "ckpt")
    dcp.save({"w": torch.arange(4096, dtype=torch.float32).reshape(64, 64)},
             checkpoint_id=path, no_dist=True)
    reads = []
    read = dcp_reader.DcpSource.read

    def counting_read(self, requests):
        reads.append([(tuple(r.origin), tuple(r.shape)) for r in requests])
        read(self, requests)

    monkeypatch.setattr(dcp_reader.DcpSource, "read", counting_read)
    dst = str(tmp_path / "out")
    sk.convert(path, dst, source_format="dcp", allow_pickle=True,
               options=sk.Options(chunk_bytes=1024))  # many boxes of one key
    assert reads == [[((0, 0), (64, 64))]]
    assert_same_bits(sk.load(dst)["w"], np.arange(4096, dtype=np.float32).reshape(64, 64))


def test_missing_data_file_is_named(tmp_path):
    path = _small_checkpoint(tmp_path)
    os.remove(os.path.join(path, "__0_0.distcp"))
    with pytest.raises(sk.NotFoundError, match=r"key 'w'.*__0_0\.distcp"):
        sk.convert(path, str(tmp_path / "out"), source_format="dcp", allow_pickle=True)


def test_truncated_data_is_corruption_naming_key_and_file(tmp_path):
    path = _small_checkpoint(tmp_path)
    data = os.path.join(path, "__0_0.distcp")
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    with pytest.raises(sk.CorruptionError, match=r"key 'w'.*__0_0\.distcp"):
        sk.convert(path, str(tmp_path / "out"), source_format="dcp", allow_pickle=True)
    assert not os.path.exists(tmp_path / "out")


def test_missing_metadata_is_named(tmp_path):
    path = _small_checkpoint(tmp_path)
    os.remove(os.path.join(path, ".metadata"))
    with pytest.raises(sk.NotFoundError, match=r"\.metadata is missing"):
        sk.convert(path, str(tmp_path / "out"), source_format="dcp", allow_pickle=True)


def test_missing_torch_is_a_clear_import_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ImportError, match=r"torch.*shardkeep\[dcp\]"):
        sk.convert(tmp_path, str(tmp_path / "out"), source_format="dcp", allow_pickle=True)


def test_load_dcp_onto_shardings_with_casts_as_native_loads(saved):
    path, expected = saved
    mesh = make_mesh((2, 4), ("a", "b"))

    def sharding(shape):
        return NamedSharding(mesh, P("a" if shape[0] % 2 == 0 else None))

    def target_of(value):
        if not isinstance(value, np.ndarray):
            return value  # Python values: a target of their own type
        if value.dtype.itemsize == 8:  # jax without x64 has no 64-bit arrays
            return np.zeros_like(value)
        return jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding(value.shape))

    target = jax.tree.map(target_of, expected)
    loaded = sk.load_dcp(path, target, allow_pickle=True)
    for got, want in zip(jax.tree.leaves(loaded), jax.tree.leaves(expected)):
        if isinstance(want, np.ndarray) and want.dtype.itemsize != 8:
            assert got.sharding == sharding(want.shape)
        assert_same_bits(np.asarray(got), np.asarray(want))
    target["top"] = jax.ShapeDtypeStruct((8, 8), jnp.float32)
    with pytest.raises(sk.IncompatibleError, match=r"'top'.*cannot cast float64 to float32"
                                                   r" without allow_lossy_cast"):
        sk.load_dcp(path, target, allow_pickle=True)
    loaded = sk.load_dcp(path, target, allow_pickle=True,
                         options=sk.Options(allow_lossy_cast=True))
    assert_same_bits(np.asarray(loaded["top"]), expected["top"].astype(np.float32))


def test_load_dcp_refuses_without_allow_pickle(saved):
    with pytest.raises(sk.InvalidArgumentError, match="allow_pickle=True"):
        sk.load_dcp(saved[0])


def test_convert_finds_the_dcp_format_itself(saved, converted, tmp_path):
    dst = str(tmp_path / "found")
    sk.convert(saved[0], dst, allow_pickle=True)
    assert sk.metadata(dst).checkpointables["state"].leaves == \
        sk.metadata(converted).checkpointables["state"].leaves


def test_load_or_metadata_of_a_dcp_folder_names_load_dcp(saved):
    for call in (sk.load, sk.metadata):
        with pytest.raises(sk.NotFoundError,
                           match=r"DCP checkpoint.*read-only.*shardkeep\.load_dcp"):
            call(saved[0])


def test_load_dcp_partial_loads_the_keys_the_target_names(saved):
    path, expected = saved
    mesh = make_mesh((8,), ("x",))
    weight = expected["model"]["layers.0.weight"]
    target = {"model": {"layers.0.weight": jax.ShapeDtypeStruct(
        weight.shape, weight.dtype, sharding=NamedSharding(mesh, P("x")))}}
    with pytest.raises(sk.IncompatibleError, match=r"checkpoint leaves not in the target: .*"
                                                   r"'optim/step'.*\(pass partial=True to load"
                                                   r" a subset\)"):
        sk.load_dcp(path, target, allow_pickle=True)
    loaded = sk.load_dcp(path, target, allow_pickle=True, partial=True)
    assert list(loaded) == ["model"] and list(loaded["model"]) == ["layers.0.weight"]
    got = loaded["model"]["layers.0.weight"]
    assert got.sharding == target["model"]["layers.0.weight"].sharding
    assert_same_bits(np.asarray(got), weight)
