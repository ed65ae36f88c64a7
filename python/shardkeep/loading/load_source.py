"""Where a load's bytes come from: the ``Source`` interface and the core
reader's source.

A source describes its tree and leaves as meta.json does, as the core's
``_core.PytreeInfo`` (path, kind, dtype, shape, prng_impl, sharding of each
leaf; see docs/FORMAT.md), and
fills read requests (``_core.ReadRequest``: leaf number, dtype name,
origin, shape, buffer), the box of that leaf in that dtype into
``buffer`` (flat uint8), cast by the core's rules. The load executor
(``load_executor``) needs nothing else, so a new input format is a new
source, not a new load path. Sources here: ``CoreSource`` (shardkeep
checkpoints and safetensors files, through the C++ reader), the Orbax and
DCP sources (``interop``) and the local tier's pieces (``local_restore``).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from .. import _core
from ..base import unchanged
from . import file_mapping
from ..errors import InvalidArgumentError


class Verify(Protocol):
    def verify(self) -> None: ...


class _NothingMapped:
    def verify(self) -> None:
        pass


NOTHING_MAPPED: Verify = _NothingMapped()


class Span(NamedTuple):
    """Stored bytes a read fetches: ``start:stop`` of ``file`` (a source's
    own units: bytes of a data file, chunk rows of an array)."""

    file: str
    start: int
    stop: int


def destination(request: _core.ReadRequest) -> np.ndarray:
    """The buffer a read request fills (a ranges request has none, and is
    never read)."""
    if request.buffer is None:
        raise InvalidArgumentError(f"a read of leaf #{request.leaf} has no buffer to fill")
    return request.buffer


class Source:
    """The interface of a load's source (see the module's description).

    ``where`` names the checkpoint in errors. ``read`` fills the requests'
    buffers (all requests of a load in one call, so a source can run them
    in parallel); ``ranges`` says, from the index alone, which stored
    ranges a read of each request (buffer None) would fetch, as
    ``Span``s: load-and-broadcast cuts a shared box
    only where no stored range falls in two pieces. ``map_boxes`` may give
    slots buffers mapped from files instead of read, set in the executor's
    ``buffers`` (the default maps nothing). ``reads_whole_leaves``: any
    read of a box of a leaf reads the whole leaf, so a caller that wants
    several boxes of a leaf one at a time (conversion) asks for the leaf.
    """

    where: str
    # The shardkeep checkpoint the loaded arrays stay known to be stored in
    # (``shardkeep.base.unchanged``); None for other formats.
    origin: unchanged.Origin | None = None
    reads_whole_leaves: bool = False

    def meta(self) -> _core.PytreeInfo:
        raise NotImplementedError

    def read(self, requests: list[_core.ReadRequest]) -> None:
        raise NotImplementedError

    def ranges(self, requests: list[_core.ReadRequest]) -> list[list[Span]]:
        raise NotImplementedError

    def map_boxes(self, slots: list, buffers: dict) -> Verify:
        return NOTHING_MAPPED


class CoreSource(Source):
    """Checkpointable ``name`` of a ``_core.Reader`` (a shardkeep checkpoint
    or safetensors files): the core reads, casts and verifies, and with
    ``map_files`` raw chunks of local files are mapped (``file_mapping``).
    ``meta`` replaces the reader's description (safetensors renames its
    leaves after the target's key paths); ``origin`` is given for shardkeep
    checkpoints."""

    def __init__(self, reader, name: str, where: str, core_options, *, map_files: bool,
                 meta: _core.PytreeInfo | None = None, origin: unchanged.Origin | None = None):
        self.where = where
        self.origin = origin
        self._reader, self._name, self._options = reader, name, core_options
        self._map_files = map_files
        self._meta = meta

    def meta(self) -> _core.PytreeInfo:
        if self._meta is None:
            self._meta = self._reader.pytree(self._name)
        return self._meta

    def read(self, requests: list[_core.ReadRequest]) -> None:
        self._reader.read(self._name, requests, self._options)

    def ranges(self, requests: list[_core.ReadRequest]) -> list[list[Span]]:
        return [[Span(r.file, r.offset, r.offset + r.length) for r in one]
                for one in self._reader.ranges(self._name, requests, self._options)]

    def map_boxes(self, slots: list, buffers: dict) -> Verify:
        if not self._map_files or not slots:
            return NOTHING_MAPPED
        mapper = file_mapping.FileMapper()
        mapper.map_boxes(self._reader, self._name, slots, buffers, self._options)
        return mapper
