"""What a slice of a local step is, as a one-process checkpoint.

A slice is the boxes one process writes in a save of the whole job. The
core refuses a one-process save whose shards do not cover their leaves (a
one-process checkpoint must load by itself), so a slice is stored with one
leaf per box: each pytree checkpointable of the slice is a list whose k-th
leaf is the slice's k-th box, whole. The json checkpointable
``shardkeep-local-slice`` records, per original checkpointable, its kind,
its meta.json and, for each slice leaf, the original leaf number, dtype,
origin and shape. json and bytes checkpointables are stored as they are.
"""

from __future__ import annotations

import json

import numpy as np

from . import _core

SLICE_PART = "shardkeep-local-slice"


def describe(parts: list[dict]) -> tuple[dict, list[np.ndarray]]:
    """A staged save's parts as a JSON header (what ``parts_of`` needs,
    without the bytes) and the flat byte buffers it describes, in order."""
    header_parts, buffers = [], []
    for part in parts:
        entry = {"name": part["name"], "kind": part["kind"], "meta": part["meta_json"]}
        if part["kind"] == "pytree":
            entry["shards"] = []
            for leaf, dtype_name, origin, shape, data in part["shards"]:
                if callable(data):  # an ArraySource's box, produced on demand
                    data = _materialise(data, origin, shape)
                entry["shards"].append([leaf, dtype_name, list(origin), list(shape)])
                buffers.append(np.asarray(data, np.uint8).reshape(-1))
        else:
            buffers.append(np.frombuffer(bytes(part["value"]), np.uint8))
        header_parts.append(entry)
    return {"parts": header_parts}, buffers


def _materialise(fill, origin, shape) -> np.ndarray:
    data = fill(list(origin), list(shape))
    return np.frombuffer(bytes(data), np.uint8) if not isinstance(data, np.ndarray) else data


def parts_of(header: dict, buffers: list, q: int, count: int) -> list[dict]:
    """The parts of slice ``q``'s one-process checkpoint (see the module docstring)."""
    parts, i = [], 0
    description = {"process": q, "process_count": count, "parts": []}
    for entry in header["parts"]:
        description["parts"].append(entry)
        if entry["kind"] != "pytree":
            parts.append({"name": entry["name"], "kind": entry["kind"],
                          "value": buffers[i].tobytes(), "meta_json": entry["meta"],
                          "shards": []})
            i += 1
            continue
        leaves, shards = [], []
        for k, (_, dtype_name, _, shape) in enumerate(entry["shards"]):
            leaves.append({"path": str(k), "kind": "array", "dtype": dtype_name,
                           "shape": list(shape), "sharding": None})
            shards.append((k, dtype_name, [0] * len(shape), list(shape), buffers[i]))
            i += 1
        meta = {"kind": "pytree",
                "tree": {"type": "list",
                         "children": [{"type": "leaf", "leaf": k} for k in range(len(leaves))]},
                "leaves": leaves}
        parts.append({"name": entry["name"], "kind": "pytree", "value": b"",
                      "meta_json": _core.encode_meta(meta), "shards": shards})
    parts.append({"name": SLICE_PART, "kind": "json",
                  "value": json.dumps(description).encode(),
                  "meta_json": _core.encode_meta({"kind": "json"}), "shards": []})
    return parts


def json_bytes(value) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), np.uint8)
