"""Loading source leaves onto a target pytree.

The rules follow ``shardkeep.load``: a target leaf that is a
``jax.ShapeDtypeStruct`` (with a sharding) or a ``jax.Array`` becomes a
``jax.Array`` of that sharding; a numpy array or scalar a numpy value; a
Python scalar a Python scalar; None the leaf as stored. Each process reads
only the boxes its addressable devices hold, each distinct box once
however many devices hold it, all reads in flight together.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import numpy as np

from .. import restore, shardings, tree_codec
from ..errors import IncompatibleError, InvalidArgumentError
from .source import Pending, SourceLeaf
from .tree_build import EMPTY_DICT, EMPTY_LIST, nest

_MAX_LISTED = 20
_FLOATS = ("float16", "bfloat16", "float32", "float64")
_INTEGERS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def load_all(where: str, leaves: Sequence[SourceLeaf], target: Any, *,
             allow_lossy_cast: bool) -> Any:
    """The source's tree, on ``target`` or (None) as stored on the host."""
    if target is None:
        reads = [leaf.read_whole() if leaf.is_array else None for leaf in leaves]
        values = [leaf.plain_value(read.result()) if read is not None else leaf.value
                  for leaf, read in zip(leaves, reads)]
        return nest(where, [(leaf.keys, value) for leaf, value in zip(leaves, values)])
    keyed, treedef = jax.tree_util.tree_flatten_with_path(target, is_leaf=lambda x: x is None)
    paths = [tree_codec.path_str(keys) for keys, _ in keyed]
    by_path = {leaf.path: leaf for leaf in leaves}
    _check_same_leaves(where, paths, by_path)
    puts = _DevicePuts()
    finishers = [_plan(where, by_path[path], t, puts, allow_lossy_cast)
                 for path, (_, t) in zip(paths, keyed)]
    puts.run()
    return jax.tree_util.tree_unflatten(treedef, [finish() for finish in finishers])


def _check_same_leaves(where: str, paths: list[str], by_path: dict[str, SourceLeaf]) -> None:
    if len(set(paths)) != len(paths):
        dup = sorted({p for p in paths if paths.count(p) > 1})
        raise InvalidArgumentError(f"{where}: target leaves share key paths {_listing(dup)}")
    missing = [p for p in paths if p not in by_path]
    extra = sorted(p for p in set(by_path) - set(paths) if not _is_empty_node(by_path[p]))
    if missing or extra:
        problems = []
        if missing:
            problems.append(f"target leaves not in the checkpoint: {_listing(missing)}")
        if extra:
            problems.append(f"checkpoint leaves not in the target: {_listing(extra)}")
        raise IncompatibleError(f"{where}: tree mismatch; " + "; ".join(problems))


def _is_empty_node(leaf: SourceLeaf) -> bool:
    """An empty container, or a None that may stand for one (Orbax records
    empty nodes such as optax's EmptyState as None): a target's flattening
    has no leaf for them, so they need no counterpart there."""
    return not leaf.is_array and (leaf.value is None or leaf.value is EMPTY_DICT
                                  or leaf.value is EMPTY_LIST)


def _listing(paths: list[str]) -> str:
    shown = ", ".join(repr(p) for p in paths[:_MAX_LISTED])
    more = len(paths) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _plan(where: str, leaf: SourceLeaf, target: Any, puts: "_DevicePuts",
          allow_lossy_cast: bool) -> Callable[[], Any]:
    """Starts the reads ``target`` needs; returns what builds its value."""
    if not leaf.is_array:
        if target is not None and not (isinstance(target, str) and isinstance(leaf.value, str)):
            raise IncompatibleError(f"{leaf.where}: holds {type(leaf.value).__name__}, the"
                                    f" target wants {_describe(target)}")
        return lambda: leaf.value
    if target is None:
        read = leaf.read_whole()
        return lambda: leaf.plain_value(read.result())
    if isinstance(target, (bool, int, float)):
        _check_shape(leaf, ())
        read = leaf.read_whole()
        return lambda: read.result().item()
    if not hasattr(target, "shape") or not hasattr(target, "dtype"):
        raise InvalidArgumentError(
            f"{where}: target leaf {leaf.path!r} is a {type(target).__name__}; targets are"
            " jax.ShapeDtypeStruct, jax/numpy arrays, numpy/Python scalars, str or None")
    _check_shape(leaf, tuple(target.shape))
    dtype = np.dtype(target.dtype)
    check_cast(leaf, dtype, allow_lossy_cast)
    if isinstance(target, (np.ndarray, np.generic)):
        read = leaf.read_whole()
        as_numpy = (lambda a: a[()]) if isinstance(target, np.generic) else (lambda a: a)
        return lambda: as_numpy(_cast(read.result(), dtype))
    sharding = restore.target_sharding(where, leaf.path, target)
    boxes = shardings.addressable_boxes(sharding, leaf.shape)
    keys = [puts.add(leaf.read_box(origin, extent), dtype, devices)
            for (origin, extent), devices in boxes.items()]

    def finish():
        arrays = [a for key in keys for a in puts.arrays(key)]
        if len(arrays) == 1 and isinstance(sharding, jax.sharding.SingleDeviceSharding):
            return arrays[0]
        return jax.make_array_from_single_device_arrays(leaf.shape, sharding, arrays)

    return finish


def _check_shape(leaf: SourceLeaf, wanted: tuple) -> None:
    if tuple(leaf.shape) != tuple(wanted):
        raise IncompatibleError(f"{leaf.where}: has shape {tuple(leaf.shape)}, the target"
                                f" wants {tuple(wanted)}")


def check_cast(leaf: SourceLeaf, to: np.dtype, allow_lossy: bool) -> None:
    """The cast rules of shardkeep's loads (cpp/src/engine/copy.h): widening
    within floats or within integers always; narrowing, signedness changes
    and float16<->bfloat16 only with ``allow_lossy``; nothing else."""
    frm = np.dtype(leaf.dtype)
    if frm == to:
        return
    names = f"{frm.name} to {to.name}"
    floats = frm.name in _FLOATS and to.name in _FLOATS
    integers = frm.name in _INTEGERS and to.name in _INTEGERS
    if not (floats or integers):
        raise IncompatibleError(f"{leaf.where}: cannot cast {names}: unsupported")
    widening = to.itemsize > frm.itemsize and (floats or to.kind == "i" or frm.kind == "u")
    if not (allow_lossy or widening):
        raise IncompatibleError(f"{leaf.where}: cannot cast {names} without"
                                " Options(allow_lossy_cast=True) (it may lose precision)")


def _cast(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    # numpy (with ml_dtypes) rounds floats to nearest even and wraps
    # integers, as the core's casts do.
    return array if array.dtype == dtype else array.astype(dtype)


def _describe(target) -> str:
    if hasattr(target, "shape") and hasattr(target, "dtype"):
        return f"{type(target).__name__} {np.dtype(target.dtype).name}{list(target.shape)}"
    return type(target).__name__


class _DevicePuts:
    """Boxes read from the source, placed on devices by two batched
    device_put calls for the whole tree (one call per shard costs more
    than the copy for small leaves). A box goes from the host to its first
    device only; the other devices holding it copy that device's array, so
    that no two shards share memory."""

    def __init__(self):
        self._reads: list[tuple[Pending, np.dtype]] = []
        self._firsts: list[jax.Device] = []
        self._others: list[tuple[int, jax.Device]] = []
        self._first_arrays: list = []
        self._other_arrays: list = []

    def add(self, read: Pending, dtype: np.dtype, devices: list) -> tuple[int, list[int]]:
        first = len(self._reads)
        self._reads.append((read, dtype))
        self._firsts.append(devices[0])
        others = []
        for device in devices[1:]:
            others.append(len(self._others))
            self._others.append((first, device))
        return first, others

    def run(self) -> None:
        host = [_cast(read.result(), dtype) for read, dtype in self._reads]
        self._first_arrays = jax.device_put(host, self._firsts)
        self._other_arrays = jax.device_put(
            [self._first_arrays[i] for i, _ in self._others], [d for _, d in self._others])

    def arrays(self, key: tuple[int, list[int]]) -> list:
        first, others = key
        return [self._first_arrays[first]] + [self._other_arrays[i] for i in others]
