"""How to place a loaded state's host boxes on their devices: the ways
JAX's public API offers, timed side by side on W1's boxes.

  callback  one jax.make_array_from_callback per leaf (what loads use)
  batched   one jax.device_put of every box of every leaf onto its device,
            then jax.make_array_from_single_device_arrays per leaf

Each way places fresh 64-byte aligned host buffers (the CPU backend
adopts those instead of copying), so neither pays for memory the other
touched. Usage: python bench/placement.py [--scale small] [--reps 3].
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402

import workloads  # noqa: E402
from shardkeep.base import host_memory, shardings  # noqa: E402


def _layout(scale: str) -> list[tuple]:
    """(leaf, sharding, {box: device}) of W1's leaves."""
    out = []
    for leaf in workloads.leaves("W1", scale):
        sharding = workloads.sharding_for("W1", leaf, "fsdp")
        indices = sharding.addressable_devices_indices_map(leaf.shape)
        out.append((leaf, sharding, {shardings.box_of_index(index, leaf.shape): device
                                     for device, index in indices.items()}))
    return out


def _buffers(layout) -> list[dict]:
    return [{box: host_memory.empty(box[1], workloads._np_dtype(leaf.dtype)) for box in boxes}
            for leaf, _, boxes in layout]


def by_callback(layout, buffers) -> list[jax.Array]:
    return [jax.make_array_from_callback(
        leaf.shape, sharding,
        lambda index, mine=mine, shape=leaf.shape: mine[shardings.box_of_index(index, shape)],
        dtype=workloads._np_dtype(leaf.dtype))
        for (leaf, sharding, _), mine in zip(layout, buffers)]


def batched(layout, buffers) -> list[jax.Array]:
    hosts, devices = [], []
    for (_, _, boxes), mine in zip(layout, buffers):
        for box, device in boxes.items():
            hosts.append(mine[box])
            devices.append(device)
    singles = jax.device_put(hosts, devices)
    out, at = [], 0
    for leaf, sharding, boxes in layout:
        out.append(jax.make_array_from_single_device_arrays(
            leaf.shape, sharding, singles[at:at + len(boxes)]))
        at += len(boxes)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", default="small", choices=list(workloads.LLAMA_SCALES))
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    layout = _layout(args.scale)
    boxes = sum(len(b) for _, _, b in layout)
    times: dict[str, list[float]] = {"callback": [], "batched": []}
    gc.disable()  # a collection inside one way's timing would be charged to it
    for _ in range(args.reps):
        for name, way in (("callback", by_callback), ("batched", batched)):
            buffers = _buffers(layout)
            start = time.perf_counter()
            jax.block_until_ready(way(layout, buffers))
            times[name].append(time.perf_counter() - start)
    print(json.dumps({"scale": args.scale, "leaves": len(layout), "boxes": boxes,
                      "seconds": times,
                      "median_us_per_box": {k: sorted(v)[len(v) // 2] / boxes * 1e6
                                            for k, v in times.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
