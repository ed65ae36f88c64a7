"""The one listing of a manager's root, when the manager is created.

The root is listed by the C++ core (``_core.list_checkpoints``, through
the Storage interface, so every backend works), by the primary, which
shares the listing with the other processes through JAX's coordination
service (each listing by itself could race with deletions the primary
is still finishing). A step is an entry named by digits only whose
``_SHARDKEEP`` the core's decoder accepts (the reader's own check:
format, version, fields); its metrics come from that record. The
primary removes stale leftovers with the core's ``collect_leftovers``
(the policy of ``shardkeep gc``, see ``shardkeep.manager.leftovers``).
"""

from __future__ import annotations

import json
import logging

import jax

from .. import _core
from .. import options as options_lib
from ..errors import ShardkeepError
from ..job import distributed
from . import leftovers

logger = logging.getLogger("shardkeep")


def committed_steps(root: str, options: options_lib.Options,
                    job_id: str) -> dict[int, tuple[str, dict, int]]:
    """{step: (folder name, metrics, created_ns)} of the committed steps
    under ``root``, as every process of the job sees them (``job_id``
    names the manager's collective calls)."""
    if jax.process_count() == 1:
        found = _list_root(root, options)
    else:
        found = _agreed_listing(root, options, job_id)
    steps = {}
    for name, (metrics, created_ns) in found.items():
        step = _core.step_of_folder(name)
        if step is None:  # the primary's listing holds step folders alone
            raise ShardkeepError(f"the listing of {root!r} names {name!r}, no step")
        steps[step] = (name, metrics, created_ns)
    return steps


def _agreed_listing(root: str, options: options_lib.Options,
                    job_id: str) -> dict[str, tuple[dict, int]]:
    """The primary's listing, shared through JAX's coordination service.

    Listing on every process would race with deletions the primary
    may still be finishing for an earlier manager of the same root.
    """
    bridge = distributed.coordination()
    key = job_id + "/steps"
    if jax.process_index() == 0:
        found = _list_root(root, options)
        bridge.set(key, json.dumps(found))
        return found
    return {name: (metrics, created_ns) for name, (metrics, created_ns)
            in json.loads(bridge.get(key, options.timeout_s)).items()}


def _list_root(root: str, options: options_lib.Options) -> dict[str, tuple[dict, int]]:
    """{directory name: (metrics, created_ns)} of the committed steps; the
    primary collects garbage."""
    found: dict[str, tuple[dict, int]] = {}
    entries = _core.list_checkpoints(root, options.to_core())
    for entry in entries:
        name = entry.name
        step = _core.step_of_folder(name)
        if step is None:
            continue
        if entry.state is _core.EntryState.REJECTED:
            logger.warning("%s is ignored: %s", leftovers.join(root, name), entry.problem)
            continue
        record = entry.commit
        if record is None:
            continue
        twin = next((n for n in found if _core.step_of_folder(n) == step), None)
        if twin is not None:
            logger.warning("step %d is in both %s and %s; using %s", step, twin, name,
                           twin)
            continue
        found[name] = (record.metrics, record.created_ns)
    if jax.process_index() == 0:
        leftovers.collect(root, entries, options)
    return found
