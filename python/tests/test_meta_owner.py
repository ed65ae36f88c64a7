"""The C++ core owns meta.json: it writes what a save hands over and decodes
what a load reads; the Python front builds and reads plain dicts only."""

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
    decoded = reader.meta("state")
    # Decoding and encoding again reproduce the file byte for byte: one
    # codec, in C++, writes and reads it.
    assert _core.encode_meta(decoded) == text
    leaves = {leaf["path"]: leaf for leaf in decoded["leaves"]}
    assert leaves["params/a~1b~0c"]["dtype"] == "bfloat16"
    assert leaves["rng"]["prng_impl"] == "threefry2x32"
    assert leaves["rng"]["shape"] == [2]
    assert leaves["point/y/1"]["value"] == "inf"
    assert leaves["name"]["value"] == "run-ä"
    assert leaves["nothing"] == {"path": "nothing", "kind": "none", "dtype": None,
                                 "shape": None, "sharding": None}
    assert leaves["params/w"]["sharding"] is not None
    assert 7 in decoded["tree"]["keys"]


def test_a_registered_kind_is_kept_through_the_core(tmp_path):
    sk.register_kind("tokenizer", base="json", type=Tokenizer,
                     save=lambda t: {"vocab": t.vocab}, load=lambda v: Tokenizer(v["vocab"]))
    sk.register_kind("tokenizer_tree", base="pytree", type=Point,
                     save=lambda p: {"x": p.x, "y": p.y}, load=lambda v: Point(v["x"], v["y"]))
    sk.save_checkpointables(tmp_path / "c", {"tok": Tokenizer(["a", "b"]), "pt": Point(np.arange(3), 2)})
    reader = _core.Reader(str(tmp_path / "c"), _core.Options())
    assert reader.meta("tok") == {"kind": "json", "registered_kind": "tokenizer"}
    assert reader.meta("pt")["registered_kind"] == "tokenizer_tree"
    loaded = sk.load_checkpointables(tmp_path / "c")
    assert loaded["tok"].vocab == ["a", "b"]
    np.testing.assert_array_equal(loaded["pt"].x, np.arange(3))


def leaf_meta(path="w"):
    return {"path": path, "kind": "array", "dtype": "float32", "shape": [2], "sharding": None}


@pytest.mark.parametrize("meta, names", [
    ({"kind": "pytree", "tree": {"type": "leaf", "leaf": 1}, "leaves": [leaf_meta()]},
     "/tree"),
    ({"kind": "pytree", "tree": {"type": "leaf", "leaf": 0},
      "leaves": [{**leaf_meta(), "dtype": "float33"}]}, "float33"),
    ({"kind": "pytree", "tree": {"type": "dict", "keys": ["a", "a"], "children": [
        {"type": "leaf", "leaf": 0}, {"type": "leaf", "leaf": 1}]},
      "leaves": [leaf_meta("a"), leaf_meta("b")]}, "duplicate key"),
    ({"kind": "pytree", "tree": {"type": "leaf", "leaf": 0},
      "leaves": [{**leaf_meta(), "kind": "scalar", "shape": [], "value": math.nan}]},
     "non-finite"),
    ({"kind": "pytree", "tree": {"type": "leaf", "leaf": 0},
      "leaves": [{**leaf_meta(), "shape": [2**64]}]}, "64 bits"),
    ({"kind": "json", "registered_kind": object()}, "object"),
])
def test_the_core_refuses_a_bad_meta_naming_what_is_wrong(meta, names):
    with pytest.raises(sk.InvalidArgumentError, match=names):
        _core.encode_meta(meta)


def test_nesting_past_the_decoders_bound_is_refused():
    tree = {"type": "leaf", "leaf": 0}
    for _ in range(600):
        tree = {"type": "list", "children": [tree]}
    with pytest.raises(sk.InvalidArgumentError, match="deeper than 512"):
        _core.encode_meta({"kind": "pytree", "tree": tree, "leaves": [leaf_meta()]})
