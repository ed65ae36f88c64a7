"""Planning a load: which boxes of which leaves this process needs.

``plan`` turns a checkpoint's leaf descriptions (meta.json's "tree" and
"leaves", whatever format they came from) and a target into a
``LoadPlan``: for every target leaf, the boxes (``Slot``) to fill, in the
dtype the target asks for and with the devices each goes to, and how the
leaf's value is finished once they are filled. Nothing is read here, and
a plan is a value: nothing in it changes while it runs. The executor
(``load_executor``) runs a plan against a source and keeps what it
chooses on the way (each box's buffer, the donated memory, the
load-and-broadcast pieces) on its own side; the local tier computes its
own fetches from the same plan.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import jax
import numpy as np

from .. import _core
from ..base import dtypes, prng_keys, shardings, tree_codec
from ..errors import IncompatibleError, InvalidArgumentError

_MAX_LISTED = 20


# eq=False: a slot is one box of one load, told apart from an equal box
# of another leaf by identity (the executor keys its buffers by slot).
@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class Slot:
    """One box of one leaf that this process needs, in the dtype wanted."""

    number: int          # the leaf's position in the checkpoint's leaves
    path: str
    origin: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    devices: tuple | None = None  # where the box goes; None: it stays on the host

    def holders(self) -> tuple:
        """The devices a box that goes to devices goes to (a SHARDED leaf's)."""
        assert self.devices is not None
        return self.devices


class Finish(enum.Enum):
    """How a leaf's value is built once its slots are filled."""

    VALUE = "value"          # ``LeafPlan.value``, read from no box
    HOST = "host"            # the one slot's numpy array
    ITEM = "item"            # the one slot's element, as a Python scalar
    DELIVER = "deliver"      # a host value in the form the target leaf asks for
    SHARDED = "sharded"      # a jax.Array assembled from the slots' device arrays


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class LeafPlan:
    """One target leaf: the boxes it needs and how its value is finished.

    ``value``: for VALUE the value itself, for DELIVER the host array
    (None: the one slot's buffer); ``target`` for DELIVER; ``number``
    (the saved leaf's), ``dtype`` (of its boxes), ``shape``, ``sharding``
    and ``key_impl`` (typed PRNG keys) for SHARDED, and ``donor``, the
    target's jax.Array when it is donated to the load (``donation``).
    """

    path: str
    finish: Finish
    slots: tuple[Slot, ...] = ()
    value: Any = None
    target: Any = None
    number: int = -1
    dtype: np.dtype | None = None
    shape: tuple[int, ...] = ()
    sharding: jax.sharding.Sharding | None = None
    key_impl: str | None = None
    donor: Any = None


@dataclasses.dataclass(frozen=True, eq=False)
class LoadPlan:
    """What one process does to load one tree.

    ``leaves`` in the target's leaf order (the checkpoint's without a
    target); ``treedef`` rebuilds the target's structure, ``tree`` (the
    meta's structure) the saved one when there is no target; ``broadcast``:
    boxes of the SHARDED leaves that several processes hold are read once
    in the job and sent to the others (the executor's load-and-broadcast
    stage, ``broadcast_load``).
    """

    where: str
    leaves: tuple[LeafPlan, ...]
    treedef: Any = None
    tree: dict = dataclasses.field(default_factory=dict)
    broadcast: bool = False

    def slots(self) -> list[Slot]:
        return [slot for leaf in self.leaves for slot in leaf.slots]

    def rebuild(self, values: list) -> Any:
        if self.treedef is None:
            return tree_codec.rebuild(self.tree, values)
        return jax.tree_util.tree_unflatten(self.treedef, values)


def plan(where: str, meta: _core.PytreeInfo, target: Any, *, partial: bool, broadcast: bool,
         allow_lossy_cast: bool, donate: bool = False) -> LoadPlan:
    """The plan of loading the leaves ``meta`` describes onto ``target``.

    ``where`` prefixes error messages. See ``shardkeep.load`` for the
    meaning of ``target`` and ``partial``; ``allow_lossy_cast`` is
    ``Options.allow_lossy_cast`` (the source applies it to arrays as it
    reads them, the plan to scalars, cast here); ``broadcast``: in a
    multi-process job, boxes of jax-sharded target leaves that several
    processes hold are read by one of them and sent to the others (see
    ``broadcast_load``); ``donate``: the target's jax.Arrays are donated
    to the load (``donation``; not with load-and-broadcast, whose received
    boxes go to memory of its own).
    """
    saved = meta.leaves
    if target is None:
        return LoadPlan(where, tuple(_plan_leaf(where, i, leaf, None, allow_lossy_cast)
                                     for i, leaf in enumerate(saved)), tree=meta.tree)
    keyed, treedef = jax.tree_util.tree_flatten_with_path(target, is_leaf=lambda x: x is None)
    paths = [tree_codec.path_str(keys) for keys, _ in keyed]
    numbers = _match(where, paths, saved, partial)
    shared = broadcast and jax.process_count() > 1
    leaves = [_plan_leaf(where, n, saved[n], t, allow_lossy_cast)
              for n, (_, t) in zip(numbers, keyed)]
    if donate and not shared:
        leaves = _with_donors(leaves, [t for _, t in keyed])
    return LoadPlan(where, tuple(leaves), treedef=treedef, broadcast=shared)


def _with_donors(leaves: list[LeafPlan], targets: list) -> list[LeafPlan]:
    """``leaves``, each sharded one whose target is a jax.Array donated that
    array; an array that is the target of several leaves is donated to the
    first."""
    seen: set[int] = set()
    out = []
    for leaf, target in zip(leaves, targets):
        if (leaf.finish is Finish.SHARDED and not leaf.key_impl
                and isinstance(target, jax.Array) and id(target) not in seen):
            seen.add(id(target))
            leaf = dataclasses.replace(leaf, donor=target)
        out.append(leaf)
    return out


def _match(where: str, target_paths: list[str], saved: list[_core.LeafInfo], partial: bool) -> list[int]:
    """The saved leaf number of each target leaf; errors list any mismatch.

    A None in the checkpoint needs no counterpart in the target: it holds
    nothing, and pytree libraries flatten empty nodes (optax's EmptyState)
    to no leaf at all.
    """
    number = {leaf.path: i for i, leaf in enumerate(saved)}
    if len(set(target_paths)) != len(target_paths):
        dup = sorted({p for p in target_paths if target_paths.count(p) > 1})
        raise InvalidArgumentError(f"{where}: target leaves share key paths {_listing(dup)}")
    missing = [p for p in target_paths if p not in number]
    wanted = set(target_paths)
    extra = [] if partial else sorted(leaf.path for leaf in saved
                                      if leaf.path not in wanted and leaf.kind != _core.LeafKind.NONE)
    if missing or extra:
        problems = []
        if missing:
            problems.append(f"target leaves not in the checkpoint: {_listing(missing)}")
        if extra:
            problems.append(f"checkpoint leaves not in the target: {_listing(extra)}"
                            " (pass partial=True to load a subset)")
        raise IncompatibleError(f"{where}: tree mismatch; " + "; ".join(problems))
    return [number[p] for p in target_paths]


def _listing(paths: list[str]) -> str:
    shown = ", ".join(repr(p) for p in paths[:_MAX_LISTED])
    more = len(paths) - _MAX_LISTED
    return shown + (f" and {more} more" if more > 0 else "")


def _plan_leaf(where: str, number: int, saved: _core.LeafInfo, target: Any,
               allow_lossy_cast: bool) -> LeafPlan:
    kind, path = saved.kind, saved.path
    if kind == _core.LeafKind.NONE:
        if target is not None:
            raise IncompatibleError(f"{where}: leaf {path!r} is None in the checkpoint, the"
                                    f" target wants {_describe(target)}")
        return LeafPlan(path, Finish.VALUE)
    if kind == _core.LeafKind.STRING:
        if target is not None and not isinstance(target, str):
            raise IncompatibleError(f"{where}: leaf {path!r} is a str in the checkpoint, the"
                                    f" target wants {_describe(target)}")
        return LeafPlan(path, Finish.VALUE, value=saved.value)
    if kind == _core.LeafKind.SCALAR:
        return _plan_scalar(where, saved, target, allow_lossy_cast)
    if _wants_keys(saved, target):
        return _plan_keys(where, number, saved, target)
    return _plan_array(where, number, saved, target)


def _wants_keys(saved: _core.LeafInfo, target: Any) -> bool:
    """Typed PRNG keys are built for a typed-key target and, without a
    target, for leaves saved from typed keys; any other target (uint32 key
    data included) takes the stored data as it is."""
    if target is None:
        return bool(saved.prng_impl)
    return hasattr(target, "dtype") and prng_keys.is_key(target.dtype)


def _plan_keys(where: str, number: int, saved: _core.LeafInfo, target: Any) -> LeafPlan:
    """Typed keys from stored key data: with the target's implementation,
    shape and sharding, or without a target the saved ones (the saved
    sharding when this job has its devices, else the default device).
    Key data saved by hand (uint32, no "prng_impl") loads onto a typed-key
    target of matching shape too."""
    path, stored = saved.path, tuple(saved.shape)
    saved_impl = saved.prng_impl  # "" for key data saved by hand
    if target is None:
        impl = saved_impl
        shape = stored[:max(len(stored) - len(prng_keys.key_shape(impl)), 0)]
        sharding = shardings.rebuild(saved.sharding) or _default_sharding()
    else:
        impl = prng_keys.impl_name(target.dtype)
        if saved_impl and saved_impl != impl:
            raise IncompatibleError(f"{where}: leaf {path!r} holds {saved_impl} keys in the"
                                    f" checkpoint, the target wants {impl} keys")
        shape = tuple(target.shape)
        sharding = target_sharding(where, path, target)
    needed = shape + prng_keys.key_shape(impl)
    if saved.dtype != prng_keys.DATA_DTYPE.name or stored != needed:
        raise IncompatibleError(
            f"{where}: leaf {path!r} is {saved.dtype}{list(stored)} in the checkpoint;"
            f" {impl} keys of shape {list(shape)} need key data of uint32{list(needed)}")
    return _plan_sharded(number, path, shape, prng_keys.DATA_DTYPE, sharding, key_impl=impl)


def _plan_scalar(where: str, saved: _core.LeafInfo, target: Any, allow_lossy_cast: bool) -> LeafPlan:
    value = _decode_scalar(saved)
    path = saved.path
    if target is None or isinstance(target, (bool, int, float)):
        return LeafPlan(path, Finish.VALUE, value=value)
    _check_target_shape(where, path, (), target)
    dtype = np.dtype(target.dtype)
    stored = np.asarray(value, dtypes.from_name(saved.dtype))
    with np.errstate(over="ignore"):  # an overflow is judged below, not warned about
        host = stored.astype(dtype)
    if not (getattr(target, "weak_type", False) and _as_jax_takes_it(stored, host)):
        # The core's rule for casts, the one its reader applies to arrays.
        _core.check_cast(saved.dtype, dtypes.name_of(dtype), allow_lossy_cast,
                         f"{where}: leaf {path!r}")
    return LeafPlan(path, Finish.DELIVER, value=host, target=target)


def _as_jax_takes_it(stored: np.ndarray, cast: np.ndarray) -> bool:
    """Whether a weakly typed target (what ``jax.eval_shape`` makes of a
    Python number, a train state's ``step=0`` say) takes ``stored`` as JAX
    takes a Python number into that dtype: a float rounds, but must not
    overflow; an int must fit. A stored scalar is a Python number too, so
    that is the rule its user already lives with."""
    if np.issubdtype(cast.dtype, np.inexact):
        return bool(np.isfinite(cast).all()) or not bool(np.isfinite(stored).all())
    return bool((cast.astype(stored.dtype) == stored).all())


def _decode_scalar(saved: _core.LeafInfo):
    value = saved.value
    if saved.dtype == "float64":
        return float(value)  # float("nan") etc. decode the non-finite spellings too.
    return bool(value) if saved.dtype == "bool" else int(value)


def _plan_array(where: str, number: int, saved: _core.LeafInfo, target: Any) -> LeafPlan:
    path, shape = saved.path, tuple(saved.shape)
    whole = (0,) * len(shape)
    if target is None or isinstance(target, (bool, int, float)):
        slot = Slot(number, path, whole, shape, dtypes.from_name(saved.dtype))
        if target is None:
            return LeafPlan(path, Finish.HOST, (slot,))
        _check_target_shape(where, path, shape, np.asarray(target))
        return LeafPlan(path, Finish.ITEM, (slot,))
    _check_target_shape(where, path, shape, target)
    dtype = np.dtype(target.dtype)
    if isinstance(target, (np.ndarray, np.generic)):
        return LeafPlan(path, Finish.DELIVER, (Slot(number, path, whole, shape, dtype),),
                        target=target)
    return _plan_sharded(number, path, shape, dtype, target_sharding(where, path, target))


def _plan_sharded(number: int, path: str, shape: tuple, dtype: np.dtype,
                  sharding: jax.sharding.Sharding, key_impl: str | None = None) -> LeafPlan:
    """A jax.Array of ``shape`` with ``sharding``; with ``key_impl``, typed
    keys whose stored data has the implementation's key shape appended."""
    key_shape = prng_keys.key_shape(key_impl) if key_impl else ()
    key_origin = (0,) * len(key_shape)
    slots = tuple(Slot(number, path, origin + key_origin, extent + key_shape, dtype,
                       tuple(devices))
                  for (origin, extent), devices in
                  shardings.addressable_boxes(sharding, shape).items())
    return LeafPlan(path, Finish.SHARDED, slots, number=number, dtype=dtype, shape=shape,
                    sharding=sharding, key_impl=key_impl)


def _check_target_shape(where: str, path: str, saved_shape: tuple, target: Any) -> None:
    if not hasattr(target, "shape") or not hasattr(target, "dtype"):
        raise InvalidArgumentError(
            f"{where}: target leaf {path!r} is a {type(target).__name__}; targets are"
            " jax.ShapeDtypeStruct, jax/numpy arrays, numpy/Python scalars, str or None")
    if tuple(target.shape) != tuple(saved_shape):
        raise IncompatibleError(
            f"{where}: leaf {path!r} has shape {tuple(saved_shape)} in the checkpoint, the"
            f" target wants {tuple(target.shape)}")


def target_sharding(where: str, path: str, target) -> jax.sharding.Sharding:
    """The sharding a jax target leaf asks for (a concrete one)."""
    sharding = getattr(target, "sharding", None)
    if not isinstance(sharding, jax.sharding.Sharding):
        # A ShapeDtypeStruct without a sharding asks for a jax.Array: put it
        # where JAX puts new arrays.
        return _default_sharding()
    if isinstance(sharding, jax.sharding.NamedSharding) and shardings.is_abstract(sharding):
        concrete = shardings.on_current_mesh(sharding)
        if concrete is None:
            raise InvalidArgumentError(
                f"{where}: target leaf {path!r} is sharded over an abstract mesh"
                f" ({sharding.mesh}) and no concrete mesh of that shape is set; load inside"
                " `with jax.set_mesh(mesh):` or give NamedSharding(mesh, spec) targets")
        return concrete
    return sharding


def _default_sharding() -> jax.sharding.Sharding:
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _describe(target) -> str:
    if hasattr(target, "shape") and hasattr(target, "dtype"):
        return f"{type(target).__name__} {np.dtype(target.dtype).name}{list(target.shape)}"
    return type(target).__name__
