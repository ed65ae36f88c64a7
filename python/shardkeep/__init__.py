"""shardkeep: distributed checkpointing for JAX with a C++ core.

    import shardkeep as sk
    sk.save("/ckpt/1", {"params": params, "opt_state": opt_state})
    state = sk.load("/ckpt/1", abstract_state)

A value to save (or a target) is one tree, the checkpointable "state",
unless it is an ``sk.Checkpointables(...)`` of named parts.
"""

from .base.array_source import ArraySource
from .base.checkpointables import JsonValue, register_kind
from .errors import (AlreadyExistsError, CommitStateUnknownError, CorruptionError,
                     IncompatibleError, InvalidArgumentError, LeaseLostError, NotFoundError,
                     OutOfSpaceError,
                     ShardkeepError, StorageError, TimeoutError)
from .loading.info import CheckpointableInfo, CheckpointInfo, LeafInfo, metadata
from .interop.convert import convert
from .interop.load_formats import load_dcp, load_orbax
from .loading.load import load, load_checkpointables
from .manager import preservation, save_decisions
from .manager.checkpoint_manager import CheckpointManager
from .base.named_parts import Checkpointables
from .options import Options
from .interop.safetensors import load_safetensors
from .gcs_settings import GcsSettings
from .s3_settings import S3Settings
from .saving.save import (SaveFuture, save, save_async, save_checkpointables,
                          save_checkpointables_async)
from .saving.staging_pool import release as release_staging_memory

__all__ = [
    "ArraySource", "CheckpointManager", "Checkpointables", "CommitStateUnknownError", "OutOfSpaceError",
    "AlreadyExistsError", "CheckpointInfo", "CheckpointableInfo", "CorruptionError",
    "IncompatibleError", "InvalidArgumentError", "JsonValue", "LeafInfo", "LeaseLostError", "NotFoundError",
    "GcsSettings", "Options", "S3Settings", "SaveFuture", "ShardkeepError", "StorageError", "TimeoutError",
    "convert", "load", "load_checkpointables", "load_dcp", "load_orbax", "load_safetensors",
    "metadata", "preservation", "save_decisions",
    "register_kind", "release_staging_memory",
    "save", "save_async",
    "save_checkpointables", "save_checkpointables_async",
]
