"""A training run as Orbax users write it: the Flax NNX model and optax
state of ``test_flax_nnx`` (sharded parameters, BatchNorm statistics, the
typed PRNG keys of an ``nnx.Rngs``), trained step by step and saved by
orbax.checkpoint's own CheckpointManager as one dict of states, the way
trainers group them: {"params", "rest" (the model's other state), "opt"}."""

import jax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import NamedSharding

from test_flax_nnx import batch, build_model, build_optimizer, new_model, new_optimizer, train_step


def training_state(model, optimizer) -> dict:
    params, rest = nnx.state(model, nnx.Param, ...)
    return {"params": params, "rest": rest, "opt": nnx.state(optimizer)}


def abstract_training_state(mesh) -> dict:
    """The target a restore onto ``mesh`` uses: shapes and dtypes from
    nnx.eval_shape, shardings from the partition specs on ``mesh``."""
    def build():
        model = build_model(seed=9)
        return model, build_optimizer(model)

    with jax.set_mesh(mesh):
        model, optimizer = nnx.eval_shape(build)
    state = training_state(model, optimizer)
    return jax.tree.map(lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                             sharding=NamedSharding(mesh, spec)),
                        state, nnx.get_partition_spec(state))


class Run:
    """A model and its optimizer on ``mesh``, one training step at a time."""

    def __init__(self, mesh):
        self.model = new_model(mesh)
        self.optimizer = new_optimizer(self.model, mesh)

    def train(self, step: int) -> float:
        return float(train_step(self.model, self.optimizer, *batch(step)))

    def state(self) -> dict:
        return training_state(self.model, self.optimizer)

    def update(self, state: dict) -> None:
        nnx.update(self.model, state["params"], state["rest"])
        nnx.update(self.optimizer, state["opt"])


def orbax_steps(root, mesh, steps) -> tuple[Run, dict]:
    """Trains on ``mesh``, saving each of ``steps`` with Orbax's
    CheckpointManager under ``root``; returns the run and {step: the state
    saved at it, as host copies}."""
    run = Run(mesh)
    saved = {}
    with ocp.CheckpointManager(str(root)) as manager:
        for step in range(max(steps) + 1):
            run.train(step)
            if step in steps:
                manager.save(step, args=ocp.args.StandardSave(run.state()))
                saved[step] = jax.tree.map(_host_copy, run.state())
        manager.wait_until_finished()
    return run, saved


def _host_copy(leaf):
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(leaf).__array__(), jax.random.key_impl(leaf)
    return leaf.__array__()
