"""The states the chaos suite saves, each rebuilt from its kind and seed,
and the bit-for-bit comparison of a loaded state with the one saved.

Kinds: ``plain`` (arrays of several dtypes, sharded and not, and Python
scalars and a string, which live in the checkpoint's metadata), ``big``
(plain plus an array of three 8 MiB upload parts, so its data file goes up
as a multipart upload) and ``train`` (a small Flax NNX model after one
optax Adam step: parameters, batch statistics, PRNG keys, optimizer
moments and counters).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

KINDS = ("plain", "big", "train")
_BIG_BYTES = 20 << 20


def _mesh():
    return jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


def build(kind: str, seed: int):
    """The state of ``kind`` for ``seed``: the same values for the same seed."""
    if kind == "train":
        return _train_state(seed)
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(8, 64)) * 4
    sharded = rng.normal(size=(rows, 32)).astype(np.float32)
    tree = {
        "w": jax.device_put(sharded, NamedSharding(_mesh(), P("data", "model"))),
        "bf16": rng.normal(size=(int(rng.integers(1, 300)),)).astype(ml_dtypes.bfloat16),
        "i8": rng.integers(-128, 128, size=(7, 11), dtype=np.int8),
        "u64": rng.integers(0, 1 << 63, size=(5,), dtype=np.uint64),
        "mask": rng.integers(0, 2, size=(13,)).astype(bool),
        "step": int(rng.integers(0, 1 << 40)),
        "lr": float(rng.random()),
        "name": f"run-{seed}-{rng.integers(1 << 30):x}",
    }
    if kind == "big":
        tree["big"] = rng.integers(-(1 << 31), 1 << 31, size=_BIG_BYTES // 4, dtype=np.int32)
    return tree


class _Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        def sharded(*names):
            return nnx.with_partitioning(nnx.initializers.lecun_normal(), names)

        self.hidden = nnx.Linear(16, 32, kernel_init=sharded(None, "model"), rngs=rngs)
        self.norm = nnx.BatchNorm(32, rngs=rngs)
        self.drop = nnx.Dropout(0.1, rngs=rngs)
        self.out = nnx.Linear(32, 4, kernel_init=sharded("model", None), rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(nnx.relu(self.norm(self.hidden(x)))))


@nnx.jit
def _train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    optimizer.update(model, grads)
    return loss


@functools.lru_cache(maxsize=8)
def _train_state(seed: int):
    # Cached: the state is immutable (jax arrays), and a round that saves
    # it again need not train again.
    with jax.set_mesh(_mesh()):
        model = _Model(nnx.Rngs(params=seed, dropout=seed + 1))
        optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    rng = np.random.default_rng(seed)
    _train_step(model, optimizer, jnp.asarray(rng.normal(size=(8, 16)), jnp.float32),
                jnp.asarray(rng.normal(size=(8, 4)), jnp.float32))
    return {"model": nnx.state(model), "optimizer": nnx.state(optimizer)}


def target(state):
    """What a load restores onto: the state's shapes, dtypes and shardings
    (jax arrays), numpy leaves and scalars as they are."""
    return jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding)
        if isinstance(a, jax.Array) else a, state)


def _bits(leaf):
    """Type, dtype, shape and bytes of a leaf; a key array by its key data."""
    if isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            return ("key", str(leaf.dtype), _bits(jax.random.key_data(leaf)))
        array = np.asarray(leaf)
        return ("array", str(array.dtype), array.shape, array.tobytes())
    if isinstance(leaf, float):
        return ("float", np.float64(leaf).tobytes())
    return (type(leaf).__name__, leaf)


def difference(loaded, expected) -> str | None:
    """Where ``loaded`` differs from ``expected`` (None when bit for bit
    equal): the tree's structure, or the first leaf that differs."""
    got, got_tree = jax.tree_util.tree_flatten_with_path(loaded)
    want, want_tree = jax.tree_util.tree_flatten_with_path(expected)
    if got_tree != want_tree:
        return f"the tree differs: loaded {got_tree}, saved {want_tree}"
    for (path, g), (_, w) in zip(got, want):
        a, b = _bits(g), _bits(w)
        if a != b:
            return (f"leaf {jax.tree_util.keystr(path)} differs: loaded "
                    f"{str(a)[:120]}, saved {str(b)[:120]}")
    return None
