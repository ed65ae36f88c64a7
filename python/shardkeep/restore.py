"""Restoring one pytree checkpointable onto a target.

Every box this process needs, of every leaf, is requested from the C++
reader in one call, so that the reads run in parallel and chunks shared by
several boxes are coalesced there. Each unique box is read once, whatever
number of local devices hold it; in a multi-process job, boxes that
several processes hold are read once in the whole job and sent to the
other holders (``broadcast_load``).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from . import broadcast_load, dtypes, file_mapping, host_memory, prng_keys, shardings, tree_codec
from .errors import IncompatibleError, InvalidArgumentError


class _Slot:
    """One box of one leaf that this process needs, and the host buffer its
    bytes go to (chosen when the whole load is planned: mapped from the
    checkpoint's files, or allocated and read)."""

    __slots__ = ("number", "path", "origin", "shape", "dtype", "devices", "buffer", "key")

    def __init__(self, number: int, path: str, origin, shape, dtype: np.dtype,
                 devices: list | None = None):
        self.number, self.path = number, path
        self.origin, self.shape, self.dtype = tuple(origin), tuple(shape), dtype
        self.devices = devices  # where the box goes; None: it stays on the host
        self.buffer: np.ndarray | None = None
        self.key = None  # the box's arrays in _DevicePuts, once scheduled


# A leaf's slots, and how to build its value once they are filled.
_Plan = tuple[list[_Slot], Callable[[], Any]]
_MAX_LISTED = 20


def restore_pytree(reader, where: str, name: str, meta: dict, target: Any, *,
                   partial: bool, core_options, map_files: bool, broadcast: bool) -> Any:
    """Loads checkpointable ``name`` (meta.json already parsed into ``meta``).

    ``where`` ("<checkpoint>/<name>") prefixes error messages. See
    ``shardkeep.load`` for the meaning of ``target`` and ``partial``;
    ``map_files``: map raw chunks of local files instead of reading them
    (see ``file_mapping``); ``broadcast``: in a multi-process job, boxes of
    jax-sharded target leaves that several processes hold are read by one
    of them and sent to the others (see ``broadcast_load``).
    """
    saved = meta["leaves"]
    puts = _DevicePuts()
    if target is None:
        plans = [_plan_leaf(where, i, leaf, None, puts, None) for i, leaf in enumerate(saved)]
        values = _run(reader, where, name, plans, puts, None, core_options, map_files)
        return tree_codec.rebuild(meta["tree"], values)
    keyed, treedef = jax.tree_util.tree_flatten_with_path(target, is_leaf=lambda x: x is None)
    paths = [tree_codec.path_str(keys) for keys, _ in keyed]
    numbers = _match(where, paths, [leaf["path"] for leaf in saved], partial)
    sharing = (broadcast_load.Plan(jax.process_index())
               if broadcast and jax.process_count() > 1 else None)
    plans = [_plan_leaf(where, n, saved[n], t, puts, sharing)
             for n, (_, t) in zip(numbers, keyed)]
    return jax.tree_util.tree_unflatten(
        treedef, _run(reader, where, name, plans, puts, sharing, core_options, map_files))


def _match(where: str, target_paths: list[str], saved_paths: list[str],
           partial: bool) -> list[int]:
    """The saved leaf number of each target leaf; errors list any mismatch."""
    number = {p: i for i, p in enumerate(saved_paths)}
    if len(set(target_paths)) != len(target_paths):
        dup = sorted({p for p in target_paths if target_paths.count(p) > 1})
        raise InvalidArgumentError(f"{where}: target leaves share key paths {_listing(dup)}")
    missing = [p for p in target_paths if p not in number]
    extra = [] if partial else sorted(set(saved_paths) - set(target_paths))
    if missing or extra:
        problems = []
        if missing:
            problems.append(f"target leaves not in the checkpoint: {_listing(missing)}")
        if extra:
            problems.append(f"checkpoint leaves not in the target: {_listing(extra)}"
                            " (pass partial=True to load a subset)")
        raise IncompatibleError(f"{where}: tree mismatch; " + "; ".join(problems))
    return [number[p] for p in target_paths]


def _listing(paths: list[str]) -> str:
    shown = ", ".join(repr(p) for p in paths[:_MAX_LISTED])
    more = len(paths) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _run(reader, where: str, name: str, plans: list[_Plan], puts: "_DevicePuts",
         sharing: broadcast_load.Plan | None, core_options, map_files: bool) -> list:
    slots = [slot for leaf_slots, _ in plans for slot in leaf_slots]
    shared = set()
    if sharing is not None:
        sharing.choose_readers(reader, name, core_options)
        shared = sharing.shared_slots()
    own = [slot for slot in slots if id(slot) not in shared]
    mapper = file_mapping.FileMapper()
    if map_files and own:
        mapper.map_boxes(reader, name, own, core_options)
    to_read = [slot for slot in own if slot.buffer is None]
    arena = host_memory.Arena()
    for slot in slots:
        if slot.buffer is None:
            slot.buffer = arena.empty(slot.shape, slot.dtype)
    requests = [_request(slot) for slot in to_read]
    if sharing is not None:
        requests += [_request(slot, origin, shape, buffer)
                     for slot, origin, shape, buffer in sharing.own_pieces()]
    if requests:
        reader.read(name, requests, core_options)
    mapper.verify()
    if sharing is not None:
        sharing.exchange(f"load of {where}", core_options.timeout_s)
    for slot in slots:
        if slot.devices is not None:
            slot.key = puts.add(slot.buffer, slot.devices)
    puts.run()
    return [finish() for _, finish in plans]


class _DevicePuts:
    """Host buffers to place on devices, placed by two batched device_put
    calls for the whole tree instead of one call per shard (the per-call
    overhead dominates loads of many small leaves).

    device_put of a numpy array may alias it on the CPU backend, so a buffer
    goes to its first device only; the other devices that hold the same box
    get copies of that device's array, so that no two shards share memory.
    """

    def __init__(self):
        self._buffers, self._firsts, self._others = [], [], []
        self._first_arrays = self._other_arrays = None

    def add(self, buffer: np.ndarray, devices: list) -> tuple[int, list[int]]:
        """Schedules ``buffer`` onto ``devices``; returns keys for ``arrays``."""
        first = len(self._buffers)
        self._buffers.append(buffer)
        self._firsts.append(devices[0])
        others = []
        for device in devices[1:]:
            others.append(len(self._others))
            self._others.append((first, device))
        return first, others

    def run(self) -> None:
        self._first_arrays = jax.device_put(self._buffers, self._firsts)
        self._other_arrays = jax.device_put(
            [self._first_arrays[i] for i, _ in self._others], [d for _, d in self._others])

    def arrays(self, key: tuple[int, list[int]]) -> list:
        first, others = key
        return [self._first_arrays[first]] + [self._other_arrays[i] for i in others]


def _plan_leaf(where: str, number: int, saved: dict, target: Any, puts: _DevicePuts,
               sharing: broadcast_load.Plan | None) -> _Plan:
    kind, path = saved["kind"], saved["path"]
    if kind == "none":
        if target is not None:
            raise IncompatibleError(f"{where}: leaf {path!r} is None in the checkpoint, the"
                                    f" target wants {_describe(target)}")
        return [], lambda: None
    if kind == "string":
        if target is not None and not isinstance(target, str):
            raise IncompatibleError(f"{where}: leaf {path!r} is a str in the checkpoint, the"
                                    f" target wants {_describe(target)}")
        return [], lambda: saved["value"]
    if kind == "scalar":
        return _plan_scalar(where, saved, target)
    if _wants_keys(saved, target):
        return _plan_keys(where, number, saved, target, puts, sharing)
    return _plan_array(where, number, saved, target, puts, sharing)


def _wants_keys(saved: dict, target: Any) -> bool:
    """Typed PRNG keys are built for a typed-key target and, without a
    target, for leaves saved from typed keys; any other target (uint32 key
    data included) takes the stored data as it is."""
    if target is None:
        return saved.get("prng_impl") is not None
    return hasattr(target, "dtype") and prng_keys.is_key(target.dtype)


def _plan_keys(where: str, number: int, saved: dict, target: Any, puts: _DevicePuts,
               sharing: broadcast_load.Plan | None) -> _Plan:
    """Typed keys from stored key data: with the target's implementation,
    shape and sharding, or without a target the saved ones (the saved
    sharding when this job has its devices, else the default device).
    Key data saved by hand (uint32, no "prng_impl") loads onto a typed-key
    target of matching shape too."""
    path, stored = saved["path"], tuple(saved["shape"])
    saved_impl = saved.get("prng_impl")
    if target is None:
        impl = saved_impl
        shape = stored[:max(len(stored) - len(prng_keys.key_shape(impl)), 0)]
        sharding = shardings.rebuild(saved["sharding"]) or _default_sharding()
    else:
        impl = prng_keys.impl_name(target.dtype)
        if saved_impl not in (None, impl):
            raise IncompatibleError(f"{where}: leaf {path!r} holds {saved_impl} keys in the"
                                    f" checkpoint, the target wants {impl} keys")
        shape = tuple(target.shape)
        sharding = target_sharding(where, path, target)
    needed = shape + prng_keys.key_shape(impl)
    if saved["dtype"] != prng_keys.DATA_DTYPE.name or stored != needed:
        raise IncompatibleError(
            f"{where}: leaf {path!r} is {saved['dtype']}{list(stored)} in the checkpoint;"
            f" {impl} keys of shape {list(shape)} need key data of uint32{list(needed)}")
    return _plan_sharded(number, path, shape, prng_keys.DATA_DTYPE, sharding, puts, sharing,
                         key_impl=impl)


def _plan_scalar(where: str, saved: dict, target: Any) -> _Plan:
    value = _decode_scalar(saved)
    if target is None or isinstance(target, (bool, int, float)):
        return [], lambda: value
    _check_target_shape(where, saved["path"], (), target)
    host = np.asarray(value, dtypes.from_name(saved["dtype"])).astype(_target_dtype(target))
    return [], lambda: _deliver(host, target, where, saved["path"])


def _decode_scalar(saved: dict):
    value = saved["value"]
    if saved["dtype"] == "float64":
        return float(value)  # float("nan") etc. decode the non-finite spellings too.
    return bool(value) if saved["dtype"] == "bool" else int(value)


def _plan_array(where: str, number: int, saved: dict, target: Any, puts: _DevicePuts,
                sharing: broadcast_load.Plan | None) -> _Plan:
    path, shape = saved["path"], tuple(saved["shape"])
    whole = (0,) * len(shape)
    if target is None or isinstance(target, (bool, int, float)):
        slot = _Slot(number, path, whole, shape, dtypes.from_name(saved["dtype"]))
        finish = (lambda: slot.buffer) if target is None else (lambda: slot.buffer.item())
        if target is not None:
            _check_target_shape(where, path, shape, np.asarray(target))
        return [slot], finish
    _check_target_shape(where, path, shape, target)
    dtype = _target_dtype(target)
    if isinstance(target, (np.ndarray, np.generic)):
        slot = _Slot(number, path, whole, shape, dtype)
        return [slot], lambda: _deliver(slot.buffer, target, where, path)
    return _plan_sharded(number, path, shape, dtype, target_sharding(where, path, target), puts,
                         sharing)


def _plan_sharded(number: int, path: str, shape: tuple, dtype: np.dtype,
                  sharding: jax.sharding.Sharding, puts: _DevicePuts,
                  sharing: broadcast_load.Plan | None, key_impl: str | None = None) -> _Plan:
    """A jax.Array of ``shape`` with ``sharding``; with ``key_impl``, typed
    keys whose stored data has the implementation's key shape appended.
    With ``sharing``, its boxes join that load-and-broadcast plan."""
    key_shape = prng_keys.key_shape(key_impl) if key_impl else ()
    key_origin = (0,) * len(key_shape)
    slots = [_Slot(number, path, origin + key_origin, extent + key_shape, dtype, devices)
             for (origin, extent), devices in
             shardings.addressable_boxes(sharding, shape).items()]
    if sharing is not None:
        sharing.add_leaf(number, path, sharding, shape, key_shape, dtype, slots)

    def finish():
        arrays = [a for slot in slots for a in puts.arrays(slot.key)]
        if key_impl:
            # Typed keys are assembled from their per-device data in the
            # sharding's device order, unlike plain arrays.
            order = {d: i for i, d in enumerate(sharding.addressable_devices_indices_map(shape))}
            arrays.sort(key=lambda a: order[next(iter(a.devices()))])
            arrays = [prng_keys.wrap(a, key_impl) for a in arrays]
        if len(arrays) == 1 and isinstance(sharding, jax.sharding.SingleDeviceSharding):
            return arrays[0]  # already the requested array
        return jax.make_array_from_single_device_arrays(shape, sharding, arrays)

    return slots, finish


def _request(slot: _Slot, origin=None, shape=None, buffer=None) -> tuple:
    """A read of ``slot`` into its buffer, or of the part ``origin``/``shape``
    of its leaf into ``buffer``."""
    if buffer is None:
        origin, shape, buffer = slot.origin, slot.shape, slot.buffer
    return (slot.number, dtypes.name_of(slot.dtype), list(origin), list(shape),
            dtypes.as_bytes(buffer))


def _check_target_shape(where: str, path: str, saved_shape: tuple, target: Any) -> None:
    if not hasattr(target, "shape") or not hasattr(target, "dtype"):
        raise InvalidArgumentError(
            f"{where}: target leaf {path!r} is a {type(target).__name__}; targets are"
            " jax.ShapeDtypeStruct, jax/numpy arrays, numpy/Python scalars, str or None")
    if tuple(target.shape) != tuple(saved_shape):
        raise IncompatibleError(
            f"{where}: leaf {path!r} has shape {tuple(saved_shape)} in the checkpoint, the"
            f" target wants {tuple(target.shape)}")


def _target_dtype(target) -> np.dtype:
    return np.dtype(target.dtype)


def target_sharding(where: str, path: str, target) -> jax.sharding.Sharding:
    sharding = getattr(target, "sharding", None)
    if not isinstance(sharding, jax.sharding.Sharding):
        # A ShapeDtypeStruct without a sharding asks for a jax.Array: put it
        # where JAX puts new arrays.
        return _default_sharding()
    if shardings.is_abstract(sharding):
        concrete = shardings.on_current_mesh(sharding)
        if concrete is None:
            raise InvalidArgumentError(
                f"{where}: target leaf {path!r} is sharded over an abstract mesh"
                f" ({sharding.mesh}) and no concrete mesh of that shape is set; load inside"
                " `with jax.set_mesh(mesh):` or give NamedSharding(mesh, spec) targets")
        return concrete
    return sharding


def _default_sharding() -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _deliver(host: np.ndarray, target: Any, where: str, path: str):
    """``host`` in the form the target leaf asks for."""
    if isinstance(target, np.generic):
        return host[()]
    if isinstance(target, np.ndarray):
        return host
    return jax.device_put(host, target_sharding(where, path, target))


def _describe(target) -> str:
    if hasattr(target, "shape") and hasattr(target, "dtype"):
        return f"{type(target).__name__} {np.dtype(target.dtype).name}{list(target.shape)}"
    return type(target).__name__
