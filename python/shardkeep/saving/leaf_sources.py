"""One leaf of a tree to save: its meta.json entry and how its boxes are
staged (``LeafStage``): the arrays that hold them, got from a leaf value
of the same signature (type, shape, dtype, sharding), and where each box
lies in them. The core carves the boxes out of those arrays
(``_core.carve_shards``), so a save does no Python work per box.

The boxes of a jax.Array depend only on its sharding and shape, so they
are computed once per pair (``_shard_stage``); the plans that ``staging``
keeps reuse them for every later value.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from .. import _core
from ..base import dtypes, prng_keys, shardings, tree_codec
from ..base.array_source import ArraySource
from ..base.checkpointables import JsonValue
from ..errors import InvalidArgumentError

Extents = tuple[int, ...]


class LeafStage(NamedTuple):  # a tuple: a tree's first save makes thousands
    """How to stage the boxes this process writes of one leaf.

    ``views(value)`` gives the arrays the boxes are carved from (device
    shards, a numpy leaf, an ``ArraySource``), ``view_boxes`` where each
    lies in the leaf, and ``boxes`` each box as (view number, origin,
    shape). ``on_host``: the views are host memory the caller owns (numpy
    leaves, the CPU backend's device buffers), which donation may reuse.
    """

    views: Callable[[Any], list]
    view_boxes: list[tuple[Extents, Extents]]
    boxes: list[tuple[int, Extents, Extents]]
    on_host: bool

    def layout(self, leaf_number: int, dtype_name: str) -> _core.LeafLayout:
        return _core.LeafLayout(leaf_number, dtype_name, self.view_boxes, self.boxes,
                                callers_memory=self.on_host)


def _whole(shape: Extents, views: Callable[[Any], list], on_host: bool) -> LeafStage:
    """One box, the whole leaf, carved from one array holding it."""
    box = ((0,) * len(shape), tuple(shape))
    return LeafStage(views, [box], [(0, *box)], on_host)


def plan_leaf(leaf: tree_codec.Leaf, replica_parallel: bool
              ) -> tuple[_core.LeafInfo, LeafStage | None]:
    """The leaf's meta.json entry and how to stage the boxes this process
    writes of it (None when it writes none)."""
    value, path = leaf.value, leaf.path
    if value is None:
        return _core.LeafInfo(path, _core.LeafKind.NONE), None
    if isinstance(value, (bool, int, float, str)):
        return tree_codec.value_leaf(path, value), None
    if isinstance(value, jax.Array):
        if prng_keys.is_key(value.dtype):
            return _plan_key_array(path, value, replica_parallel)
        return _plan_jax_array(path, value, replica_parallel)
    if isinstance(value, ArraySource):
        _check_dtype(path, value.dtype)
        meta = _core.LeafInfo(path, _core.LeafKind.ARRAY, dtypes.name_of(value.dtype),
                              list(value.shape))
        # Read chunk by chunk by the writer threads, never staged.
        return meta, _whole(value.shape, _listed, True) if jax.process_index() == 0 else None
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        _check_dtype(path, arr.dtype)
        meta = _core.LeafInfo(path, _core.LeafKind.ARRAY, dtypes.name_of(arr.dtype),
                              list(arr.shape))
        # Host data is the same on every process; only the primary writes it.
        if jax.process_index() != 0:
            return meta, None
        views = _big_endian_host if arr.dtype.byteorder == ">" else _host
        return meta, _whole(arr.shape, views, True)
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
                    ) -> tuple[_core.LeafInfo, LeafStage | None]:
    """Typed PRNG keys are saved as their key data plus the implementation's
    name; the sharding described is the key array's own, which a load
    without a target gives back."""
    check_not_deleted(path, keys)
    meta, stage = _plan_jax_array(path, prng_keys.data_of(keys), replica_parallel)
    if meta.sharding is not None:
        meta.sharding = shardings.describe(keys.sharding)
    meta.prng_impl = prng_keys.impl_name(keys.dtype)
    if stage is None:
        return meta, None
    return meta, stage._replace(views=functools.partial(_of_key_data, stage.views))


def _plan_jax_array(path: str, arr: jax.Array, replica_parallel: bool
                    ) -> tuple[_core.LeafInfo, LeafStage | None]:
    check_not_deleted(path, arr)
    _check_dtype(path, arr.dtype)
    sharding = arr.sharding
    meta = _core.LeafInfo(path, _core.LeafKind.ARRAY, dtypes.name_of(arr.dtype),
                          list(arr.shape), shardings.describe(sharding))
    on_host = shardings.on_cpu(sharding)
    if isinstance(sharding, jax.sharding.SingleDeviceSharding) and jax.process_count() == 1:
        # The common case of many small leaves: one shard, the whole array.
        return meta, _whole(arr.shape, _listed, on_host)
    if jax.process_count() > 1 and arr.is_fully_addressable:
        # A process-local array (e.g. jnp.asarray(step) in each process) is
        # not part of a global array: every process has its own copy, like
        # a numpy leaf, so only the primary writes it, whole.
        meta.sharding = None
        if jax.process_index() != 0:
            return meta, None
        return meta, _whole(arr.shape, _listed, on_host)
    return meta, _shard_stage(arr, replica_parallel, on_host)


def _shard_stage(arr: jax.Array, replica_parallel: bool, on_host: bool) -> LeafStage | None:
    """How to stage the boxes this process writes of a sharded ``arr``.

    They depend only on the sharding and the shape (a shard's position in
    ``addressable_shards`` is fixed by the sharding), so they are computed
    once per pair: building ``addressable_shards`` and their indices costs
    JAX time per shard, which a tree's first save would otherwise pay for
    every leaf, where a model has few distinct (sharding, shape) pairs
    (docs/DESIGN_NOTES.md, "The plan of a tree saved again", has the figure).
    """
    key = (arr.sharding, arr.shape, replica_parallel)
    try:
        found = _stages_by_layout.get(key, _UNKNOWN)
    except TypeError:  # an unhashable sharding
        return _compute_shard_stage(arr, replica_parallel, on_host)
    if found is _UNKNOWN:
        found = _compute_shard_stage(arr, replica_parallel, on_host)
        if len(_stages_by_layout) >= _MAX_LAYOUTS:
            del _stages_by_layout[next(iter(_stages_by_layout))]
        _stages_by_layout[key] = found
    return found


_MAX_LAYOUTS = 1024
_UNKNOWN: Any = object()
_stages_by_layout: dict[tuple, LeafStage | None] = {}


def _compute_shard_stage(arr: jax.Array, replica_parallel: bool, on_host: bool
                         ) -> LeafStage | None:
    shards = arr.addressable_shards
    slots: list = []  # a shard's position, or (position, the part's slices)
    if not replica_parallel or jax.process_count() == 1:
        # replica_id 0 of each box is written exactly once over all processes.
        # (Replica-parallel splits a box among processes; with one process
        # the plan would be the same, at a higher planning cost.)
        slots = [k for k, s in enumerate(shards) if s.replica_id == 0]
        view_boxes = [shardings.box_of_index(shards[k].index, arr.shape) for k in slots]
        boxes = [(n, *box) for n, box in enumerate(view_boxes)]
    else:
        view_boxes, boxes = [], []
        slot_of = {s.device: k for k, s in enumerate(shards)}
        for device, box in shardings.replica_parallel_boxes(arr.sharding, arr.shape).items():
            k = slot_of[device]
            shard_box = shardings.box_of_index(shards[k].index, arr.shape)
            if box[1] == shard_box[1] or on_host:
                # On the host the core carves the part out of the shard.
                slots.append(k)
                view_boxes.append(shard_box)
            else:
                # On an accelerator the part is sliced on the device, so
                # that only its bytes cross to the host.
                local = tuple(slice(o - so, o - so + n)
                              for o, so, n in zip(box[0], shard_box[0], box[1]))
                slots.append((k, local))
                view_boxes.append(box)
            boxes.append((len(slots) - 1, *box))
    if not slots:
        return None
    return LeafStage(functools.partial(_shard_views, slots), view_boxes, boxes, on_host)


# View getters: a leaf value -> the arrays its boxes are carved from. A
# plan's getters apply to any later value of the same signature (type,
# shape, dtype, sharding), so shards are found by their position in
# ``addressable_shards``, whose order the sharding fixes.

def _listed(value) -> list:
    return [value]


def _host(value) -> list:
    return [np.asarray(value)]


def _big_endian_host(value) -> list:
    return [dtypes.little_endian(np.asarray(value))]


def _shard_views(slots: list, arr: jax.Array) -> list:
    # addressable_data(k) is addressable_shards[k].data without building
    # every Shard object of the array.
    return [arr.addressable_data(k) if isinstance(k, int) else arr.addressable_data(k[0])[k[1]]
            for k in slots]


def _of_key_data(views: Callable, keys: jax.Array) -> list:
    return views(prng_keys.data_of(keys))


def check_not_deleted(path: str, arr: jax.Array) -> None:
    if arr.is_deleted():
        raise InvalidArgumentError(f"leaf {path!r} is a deleted (donated?) jax.Array")


def _check_dtype(path: str, dtype) -> None:
    if not dtypes.is_supported(dtype):
        raise InvalidArgumentError(
            f"leaf {path!r} has unsupported dtype {dtype}; supported are bool, integer, float"
            " and complex types, the ml_dtypes types (bfloat16, float8, int4…) and typed PRNG"
            " keys")
