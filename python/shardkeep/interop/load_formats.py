"""Loading Orbax and PyTorch DCP checkpoints: each format's source
(``orbax.OrbaxSource``, ``dcp.DcpSource``) run by shardkeep's own load
executor, so matching, casts, errors, donation and load-and-broadcast are
those of ``shardkeep.load``, and so are the ``jax.monitoring`` events
(``shardkeep.base.events``). The sources themselves need no executor:
conversion reads them directly."""

from __future__ import annotations

import os
from typing import Any

from ..base import events
from ..loading import load_executor
from .. import options as options_lib
from .dcp import DcpSource
from .orbax import OrbaxSource


def load_orbax(path, target: Any = None, *, partial: bool = False,
               options: options_lib.Options | None = None) -> Any:
    """Loads an Orbax checkpoint's pytree onto ``target``.

    ``path`` is the folder Orbax saved the pytree to (``_METADATA`` in
    it), or a folder holding exactly one such item (a ``CheckpointManager``
    step, or a v1 ``save`` path). ``target`` follows
    ``shardkeep.load``: ``jax.ShapeDtypeStruct`` leaves with shardings give
    ``jax.Array``s of those shardings, each process reading from storage
    only the boxes its devices hold (each distinct box once, and once in
    the whole job with ``Options(broadcast_load=True)``); numpy or Python
    leaves give numpy or Python values; None (whole or per leaf) the saved
    shapes and dtypes on the host (numpy arrays, Python scalars and
    strings), with nested dicts and lists rebuilt from Orbax's tree
    metadata. Typed PRNG keys (Orbax records their implementation) load
    onto typed-key targets, and without a target as typed keys. Leaves are
    matched by shardkeep key path (keys joined by '/', see docs/FORMAT.md
    §4.2); a target must name every saved leaf but Nones, unless
    ``partial=True``, which loads only the leaves the target names (the
    parameters alone of a training state, say), reading no other array.

    A target dtype other than the saved one is a cast, with the rules of
    ``shardkeep.load`` (lossy ones need ``Options(allow_lossy_cast=True)``);
    a shape other than the saved one raises IncompatibleError.
    ``options.io_threads`` bounds tensorstore's concurrent file reads and
    copies. Needs the ``tensorstore`` package (``shardkeep[orbax]``).
    """
    options = options_lib.resolve(options)
    with events.loading(os.fspath(path)) as report:
        source = OrbaxSource(path, options)
        return report.loaded(load_executor.load_with(
            source, target, path=source.directory, partial=partial, options=options))


def load_dcp(path, target: Any = None, *, allow_pickle: bool = False, partial: bool = False,
             options: options_lib.Options | None = None) -> Any:
    """Loads a PyTorch DCP checkpoint's state dict onto ``target``.

    ``allow_pickle=True`` is required: DCP's metadata is a pickle (see
    docs/INTEROP.md). ``target`` follows ``shardkeep.load``; leaves are
    matched by key path (DCP's record of the nested state dict, or each
    flattened key as one dict key); ``partial=True`` loads only the keys
    the target names, as for ``shardkeep.load``. Each process reads the
    keys its boxes lie in, whole (DCP reads no part of a key); with
    ``Options(broadcast_load=True)`` each key that several processes hold
    is read by one of them and sent to the others. Needs ``torch``
    (``shardkeep[dcp]``).
    """
    options = options_lib.resolve(options)
    with events.loading(os.fspath(path)) as report:
        source = DcpSource(path, allow_pickle=allow_pickle, options=options)
        return report.loaded(load_executor.load_with(
            source, target, path=source.directory, partial=partial, options=options))

