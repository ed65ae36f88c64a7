"""Converting other formats' checkpoints into shardkeep checkpoints."""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Iterator

from .. import options as options_lib
from ..errors import InvalidArgumentError
from . import dcp, orbax
from .progress import Progress
from .source import SourceLeaf, read_ahead, thread_reads
from .tree_build import nest

SOURCE_FORMATS = ("orbax", "dcp", "safetensors")
_DEFAULT_WINDOW = 1 << 30  # bytes read ahead when Options.host_memory_limit is 0
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

    Leaves are read in parallel, a bounded window ahead of the writer
    (``options.host_memory_limit``, 1 GiB by default), and the tree is
    saved with ``shardkeep.save`` (``options`` apply to it too), which
    today holds the whole tree in host memory. A progress line is shown
    on standard error when it is a terminal. Run it in one process.
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
    window = options.host_memory_limit or _DEFAULT_WINDOW
    with _leaves(src, source_format, allow_pickle, options) as (where, leaves):
        progress = Progress(f"convert {os.fspath(src)}", len(leaves),
                            sum(leaf.nbytes for leaf in leaves))
        entries = []
        try:
            for leaf, value in read_ahead(leaves, window):
                entries.append((leaf.keys, value))
                progress.advance(1, leaf.nbytes)
        finally:
            progress.finish()
        tree = nest(where, entries)
    save(dst, tree, options=options)


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
    from ..safetensors_load import load_safetensors  # late: it needs the extension

    # Loaded mapped from the files where they allow it (options.map_files):
    # the page cache holds the tensors, not new memory.
    return load_safetensors(src, options=options)
