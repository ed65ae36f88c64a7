"""Orbax's folders and JSON files, apart from its arrays: what makes a
folder a ``CheckpointManager`` step, what its ``_CHECKPOINT_METADATA``
records, and the JSON files Orbax writes (item metadata, JSON items).

Kept apart from the array reader (``shardkeep.interop.orbax``) so that
the manager can list a root's Orbax steps without loading the reader.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import CorruptionError, NotFoundError
from ..loading.other_formats import ORBAX_STEP_MARKER, step_of_folder

_COMMIT_MARKER = "commit_success.txt"
# The handler of a JSON item (``args.JsonSave``), by the end of its name.
_JSON_HANDLER = "JsonCheckpointHandler"
# The item Orbax saves metrics in when a ``best_fn`` asks for them.
_METRICS_ITEM = "metrics"


def step_metadata(folder: str) -> dict:
    """A step folder's ``_CHECKPOINT_METADATA``: its item handlers, metrics
    and timestamps (fields older versions lack are absent here too)."""
    metadata = read_json(folder, ORBAX_STEP_MARKER)
    if not isinstance(metadata, dict):
        raise CorruptionError(f"Orbax checkpoint {folder}: {ORBAX_STEP_MARKER} is not a JSON"
                              " object")
    return metadata


def custom_metadata(folder: str) -> dict:
    """The custom metadata Orbax saved with a checkpoint (a manager's step
    folder, or a checkpointer's save): the ``custom_metadata`` of the
    folder's ``_CHECKPOINT_METADATA``, {} when it has none."""
    value = step_metadata(folder).get("custom_metadata")
    return dict(value) if isinstance(value, dict) else {}


def item_handlers(metadata: dict) -> dict[str, str]:
    """{item: the class name of the handler that wrote it} from a step's
    ``_CHECKPOINT_METADATA``."""
    handlers = metadata.get("item_handlers")
    if not isinstance(handlers, dict):
        return {}
    return {item: str(handler) for item, handler in handlers.items()}


def is_json_handler(handler: str | None) -> bool:
    return handler is not None and handler.endswith(_JSON_HANDLER)


def describe_step(folder: str) -> tuple[int, dict, int] | None:
    """(step, metrics, created_ns) of an Orbax step folder, None for any
    other folder; CorruptionError when its JSON files are not Orbax's.
    Metrics are those Orbax saved (its "metrics" item, written when a
    ``best_fn`` is set), the time its commit's."""
    step = step_of_folder(folder)
    if step is None:
        return None
    metadata = step_metadata(folder)
    metrics = metadata.get("metrics")
    if not metrics and is_json_handler(item_handlers(metadata).get(_METRICS_ITEM)):
        metrics = read_json_item(os.path.join(folder, _METRICS_ITEM))
    created = (metadata.get("commit_timestamp_nsecs") or metadata.get("init_timestamp_nsecs")
               or os.stat(folder).st_mtime_ns)
    return step, metrics if isinstance(metrics, dict) else {}, int(created)


def read_json_item(folder: str) -> Any:
    """The value of a JSON item (``args.JsonSave``): the one file in its
    folder besides Orbax's commit marker."""
    files = sorted(n for n in os.listdir(folder) if n != _COMMIT_MARKER
                   and os.path.isfile(os.path.join(folder, n)))
    if len(files) != 1:
        raise CorruptionError(f"Orbax checkpoint {folder}: a JSON item holds one file, this"
                              f" holds {files}")
    return read_json(folder, files[0])


def read_json(directory: str, name: str) -> Any:
    """The JSON file ``name`` of an Orbax checkpoint's ``directory``."""
    file = os.path.join(directory, name)
    try:
        with open(file, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError as e:
        raise NotFoundError(f"Orbax checkpoint {directory}: {name} is missing") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptionError(f"Orbax checkpoint {directory}: {name} is not valid JSON: {e}") from e
