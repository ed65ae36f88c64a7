"""Saving and loading on s3:// against a real server (SeaweedFS, see
s3_server.py): every dtype sharded on 8 devices, resharding, partial loads,
casts, metadata, async saves, and configuration by the environment or by
per-call settings."""

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from conftest import assert_same_bits, sample_array, make_mesh
from s3_server import ACCESS_KEY_ID, SECRET_ACCESS_KEY

DTYPES = [
    "bool", "int4", "uint4", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
    "uint64", "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2",
]
# Small chunks, so that every shard is stored as several chunks.
SMALL_CHUNKS = sk.Options(chunk_bytes=256, timeout_s=60.0)


def _sharded(host, mesh, spec):
    return jax.make_array_from_callback(host.shape, NamedSharding(mesh, spec),
                                        lambda index: host[index])


def test_every_dtype_sharded_on_8_devices(s3):
    mesh = make_mesh((8,), ("x",))
    hosts = {name: sample_array(name, (16, 3), seed=i) for i, name in enumerate(DTYPES)}
    key_data = np.asarray(jax.random.key_data(jax.random.split(jax.random.key(3), 8)))
    with jax.enable_x64(True):
        tree = {
            "sharded": {name: _sharded(h, mesh, P("x")) for name, h in hosts.items()},
            "numpy": {name: h[:5] for name, h in hosts.items()},
            "keys": jax.random.wrap_key_data(_sharded(key_data, mesh, P("x"))),
            "zero_d": jnp.asarray(2.5, jnp.float32),
            "empty": jnp.zeros((0, 3), jnp.bfloat16),
            "step": 11, "name": "run-1",
        }
        url = s3.url("dtypes/ckpt")
        sk.save(url, tree, options=SMALL_CHUNKS)
        assert f"dtypes/ckpt/_SHARDKEEP" in s3.keys("dtypes/")
        plain = sk.load(url)
        target = jax.tree.map(lambda a: a, tree)
        placed = sk.load(url, target)
    for name, host in hosts.items():
        assert_same_bits(plain["sharded"][name], host)
        assert_same_bits(plain["numpy"][name], host[:5])
        got = placed["sharded"][name]
        assert got.sharding == tree["sharded"][name].sharding, name
        for shard in got.addressable_shards:
            assert_same_bits(shard.data, host[shard.index])
    assert placed["keys"].dtype == tree["keys"].dtype
    assert placed["keys"].sharding == tree["keys"].sharding
    assert_same_bits(jax.random.key_data(placed["keys"]), key_data)
    assert_same_bits(plain["zero_d"], np.float32(2.5).reshape(()))
    assert_same_bits(plain["empty"], np.zeros((0, 3), ml_dtypes.bfloat16))
    assert plain["step"] == 11 and plain["name"] == "run-1"


def _training_state(mesh):
    w = np.arange(32 * 24, dtype=np.float32).reshape(32, 24) / 7
    b = np.arange(24, dtype=np.float32)
    mu = -w
    return ({"params": {"w": _sharded(w, mesh, P("a", "b")), "b": _sharded(b, mesh, P("b"))},
             "opt": {"mu": _sharded(mu, mesh, P("b", "a")), "count": jnp.asarray(3)}},
            {"w": w, "b": b, "mu": mu})


def test_resharding_partial_loads_and_casts(s3):
    state, host = _training_state(make_mesh((2, 4), ("a", "b")))
    url = s3.url("run/7")
    sk.save_checkpointables(url, {"state": state, "config": sk.JsonValue({"lr": 0.1}),
                                  "loader": b"\x00pos=42\xff"}, step=7, options=SMALL_CHUNKS)
    other = make_mesh((4, 2), ("a", "b"))
    w_sharding = NamedSharding(other, P(None, "a"))
    # A subtree only, onto another mesh, cast to bfloat16.
    part = sk.load(url, {"params": {"w": jax.ShapeDtypeStruct(
        (32, 24), jnp.bfloat16, sharding=w_sharding)}}, partial=True,
        options=sk.Options(allow_lossy_cast=True))
    w = part["params"]["w"]
    assert w.dtype == jnp.bfloat16 and w.sharding == w_sharding
    assert set(part) == {"params"} and set(part["params"]) == {"w"}
    for shard in w.addressable_shards:
        assert_same_bits(shard.data, host["w"].astype(ml_dtypes.bfloat16)[shard.index])
    with pytest.raises(sk.IncompatibleError):  # lossy without permission
        sk.load(url, {"params": {"w": jax.ShapeDtypeStruct((32, 24), jnp.bfloat16)}},
                partial=True)
    # The whole state, resharded everywhere.
    target = {"params": {"w": jax.ShapeDtypeStruct((32, 24), jnp.float32, sharding=w_sharding),
                         "b": jax.ShapeDtypeStruct((24,), jnp.float32,
                                                   sharding=NamedSharding(other, P("a")))},
              "opt": {"mu": jax.ShapeDtypeStruct((32, 24), jnp.float32,
                                                 sharding=NamedSharding(other, P("b", "a"))),
                      "count": jax.ShapeDtypeStruct((), jnp.int32)}}
    whole = sk.load(url, target)
    for got, want in ((whole["params"]["w"], host["w"]), (whole["params"]["b"], host["b"]),
                      (whole["opt"]["mu"], host["mu"])):
        for shard in got.addressable_shards:
            assert_same_bits(shard.data, want[shard.index])
    assert int(whole["opt"]["count"]) == 3
    # One checkpointable alone.
    assert sk.load_checkpointables(url, {"config": None, "loader": None}) == {
        "config": {"lr": 0.1}, "loader": b"\x00pos=42\xff"}


def test_metadata_describes_the_checkpoint_and_its_abstract_tree(s3):
    mesh = make_mesh((2, 4), ("a", "b"))
    state, host = _training_state(mesh)
    url = s3.url("meta/ckpt")
    sk.save(url, state, step=12, custom_metadata={"run": "m"}, options=SMALL_CHUNKS)
    info = sk.metadata(url)
    assert info.path == url and info.step == 12 and info.custom_metadata == {"run": "m"}
    leaves = {leaf.path: leaf for leaf in info.checkpointables["state"].leaves}
    assert leaves["params/w"].dtype == "float32" and leaves["params/w"].shape == (32, 24)
    assert leaves["params/w"].bytes == 32 * 24 * 4
    abstract = info.checkpointables["state"].abstract_tree()
    assert abstract["params"]["w"].sharding == state["params"]["w"].sharding
    loaded = sk.load(url, abstract)
    for shard in loaded["opt"]["mu"].addressable_shards:
        assert_same_bits(shard.data, host["mu"][shard.index])
    with pytest.raises(sk.NotFoundError):
        sk.metadata(s3.url("meta/absent"))


def test_async_save_owns_its_copies(s3):
    mesh = make_mesh((8,), ("x",))
    host = np.arange(64 * 8, dtype=np.float32).reshape(64, 8)
    w = _sharded(host, mesh, P("x"))
    url = s3.url("async/ckpt")
    future = sk.save_async(url, {"w": w, "n": np.arange(5)}, options=SMALL_CHUNKS)
    w.delete()  # the save holds host copies
    future.result()
    assert future.done() and future.path == url
    out = sk.load(url)
    assert_same_bits(out["w"], host)
    assert_same_bits(out["n"], np.arange(5))


def test_an_existing_checkpoint_is_not_overwritten_without_force(s3):
    url = s3.url("exists/ckpt")
    sk.save(url, {"v": np.ones(3)})
    with pytest.raises(sk.AlreadyExistsError, match="exists/ckpt"):
        sk.save(url, {"v": np.zeros(3)})
    assert_same_bits(sk.load(url)["v"], np.ones(3))
    sk.save(url, {"v": np.full(3, 2.0)}, force=True)
    assert_same_bits(sk.load(url)["v"], np.full(3, 2.0))


def _point_environment_nowhere(monkeypatch):
    """The environment names a server that is not there, with other keys."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAENVIRONMENT")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "environment-secret")


def test_per_call_settings_reach_a_server_the_environment_does_not_name(s3, monkeypatch):
    _point_environment_nowhere(monkeypatch)
    options = sk.Options(s3=s3.settings, timeout_s=30.0)
    url = s3.url("override/ckpt")
    tree = {"w": jnp.arange(16.0), "step": 3}
    sk.save(url, tree, options=options)
    sk.save_async(s3.url("override/async"), tree, options=options).result()
    assert_same_bits(sk.load(url, options=options)["w"], np.arange(16.0, dtype=np.float32))
    assert sk.load_checkpointables(s3.url("override/async"), options=options)["state"]["step"] == 3
    leaves = sk.metadata(url, options=options).checkpointables["state"].leaves
    assert [leaf.path for leaf in leaves] == ["w", "step"]
    # Without them the environment's server is used, which is not there.
    with pytest.raises(sk.ShardkeepError):
        sk.load(url, options=sk.Options(timeout_s=2.0))


def test_an_aws_profile_from_the_credentials_file(s3, monkeypatch, tmp_path):
    aws = tmp_path / ".aws"
    aws.mkdir()
    (aws / "credentials").write_text(
        "[default]\naws_access_key_id = AKIADEFAULTWRONG\naws_secret_access_key = wrong\n\n"
        f"[tests]\naws_access_key_id = {ACCESS_KEY_ID}\n"
        f"aws_secret_access_key = {SECRET_ACCESS_KEY}\n")
    (aws / "config").write_text("[profile tests]\nregion = us-east-1\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SHARED_CREDENTIALS_FILE",
                 "AWS_CONFIG_FILE", "AWS_REGION"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_PROFILE", "tests")
    url = s3.url("profile/env")
    sk.save(url, {"v": np.arange(3)})
    assert_same_bits(sk.load(url)["v"], np.arange(3))
    # The same profile named per call, while the environment names another.
    monkeypatch.setenv("AWS_PROFILE", "default")
    options = sk.Options(s3=sk.S3Settings(profile="tests"), timeout_s=30.0)
    assert_same_bits(sk.load(url, options=options)["v"], np.arange(3))
    with pytest.raises(sk.ShardkeepError, match="AKIADEFAULTWRONG"):
        sk.load(url, options=sk.Options(timeout_s=10.0))


def test_settings_hide_secrets_and_check_their_fields():
    settings = sk.S3Settings(endpoint_url="http://127.0.0.1:1", region="auto",
                             access_key_id="AKIAVISIBLE", secret_access_key="s3cr3t-value",
                             session_token="t0ken-value", profile="p")
    for text in (repr(settings), str(settings), repr(sk.Options(s3=settings))):
        assert "AKIAVISIBLE" in text and "http://127.0.0.1:1" in text
        assert "s3cr3t-value" not in text and "t0ken-value" not in text
    core = sk.Options(s3=settings, timeout_s=5.0).to_core()
    assert core.s3.endpoint_url == "http://127.0.0.1:1"
    assert core.s3.secret_access_key == "s3cr3t-value" and core.s3.profile == "p"
    assert "s3cr3t-value" not in repr(core.s3)
    assert sk.Options().to_core().s3.endpoint_url is None
    with pytest.raises(sk.InvalidArgumentError, match="together"):
        sk.S3Settings(access_key_id="AKIAONLY")
    with pytest.raises(sk.InvalidArgumentError, match="endpoint_url"):
        sk.S3Settings(endpoint_url="127.0.0.1:8333")
    with pytest.raises(sk.InvalidArgumentError) as excinfo:
        sk.S3Settings(access_key_id="AKIA", secret_access_key="")
    assert "<hidden>" in str(excinfo.value)
    with pytest.raises(sk.InvalidArgumentError, match="S3Settings"):
        sk.Options(s3={"endpoint_url": "http://x"})


def test_urls_are_taken_as_given(s3):
    # A trailing slash names the same checkpoint.
    sk.save(s3.url("slash/ckpt/"), {"v": np.arange(2)})
    assert_same_bits(sk.load(s3.url("slash/ckpt"))["v"], np.arange(2))
    assert os.environ["AWS_ENDPOINT_URL"] == s3.endpoint_url
