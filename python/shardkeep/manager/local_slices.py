"""What a slice of a local step is, as a one-process checkpoint.

A slice is the boxes one process writes in a save of the whole job. The
core refuses a one-process save whose shards do not cover their leaves (a
one-process checkpoint must load by itself), so a slice is stored with one
leaf per box: each pytree checkpointable of the slice is a list whose k-th
leaf is the slice's k-th box, whole. The json checkpointable
``shardkeep-local-slice`` records, per original checkpointable, its kind,
its meta.json and, for each slice leaf, a ``SliceShard``: the original
leaf number, dtype, origin and shape. json and bytes checkpointables are
stored as they are.
"""

from __future__ import annotations

import dataclasses
import json
from typing import NamedTuple

import numpy as np

from .. import _core
from ..base import unchanged
from ..errors import CorruptionError

SLICE_PART = "shardkeep-local-slice"
# The custom-metadata key of a slice's commit record that says which slice
# of which save it is; the manager refuses it (and every "shardkeep_" key)
# in a user's custom metadata (``step_record.checked_custom_metadata``).
LOCAL_MARK = "shardkeep_local"


class SliceShard(NamedTuple):
    """One box stored in a slice, as leaf k of its checkpointable there:
    which leaf of the original checkpointable it is a box of, its dtype,
    and where it lies in that leaf."""

    leaf: int
    dtype: str
    origin: tuple[int, ...]
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SlicePart:
    """One checkpointable of a slice: its kind, the original meta.json (its
    text, as the save's part carried it) and, for a pytree, the boxes
    stored as its leaves, in order."""

    name: str
    kind: str
    meta: str
    shards: tuple[SliceShard, ...] = ()


@dataclasses.dataclass(frozen=True)
class Description:
    """What ``shardkeep-local-slice`` records (and processes send each
    other): the slice's parts and, once known, whose slice of which step
    it is."""

    parts: tuple[SlicePart, ...]
    process: int | None = None
    process_count: int | None = None
    step: int | None = None

    def to_json(self) -> dict:
        """The JSON document, every record with named fields."""
        return {"process": self.process, "process_count": self.process_count,
                "step": self.step,
                "parts": [{"name": p.name, "kind": p.kind, "meta": p.meta,
                           "shards": [s._asdict() for s in p.shards]} for p in self.parts]}

    def encoded(self) -> np.ndarray:
        """``to_json`` as UTF-8 bytes, ready for the exchange."""
        return json_bytes(self.to_json())

    @classmethod
    def decode(cls, data: bytes, where: str) -> "Description":
        """The description in ``data`` (``encoded``'s bytes); CorruptionError
        naming ``where`` when it is not one."""
        try:
            document = json.loads(data)
            parts = tuple(
                SlicePart(p["name"], p["kind"], p["meta"],
                          tuple(SliceShard(int(s["leaf"]), s["dtype"], tuple(s["origin"]),
                                           tuple(s["shape"])) for s in p["shards"]))
                for p in document["parts"])
            return cls(parts, document["process"], document["process_count"],
                       document["step"])
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptionError(f"{where}: not a local slice description ({e!r}); the slice"
                                  " was written by another shardkeep version or damaged") from e


def describe(parts: list[_core.SavePart]) -> tuple[Description, list[np.ndarray]]:
    """A staged save's parts as a description (what ``parts_of`` needs,
    without the bytes) and the flat byte buffers it describes, in order."""
    described: list[SlicePart] = []
    buffers: list[np.ndarray] = []
    for part in parts:
        shards = []
        if part.kind == "pytree":
            for shard in part.shards:
                shards.append(SliceShard(shard.leaf, shard.dtype, tuple(shard.origin),
                                         tuple(shard.shape)))
                # A fill function (an ArraySource's box) is called for the whole box.
                data = (shard.data(shard.origin, shard.shape) if callable(shard.data)
                        else shard.data)
                buffers.append(np.asarray(data, np.uint8).reshape(-1))
        else:
            buffers.append(np.frombuffer(part.value, np.uint8))
        described.append(SlicePart(part.name, part.kind, part.meta_json, tuple(shards)))
    return Description(tuple(described)), buffers


@dataclasses.dataclass(frozen=True)
class Previous:
    """An earlier committed slice of the same process, as its commit record
    names it: a save of the slice links its boxes where they are equal."""

    path: str
    created_ns: int


def parts_of(description: Description, buffers: list[np.ndarray], q: int, count: int,
             compare_with: Previous | None = None) -> list[_core.SavePart]:
    """The parts of slice ``q``'s one-process checkpoint (see the module
    docstring). With ``compare_with``, each box worth comparing
    (``unchanged.worth_comparing``) is compared with leaf k of the same
    checkpointable there (``_core.Shard.compare_with``): a job whose state
    keeps its structure holds the same box there."""
    parts: list[_core.SavePart] = []
    i = 0
    for entry in description.parts:
        if entry.kind != "pytree":
            parts.append(_core.SavePart(entry.name, entry.kind, entry.meta, buffers[i].tobytes()))
            i += 1
            continue
        leaves, shards = [], []
        for k, stored in enumerate(entry.shards):
            leaves.append(_core.LeafInfo(str(k), _core.LeafKind.ARRAY, stored.dtype,
                                         list(stored.shape)))
            shard = _core.Shard(k, stored.dtype, [0] * len(stored.shape), stored.shape,
                                buffers[i])
            if compare_with is not None and unchanged.worth_comparing(buffers[i]):
                shard.compare_with = _core.StoredIn(compare_with.path, entry.name, str(k),
                                                    compare_with.created_ns)
            shards.append(shard)
            i += 1
        # The slice's boxes in order: a list of leaves.
        tree = _core.tree_of_keys(entry.name, [([(str(k), True)], _core.KeyedValue.LEAF)
                                               for k in range(len(leaves))])
        meta = _core.encode_pytree_meta(_core.PytreeInfo(tree, leaves))
        parts.append(_core.SavePart(entry.name, "pytree", meta, shards=shards))
    recorded = dataclasses.replace(description, process=q, process_count=count, step=None)
    parts.append(_core.SavePart(SLICE_PART, "json", _core.encode_value_meta("json"),
                                recorded.encoded().tobytes()))
    return parts


def json_bytes(value) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), np.uint8)


@dataclasses.dataclass
class Decision:
    """The step the local tiers can rebuild, and who holds each of its slices."""

    step: int
    process_count: int                 # P_S: processes that saved the step
    holders: dict[int, list[int]]      # slice q -> processes holding it
    paths: dict[int, str]              # slice q -> its checkpoint, for slices held here

    def server(self, q: int) -> int:
        """The process that sends slice q's description and pieces to the
        processes without it: process q itself when it still holds its
        slice (so that no process serves two slices while others serve
        none), else the lowest holder of the peer copy."""
        holders = self.holders[q]
        return q if q in holders else holders[0]
