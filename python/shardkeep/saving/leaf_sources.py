"""One leaf of a tree to save: its meta.json entry and the boxes this
process writes of it, each with a getter that finds the box's data in a
leaf value of the same signature (type, shape, dtype, sharding), and the
host bytes of what a getter returns.

The boxes of a jax.Array depend only on its sharding and shape, so they
are computed once per pair (``_shard_sources``); the plans that
``staging`` keeps reuse the getters for every later value.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import numpy as np

from .. import _core
from ..base import dtypes, prng_keys, shardings, tree_codec
from ..base.array_source import ArraySource
from ..base.checkpointables import JsonValue
from ..errors import InvalidArgumentError

def plan_leaf(leaf: tree_codec.Leaf, replica_parallel: bool) -> tuple[_core.LeafInfo, list]:
    """The leaf's meta.json entry and the (box, source getter) pairs this
    process writes; a getter takes a leaf value of the same signature."""
    value, path = leaf.value, leaf.path
    if value is None:
        return _core.LeafInfo(path, _core.LeafKind.NONE), []
    if isinstance(value, (bool, int, float, str)):
        return tree_codec.value_leaf(path, value), []
    if isinstance(value, jax.Array):
        if prng_keys.is_key(value.dtype):
            return _plan_key_array(path, value, replica_parallel)
        return _plan_jax_array(path, value, replica_parallel)
    if isinstance(value, ArraySource):
        _check_dtype(path, value.dtype)
        meta = _core.LeafInfo(path, _core.LeafKind.ARRAY, dtypes.name_of(value.dtype),
                              list(value.shape))
        whole = ((0,) * len(value.shape), value.shape)
        return meta, [(whole, _itself)] if jax.process_index() == 0 else []
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        _check_dtype(path, arr.dtype)
        meta = _core.LeafInfo(path, _core.LeafKind.ARRAY, dtypes.name_of(arr.dtype),
                              list(arr.shape))
        # Host data is the same on every process; only the primary writes it.
        sources = [(((0,) * arr.ndim, arr.shape), np.asarray)] if jax.process_index() == 0 else []
        return meta, sources
    if isinstance(value, (JsonValue, bytes, bytearray, memoryview)):
        raise InvalidArgumentError(
            f"leaf {path!r} is a {type(value).__name__}, which is saved as a checkpointable of"
            " its own, never inside a tree: pass the parts as sk.Checkpointables(...) (a plain"
            " dict is one tree, the checkpointable 'state')")
    raise InvalidArgumentError(
        f"leaf {path!r} has unsupported type {type(value).__module__}.{type(value).__qualname__};"
        " supported leaves are jax.Array (typed PRNG keys included), numpy arrays and scalars,"
        " bool, int, float, str and None. Save only the array part of the tree, e.g. for an"
        " Equinox module `params, static = eqx.partition(model, eqx.is_array)` and save"
        " `params`, or replace the leaf with None")


def _plan_key_array(path: str, keys: jax.Array, replica_parallel: bool
                    ) -> tuple[_core.LeafInfo, list]:
    """Typed PRNG keys are saved as their key data plus the implementation's
    name; the sharding described is the key array's own, which a load
    without a target gives back."""
    check_not_deleted(path, keys)
    meta, sources = _plan_jax_array(path, prng_keys.data_of(keys), replica_parallel)
    if meta.sharding is not None:
        meta.sharding = shardings.describe(keys.sharding)
    meta.prng_impl = prng_keys.impl_name(keys.dtype)
    return meta, [(box, functools.partial(_of_key_data, get)) for box, get in sources]


def _plan_jax_array(path: str, arr: jax.Array, replica_parallel: bool
                    ) -> tuple[_core.LeafInfo, list]:
    check_not_deleted(path, arr)
    _check_dtype(path, arr.dtype)
    sharding = arr.sharding
    meta = _core.LeafInfo(path, _core.LeafKind.ARRAY, dtypes.name_of(arr.dtype),
                          list(arr.shape), shardings.describe(sharding))
    if isinstance(sharding, jax.sharding.SingleDeviceSharding) and jax.process_count() == 1:
        # The common case of many small leaves: one shard, the whole array.
        return meta, [(((0,) * arr.ndim, tuple(arr.shape)), _itself)]
    if jax.process_count() > 1 and arr.is_fully_addressable:
        # A process-local array (e.g. jnp.asarray(step) in each process) is
        # not part of a global array: every process has its own copy, like
        # a numpy leaf, so only the primary writes it, whole.
        meta.sharding = None
        if jax.process_index() != 0:
            return meta, []
        return meta, [(((0,) * arr.ndim, tuple(arr.shape)), _itself)]
    return meta, _shard_sources(arr, replica_parallel)


def _shard_sources(arr: jax.Array, replica_parallel: bool) -> list:
    """The boxes this process writes of ``arr`` and their getters.

    They depend only on the sharding and the shape (a shard's position in
    ``addressable_shards`` is fixed by the sharding), so they are computed
    once per pair: building ``addressable_shards`` and their indices costs
    JAX time per shard, which a tree's first save would otherwise pay for
    every leaf, where a model has few distinct (sharding, shape) pairs
    (docs/DESIGN_NOTES.md, "The plan of a tree saved again", has the figure).
    """
    key = (arr.sharding, arr.shape, replica_parallel)
    try:
        found = _sources_by_layout.get(key)
    except TypeError:  # an unhashable sharding
        return _compute_shard_sources(arr, replica_parallel)
    if found is None:
        found = _compute_shard_sources(arr, replica_parallel)
        if len(_sources_by_layout) >= _MAX_LAYOUTS:
            del _sources_by_layout[next(iter(_sources_by_layout))]
        _sources_by_layout[key] = found
    return found


_MAX_LAYOUTS = 1024
_sources_by_layout: dict[tuple, list] = {}


def _compute_shard_sources(arr: jax.Array, replica_parallel: bool) -> list:
    if not replica_parallel or jax.process_count() == 1:
        # replica_id 0 of each box is written exactly once over all processes.
        # (Replica-parallel splits a box among processes; with one process
        # the plan would be the same, at a higher planning cost.)
        return [(shardings.box_of_index(s.index, arr.shape), functools.partial(_shard_data, k))
                for k, s in enumerate(arr.addressable_shards) if s.replica_id == 0]
    shards = {s.device: (k, s) for k, s in enumerate(arr.addressable_shards)}
    sources = []
    for device, box in shardings.replica_parallel_boxes(arr.sharding, arr.shape).items():
        k, shard = shards[device]
        shard_origin, shard_extent = shardings.box_of_index(shard.index, arr.shape)
        if box[1] == shard_extent:
            sources.append((box, functools.partial(_shard_data, k)))
            continue
        local = tuple(slice(o - so, o - so + n)
                      for o, so, n in zip(box[0], shard_origin, box[1]))
        sources.append((box, functools.partial(_shard_slice, k, local)))
    return sources


# Source getters: a leaf value -> what to stage. A plan's getters apply to
# any later value of the same signature (type, shape, dtype, sharding), so
# shards are found by their position in ``addressable_shards``, whose order
# the sharding fixes.

def _itself(arr):
    return arr


def _shard_data(k: int, arr: jax.Array) -> jax.Array:
    # addressable_data(k) is addressable_shards[k].data without building
    # every Shard object of the array.
    return arr.addressable_data(k)


def _shard_slice(k: int, index: tuple[slice, ...], arr: jax.Array):
    return _slice_of(arr.addressable_data(k), index)


def _of_key_data(get: Callable, keys: jax.Array):
    return get(prng_keys.data_of(keys))


class _HostSlice:
    """Part of a CPU-resident shard, sliced on the host when staged (no copy
    where the slice is contiguous and the save is synchronous)."""

    def __init__(self, data: jax.Array, index: tuple[slice, ...]):
        self.data = data
        self.index = index

    def to_numpy(self) -> np.ndarray:
        return np.asarray(self.data)[self.index]


def _slice_of(data: jax.Array, index: tuple[slice, ...]):
    """The part ``index`` of a single-device shard, as a staging source.

    On accelerators the slice is taken on the device so that only its
    bytes cross to the host; on the CPU backend the host view is sliced.
    """
    if all(d.platform == "cpu" for d in data.devices()):
        return _HostSlice(data, index)
    return data[index]


def check_not_deleted(path: str, arr: jax.Array) -> None:
    if arr.is_deleted():
        raise InvalidArgumentError(f"leaf {path!r} is a deleted (donated?) jax.Array")


def _check_dtype(path: str, dtype) -> None:
    if not dtypes.is_supported(dtype):
        raise InvalidArgumentError(
            f"leaf {path!r} has unsupported dtype {dtype}; supported are bool, integer, float"
            " and complex types, the ml_dtypes types (bfloat16, float8, int4…) and typed PRNG"
            " keys")


def host_bytes(src) -> np.ndarray:
    """The bytes of ``src`` in host memory, C-contiguous and little-endian,
    as a flat uint8 array (a view where they already are)."""
    raw = src.to_numpy() if isinstance(src, _HostSlice) else np.asarray(src)
    if not raw.flags.c_contiguous or raw.dtype.byteorder == ">":
        raw = np.ascontiguousarray(dtypes.little_endian(raw))
    return dtypes.as_bytes(raw)
