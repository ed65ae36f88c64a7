"""Boxes of shardings, and sharding descriptions stored in meta.json.

Works only from ``sharding.devices_indices_map`` / ``shard.index``, which
every ``jax.sharding.Sharding`` provides, because the concrete sharding
classes change between JAX versions.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (origin, shape)


def box_of_index(index: Sequence[slice] | None, shape: Sequence[int]) -> Box:
    """The box an index (a tuple of slices, as in ``shard.index``) selects.
    (JAX types an index as optional; a sharding that places no box on a
    device has no index for it and is refused.)"""
    if index is None:
        raise ValueError(f"a shard of an array of shape {tuple(shape)} has no index")
    origin, extent = [], []
    for s, n in zip(index, shape):
        start, stop, step = s.indices(n)
        if step != 1:
            raise ValueError(f"strided shard index {index} is not a box")
        origin.append(start)
        extent.append(max(stop - start, 0))
    return tuple(origin), tuple(extent)


def addressable_boxes(sharding: jax.sharding.Sharding,
                      shape: Sequence[int]) -> dict[Box, list[jax.Device]]:
    """Each unique box this process's devices hold, with the devices holding it.

    Cached per (sharding, shape): a tree has many leaves of few such pairs.
    The result is shared and must not be modified.
    """
    shape = tuple(shape)
    if isinstance(sharding, SingleDeviceSharding):  # the common small-leaf case, uncached
        (device,) = sharding.device_set
        # jax.Device is jaxlib's extension type, which has no stubs.
        if device.process_index != jax.process_index():  # type: ignore[attr-defined]
            return {}
        return {((0,) * len(shape), shape): [device]}
    try:
        return _cached_addressable_boxes(sharding, shape)
    except TypeError:  # unhashable sharding
        return _addressable_boxes(sharding, shape)


def _addressable_boxes(sharding: jax.sharding.Sharding,
                       shape: tuple[int, ...]) -> dict[Box, list[jax.Device]]:
    boxes: dict[Box, list[jax.Device]] = {}
    for device, index in sharding.addressable_devices_indices_map(shape).items():
        boxes.setdefault(box_of_index(index, shape), []).append(device)
    return boxes


_cached_addressable_boxes = functools.lru_cache(maxsize=1024)(_addressable_boxes)


def box_holders(sharding: jax.sharding.Sharding,
                shape: Sequence[int]) -> dict[Box, tuple[int, ...]]:
    """Each unique box of the whole array, with the processes whose devices
    hold it (ascending). From the global ``devices_indices_map``, so every
    process computes the same result. Cached like ``addressable_boxes``;
    the result is shared and must not be modified.
    """
    shape = tuple(shape)
    try:
        return _cached_box_holders(sharding, shape)
    except TypeError:  # unhashable sharding
        return _box_holders(sharding, shape)


def _box_holders(sharding: jax.sharding.Sharding,
                 shape: tuple[int, ...]) -> dict[Box, tuple[int, ...]]:
    holders: dict[Box, set[int]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        # jax.Device is jaxlib's extension type, which has no stubs.
        process = device.process_index  # type: ignore[attr-defined]
        holders.setdefault(box_of_index(index, shape), set()).add(process)
    return {box: tuple(sorted(processes)) for box, processes in holders.items()}


_cached_box_holders = functools.lru_cache(maxsize=1024)(_box_holders)


def replica_parallel_boxes(sharding: jax.sharding.Sharding,
                           shape: Sequence[int]) -> dict[jax.Device, Box]:
    """The box each of this process's devices writes in a replica-parallel save.

    Works from the global ``devices_indices_map``, which every process
    computes alike, so the processes agree on who writes what without
    talking. A box held by devices of P processes is split among those
    processes, one writer device each (its lowest-numbered holder): replicas
    inside one process would only split the same process's work. The cut
    runs along the first dimension at least P long, so every slice is a
    contiguous piece of the box (written without a gather, read without a
    scatter); when no dimension is that long, the longest one is cut into
    fewer slices and only the first processes write. A box without
    elements, or of a 0-d array, is written whole by its first holder. Over
    all processes the written boxes tile the array: no element twice, none
    missed. Devices that write nothing are absent from the result.
    """
    shape = tuple(shape)
    try:
        hash(sharding)
    except TypeError:
        return dict(_plan_replica_slices(sharding, shape))
    return dict(_cached_replica_slices(sharding, shape))


def _plan_replica_slices(sharding: jax.sharding.Sharding,
                         shape: tuple[int, ...]) -> tuple[tuple[jax.Device, Box], ...]:
    holders: dict[Box, list[jax.Device]] = {}
    for device, index in sharding.devices_indices_map(shape).items():
        holders.setdefault(box_of_index(index, shape), []).append(device)
    local = {d for d in sharding.addressable_devices}
    plan: dict[jax.Device, Box] = {}
    for (origin, extent), devices in holders.items():
        writers = _one_device_per_process(devices)
        if not extent or 0 in extent:
            if writers[0] in local:
                plan[writers[0]] = (origin, extent)
            continue
        dim = next((d for d, n in enumerate(extent) if n >= len(writers)),
                   int(np.argmax(extent)))
        parts = min(len(writers), extent[dim])
        for r, device in enumerate(writers[:parts]):
            if device not in local:
                continue
            start = extent[dim] * r // parts
            stop = extent[dim] * (r + 1) // parts
            plan[device] = (origin[:dim] + (origin[dim] + start,) + origin[dim + 1:],
                            extent[:dim] + (stop - start,) + extent[dim + 1:])
    return tuple(plan.items())


def _one_device_per_process(devices: list[jax.Device]) -> list[jax.Device]:
    """The lowest-numbered device of each process, ordered by process."""
    first: dict[int, jax.Device] = {}
    for device in sorted(devices, key=lambda d: d.id):
        first.setdefault(device.process_index, device)
    return [first[p] for p in sorted(first)]


# A training state has many leaves of few (sharding, shape) pairs, and the
# global map has an entry per device of the job.
_cached_replica_slices = functools.lru_cache(maxsize=1024)(_plan_replica_slices)


def is_abstract(sharding: jax.sharding.Sharding) -> bool:
    """Whether ``sharding`` names mesh axes but no devices (a NamedSharding
    over an AbstractMesh, as ``flax.nnx.eval_shape`` returns under
    ``jax.set_mesh``)."""
    return isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, AbstractMesh)


def on_current_mesh(sharding: NamedSharding) -> NamedSharding | None:
    """An abstract-mesh sharding placed on the concrete mesh set by
    ``jax.set_mesh``, or None when none is set or its axes differ."""
    mesh = jax.sharding.get_mesh()
    if mesh.empty or dict(mesh.shape) != dict(sharding.mesh.shape):
        return None
    return NamedSharding(mesh, sharding.spec, memory_kind=sharding.memory_kind)


def on_cpu(sharding: jax.sharding.Sharding) -> bool:
    """Whether all devices of ``sharding`` are CPU devices (whose arrays
    already live in host memory)."""
    try:
        return _cached_on_cpu(sharding)
    except TypeError:  # unhashable sharding
        return _all_cpu(sharding)


def _all_cpu(sharding: jax.sharding.Sharding) -> bool:
    # jax.Device is jaxlib's extension type, which has no stubs.
    return all(d.platform == "cpu" for d in sharding.device_set)  # type: ignore[attr-defined]


_cached_on_cpu = functools.lru_cache(maxsize=1024)(_all_cpu)


def describe(sharding: jax.sharding.Sharding | None) -> dict | None:
    """A JSON description of ``sharding`` (informational; see ``rebuild``).

    Cached per sharding: the result is shared and must not be modified.
    """
    if sharding is None:
        return None
    try:
        return _cached_description(sharding)
    except TypeError:  # unhashable sharding
        return _description(sharding)


def _description(sharding: jax.sharding.Sharding) -> dict:
    if isinstance(sharding, SingleDeviceSharding):
        (device,) = sharding.device_set
        # jax.Device is jaxlib's extension type, which has no stubs.
        return {"type": "single_device", "device_id": device.id}  # type: ignore[attr-defined]
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        return {
            "type": "named",
            "axis_names": list(mesh.axis_names),
            "mesh_shape": list(mesh.devices.shape),
            "spec": [_spec_entry(e) for e in sharding.spec],
            "device_ids": [int(d.id) for d in mesh.devices.flat],
        }
    return {"type": "other", "class": type(sharding).__name__}


_cached_description = functools.lru_cache(maxsize=1024)(_description)


def _spec_entry(entry):
    if entry is None or isinstance(entry, str):
        return entry
    if isinstance(entry, tuple):
        return list(entry)
    return None  # PartitionSpec.UNCONSTRAINED and the like: no fixed layout.


def rebuild(description: dict | None) -> jax.sharding.Sharding | None:
    """The sharding a description stands for, if every device it names exists.

    Returns None when the description is missing, of another type, or names
    devices this job does not have (loading onto another topology).
    """
    if not description:
        return None
    devices = {d.id: d for d in jax.devices()}
    if description.get("type") == "single_device":
        device = devices.get(description.get("device_id"))
        return SingleDeviceSharding(device) if device is not None else None
    if description.get("type") == "named":
        ids = description["device_ids"]
        if not all(i in devices for i in ids):
            return None
        mesh_devices = np.array([devices[i] for i in ids], dtype=object)
        mesh = Mesh(mesh_devices.reshape(description["mesh_shape"]),
                    tuple(description["axis_names"]))
        spec = [tuple(e) if isinstance(e, list) else e for e in description["spec"]]
        return NamedSharding(mesh, PartitionSpec(*spec))
    return None
