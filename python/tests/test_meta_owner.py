"""The C++ core owns meta.json: it writes what a save hands over and decodes
what a load reads; the Python front builds and reads the core's own typed
PytreeInfo and LeafInfo, never dicts of meta.json."""

import collections
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import shardkeep as sk
from shardkeep import _core
from conftest import make_mesh

Point = collections.namedtuple("Point", ["x", "y"])


class Tokenizer:
    def __init__(self, vocab):
        self.vocab = vocab


def every_kind_of_leaf():
    mesh = make_mesh((2, 4), ("data", "model"))
    return {
        "params": {"w": jax.device_put(jnp.arange(32.0).reshape(4, 8),
                                       NamedSharding(mesh, P("data", "model"))),
                   "a/b~c": jnp.ones((3,), jnp.bfloat16)},
        "rng": jax.random.key(3),
        "point": Point(np.int8(4), [1.5, math.inf, float("nan")]),
        "step": 12, "done": False, "name": "run-ä", "nothing": None,
        7: (np.zeros((0, 2), np.float32),),
    }


def test_the_saved_meta_is_the_cores_encoding_of_what_the_core_decodes(tmp_path):
    sk.save(tmp_path / "c", every_kind_of_leaf())
    text = (tmp_path / "c" / "state" / "meta.json").read_text()
    reader = _core.Reader(str(tmp_path / "c"), _core.Options())
    decoded = reader.pytree("state")
    # Decoding and encoding again reproduce the file byte for byte: one
    # codec, in C++, writes and reads it.
    assert _core.encode_pytree_meta(decoded) == text
    leaves = {leaf.path: leaf for leaf in decoded.leaves}
    assert leaves["params/a~1b~0c"].dtype == "bfloat16"
    assert leaves["rng"].prng_impl == "threefry2x32"
    assert leaves["rng"].shape == [2]
    assert leaves["point/y/1"].kind == _core.LeafKind.SCALAR
    assert leaves["point/y/1"].value == "inf"
    assert leaves["name"].value == "run-ä"
    nothing = leaves["nothing"]
    assert (nothing.kind, nothing.dtype, nothing.shape, nothing.sharding, nothing.value) == (
        _core.LeafKind.NONE, "", [], None, None)
    assert leaves["params/w"].sharding["spec"] == ["data", "model"]
    assert [leaf.index for leaf in decoded.leaves] == list(range(len(decoded.leaves)))
    assert 7 in decoded.tree["keys"]


def test_a_registered_kind_is_kept_through_the_core(tmp_path):
    sk.register_kind("tokenizer", base="json", type=Tokenizer,
                     save=lambda t: {"vocab": t.vocab}, load=lambda v: Tokenizer(v["vocab"]))
    sk.register_kind("tokenizer_tree", base="pytree", type=Point,
                     save=lambda p: {"x": p.x, "y": p.y}, load=lambda v: Point(v["x"], v["y"]))
    sk.save_checkpointables(tmp_path / "c", {"tok": Tokenizer(["a", "b"]), "pt": Point(np.arange(3), 2)})
    reader = _core.Reader(str(tmp_path / "c"), _core.Options())
    assert reader.registered_kind("tok") == "tokenizer"
    assert reader.registered_kind("pt") == reader.pytree("pt").registered_kind == "tokenizer_tree"
    loaded = sk.load_checkpointables(tmp_path / "c")
    assert loaded["tok"].vocab == ["a", "b"]
    np.testing.assert_array_equal(loaded["pt"].x, np.arange(3))


def leaf_meta(path="w", **changes):
    leaf = _core.LeafInfo(path, _core.LeafKind.ARRAY, "float32", [2])
    for name, value in changes.items():
        setattr(leaf, name, value)
    return leaf


def one_leaf(leaf):
    return _core.PytreeInfo({"type": "leaf", "leaf": 0}, [leaf])


@pytest.mark.parametrize("meta, names", [
    (lambda: _core.PytreeInfo({"type": "leaf", "leaf": 1}, [leaf_meta()]), "/tree"),
    (lambda: _core.PytreeInfo({"type": "dict", "keys": ["a", "a"], "children": [
        {"type": "leaf", "leaf": 0}, {"type": "leaf", "leaf": 1}]},
        [leaf_meta("a"), leaf_meta("b")]), "duplicate key"),
    (lambda: one_leaf(leaf_meta(kind=_core.LeafKind.SCALAR, shape=[])), "value"),
    (lambda: one_leaf(leaf_meta(shape=[2**62, 4])), "2\\^63 bytes"),
    (lambda: _core.PytreeInfo({"type": "list", "children": [
        {"type": "leaf", "leaf": 0}, {"type": "leaf", "leaf": 1}]},
        [leaf_meta("w"), leaf_meta("w")]), r'leaf 1 \("w"\): duplicate leaf path'),
])
def test_the_core_refuses_a_bad_meta_naming_what_is_wrong(meta, names):
    with pytest.raises(sk.InvalidArgumentError, match=names):
        _core.encode_pytree_meta(meta())


@pytest.mark.parametrize("build, names", [
    (lambda: leaf_meta(dtype="float33"), "float33"),
    (lambda: leaf_meta(kind=_core.LeafKind.SCALAR, shape=[], value=math.nan), "non-finite"),
    (lambda: leaf_meta(sharding={"spec": object()}), "LeafInfo.sharding.*object"),
    (lambda: _core.encode_value_meta("json", registered_kind=object()), "registered_kind"),
])
def test_a_leaf_is_checked_as_it_is_built(build, names):
    with pytest.raises((sk.InvalidArgumentError, TypeError), match=names):
        build()


def test_nesting_past_the_decoders_bound_is_refused():
    tree = {"type": "leaf", "leaf": 0}
    for _ in range(600):
        tree = {"type": "list", "children": [tree]}
    with pytest.raises(sk.InvalidArgumentError, match="deeper than 512"):
        _core.PytreeInfo(tree, [leaf_meta()])
