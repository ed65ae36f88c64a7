"""``metadata``: what a checkpoint holds, read from its small JSON files only."""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax

from .. import _core
from ..base import dtypes, prng_keys, shardings, tree_codec
from .. import options as options_lib
from ..errors import InvalidArgumentError
from . import other_formats as formats


@dataclasses.dataclass(frozen=True)
class LeafInfo:
    """One saved leaf. ``bytes`` is the raw (uncompressed) size of its data.

    ``dtype`` and ``shape`` are those stored: typed PRNG keys (``prng_impl``
    set) are stored as uint32 key data of shape key shape + the
    implementation's key shape.
    """

    path: str
    kind: str                 # "array", "scalar", "string" or "none"
    dtype: str | None
    shape: tuple[int, ...] | None
    sharding: dict | None     # the saved sharding description
    bytes: int
    value: Any = None         # scalar and str leaves only
    prng_impl: str | None = None  # typed PRNG keys only, e.g. "threefry2x32"

    def abstract(self) -> jax.ShapeDtypeStruct | None:
        """The leaf as it was saved: a ShapeDtypeStruct (typed keys as key
        dtype and key shape) with the saved sharding when this job has the
        devices it names; None for scalar, str and None leaves."""
        if self.kind != "array" or self.dtype is None or self.shape is None:
            return None
        sharding = shardings.rebuild(self.sharding)
        if self.prng_impl is None:
            return jax.ShapeDtypeStruct(self.shape, dtypes.from_name(self.dtype),
                                        sharding=sharding)
        key_rank = len(prng_keys.key_shape(self.prng_impl))
        return jax.ShapeDtypeStruct(self.shape[:len(self.shape) - key_rank],
                                    prng_keys.key_dtype(self.prng_impl), sharding=sharding)


@dataclasses.dataclass(frozen=True)
class CheckpointableInfo:
    """One checkpointable. ``leaves`` and ``tree`` are set for pytrees only."""

    name: str
    kind: str
    leaves: tuple[LeafInfo, ...] | None = None
    tree: dict | None = None

    def abstract_tree(self) -> Any:
        """The saved tree with ``jax.ShapeDtypeStruct`` for array leaves.

        Each struct carries the saved sharding when this job has the devices
        it names (else no sharding: load puts it on the default device), so
        ``load(path, info.checkpointables["state"].abstract_tree())``
        restores arrays as they were sharded at save time. Scalar, str and
        None leaves stay None (loaded as Python values).
        """
        if self.tree is None or self.leaves is None:
            raise InvalidArgumentError(f"checkpointable {self.name!r} is of kind {self.kind!r},"
                                       " not a tree")
        return tree_codec.rebuild(self.tree, [leaf.abstract() for leaf in self.leaves])


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint, as described by its ``_SHARDKEEP`` record."""

    path: str
    step: int | None
    checkpointables: dict[str, CheckpointableInfo]
    custom_metadata: dict
    metrics: dict
    commit_record: dict


def metadata(path, *, options: options_lib.Options | None = None) -> CheckpointInfo:
    """Describes the checkpoint at ``path`` without reading any array data.

    ``options`` matter for ``s3://`` paths (their ``s3`` settings and
    ``timeout_s``). Raises NotFoundError if ``path`` holds no committed
    checkpoint; for an Orbax, DCP or safetensors checkpoint, its message
    says so and names the call that reads it.
    """
    path = os.fspath(path)
    reader = formats.open_reader(path, options_lib.resolve(options).to_core())
    record = reader.commit
    parts = {}
    for name, kind in record.checkpointables.items():
        if kind == "pytree":
            meta = reader.pytree(name)
            leaves = tuple(_leaf_info(leaf) for leaf in meta.leaves)
            parts[name] = CheckpointableInfo(name, kind, leaves, meta.tree)
        else:
            parts[name] = CheckpointableInfo(name, kind)
    return CheckpointInfo(path, record.step, parts, record.custom_metadata, record.metrics,
                          record.document())


def _leaf_info(leaf: _core.LeafInfo) -> LeafInfo:
    shaped = leaf.kind in (_core.LeafKind.ARRAY, _core.LeafKind.SCALAR)
    return LeafInfo(leaf.path, leaf.kind.name.lower(), leaf.dtype or None,
                    tuple(leaf.shape) if shaped else None, leaf.sharding, leaf.nbytes,
                    leaf.value, leaf.prng_impl or None)
