"""The blocking phase of a pytree save: classify leaves, plan shards, stage.

Produces the meta.json text and the ``_core.Shard``s ``_core.start_save``
takes. Device-to-host copies of all planned shards are started before
any is waited for, so that they overlap; on GPUs they go into pinned host
memory (``device_copies``).

Planning (flattening the tree into meta.json's structure, describing each
leaf, choosing the boxes this process writes) costs tens of microseconds
per leaf, and a training loop saves the same tree again and again. So the
plan is kept, keyed by the tree's ``jax.tree_util`` structure, and reused
when every leaf has the type, shape, dtype and sharding it had (and each
bool, int, float and str leaf the same value: those values are in
meta.json). One exception: a dict's key order is recorded as of the save
that made the plan (a treedef does not tell insertion orders apart).
What a plan knows of each leaf (its meta.json entry, its boxes and their
getters) is ``leaf_sources``'.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import numpy as np

from .. import _core
from ..base import dtypes, tree_codec, unchanged
from ..base.array_source import ArraySource
from ..errors import ShardkeepError
from . import device_copies, leaf_sources, save_base

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
    there is one (CPU backend, numpy leaves) or its copy in an async
    save's staging buffer, the device-to-host copy elsewhere, a fill
    function (``ArraySource`` leaves), or where a base stores it."""

    meta_json: str
    shards: list[_core.Shard]
    # (key path, value) of the arrays whose places are remembered
    # (``shardkeep.base.unchanged``), once the save is known.
    arrays: list[tuple[str, jax.Array]]


def stage_pytree(tree: Any, *, replica_parallel: bool,
                 registered_kind: str | None = None, base: save_base.Base | None = None,
                 checkpointable: str = "state", planned: "Planned | None" = None,
                 copies: _core.StagingCopies | None = None,
                 feed: _core.ShardFeed | None = None,
                 pinned_host: bool | None = None) -> StagedTree:
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
    has it. With ``copies``, the boxes in the caller's host memory are
    copied into their staging buffer (an async save; the copies run on
    native threads while the rest is staged), else they are views of it.

    With ``feed`` (a synchronous save already started, which plans no
    links from a base), the shards go to the feed a group of leaves at a
    time, about ``FEED_GROUP_BYTES`` each, so that the save's writers start
    on the first leaves while later ones are staged; none are returned.

    ``pinned_host`` is ``Options.pinned_host_staging``: whether the boxes
    on accelerators are copied into pinned host memory.
    """
    plan, values = planned if planned is not None else plan_pytree(tree, replica_parallel)
    for number in plan.array_leaves:
        leaf_sources.check_not_deleted(plan.leaf_metas[plan.codec_number[number]].path, values[number])
    arrays = [(plan.leaf_metas[plan.codec_number[number]].path, values[number])
              for number in plan.remembered_arrays]
    stored: dict[int, _core.StoredIn] = {}  # value index -> where base holds it
    if base is not None:
        stored = unchanged.stored_in({number: values[number] for number in plan.remembered_arrays},
                                     base.checkpoint, base.created_ns)
    compared: dict[int, _core.StoredIn] = {}  # value index -> the base's leaf to compare with
    if base is not None and base.compare_contents:
        for number in plan.comparable_arrays:
            if number not in stored:
                path = plan.leaf_metas[plan.codec_number[number]].path
                compared[number] = _core.StoredIn(base.checkpoint, checkpointable, path,
                                                  base.created_ns)
    shards: list[_core.Shard] = []
    carved: list[_Leaf] = []  # the leaves whose boxes the core carves out of host views
    for leaf in plan.leaves:
        if leaf.value_index in stored:
            shards += _stored_shards(plan, leaf, stored[leaf.value_index])
        elif leaf.fills:  # an ArraySource: produced chunk by chunk by the writers
            source = values[leaf.value_index]
            path = plan.leaf_metas[leaf.leaf_number].path
            shards += [_core.Shard(leaf.leaf_number, leaf.dtype_name, list(origin), list(shape),
                                   functools.partial(_fill_from, path, source))
                       for _, origin, shape in leaf.stage.boxes]
        else:
            carved.append(leaf)
    views: list[list] = [leaf.stage.views(values[leaf.value_index]) for leaf in carved]
    if not plan.all_on_host:
        device_copies.start([of_leaf for leaf, of_leaf in zip(carved, views)
                             if not leaf.stage.on_host], pinned_host)
    if feed is not None:
        feed.add(shards)  # sources: the writers produce them chunk by chunk
        for group in _feed_groups(carved):
            feed.add(_core.carve_shards(
                [carved[i].layout for i in group],
                [device_copies.host_views(carved[i].stage.on_host, views[i]) for i in group]))
        return StagedTree(plan.meta_json_for(values, registered_kind), [], arrays)
    # The caller's memory (on the CPU backend, donation reuses it) goes to
    # ``copies`` (each layout knows whether its views are that memory; on
    # accelerators they are fresh copies nobody else writes).
    carved_shards = _core.carve_shards(
        [leaf.layout for leaf in carved],
        [device_copies.host_views(leaf.stage.on_host, of_leaf)
         for leaf, of_leaf in zip(carved, views)], copies)
    if compared:
        at = 0
        for leaf in carved:
            count = leaf.layout.box_count
            if leaf.value_index in compared:
                for shard in carved_shards[at:at + count]:
                    shard.compare_with = compared[leaf.value_index]
            at += count
    shards += carved_shards
    return StagedTree(plan.meta_json_for(values, registered_kind), shards, arrays)


# About how many bytes of leaves a synchronous save's staging hands its
# writers at a time: small enough that they start at once, large enough
# that a group's native call costs little beside its writes.
FEED_GROUP_BYTES = 4 << 20


def _feed_groups(leaves: list["_Leaf"]) -> list[range]:
    """``leaves``' indices, in order, in groups of about FEED_GROUP_BYTES."""
    groups, start, size = [], 0, 0
    for i, leaf in enumerate(leaves):
        size += leaf.nbytes
        if size >= FEED_GROUP_BYTES:
            groups.append(range(start, i + 1))
            start, size = i + 1, 0
    if start < len(leaves):
        groups.append(range(start, len(leaves)))
    return groups


def meta_json_of(planned: "Planned", registered_kind: str | None = None) -> str:
    """The meta.json text of a planned tree (as ``stage_pytree`` gives it)."""
    plan, values = planned
    return plan.meta_json_for(values, registered_kind)


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


def _stored_shards(plan: "_Plan", leaf: "_Leaf", place: _core.StoredIn) -> list[_core.Shard]:
    """The shards naming where ``base`` stores the leaf as it is."""
    if jax.process_count() == 1:
        # This process writes the whole leaf: one shard names it (the core
        # links every chunk inside), not one per device.
        shape = plan.leaf_metas[leaf.leaf_number].shape
        return [_core.Shard(leaf.leaf_number, leaf.dtype_name, [0] * len(shape), shape, place)]
    return [_core.Shard(leaf.leaf_number, leaf.dtype_name, list(origin), list(shape), place)
            for _, origin, shape in leaf.stage.boxes]


class _Leaf(NamedTuple):  # a tuple: a tree's first save makes thousands
    """A leaf this process writes boxes of, and how they are staged."""

    value_index: int       # the leaf's index in the treedef's order
    leaf_number: int       # the leaf's number in meta.json
    dtype_name: str
    stage: leaf_sources.LeafStage
    layout: _core.LeafLayout
    fills: bool            # an ArraySource, read by the writer threads
    nbytes: int            # of the boxes this process writes


@dataclasses.dataclass
class _Plan:
    """How to save every tree of one structure and leaf signature."""

    signature: list           # per value: what must match for the plan to apply
    leaf_metas: list[_core.LeafInfo]  # meta.json entries, in meta.json's leaf order
    codec_number: list[int]   # value index -> meta.json leaf number
    array_leaves: list[int]   # value indices of jax.Arrays (checked not deleted)
    # Those whose places are remembered (``unchanged.worth_remembering``).
    remembered_arrays: list[int]
    # The jax and numpy arrays a save compares with its base's
    # (``unchanged.worth_comparing``).
    comparable_arrays: list[int]
    leaves: list[_Leaf]
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
                self.leaf_metas[self.codec_number[i]] = tree_codec.value_leaf(meta.path, value)
            self._values = now
            self._registered_kind = registered_kind
            self._meta_json = _core.encode_pytree_meta(
                _core.PytreeInfo(self.structure, self.leaf_metas, registered_kind or ""))
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
    metas_by_number: dict[int, _core.LeafInfo] = {}
    plan_leaves: list[_Leaf] = []
    array_leaves: list[int] = []
    remembered_arrays: list[int] = []
    comparable_arrays: list[int] = []
    scalar_values: list[tuple[int, Any]] = []
    aliased_sizes: list[int] = []
    for index, value in enumerate(values):
        number = codec_number[index]
        meta, stage = leaf_sources.plan_leaf(tree_codec.Leaf(leaves[number].path, value),
                                             replica_parallel)
        metas_by_number[number] = meta
        if stage is not None:
            fills = isinstance(value, ArraySource)
            itemsize = dtypes.from_name(meta.dtype).itemsize
            sizes = [math.prod(shape) * itemsize for _, _, shape in stage.boxes]
            plan_leaves.append(_Leaf(index, number, meta.dtype, stage,
                                     stage.layout(number, meta.dtype), fills, sum(sizes)))
            if stage.on_host and not fills:
                aliased_sizes += sizes
        comparable = unchanged.worth_comparing(value)
        if comparable:
            comparable_arrays.append(index)
        if isinstance(value, jax.Array):
            array_leaves.append(index)
            if comparable:  # unchanged.worth_remembering, asked once
                remembered_arrays.append(index)
        elif isinstance(value, _VALUE_TYPES):
            scalar_values.append((index, value))
    leaf_metas = [metas_by_number[number] for number in range(len(leaves))]
    plan = _Plan([_signature(v) for v in values], leaf_metas, codec_number, array_leaves,
                 remembered_arrays, comparable_arrays, plan_leaves, structure, cacheable,
                 all(leaf.stage.on_host for leaf in plan_leaves), aliased_sizes, scalar_values)
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
