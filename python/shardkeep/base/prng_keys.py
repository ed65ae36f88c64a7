"""Typed PRNG key arrays (``jax.random.key``) as stored key data.

A typed key array of shape S is saved as its key data
(``jax.random.key_data``: uint32 of shape S + the implementation's key
shape) with the implementation's name beside it in meta.json
(``"prng_impl"``), and wrapped back into typed keys on load. Only public
JAX functions are used; the implementation of a key dtype is read by
tracing ``jax.random.key_impl``, because the dtype itself exposes it only
through private attributes.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

from ..errors import IncompatibleError

DATA_DTYPE = np.dtype(np.uint32)


@functools.lru_cache(maxsize=None)
def is_key(dtype) -> bool:
    """Whether ``dtype`` is a typed PRNG key dtype (``key<fry>`` and the like)."""
    try:
        return bool(jax.numpy.issubdtype(dtype, jax.dtypes.prng_key))
    except TypeError:
        return False


@functools.lru_cache(maxsize=None)
def impl_name(key_dtype) -> str:
    """The implementation name of a key dtype, e.g. "threefry2x32"."""
    names = []
    jax.eval_shape(lambda k: names.append(str(jax.random.key_impl(k))),
                   jax.ShapeDtypeStruct((), key_dtype))
    return names[0]


@functools.lru_cache(maxsize=None)
def key_dtype(impl: str):
    """The key dtype of implementation ``impl``; IncompatibleError if this
    JAX does not know it (a checkpoint written with a custom implementation)."""
    try:
        return jax.eval_shape(lambda: jax.random.key(0, impl=impl)).dtype
    except ValueError as e:
        raise IncompatibleError(f"PRNG implementation {impl!r} is unknown to this JAX: {e}") from e


@functools.lru_cache(maxsize=None)
def key_shape(impl: str) -> tuple[int, ...]:
    """The trailing shape one key of ``impl`` takes in key data, e.g. (2,)."""
    key_dtype(impl)  # a clear error for an unknown implementation
    return tuple(jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl))).shape)


def data_of(keys: jax.Array) -> jax.Array:
    """The uint32 key data of a typed key array (same devices, trailing key dims)."""
    return jax.random.key_data(keys)


def wrap(data: jax.Array, impl: str) -> jax.Array:
    """Typed keys of ``impl`` from their key data (on the data's devices)."""
    return jax.random.wrap_key_data(data, impl=impl)
