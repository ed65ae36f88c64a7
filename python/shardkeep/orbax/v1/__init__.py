"""``shardkeep.orbax.v1``: Orbax v1's training ``Checkpointer``, backed by shardkeep.

    from orbax.checkpoint.experimental import v1 as ocp   # before
    from shardkeep.orbax import v1 as ocp                 # after

    with ocp.training.Checkpointer(root) as ckptr:
        ckptr.save(step, state, metrics={"loss": loss})
        state = ckptr.load(ckptr.latest.step, abstract_state)
"""

from . import training

__all__ = ["training"]
