"""``shardkeep.orbax``: the manager API Orbax users write against, backed by shardkeep.

Changing one import moves a program written against Orbax's v0 manager:

    import orbax.checkpoint as ocp        # before
    from shardkeep import orbax as ocp    # after

    options = ocp.CheckpointManagerOptions(save_interval_steps=100, max_to_keep=3)
    with ocp.CheckpointManager(root, options=options) as mngr:
        mngr.save(step, args=ocp.args.StandardSave(state), metrics={"loss": loss})
        state = mngr.restore(mngr.latest_step(), args=ocp.args.StandardRestore(abstract))

It is written against shardkeep's public API alone. docs/ORBAX.md maps
each Orbax name onto shardkeep's, and lists what is refused.
"""

from . import args
from .manager import CheckpointManager
from .options import AsyncOptions, CheckpointManagerOptions

__all__ = ["AsyncOptions", "CheckpointManager", "CheckpointManagerOptions", "args"]
