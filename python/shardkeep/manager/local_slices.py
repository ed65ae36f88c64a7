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

import dataclasses
import json

import numpy as np

from .. import _core
from ..base import unchanged

SLICE_PART = "shardkeep-local-slice"


def describe(parts: list[_core.SavePart]) -> tuple[dict, list[np.ndarray]]:
    """A staged save's parts as a JSON header (what ``parts_of`` needs,
    without the bytes) and the flat byte buffers it describes, in order."""
    header_parts: list[dict] = []
    buffers: list[np.ndarray] = []
    for part in parts:
        entry: dict = {"name": part.name, "kind": part.kind, "meta": part.meta_json}
        if part.kind == "pytree":
            entry["shards"] = []
            for shard in part.shards:
                entry["shards"].append([shard.leaf, shard.dtype, shard.origin, shard.shape])
                # A fill function (an ArraySource's box) is called for the whole box.
                data = (shard.data(shard.origin, shard.shape) if callable(shard.data)
                        else shard.data)
                buffers.append(np.asarray(data, np.uint8).reshape(-1))
        else:
            buffers.append(np.frombuffer(part.value, np.uint8))
        header_parts.append(entry)
    return {"parts": header_parts}, buffers


@dataclasses.dataclass(frozen=True)
class Previous:
    """An earlier committed slice of the same process, as its commit record
    names it: a save of the slice links its boxes where they are equal."""

    path: str
    created_ns: int


def parts_of(header: dict, buffers: list[np.ndarray], q: int, count: int,
             compare_with: Previous | None = None) -> list[_core.SavePart]:
    """The parts of slice ``q``'s one-process checkpoint (see the module
    docstring). With ``compare_with``, each box worth comparing
    (``unchanged.worth_comparing``) is compared with leaf k of the same
    checkpointable there (``_core.Shard.compare_with``): a job whose state
    keeps its structure holds the same box there."""
    parts: list[_core.SavePart] = []
    i = 0
    description: dict = {"process": q, "process_count": count, "parts": []}
    for entry in header["parts"]:
        description["parts"].append(entry)
        if entry["kind"] != "pytree":
            parts.append(_core.SavePart(entry["name"], entry["kind"], entry["meta"],
                                        buffers[i].tobytes()))
            i += 1
            continue
        leaves, shards = [], []
        for k, (_, dtype_name, _, shape) in enumerate(entry["shards"]):
            leaves.append({"path": str(k), "kind": "array", "dtype": dtype_name,
                           "shape": list(shape), "sharding": None})
            shard = _core.Shard(k, dtype_name, [0] * len(shape), shape, buffers[i])
            if compare_with is not None and unchanged.worth_comparing(buffers[i]):
                shard.compare_with = _core.StoredIn(compare_with.path, entry["name"], str(k),
                                                    compare_with.created_ns)
            shards.append(shard)
            i += 1
        meta = {"kind": "pytree",
                "tree": {"type": "list",
                         "children": [{"type": "leaf", "leaf": k} for k in range(len(leaves))]},
                "leaves": leaves}
        parts.append(_core.SavePart(entry["name"], "pytree", _core.encode_meta(meta),
                                    shards=shards))
    parts.append(_core.SavePart(SLICE_PART, "json", _core.encode_meta({"kind": "json"}),
                                json.dumps(description).encode()))
    return parts


def json_bytes(value) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), np.uint8)
