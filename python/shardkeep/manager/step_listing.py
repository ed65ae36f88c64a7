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
Orbax's step folders are steps too, marked as such
(``shardkeep.manager.orbax_steps``), on roots on a local file system,
where Orbax checkpoints are read; a step in both formats is shardkeep's.
"""

from __future__ import annotations

import json
import logging
import os

import jax

from .. import _core
from .. import options as options_lib
from ..errors import ShardkeepError
from ..job import distributed
from ..interop import orbax_folders
from ..loading.other_formats import named_like_step
from . import leftovers
from .step_record import Listed

logger = logging.getLogger("shardkeep")


def committed_steps(root: str, options: options_lib.Options, job_id: str) -> dict[int, Listed]:
    """The committed steps under ``root``, as every process of the job
    sees them (``job_id`` names the manager's collective calls)."""
    if jax.process_count() == 1:
        found = _list_root(root, options)
    else:
        found = _agreed_listing(root, options, job_id)
    orbax = sorted(step for step, listed in found.items() if listed.orbax)
    if orbax:
        logger.info("%s holds Orbax steps %s: they load through the Orbax reader, are never"
                    " deleted by retention, and new steps are saved in shardkeep's format",
                    root, orbax)
    return found


def _agreed_listing(root: str, options: options_lib.Options, job_id: str) -> dict[int, Listed]:
    """The primary's listing, shared through JAX's coordination service.

    Listing on every process would race with deletions the primary
    may still be finishing for an earlier manager of the same root.
    """
    bridge = distributed.coordination()
    key = job_id + "/steps"
    if jax.process_index() == 0:
        found = _list_root(root, options)
        bridge.set(key, json.dumps({step: list(listed) for step, listed in found.items()}))
        return found
    shared = json.loads(bridge.get(key, options.timeout_s))
    return {int(step): Listed(*listed) for step, listed in shared.items()}


def _list_root(root: str, options: options_lib.Options) -> dict[int, Listed]:
    """The committed steps; the primary collects garbage."""
    found: dict[int, Listed] = {}
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
        if step in found:
            logger.warning("step %d is in both %s and %s; using %s", step, found[step].name,
                           name, found[step].name)
            continue
        found[step] = Listed(name, record.metrics, record.created_ns, False)
    for name, (step, metrics, created_ns) in _orbax_steps(root, entries).items():
        if step in found:
            logger.warning("step %d is in both %s and Orbax's %s; using %s", step,
                           found[step].name, name, found[step].name)
            continue
        found[step] = Listed(name, metrics, created_ns, True)
    if jax.process_index() == 0:
        leftovers.collect(root, entries, options)
    return found


def _orbax_steps(root: str, entries: list[_core.RootEntry]) -> dict[str, tuple[int, dict, int]]:
    """{name: (step, metrics, created_ns)} of the Orbax steps among the
    entries no shardkeep state describes."""
    others = [e.name for e in entries if e.state is _core.EntryState.OTHER]
    local = _core.Location(root).local_path
    if local is None:  # Orbax checkpoints are read from local files alone
        unread = [name for name in others if named_like_step(name)]
        if unread:
            logger.warning("%s holds %s, named like Orbax steps, which are not listed:"
                           " shardkeep reads Orbax checkpoints from a local file system only;"
                           " to resume from them, copy the root to one and open the manager"
                           " there", root, unread)
        return {}
    found = {}
    for name in others:
        try:
            described = orbax_folders.describe_step(os.path.join(local, name))
        except ShardkeepError as e:  # as a rejected record of shardkeep's: not a step
            logger.warning("%s is ignored: %s", leftovers.join(root, name), e)
            continue
        if described is not None:
            found[name] = described
    return found
