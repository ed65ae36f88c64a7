"""A small causal transformer language model, its data and its training step.

Everything is deterministic: parameters come from a fixed key, and batch
``s`` is generated from the seed and ``s`` alone, so a run resumed at step
``s`` sees exactly the data an uninterrupted run sees.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 256
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    d_ff: int = 256
    seq: int = 32
    batch: int = 16
    learning_rate: float = 3e-3
    seed: int = 0


def make_mesh(shape: tuple[int, int]) -> Mesh:
    """A ("data", "model") mesh over the first devices."""
    count = shape[0] * shape[1]
    return Mesh(np.array(jax.devices()[:count]).reshape(shape), ("data", "model"))


def init_params(config: Config) -> dict:
    """Fresh parameters as numpy arrays (on the host: compiling a sharded
    random-number generator would take longer than the whole training)."""
    rng = np.random.default_rng(config.seed)
    d, f = config.d_model, config.d_ff

    def normal(shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def dense(shape):
        return normal(shape, 1 / np.sqrt(shape[0]))

    params = {
        "embed": normal((config.vocab, d), 0.02),
        "pos": normal((config.seq, d), 0.02),
        "final_norm": np.ones((d,), np.float32),
        "head": dense((d, config.vocab)),
    }
    for i in range(config.layers):
        params[f"layer_{i}"] = {
            "attn_norm": np.ones((d,), np.float32),
            "qkv": dense((d, 3 * d)),
            "out": dense((d, d)),
            "mlp_norm": np.ones((d,), np.float32),
            "up": dense((d, f)),
            "down": dense((f, d)),
        }
    return params


def param_specs(params: dict, *, transposed: bool = False) -> dict:
    """Tensor parallelism over "model" for matrices; vectors replicated.

    ``transposed`` gives another layout of the same arrays (as an
    evaluation job with its own sharding might use).
    """
    def spec(path, leaf):
        if leaf.ndim == 1:
            return P()
        name = jax.tree_util.keystr(path[-1:])
        rows = name in ("['out']", "['down']", "['embed']", "['pos']")
        if transposed:
            return P("data", "model") if rows else P("model", "data")
        return P("model", None) if rows else P(None, "model")

    return jax.tree_util.tree_map_with_path(spec, params)


def optimizer(config: Config) -> optax.GradientTransformation:
    return optax.adamw(config.learning_rate, weight_decay=0.01)


def init_state(config: Config, mesh: Mesh) -> dict:
    """Parameters and optimizer state, placed on ``mesh``."""
    params = init_params(config)
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(params))
    params = jax.device_put(params, shardings)
    # Each moment is sharded like the parameter whose key path it ends with;
    # the step count is replicated.
    by_path = {jax.tree_util.keystr(path): leaf.sharding
               for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
    replicated = NamedSharding(mesh, P())

    def sharding(path, _):
        key = jax.tree_util.keystr(path)
        return next((s for k, s in by_path.items() if key.endswith(k)), replicated)

    init = optimizer(config).init
    opt_shardings = jax.tree_util.tree_map_with_path(sharding, jax.eval_shape(init, params))
    opt_state = jax.jit(init, out_shardings=opt_shardings)(params)
    return {"params": params, "opt_state": opt_state}


def batch(config: Config, step: int, *, seed_offset: int = 0) -> np.ndarray:
    """Token sequences that follow a hidden per-sequence stride, from (seed, step) only."""
    rng = np.random.default_rng([config.seed + seed_offset, step])
    start = rng.integers(0, config.vocab, size=(config.batch, 1))
    stride = rng.integers(1, 8, size=(config.batch, 1))
    tokens = (start + stride * np.arange(config.seq + 1)) % config.vocab
    noise = rng.random(tokens.shape) < 0.05
    tokens = np.where(noise, rng.integers(0, config.vocab, size=tokens.shape), tokens)
    return tokens.astype(np.int32)


def _norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def forward(config: Config, params: dict, tokens: jax.Array) -> jax.Array:
    """Logits for every position of ``tokens`` (batch, seq)."""
    b, t = tokens.shape
    h, d = config.heads, config.d_model
    x = params["embed"][tokens] + params["pos"][:t]
    mask = jnp.tril(jnp.ones((t, t), bool))
    for i in range(config.layers):
        layer = params[f"layer_{i}"]
        q, k, v = jnp.split(_norm(x, layer["attn_norm"]) @ layer["qkv"], 3, axis=-1)
        q, k, v = (a.reshape(b, t, h, d // h) for a in (q, k, v))
        scores = jnp.einsum("bqhc,bkhc->bhqk", q, k) / np.sqrt(d // h)
        weights = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
        x = x + jnp.einsum("bhqk,bkhc->bqhc", weights, v).reshape(b, t, d) @ layer["out"]
        x = x + jax.nn.gelu(_norm(x, layer["mlp_norm"]) @ layer["up"]) @ layer["down"]
    return _norm(x, params["final_norm"]) @ params["head"]


def loss_fn(config: Config, params: dict, tokens: jax.Array) -> jax.Array:
    logits = forward(config, params, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def _train_step(config: Config, state: dict, tokens: jax.Array):
    opt = optimizer(config)
    loss, grads = jax.value_and_grad(lambda p: loss_fn(config, p, tokens))(state["params"])
    updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
    params = optax.apply_updates(state["params"], updates)
    return {"params": params, "opt_state": opt_state}, loss


def make_train_step(config: Config, state_shardings, batch_sharding):
    """A jitted step: (state, tokens) -> (state, loss); the input state is donated."""
    replicated = NamedSharding(batch_sharding.mesh, P())
    step = jax.jit(_train_step, static_argnums=0, in_shardings=(state_shardings, batch_sharding),
                   out_shardings=(state_shardings, replicated), donate_argnums=1)
    return functools.partial(step, config)


def make_eval(config: Config):
    """A jitted evaluation loss; shardings follow the arguments."""
    return jax.jit(lambda params, tokens: loss_fn(config, params, tokens))
