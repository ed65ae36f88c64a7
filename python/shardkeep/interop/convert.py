"""Converting other formats' checkpoints into shardkeep checkpoints."""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Any, Iterator

import numpy as np

from .. import options as options_lib
from ..array_source import ArraySource
from ..errors import InvalidArgumentError
from . import dcp, orbax
from .progress import Progress
from .source import SourceLeaf, thread_reads
from .tree_build import nest

SOURCE_FORMATS = ("orbax", "dcp", "safetensors")
_MAX_READ_THREADS = 8


def convert(src, dst, *, source_format: str = "orbax", allow_pickle: bool = False,
            options: options_lib.Options | None = None) -> None:
    """Writes a shardkeep checkpoint at ``dst`` holding the pytree of ``src``.

    ``source_format``:

    * "orbax": an Orbax pytree item (see ``shardkeep.load_orbax`` for the
      folders accepted); needs ``tensorstore``.
    * "dcp": a PyTorch DCP checkpoint folder; needs ``torch`` and
      ``allow_pickle=True``, because DCP's metadata is a pickle (see
      docs/INTEROP.md). Nested state dicts come back nested as DCP recorded
      them; keys DCP did not flatten (module FQNs such as
      "model.layers.0.weight") stay one key each.
    * "safetensors": a file, a folder of them or an index JSON, through
      ``shardkeep.load_safetensors`` (tensor names split at '.' into
      nested dicts).

    The tree is saved with ``shardkeep.save`` (``options`` apply to it
    too) with every array as a ``shardkeep.ArraySource``: the save's
    writer threads read each chunk as they write it, so a conversion
    holds about one chunk per writer thread (Orbax, safetensors) or one
    leaf per writer thread (DCP, whose leaves are read whole), never the
    state. A progress line is shown on standard error when it is a
    terminal. Run it in one process.
    """
    options = options_lib.resolve(options)
    if source_format not in SOURCE_FORMATS:
        raise InvalidArgumentError(
            f"source_format must be one of {', '.join(map(repr, SOURCE_FORMATS))},"
            f" got {source_format!r}")
    if allow_pickle and source_format != "dcp":
        raise InvalidArgumentError(f"allow_pickle applies to source_format='dcp' only;"
                                   f" {source_format!r} checkpoints hold no pickles")
    from ..save import save  # late: shardkeep's package imports this module

    if source_format == "safetensors":
        save(dst, _safetensors_tree(src, options), options=options)
        return
    with _leaves(src, source_format, allow_pickle, options) as (where, leaves):
        progress = Progress(f"convert {os.fspath(src)}", len(leaves),
                            sum(leaf.nbytes for leaf in leaves))
        whole = source_format == "dcp"
        entries = [(leaf.keys, _value_of(leaf, progress, whole)) for leaf in leaves]
        try:
            save(dst, nest(where, entries), options=options)
        finally:
            progress.finish()


def _value_of(leaf: SourceLeaf, progress: Progress, read_whole: bool) -> Any:
    """What the saved tree holds for ``leaf``: an ArraySource for arrays
    (read as the writers need them), the value itself otherwise."""
    if not leaf.is_array:
        progress.advance(1, 0)
        return leaf.value
    if leaf.python_scalar or leaf.nbytes == 0:  # tiny: read now
        progress.advance(1, leaf.nbytes)
        return leaf.plain_value(leaf.read_whole().result())
    return ArraySource(leaf.shape, leaf.dtype, _ChunkReads(leaf, progress, read_whole))


class _ChunkReads:
    """An ArraySource's read of one leaf: each box read from the source, or
    (``read_whole``, for sources that cannot read part of a leaf) sliced
    from the whole leaf, read once and dropped when its last box is out."""

    def __init__(self, leaf: SourceLeaf, progress: Progress, read_whole: bool):
        self._leaf, self._progress, self._read_whole = leaf, progress, read_whole
        self._lock = threading.Lock()
        self._remaining = leaf.nbytes
        self._whole: Any = None  # a Pending of the whole leaf while boxes are out

    def __call__(self, origin: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
        if self._read_whole:
            with self._lock:
                if self._whole is None:
                    self._whole = self._leaf.read_whole()
                whole = self._whole
            values = whole.result()[tuple(slice(o, o + n) for o, n in zip(origin, shape))]
        else:
            values = self._leaf.read_box(origin, shape).result()
        with self._lock:
            self._remaining -= values.nbytes
            done = self._remaining == 0
            if done:
                self._whole = None
        self._progress.advance(1 if done else 0, values.nbytes)
        return values


@contextlib.contextmanager
def _leaves(src, source_format: str, allow_pickle: bool,
            options: options_lib.Options) -> Iterator[tuple[str, list[SourceLeaf]]]:
    """The source's description and leaves, its readers open meanwhile."""
    if source_format == "orbax":
        item = orbax.open_item(src, options)
        yield item.where, item.leaves
        return
    threads = options.io_threads or min(_MAX_READ_THREADS, os.cpu_count() or 1)
    with thread_reads(threads) as pool, warnings.catch_warnings():
        # DCP warns on every load outside a process group, which is how
        # each key is read here on purpose.
        warnings.filterwarnings("ignore", message=r"torch\.distributed is .*single process",
                                category=UserWarning)
        checkpoint = dcp.DcpCheckpoint(src, allow_pickle=allow_pickle, pool=pool)
        yield checkpoint.where, checkpoint.leaves


def _safetensors_tree(src, options: options_lib.Options) -> Any:
    from ..safetensors_load import safetensors_sources  # late: it needs the extension

    return safetensors_sources(src, options=options)
