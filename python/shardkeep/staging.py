"""The blocking phase of a pytree save: classify leaves, plan shards, stage.

Produces the meta.json text and the shard tuples ``_core.start_save``
expects. Device-to-host copies of all planned shards are started before
any is waited for, so that they overlap.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
from typing import Any, Iterator

import jax
import numpy as np

from . import dtypes, host_memory, prng_keys, shardings, tree_codec
from .errors import InvalidArgumentError

_INT64 = np.iinfo(np.int64)

# Options.replica_parallel of the save being staged (see ``planning``).
_replica_parallel = contextvars.ContextVar("shardkeep_replica_parallel", default=True)


@contextlib.contextmanager
def planning(*, replica_parallel: bool) -> Iterator[None]:
    """Stages the pytrees encoded inside the ``with`` block with these settings.

    The save passes its options this way because the checkpointable
    encoders between it and ``stage_pytree`` do not take options.
    """
    token = _replica_parallel.set(bool(replica_parallel))
    try:
        yield
    finally:
        _replica_parallel.reset(token)


def stage_pytree(tree: Any, *, own_copies: bool,
                 replica_parallel: bool | None = None) -> tuple[str, list[tuple]]:
    """Returns (meta.json text, shards) for saving ``tree``.

    With ``own_copies`` every shard's bytes are copied into buffers owned by
    the save, so the caller may donate, delete or overwrite its arrays as
    soon as this returns (async saves). Without it, host-resident data is
    passed as zero-copy views (synchronous saves).

    ``replica_parallel`` (default: the enclosing ``planning`` block's, else
    True) splits each replicated box among the devices holding it (see
    ``shardings.replica_parallel_boxes``); otherwise the replica with
    ``replica_id == 0`` writes it whole. Either way each element of each
    jax.Array is written by exactly one device of the job, and numpy leaves
    by process 0 only.
    """
    if replica_parallel is None:
        replica_parallel = _replica_parallel.get()
    structure, leaves = tree_codec.flatten(tree)
    leaf_metas, planned = [], []
    for number, leaf in enumerate(leaves):
        meta, sources = _plan_leaf(leaf, replica_parallel)
        leaf_metas.append(meta)
        planned.extend((number, meta["dtype"], box, src) for box, src in sources)
    for *_, src in planned:
        if isinstance(src, jax.Array) and not shardings.on_cpu(src.sharding):
            src.copy_to_host_async()
    hosts = [_to_host(src) for *_, src in planned]
    if own_copies:
        private = [not _may_alias(src) for *_, src in planned]
        hosts = host_memory.copies_of(hosts, skip=private)
    shards = [(number, dtype_name, list(origin), list(shape), dtypes.as_bytes(host))
              for (number, dtype_name, (origin, shape), _), host in zip(planned, hosts)]
    meta_json = json.dumps({"kind": "pytree", "tree": structure, "leaves": leaf_metas},
                           allow_nan=False, ensure_ascii=False)
    return meta_json, shards


def _plan_leaf(leaf: tree_codec.Leaf, replica_parallel: bool) -> tuple[dict, list]:
    """The leaf's meta.json entry and the (box, source) pairs this process writes."""
    value, path = leaf.value, leaf.path
    base = {"path": path, "sharding": None}
    if value is None:
        return {**base, "kind": "none", "dtype": None, "shape": None}, []
    if isinstance(value, str):
        return {**base, "kind": "string", "dtype": None, "shape": None, "value": value}, []
    if isinstance(value, (bool, int, float)):
        return {**base, "kind": "scalar", **_scalar_spec(path, value), "shape": []}, []
    if isinstance(value, jax.Array):
        if prng_keys.is_key(value.dtype):
            return _plan_key_array(path, value, replica_parallel)
        return _plan_jax_array(path, value, replica_parallel)
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        _check_dtype(path, arr.dtype)
        meta = {**base, "kind": "array", "dtype": dtypes.name_of(arr.dtype),
                "shape": list(arr.shape)}
        # Host data is the same on every process; only the primary writes it.
        sources = [(((0,) * arr.ndim, arr.shape), arr)] if jax.process_index() == 0 else []
        return meta, sources
    raise InvalidArgumentError(
        f"leaf {path!r} has unsupported type {type(value).__module__}.{type(value).__qualname__};"
        " supported leaves are jax.Array (typed PRNG keys included), numpy arrays and scalars,"
        " bool, int, float, str and None. Save only the array part of the tree, e.g. for an"
        " Equinox module `params, static = eqx.partition(model, eqx.is_array)` and save"
        " `params`, or replace the leaf with None")


def _scalar_spec(path: str, value) -> dict:
    if isinstance(value, bool):
        return {"dtype": "bool", "value": value}
    if isinstance(value, int):
        if not _INT64.min <= value <= _INT64.max:
            raise InvalidArgumentError(f"int leaf {path!r} = {value} does not fit in int64")
        return {"dtype": "int64", "value": value}
    if math.isnan(value):
        encoded = "nan"
    elif math.isinf(value):
        encoded = "inf" if value > 0 else "-inf"
    else:
        encoded = value
    return {"dtype": "float64", "value": encoded}


def _plan_key_array(path: str, keys: jax.Array, replica_parallel: bool) -> tuple[dict, list]:
    """Typed PRNG keys are saved as their key data plus the implementation's
    name; the sharding described is the key array's own, which a load
    without a target gives back."""
    _check_not_deleted(path, keys)
    meta, sources = _plan_jax_array(path, prng_keys.data_of(keys), replica_parallel)
    if meta["sharding"] is not None:
        meta["sharding"] = shardings.describe(keys.sharding)
    meta["prng_impl"] = prng_keys.impl_name(keys.dtype)
    return meta, sources


def _plan_jax_array(path: str, arr: jax.Array, replica_parallel: bool) -> tuple[dict, list]:
    _check_not_deleted(path, arr)
    _check_dtype(path, arr.dtype)
    sharding = arr.sharding
    meta = {"path": path, "kind": "array", "dtype": dtypes.name_of(arr.dtype),
            "shape": list(arr.shape), "sharding": shardings.describe(sharding)}
    if isinstance(sharding, jax.sharding.SingleDeviceSharding) and jax.process_count() == 1:
        # The common case of many small leaves: one shard, the whole array.
        return meta, [(((0,) * arr.ndim, tuple(arr.shape)), arr)]
    if jax.process_count() > 1 and arr.is_fully_addressable:
        # A process-local array (e.g. jnp.asarray(step) in each process) is
        # not part of a global array: every process has its own copy, like
        # a numpy leaf, so only the primary writes it, whole.
        meta["sharding"] = None
        if jax.process_index() != 0:
            return meta, []
        return meta, [(((0,) * arr.ndim, tuple(arr.shape)), arr)]
    if not replica_parallel or jax.process_count() == 1:
        # replica_id 0 of each box is written exactly once over all processes.
        # (Replica-parallel splits a box among processes; with one process
        # the plan would be the same, at a higher planning cost.)
        sources = [(shardings.box_of_index(s.index, arr.shape), s.data)
                   for s in arr.addressable_shards if s.replica_id == 0]
        return meta, sources
    shards = {s.device: s for s in arr.addressable_shards}
    sources = []
    for device, box in shardings.replica_parallel_boxes(arr.sharding, arr.shape).items():
        shard = shards[device]
        shard_origin, shard_extent = shardings.box_of_index(shard.index, arr.shape)
        if box[1] == shard_extent:
            sources.append((box, shard.data))
            continue
        local = tuple(slice(o - so, o - so + n)
                      for o, so, n in zip(box[0], shard_origin, box[1]))
        sources.append((box, _slice_of(shard.data, local)))
    return meta, sources


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


def _check_not_deleted(path: str, arr: jax.Array) -> None:
    if arr.is_deleted():
        raise InvalidArgumentError(f"leaf {path!r} is a deleted (donated?) jax.Array")


def _check_dtype(path: str, dtype) -> None:
    if not dtypes.is_supported(dtype):
        raise InvalidArgumentError(
            f"leaf {path!r} has unsupported dtype {dtype}; supported are bool, integer, float"
            " and complex types, the ml_dtypes types (bfloat16, float8, int4…) and typed PRNG"
            " keys")


def _to_host(src) -> np.ndarray:
    raw = src.to_numpy() if isinstance(src, _HostSlice) else np.asarray(src)
    return np.ascontiguousarray(dtypes.little_endian(raw))


def _may_alias(src) -> bool:
    """Whether the host array of ``src`` may later change under the save.

    Numpy inputs belong to the caller. On the CPU backend np.asarray of a
    jax.Array aliases the device buffer, which donation may reuse; on
    accelerators it is a fresh host copy that nothing else writes.
    """
    if isinstance(src, _HostSlice):
        return True
    if not isinstance(src, jax.Array):
        return True
    return any(d.platform == "cpu" for d in src.devices())
