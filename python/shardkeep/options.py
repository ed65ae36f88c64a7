"""User-facing save/restore options and their conversion to the core's."""

from __future__ import annotations

import dataclasses

from .errors import InvalidArgumentError
from .gcs_settings import GcsSettings
from .s3_settings import S3Settings


@dataclasses.dataclass(frozen=True)
class Options:
    """Tuning knobs for saving and loading.

    Attributes:
      chunk_bytes: largest stored chunk; a device shard is split into chunks
        of at most this size so restores onto another sharding read little
        waste and one large shard is written by several threads.
      compression: None (raw) or "zstd": each chunk of a multi-byte dtype
        is split into byte planes and compressed with zstd, in parallel by
        the writer threads, and decoded by the reader threads. A chunk that
        does not shrink is stored raw. Figures in docs/COMPRESSION.md.
      compression_level: zstd's level for ``compression="zstd"``; None
        takes the default chosen by measurement (docs/COMPRESSION.md).
        Negative levels are faster, higher ones smaller and slower.
      io_threads: worker threads of the C++ engine; 0 picks a default (one
        per core, at most 16; loads from S3 keep 32 reads in flight).
      host_memory_limit: cap on the memory the C++ engine allocates for
        its own buffers (a load's read and decompression buffers; a save's
        gather buffers and zstd output and working memory); 0 means the
        default, 1 GiB. It does not count the arrays being saved or loaded,
        nor the host copies ``save_async`` stages. A single chunk needing
        more than the cap is processed alone.
      timeout_s: limit on every wait (barriers, save completion in C++).
      replica_parallel: split each box that devices of several processes
        hold among those processes (one writer device each), so that in a
        multi-process job every process writes a share: near-equal
        contiguous slices along the box's first dimension at least as long
        as the number of those processes; when no dimension is that long,
        the longest is cut into fewer slices and only the first processes
        write (see ``shardings.replica_parallel_boxes``). False: the
        replica with replica_id 0 writes each box whole.
      allow_lossy_cast: permit loading into a dtype that cannot hold every
        stored value (e.g. float32 -> bfloat16, int32 -> int16).
      map_files: loads from local files map each box stored raw as one
        chunk (copy-on-write) instead of reading it into new memory: no
        copy, and the page cache is the array (see shardkeep.loading.file_mapping).
        Turn it off when other programs may truncate or rewrite checkpoint
        files in place while loaded arrays live (shardkeep never does).
      donate_target: a load's target jax.Arrays are donated to it, as to a
        jit with ``donate_argnums``: do not use them afterwards. On the CPU
        backend the load reads each leaf straight into its target's memory
        where JAX can give that memory up (it owns it and no numpy view of
        it is alive); the target array is then deleted. This spares a job
        that loads again and again the first touch of fresh pages. On other
        backends the target arrays are deleted before the load places their
        replacements, so devices never hold both. If the load fails, the
        donated arrays are lost. No effect with load-and-broadcast (see
        shardkeep.loading.donation).
      reuse_staging_memory: ``save_async`` copies the state into host
        memory kept from the previous async save (already touched, so the
        copy runs at memory speed instead of taking a page fault per page)
        and keeps that memory for the next one: at most one staging copy
        of the state, held between saves. False: a save stages into fresh
        memory, freed when it finishes. ``shardkeep.release_staging_memory()``
        and ``CheckpointManager.close()`` free the kept memory.
      pinned_host_staging: a save's device-to-host copies (arrays on an
        accelerator) go into pinned host memory (JAX's ``pinned_host``
        memory kind), all started before any is waited for: the copy
        engines then run at the link's speed, with no bounce buffer and no
        page faults on fresh memory. None (the default): on
        for GPUs, off for TPUs, whose pinned host memory is a smaller
        pool the device manages. False: each array's own copy into
        pageable memory. No effect on the CPU backend, whose arrays are
        already in host memory (docs/ACCELERATORS.md).
      compare_with_base: a save with a base (``base=``; under a manager,
        the previous step) also compares the arrays not known to be stored
        there (a numpy array, an array a function rebuilt with the same
        values), jax or numpy, of at least 1 MiB: each chunk stored in the
        base under the same key path is checked against the array's bytes
        (its checksum, then the bytes read back) and linked where equal.
        Costs a checksum of each such array in the background phase and a
        read of the base's chunks that match (see docs/INCREMENTAL.md).
      broadcast_load: in a multi-process load, each box that several
        processes hold (a replicated mesh axis) is read from storage by one
        of them and sent to the others through JAX collectives, so storage
        serves one copy of the checkpoint whatever the number of replicas.
        The result is bit-identical. Every process must load the same
        checkpoint with the same target (turn it off where processes load
        different checkpoints, e.g. each its own local copy). No effect in
        a single-process job, on numpy targets, or without a target. None
        (the default): on for checkpoints on an object store (``s3://``, ``gs://``),
        where reading once and sending saves requests and bandwidth; off
        for file-system paths, where re-reading from the page cache costs
        less than sending over CPU collectives (figures in docs/SCALE.md).
      s3: settings for ``s3://`` paths that win over the environment and
        the AWS files (endpoint, region, credentials, profile); see
        ``shardkeep.S3Settings``. Requests to the store are retried within
        ``timeout_s``.
      gcs: settings for ``gs://`` paths that win over the environment
        (endpoint, a key file, anonymous access); see
        ``shardkeep.GcsSettings``. Requests are retried within ``timeout_s``.
    """

    chunk_bytes: int = 64 << 20
    compression: str | None = None
    compression_level: int | None = None
    io_threads: int = 0
    host_memory_limit: int = 0
    timeout_s: float = 600.0
    replica_parallel: bool = True
    allow_lossy_cast: bool = False
    map_files: bool = True
    donate_target: bool = False
    reuse_staging_memory: bool = True
    pinned_host_staging: bool | None = None
    compare_with_base: bool = False
    broadcast_load: bool | None = None
    s3: S3Settings | None = None
    gcs: GcsSettings | None = None

    def __post_init__(self):
        if self.chunk_bytes <= 0:
            raise InvalidArgumentError(f"Options.chunk_bytes must be > 0, got {self.chunk_bytes}")
        if self.compression not in (None, "zstd"):
            raise InvalidArgumentError(
                f"Options.compression must be None or 'zstd', got {self.compression!r}")
        if self.compression_level is not None and (
                isinstance(self.compression_level, bool)
                or not isinstance(self.compression_level, int)):
            raise InvalidArgumentError(
                f"Options.compression_level must be an int or None, got {self.compression_level!r}")
        if self.io_threads < 0:
            raise InvalidArgumentError(f"Options.io_threads must be >= 0, got {self.io_threads}")
        if self.host_memory_limit < 0:
            raise InvalidArgumentError(
                f"Options.host_memory_limit must be >= 0, got {self.host_memory_limit}")
        if not self.timeout_s > 0:
            raise InvalidArgumentError(f"Options.timeout_s must be > 0, got {self.timeout_s}")
        if self.s3 is not None and not isinstance(self.s3, S3Settings):
            raise InvalidArgumentError(
                f"Options.s3 must be a shardkeep.S3Settings or None, got {type(self.s3).__name__}")
        if self.gcs is not None and not isinstance(self.gcs, GcsSettings):
            raise InvalidArgumentError(
                "Options.gcs must be a shardkeep.GcsSettings or None, got "
                f"{type(self.gcs).__name__}")

    def broadcasts_load_of(self, path: str) -> bool:
        """Whether a load of ``path`` uses load-and-broadcast."""
        if self.broadcast_load is not None:
            return bool(self.broadcast_load)
        from . import _core  # Imported late so that this module stays importable alone.

        return _core.Location(path).object_store

    def to_core(self):
        """Returns the equivalent ``shardkeep._core.Options``."""
        from . import _core  # Imported late so that this module stays importable alone.

        level = {} if self.compression_level is None else {"zstd_level": self.compression_level}
        return _core.Options(
            chunk_bytes=self.chunk_bytes,
            compress=self.compression == "zstd",
            **level,
            io_threads=self.io_threads,
            host_memory_limit=self.host_memory_limit,
            timeout_s=float(self.timeout_s),
            allow_lossy_cast=self.allow_lossy_cast,
            s3=self.s3.to_core() if self.s3 is not None else None,
            gcs=self.gcs.to_core() if self.gcs is not None else None,
        )


def resolve(options: Options | None) -> Options:
    """Returns ``options``, or the defaults when None; rejects other types."""
    if options is None:
        return Options()
    if not isinstance(options, Options):
        raise InvalidArgumentError(
            f"options must be a shardkeep.Options, got {type(options).__name__}")
    return options
