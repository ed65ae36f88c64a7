"""The blocking phase of a pytree save: classify leaves, plan shards, stage.

Produces the meta.json text and the ``_core.Shard``s ``_core.start_save``
takes. Device-to-host copies of all planned shards are started before
any is waited for, so that they overlap.

Planning (flattening the tree into meta.json's structure, describing each
leaf, choosing the boxes this process writes) costs tens of microseconds
per leaf, and a training loop saves the same tree again and again. So the
plan is kept, keyed by the tree's ``jax.tree_util`` structure, and reused
when every leaf has the type, shape, dtype and sharding it had (and each
bool, int, float and str leaf the same value: those values are in
meta.json). One exception: a dict's key order is recorded as of the save
that made the plan (a treedef does not tell insertion orders apart).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import numpy as np

from .. import _core
from ..base import dtypes, prng_keys, shardings, tree_codec, unchanged
from ..base.array_source import ArraySource
from ..base.checkpointables import JsonValue
from ..errors import InvalidArgumentError, ShardkeepError

_INT64 = np.iinfo(np.int64)

# Plans of recently saved trees; a few, for jobs that save several trees.
_MAX_PLANS = 8
_plans: dict[tuple, "_Plan"] = {}

_VALUE_TYPES = (bool, int, float, str)


def kept_plans() -> int:
    """How many trees' plans are kept for the saves to come."""
    return len(_plans)


@dataclasses.dataclass(frozen=True)
class StagedTree:
    """A pytree ready to save: its meta.json text and the shards this
    process writes. Each shard's data is a host view of the array where
    there is one (CPU backend, numpy leaves), the device-to-host copy
    elsewhere, or a fill function (``ArraySource`` leaves). ``aliased``
    are the shards whose bytes belong to the caller and may change under
    the save (donation reuses a CPU buffer): an async save copies those
    before it returns. Their data is always a host array."""

    meta_json: str
    shards: list[_core.Shard]
    aliased: list[_core.Shard]
    # (key path, value) of the arrays whose places are remembered
    # (``shardkeep.base.unchanged``), once the save is known.
    arrays: list[tuple[str, jax.Array]]


@dataclasses.dataclass(frozen=True)
class Base:
    """The committed checkpoint a save takes its unchanged arrays from
    (``shardkeep.base.unchanged``), as its commit record names it."""

    checkpoint: str
    created_ns: int
    # Compare the other arrays with the base's leaves of the same key path
    # (``Options.compare_with_base``).
    compare_contents: bool = False


def stage_pytree(tree: Any, *, replica_parallel: bool,
                 registered_kind: str | None = None, base: Base | None = None,
                 checkpointable: str = "state", planned: "Planned | None" = None,
                 on_aliased: Callable[[_core.Shard], None] | None = None) -> StagedTree:
    """Plans and stages the save of ``tree`` (see ``StagedTree``).

    ``replica_parallel`` splits each replicated box among the devices
    holding it (see ``shardings.replica_parallel_boxes``); otherwise the
    replica with ``replica_id == 0`` writes it whole. Either way each
    element of each jax.Array is written by exactly one device of the job,
    and numpy leaves by process 0 only. ``registered_kind`` is recorded in
    meta.json (``checkpointables.register_kind``). The boxes of arrays known
    to be stored in ``base`` as they are are not staged: their shards name
    where they are stored (``_core.StoredIn``). Where ``base`` compares
    contents, the shards of the other arrays worth comparing name the leaf
    of the same key path in checkpointable ``checkpointable`` of ``base``
    as the place whose bytes the core compares theirs with.

    ``planned`` is ``plan_pytree(tree, replica_parallel)`` when the caller
    has it; ``on_aliased`` is called with each aliased shard as soon as it
    is staged (an async save starts copying it while the rest is staged).
    """
    plan, values = planned if planned is not None else plan_pytree(tree, replica_parallel)
    for number in plan.array_leaves:
        _check_not_deleted(plan.leaf_metas[plan.codec_number[number]]["path"], values[number])
    arrays = [(plan.leaf_metas[plan.codec_number[number]]["path"], values[number])
              for number in plan.remembered_arrays]
    stored: dict[int, _core.StoredIn] = {}  # value index -> where base holds it
    if base is not None:
        stored = unchanged.stored_in({number: values[number] for number in plan.remembered_arrays},
                                     base.checkpoint, base.created_ns)
    compared: dict[int, _core.StoredIn] = {}  # value index -> the base's leaf to compare with
    if base is not None and base.compare_contents:
        for number in plan.comparable_arrays:
            if number not in stored:
                path = plan.leaf_metas[plan.codec_number[number]]["path"]
                compared[number] = _core.StoredIn(base.checkpoint, checkpointable, path,
                                                  base.created_ns)
    sources = [None if s.value_index in stored else s.get(values[s.value_index])
               for s in plan.sources]
    if not plan.all_on_host:
        for s, src in zip(plan.sources, sources):
            if src is not None and not s.on_host:
                src.copy_to_host_async()
    shards: list[_core.Shard] = []
    aliased: list[_core.Shard] = []
    named: set[int] = set()  # value indices whose whole leaf is named as stored
    for s, src in zip(plan.sources, sources):
        if src is None:  # stored in the base as it is
            origin, shape = s.origin, s.shape
            if jax.process_count() == 1:
                # This process writes the whole leaf: one shard names it
                # (the core links every chunk inside), not one per device.
                if s.value_index in named:
                    continue
                named.add(s.value_index)
                shape = plan.leaf_metas[s.leaf_number]["shape"]
                origin = [0] * len(shape)
            shards.append(_core.Shard(s.leaf_number, s.dtype_name, origin, shape,
                                      stored[s.value_index]))
            continue
        if isinstance(src, ArraySource):  # produced chunk by chunk by the writers
            path = plan.leaf_metas[s.leaf_number]["path"]
            shards.append(_core.Shard(s.leaf_number, s.dtype_name, s.origin, s.shape,
                                      functools.partial(_fill_from, path, src)))
            continue
        shard = _core.Shard(s.leaf_number, s.dtype_name, s.origin, s.shape, _host_bytes(src))
        if s.value_index in compared:
            shard.compare_with = compared[s.value_index]
        shards.append(shard)
        if s.on_host:  # the caller's memory (on the CPU backend, donation reuses it)
            aliased.append(shard)
            if on_aliased is not None:
                on_aliased(shard)
        # (On accelerators the host array is a fresh copy nobody else writes.)
    return StagedTree(plan.meta_json_for(values, registered_kind), shards, aliased, arrays)


Planned = tuple["_Plan", list]


def plan_pytree(tree: Any, replica_parallel: bool) -> Planned:
    """The plan of ``tree`` (kept for trees of its structure and leaf
    signatures) and the values it indexes."""
    flat: list | None
    key: tuple | None
    try:
        flat, treedef = jax.tree_util.tree_flatten(tree, is_leaf=_is_none)
        key = (treedef, replica_parallel)
    except (TypeError, ValueError):  # e.g. a dict with str and int keys, which JAX cannot sort
        flat, key = None, None
    plan = _plans.get(key) if key is not None else None
    if plan is not None and flat is not None and plan.fits(flat):
        return plan, flat
    plan, values = _make_plan(tree, flat, replica_parallel)
    if plan.cacheable and key is not None:
        _plans.pop(key, None)
        while len(_plans) >= _MAX_PLANS:
            del _plans[next(iter(_plans))]
        _plans[key] = plan
    return plan, values


def aliased_sizes(planned: Planned) -> list[int]:
    """The byte sizes of the shards ``stage_pytree`` may report as aliased,
    in its order (fewer where a base holds some)."""
    return planned[0].aliased_sizes


def _fill_from(path: str, source: ArraySource, origin: list[int],
               shape: list[int]) -> np.ndarray:
    try:
        return source.fill(origin, shape)
    except ShardkeepError as e:  # the core fails the save with its kind
        raise type(e)(f"reading leaf {path!r} at {tuple(origin)}: {e}") from e
    except Exception as e:
        raise RuntimeError(f"reading leaf {path!r} at {tuple(origin)}: {e}") from e


def _is_none(value) -> bool:
    return value is None


@dataclasses.dataclass(frozen=True)
class _Source:
    """One box this process writes, and how to find its data in a leaf value."""

    value_index: int       # the leaf's index in the treedef's order
    leaf_number: int       # the leaf's number in meta.json
    dtype_name: str
    origin: list[int]
    shape: list[int]
    get: Callable          # leaf value -> jax.Array, numpy array or _HostSlice
    on_host: bool          # the data is in host memory the caller owns


@dataclasses.dataclass
class _Plan:
    """How to save every tree of one structure and leaf signature."""

    signature: list           # per value: what must match for the plan to apply
    leaf_metas: list[dict]    # meta.json entries, in meta.json's leaf order
    codec_number: list[int]   # value index -> meta.json leaf number
    array_leaves: list[int]   # value indices of jax.Arrays (checked not deleted)
    # Those whose places are remembered (``unchanged.worth_remembering``).
    remembered_arrays: list[int]
    # The jax and numpy arrays a save compares with its base's
    # (``unchanged.worth_comparing``).
    comparable_arrays: list[int]
    sources: list[_Source]
    structure: dict
    cacheable: bool
    all_on_host: bool
    aliased_sizes: list[int]  # bytes of the sources in the caller's host memory
    _values: list = dataclasses.field(default_factory=list)  # bool/int/float/str leaves
    _registered_kind: str | None = None
    _meta_json: str = ""

    def fits(self, values: list) -> bool:
        return len(values) == len(self.signature) and all(
            _signature(v) == s for v, s in zip(values, self.signature))

    def meta_json_for(self, values: list, registered_kind: str | None = None) -> str:
        """meta.json's text, with this save's bool/int/float/str values,
        written by the core (which owns the format and checks the meta)."""
        now = [(i, values[i]) for i, _ in self._values]
        if not self._meta_json or registered_kind != self._registered_kind or any(
                type(a) is not type(b) or a != b for (_, a), (_, b) in zip(now, self._values)):
            for i, value in now:
                meta = self.leaf_metas[self.codec_number[i]]
                self.leaf_metas[self.codec_number[i]] = {**meta, **_value_spec(meta["path"], value)}
            self._values = now
            self._registered_kind = registered_kind
            meta = {"kind": "pytree", "tree": self.structure, "leaves": self.leaf_metas}
            if registered_kind is not None:
                meta["registered_kind"] = registered_kind
            self._meta_json = _core.encode_meta(meta)
        return self._meta_json


def _signature(value) -> tuple:
    if isinstance(value, ArraySource):
        return (type(value), value.shape, value.dtype)
    if isinstance(value, jax.Array):
        return (type(value), value.shape, value.dtype, value.sharding)
    if isinstance(value, (np.ndarray, np.generic)):
        return (type(value), value.shape, value.dtype)
    return (type(value),)


def _make_plan(tree: Any, values: list | None, replica_parallel: bool
               ) -> tuple[_Plan, list]:
    """The plan for ``tree`` and the values it indexes: ``values`` (the
    treedef's order), or tree_codec's leaves where JAX cannot flatten the
    tree or the two flattenings do not match one to one (such a plan is
    not kept)."""
    structure, leaves = tree_codec.flatten(tree)
    cacheable = False
    if values is not None:
        codec_number = _codec_numbers(tree, values, leaves)
        cacheable = sorted(codec_number) == list(range(len(leaves)))
    if values is None or not cacheable:
        values = [leaf.value for leaf in leaves]
        codec_number = list(range(len(leaves)))
    leaf_metas: list[dict] = [{}] * len(leaves)
    plan_sources: list[_Source] = []
    array_leaves: list[int] = []
    remembered_arrays: list[int] = []
    comparable_arrays: list[int] = []
    scalar_values: list[tuple[int, Any]] = []
    for index, value in enumerate(values):
        number = codec_number[index]
        meta, sources = _plan_leaf(tree_codec.Leaf(leaves[number].path, value), replica_parallel)
        leaf_metas[number] = meta
        # A source is read by the writer threads, never staged or copied.
        on_host = isinstance(value, ArraySource) or not isinstance(value, jax.Array) or \
            shardings.on_cpu(value.sharding)
        plan_sources.extend(_Source(index, number, meta["dtype"], list(origin), list(shape),
                                    get, on_host)
                            for (origin, shape), get in sources)
        if unchanged.worth_comparing(value):
            comparable_arrays.append(index)
        if isinstance(value, jax.Array):
            array_leaves.append(index)
            if unchanged.worth_remembering(value):
                remembered_arrays.append(index)
        elif isinstance(value, _VALUE_TYPES):
            scalar_values.append((index, value))
    aliased_sizes = [math.prod(s.shape) * dtypes.from_name(s.dtype_name).itemsize
                     for s in plan_sources
                     if s.on_host and not isinstance(values[s.value_index], ArraySource)]
    plan = _Plan([_signature(v) for v in values], leaf_metas, codec_number, array_leaves,
                 remembered_arrays, comparable_arrays, plan_sources, structure, cacheable,
                 all(s.on_host for s in plan_sources), aliased_sizes, scalar_values)
    return plan, values


def _codec_numbers(tree: Any, values: list, leaves: list[tree_codec.Leaf]) -> list[int]:
    """meta.json's number (tree_codec's order) of each of ``values`` (the
    treedef's order); -1 where none matches."""
    if len(values) == len(leaves) and all(v is leaf.value for v, leaf in zip(values, leaves)):
        return list(range(len(leaves)))  # the same order: dict keys were inserted sorted
    number_of = {id(leaf.value): n for n, leaf in enumerate(leaves)}
    if len(number_of) == len(leaves) == len(values):
        # Every leaf a distinct object: matched by identity.
        return [number_of.get(id(v), -1) for v in values]
    # Shared objects (None, small ints, one array in two places): by key
    # path, which costs JAX tens of milliseconds for thousands of leaves.
    number_by_path = {leaf.path: n for n, leaf in enumerate(leaves)}
    with_paths, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_none)
    return [number_by_path.get(tree_codec.path_str(p), -1) for p, _ in with_paths]


def _plan_leaf(leaf: tree_codec.Leaf, replica_parallel: bool) -> tuple[dict, list]:
    """The leaf's meta.json entry and the (box, source getter) pairs this
    process writes; a getter takes a leaf value of the same signature."""
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
    if isinstance(value, ArraySource):
        _check_dtype(path, value.dtype)
        meta = {**base, "kind": "array", "dtype": dtypes.name_of(value.dtype),
                "shape": list(value.shape)}
        whole = ((0,) * len(value.shape), value.shape)
        return meta, [(whole, _itself)] if jax.process_index() == 0 else []
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        _check_dtype(path, arr.dtype)
        meta = {**base, "kind": "array", "dtype": dtypes.name_of(arr.dtype),
                "shape": list(arr.shape)}
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


def _value_spec(path: str, value) -> dict:
    """The dtype and value fields of a bool, int, float or str leaf."""
    return {"value": value} if isinstance(value, str) else _scalar_spec(path, value)


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
    return meta, [(box, functools.partial(_of_key_data, get)) for box, get in sources]


def _plan_jax_array(path: str, arr: jax.Array, replica_parallel: bool) -> tuple[dict, list]:
    _check_not_deleted(path, arr)
    _check_dtype(path, arr.dtype)
    sharding = arr.sharding
    meta = {"path": path, "kind": "array", "dtype": dtypes.name_of(arr.dtype),
            "shape": list(arr.shape), "sharding": shardings.describe(sharding)}
    if isinstance(sharding, jax.sharding.SingleDeviceSharding) and jax.process_count() == 1:
        # The common case of many small leaves: one shard, the whole array.
        return meta, [(((0,) * arr.ndim, tuple(arr.shape)), _itself)]
    if jax.process_count() > 1 and arr.is_fully_addressable:
        # A process-local array (e.g. jnp.asarray(step) in each process) is
        # not part of a global array: every process has its own copy, like
        # a numpy leaf, so only the primary writes it, whole.
        meta["sharding"] = None
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


def _check_not_deleted(path: str, arr: jax.Array) -> None:
    if arr.is_deleted():
        raise InvalidArgumentError(f"leaf {path!r} is a deleted (donated?) jax.Array")


def _check_dtype(path: str, dtype) -> None:
    if not dtypes.is_supported(dtype):
        raise InvalidArgumentError(
            f"leaf {path!r} has unsupported dtype {dtype}; supported are bool, integer, float"
            " and complex types, the ml_dtypes types (bfloat16, float8, int4…) and typed PRNG"
            " keys")


def _host_bytes(src) -> np.ndarray:
    """The bytes of ``src`` in host memory, C-contiguous and little-endian,
    as a flat uint8 array (a view where they already are)."""
    raw = src.to_numpy() if isinstance(src, _HostSlice) else np.asarray(src)
    if not raw.flags.c_contiguous or raw.dtype.byteorder == ">":
        raw = np.ascontiguousarray(dtypes.little_endian(raw))
    return dtypes.as_bytes(raw)
