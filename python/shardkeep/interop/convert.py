"""Converting other formats' checkpoints into shardkeep checkpoints."""

from __future__ import annotations

import math
import os
import threading
from typing import Any

import jax
import numpy as np

from .. import _core
from ..base import dtypes, prng_keys, tree_codec
from .. import options as options_lib
from ..base.array_source import ArraySource
from ..errors import InvalidArgumentError, NotFoundError
from . import dcp, orbax
from ..loading import other_formats
from ..loading.load_source import Source
from ..saving.save import save
from .progress import Progress

SOURCE_FORMATS = ("orbax", "dcp", "safetensors")


def convert(src, dst, *, source_format: str | None = None, allow_pickle: bool = False,
            step: int | None = None, options: options_lib.Options | None = None) -> None:
    """Writes a shardkeep checkpoint at ``dst`` holding the pytree of ``src``.

    ``source_format`` (None: found from the files at ``src``, which must
    then be local; NotFoundError when none of these formats' files is
    there):

    * "orbax": an Orbax pytree item (see ``shardkeep.load_orbax`` for the
      folders accepted); needs ``tensorstore``. Typed PRNG keys stay typed
      keys, and the step of a ``CheckpointManager`` step folder and the
      custom metadata Orbax saved with it (``shardkeep.metadata(dst)
      .custom_metadata``) are kept.
    * "dcp": a PyTorch DCP checkpoint folder; needs ``torch`` and
      ``allow_pickle=True``, because DCP's metadata is a pickle (see
      docs/INTEROP.md). Nested state dicts come back nested as DCP recorded
      them; keys DCP did not flatten (module FQNs such as
      "model.layers.0.weight") stay one key each.
    * "safetensors": a file, a folder of them or an index JSON, through
      ``shardkeep.load_safetensors`` (tensor names split at '.' into
      nested dicts).

    ``step`` is recorded in the checkpoint (``shardkeep.metadata``,
    ``shardkeep ls``); None takes the Orbax step folder's number, when
    there is one. The tree is saved with ``shardkeep.save`` (``options``
    apply to it too) with every array as a ``shardkeep.ArraySource``: the
    save's writer threads read each chunk as they write it, so a
    conversion holds about one chunk per writer thread (Orbax,
    safetensors) or one leaf per writer thread (DCP, whose leaves are read
    whole), never the state. A progress line is shown on standard error
    when it is a terminal. Run it in one process.
    """
    options = options_lib.resolve(options)
    if source_format is None:
        source_format = _found_format(os.fspath(src))
    if source_format not in SOURCE_FORMATS:
        raise InvalidArgumentError(
            f"source_format must be one of {', '.join(map(repr, SOURCE_FORMATS))},"
            f" got {source_format!r}")
    if allow_pickle and source_format != "dcp":
        raise InvalidArgumentError(f"allow_pickle applies to source_format='dcp' only;"
                                   f" {source_format!r} checkpoints hold no pickles")
    if source_format == "safetensors":
        save(dst, _safetensors_tree(src, options), options=options, step=step)
        return
    if source_format == "orbax":
        source = orbax.OrbaxSource(src, options)
        _save_source(src, dst, source, source.step if step is None else step, options,
                     custom_metadata=source.custom_metadata)
    else:
        with dcp.quiet():
            _save_source(src, dst, dcp.DcpSource(src, allow_pickle=allow_pickle,
                                                 options=options), step, options)


def _found_format(src: str) -> str:
    found = other_formats.identify(src)
    if found is None:
        raise NotFoundError(
            f"{src}: found no checkpoint to convert (an Orbax _METADATA or"
            f" {other_formats.ORBAX_STEP_MARKER}, a DCP {other_formats.DCP_METADATA_FILE} or"
            " safetensors files; formats are found on local paths only); name its format"
            " (source_format=, or --from for the shardkeep tool)")
    return found


def _save_source(src, dst, source: Source, step: int | None, options: options_lib.Options,
                 *, custom_metadata: dict | None = None) -> None:
    meta = source.meta()
    leaves = meta.leaves
    progress = Progress(f"convert {os.fspath(src)}", len(leaves),
                        sum(leaf.nbytes for leaf in leaves))
    values = [_value_of(source, number, leaf, progress) for number, leaf in enumerate(leaves)]
    try:
        save(dst, tree_codec.rebuild(meta.tree, values), options=options, step=step,
             custom_metadata=custom_metadata)
    finally:
        progress.finish()


def _value_of(source: Source, number: int, leaf: _core.LeafInfo, progress: Progress) -> Any:
    """What the saved tree holds for a leaf: an ArraySource for arrays
    (read as the writers need them), typed keys for key data (small: read
    now), the value itself otherwise."""
    if leaf.kind != _core.LeafKind.ARRAY:
        progress.advance(1, 0)
        return leaf.value if leaf.kind != _core.LeafKind.NONE else None
    if leaf.prng_impl or leaf.nbytes == 0:
        progress.advance(1, leaf.nbytes)
        data = _read_box(source, number, leaf, (0,) * len(leaf.shape), tuple(leaf.shape))
        if leaf.prng_impl:
            return prng_keys.wrap(jax.numpy.asarray(data), leaf.prng_impl)
        return data
    return ArraySource(tuple(leaf.shape), dtypes.from_name(leaf.dtype),
                       _ChunkReads(source, number, leaf, progress))


def _read_box(source: Source, number: int, leaf: _core.LeafInfo, origin: tuple, shape: tuple) -> np.ndarray:
    out = np.empty(shape, dtypes.from_name(leaf.dtype))
    source.read([_core.ReadRequest(number, leaf.dtype, origin, shape, dtypes.as_bytes(out))])
    return out


class _ChunkReads:
    """An ArraySource's read of one leaf: each box read from the source,
    or, for a source that reads whole leaves (DCP), sliced from the whole
    leaf, asked of the source once and dropped when its last box is out."""

    def __init__(self, source: Source, number: int, leaf: _core.LeafInfo, progress: Progress):
        self._source, self._number, self._leaf = source, number, leaf
        self._progress = progress
        self._lock = threading.Lock()
        self._remaining = leaf.nbytes
        self._whole: np.ndarray | None = None  # while boxes of a whole read are out

    def __call__(self, origin: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
        if self._source.reads_whole_leaves:
            with self._lock:
                if self._whole is None:
                    full = tuple(self._leaf.shape)
                    self._whole = _read_box(self._source, self._number, self._leaf,
                                            (0,) * len(full), full)
                whole = self._whole
            values = whole[tuple(slice(o, o + n) for o, n in zip(origin, shape))]
        else:
            values = _read_box(self._source, self._number, self._leaf, origin, shape)
        with self._lock:
            self._remaining -= values.nbytes
            done = self._remaining == 0
            if done:
                self._whole = None
        self._progress.advance(1 if done else 0, values.nbytes)
        return values


def _safetensors_tree(src, options: options_lib.Options) -> Any:
    from .safetensors import safetensors_sources  # late: it needs the extension

    return safetensors_sources(src, options=options)
