"""W8: one process of a 4-process job (bench/w8.py starts them).

    python w8_worker.py SPEC_JSON

SPEC_JSON: {"coordinator", "process_id", "num_processes", "part" ("a" or
"b"), "scale", "root", "local_root", "drop_caches", "reps", "out"}.

Part a: load-and-broadcast against every replica reading, onto a
(replica=4) and a (replica=2, fsdp=2) mesh. Part b: the manager's local
tier: blocking and total time of local and persistent saves, then restores
from the local tier, from a peer's copy (one process's local root wiped)
and from persistent storage (two adjacent roots wiped).

Every timed operation runs between two barriers of all processes; each
process records its own time and the bytes it read through shardkeep's
storage layer (``_core.storage_bytes_read``; loads use
``Options(map_files=False)`` since mapped files are not read through it),
and checks every shard it holds against the values it should have.
Writes one JSON record to ``out``.
"""

from __future__ import annotations

import atexit
import dataclasses
import inspect
import json
import os
import shutil
import sys
import time
import traceback

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from page_cache import evict  # noqa: E402

# Leaves x (rows, cols) float32: 64 MiB at small scale, 512 MiB at full
# (each replica of part a holds all of it; part b shards it over the four
# processes). Rows divide by 4, so every mesh splits them evenly.
SCALES = {"small": (8, 1024, 2048), "full": (8, 4096, 4096)}
# Part b's schedule: a local save every 2 steps, a persistent one every 3;
# these steps save to one tier only (6 would save to both).
LOCAL_EVERY, PERSISTENT_EVERY = 2, 3
SAVE_STEPS = (2, 3, 4, 8, 9, 10)


def spec_shape(scale: str) -> tuple[int, tuple[int, int]]:
    leaves, rows, cols = SCALES[scale]
    return leaves, (rows, cols)


def expected(leaf: int, step: int, index, shape) -> np.ndarray:
    """The values of box ``index`` (a tuple of slices) of leaf ``leaf`` at
    ``step``: cheap to compute, exact in float32, different per leaf and step."""
    rows, cols = (range(*s.indices(n)) for s, n in zip(index, shape))
    flat = np.add.outer(np.arange(rows.start, rows.stop, dtype=np.int64) * shape[1],
                        np.arange(cols.start, cols.stop, dtype=np.int64))
    return ((flat % 65521) + leaf * 7 + step).astype(np.float32)


class Job:
    def __init__(self, spec: dict):
        import jax
        # Collectives between CPU processes (load-and-broadcast, the local
        # tier's peer copies) need gloo, chosen before initialize.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(spec["coordinator"], num_processes=spec["num_processes"],
                                   process_id=spec["process_id"])
        self.jax = jax
        self.spec = spec
        self.process = jax.process_index()
        self.leaves, self.shape = spec_shape(spec["scale"])
        self.barriers = 0

    def barrier(self) -> None:
        from jax._src import distributed
        self.barriers += 1
        distributed.global_state.client.wait_at_barrier(f"w8-{self.barriers}", 600_000)

    def mesh(self, shape, names):
        from jax.sharding import Mesh
        return Mesh(np.array(self.jax.devices()).reshape(shape), names)

    def sharding(self, mesh, spec):
        from jax.sharding import NamedSharding
        return NamedSharding(mesh, spec)

    def state(self, sharding, step: int) -> dict:
        return {f"layer{k:02d}": self.jax.make_array_from_callback(
                    self.shape, sharding,
                    lambda index, k=k: expected(k, step, index, self.shape))
                for k in range(self.leaves)}

    def target(self, sharding) -> dict:
        return {f"layer{k:02d}": self.jax.ShapeDtypeStruct(self.shape, np.float32,
                                                           sharding=sharding)
                for k in range(self.leaves)}

    def check(self, loaded: dict, step: int) -> bool:
        """Every shard this process holds has its values at ``step``."""
        for k in range(self.leaves):
            for shard in loaded[f"layer{k:02d}"].addressable_shards:
                if not np.array_equal(np.asarray(shard.data),
                                      expected(k, step, shard.index, self.shape)):
                    return False
        return True

    def held_bytes(self, loaded: dict) -> int:
        """Bytes of the loaded state on this process's devices."""
        return sum(shard.data.nbytes for leaf in loaded.values()
                   for shard in leaf.addressable_shards)

    def make_cold(self, path: str) -> dict | None:
        """Process 0 evicts ``path`` (or drops the page cache) while the
        others wait: every process starts the next load cold."""
        cold = evict(path, self.spec["drop_caches"]) if self.process == 0 else None
        self.barrier()
        return cold

    def timed(self, operation):
        """(result, seconds, storage bytes read) of ``operation``, between barriers."""
        from shardkeep import _core
        self.barrier()
        before = _core.storage_bytes_read()
        started = time.perf_counter()
        result = operation()
        self.jax.block_until_ready(result)
        seconds = time.perf_counter() - started
        read = _core.storage_bytes_read() - before
        self.barrier()
        return result, seconds, read


def exchange_floor(job: Job, share: int, destinations) -> dict | None:
    """Seconds of ``exchange_bytes`` alone sending ``share`` bytes to each
    of ``destinations``: the collective's own cost in the pattern the
    feature uses, without reading or placing anything (the median of 3,
    into buffers touched beforehand). None where shardkeep has no exchange."""
    try:
        from shardkeep.job import exchange
    except ImportError:
        return None
    buffer = np.ones(share, np.uint8)
    times = []
    for round_ in range(3):
        _, seconds, _ = job.timed(lambda: exchange.exchange_bytes(
            {q: [buffer] for q in destinations}, name=f"W8 floor, round {round_}"))
        times.append(seconds)
    return {"bytes_sent": share * len(destinations), "seconds": sorted(times)[1]}


def stored_bytes(path: str) -> dict:
    """Data-file bytes and everything else (commit record, meta, index)."""
    data = other = 0
    for folder, _, names in os.walk(path):
        for name in names:
            size = os.path.getsize(os.path.join(folder, name))
            if os.sep + "data" in folder[len(path):]:
                data += size
            else:
                other += size
    return {"data": data, "metadata": other}


def part_a(job: Job) -> dict:
    """Load-and-broadcast vs every replica reading."""
    import shardkeep as sk
    from jax.sharding import PartitionSpec as P
    has_broadcast = "broadcast_load" in {f.name for f in dataclasses.fields(sk.Options)}
    on_s3 = job.spec.get("s3_root") is not None
    ckpt = (job.spec["s3_root"] + "/a/ckpt" if on_s3
            else os.path.join(job.spec["root"], "a", "ckpt"))
    if job.process == 0 and not on_s3:
        shutil.rmtree(ckpt, ignore_errors=True)
    job.barrier()
    saved = job.state(job.sharding(job.mesh((4,), ("fsdp",)), P("fsdp")), step=0)
    sk.save(ckpt, saved, force=on_s3)
    del saved
    # On S3 the data bytes are the state's; the metadata is not listed.
    stored = ({"data": job.leaves * job.shape[0] * job.shape[1] * 4, "metadata": 0}
              if on_s3 else stored_bytes(ckpt))
    out = {"stored": stored, "broadcast_available": has_broadcast, "loads": [],
           "storage": "s3" if on_s3 else "file"}
    meshes = {"replica=4": (job.mesh((4,), ("replica",)), P()),
              "replica=2,fsdp=2": (job.mesh((2, 2), ("replica", "fsdp")), P("fsdp"))}
    modes = ["every_replica_reads", "broadcast"] if has_broadcast else ["every_replica_reads"]
    # What the broadcast sends, without the reads: replica=4, each process
    # reads a quarter and sends it to the 3 others; replica=2 x fsdp=2,
    # each reads half of its fsdp shard and sends it to the process
    # holding the same shard in the other replica (devices of a (2, 2)
    # mesh: replicas are rows, so process p pairs with p ^ 2).
    total = job.leaves * job.shape[0] * job.shape[1] * 4
    out["exchange_floor"] = {
        "replica=4": exchange_floor(job, total // 4,
                                    [q for q in range(4) if q != job.process]),
        "replica=2,fsdp=2": exchange_floor(job, total // 4, [job.process ^ 2])}
    for rep in range(job.spec["reps"]):
        for mesh_name, (mesh, spec) in meshes.items():
            order = modes if rep % 2 == 0 else modes[::-1]
            for mode in order:
                extra = {"broadcast_load": mode == "broadcast"} if has_broadcast else {}
                options = sk.Options(map_files=False, **extra)
                target = job.target(job.sharding(mesh, spec))
                cold = job.make_cold(ckpt)
                loaded, seconds, read = job.timed(lambda: sk.load(ckpt, target, options=options))
                out["loads"].append({"mesh": mesh_name, "mode": mode, "rep": rep,
                                     "seconds": seconds, "bytes_read": read,
                                     "held_bytes": job.held_bytes(loaded),
                                     "ok": job.check(loaded, 0), "cold": cold})
                del loaded
    return out


def part_b(job: Job) -> dict:
    """The local tier: saves to each tier, then restores from each source."""
    import shardkeep as sk
    from jax.sharding import PartitionSpec as P
    parameters = inspect.signature(sk.CheckpointManager).parameters
    if "local_root" not in parameters:
        return {"not_run": "this shardkeep's CheckpointManager has no local tier (local_root)"}
    persistent = os.path.join(job.spec["root"], "b", "persistent")
    local_template = os.path.join(job.spec["local_root"], "b", "p{process}")
    own_local = local_template.format(process=job.process)
    if job.process == 0:
        shutil.rmtree(persistent, ignore_errors=True)
    shutil.rmtree(own_local, ignore_errors=True)
    job.barrier()
    sharding = job.sharding(job.mesh((4,), ("fsdp",)), P("fsdp"))
    options = sk.Options(map_files=False)

    def manager():
        return sk.CheckpointManager(
            persistent, save_interval_steps=PERSISTENT_EVERY, local_root=local_template,
            local_save_interval_steps=LOCAL_EVERY, async_save=True, options=options)

    # The peer copy alone: each process's slice to its ring successor.
    out = {"saves": [], "restores": [], "exchange_floor": exchange_floor(
        job, job.leaves * job.shape[0] * job.shape[1] * 4 // 4,
        [(job.process + 1) % 4])}
    saving = manager()
    for step in SAVE_STEPS:
        state = job.state(sharding, step)
        job.jax.block_until_ready(state)
        job.barrier()
        started = time.perf_counter()
        saving.save(step, state)
        blocking = time.perf_counter() - started
        saving.wait()
        total = time.perf_counter() - started
        job.barrier()
        tier = "local" if step % LOCAL_EVERY == 0 else "persistent"
        out["saves"].append({"step": step, "tier": tier, "blocking_seconds": blocking,
                             "total_seconds": total,
                             "state_bytes": sum(s.data.nbytes for leaf in state.values()
                                                for s in leaf.addressable_shards)})
        del state
    saving.close()

    target = job.target(sharding)
    # Each source in turn: local copies; process 1's root wiped (a replaced
    # host: its slices come from its peer); processes 1 and 2 wiped (the
    # local tiers cannot rebuild step 10: persistent step 9).
    for source, wiped, expect in (("local", (), SAVE_STEPS[-1]),
                                  ("peer", (1,), SAVE_STEPS[-1]),
                                  ("persistent", (1, 2), SAVE_STEPS[-2])):
        if job.process in wiped:
            shutil.rmtree(own_local, ignore_errors=True)
        cold = job.make_cold(persistent)
        restoring = manager()
        (step, loaded), seconds, read = job.timed(lambda: restoring.restore(target))
        out["restores"].append({"source": source, "wiped": list(wiped), "step": step,
                                "expected_step": expect, "seconds": seconds,
                                "bytes_read": read, "held_bytes": job.held_bytes(loaded),
                                "ok": step == expect and job.check(loaded, step),
                                "cold": cold})
        del loaded
        restoring.close()
        job.barrier()
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    record = {"process": spec["process_id"], "ok": False}
    try:
        job = Job(spec)
        record.update((part_a if spec["part"] == "a" else part_b)(job))
        record["ok"] = True
    except Exception:  # the launcher reports it with the process's number
        record["error"] = traceback.format_exc()
    with open(spec["out"], "w") as f:
        json.dump(record, f, indent=1)
    if not record["ok"]:
        os._exit(1)  # without JAX's shutdown barrier, which would wait for the others
    import jax
    jax.distributed.shutdown()
    # As the test jobs do: skip the interpreter's teardown, where gloo's
    # threads can abort a finished process, after the exit handlers.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
