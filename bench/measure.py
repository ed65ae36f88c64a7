"""One measurement in a fresh process: python measure.py TOOL WORKLOAD OP --out FILE.

TOOL is a tool configuration from tools.py or "floor"; OP is one of

  save          durable save (returns after the checkpoint is complete and fsynced)
  async_save    blocking part of an asynchronous save (then waits, timed apart)
  load_cold     load onto the saved sharding, checkpoint files evicted from the page cache
  load_warm     the same with the files in the page cache
  reshard_cold  load onto a (2, 4) mesh, tensor x FSDP sharding, files evicted
  reshard_warm  the same with the files in the page cache
  load          load as is (tmpfs, where the page cache is the storage)
  write         floor: the state's bytes written by the fastest of several
                parallel-stream configurations, each file and the folder fsynced
  read_cold     floor: one sequential read of the file into a reused 64 MiB buffer,
                evicted from the page cache first
  read_warm     floor: the same read with the file in the page cache
  read_fresh_cold, read_fresh_warm
                floor: the file read by parallel threads into fresh memory
  map_cold, map_warm
                floor: the file mapped and every page touched once
  first_touch   floor: fresh memory of the state's size touched once per page,
                and a copy into it once touched
  memcpy        floor: one numpy copy of a buffer of the state's size
  device_put    floor: one batched jax.device_put of host arrays of the leaves' sizes
                (floors.py says more of each)
  stall         W6: stall of an async save in a training loop, W1's state (training_loop.py)
  stall_small   W6: the same with W2's 2,000 small leaves
  memcpy_touched floor (W6): copy of W1's state into memory already touched (stall_floors.py)
  d2h           floor (W6): device-to-host copies of W2's leaves into touched memory
  read_cold, read_warm (W7) floor: one sequential read of each safetensors file
  load_cold, load_warm, reshard_cold, reshard_warm (W7): the safetensors model
                onto FSDP / the (2, 4) mesh (model_loaders.py), every leaf checked
  upload        floor (W5): the state's bytes put to the S3 server by boto3 (s3_floor.py);
                (W10) put to the GCS emulator by google-cloud-storage (gcs_floor.py)
  download      floor (W5, W10): the same objects got back into memory

Loads read the checkpoint that the same tool's "save" left at
ROOT/TOOL/WORKLOAD/ckpt. For W5, ROOT is an s3://bucket URL and the server
is given by the AWS environment variables; for W10 a gs://bucket URL and
the emulator's variables (gcs_server.py); their "load" reads the objects
as the server holds them (no client-side cache to make cold or warm). Peak RSS is the kernel's VmHWM, reset just before
the timed operation (/proc/self/clear_refs), so it covers that operation
and whatever the process already held (the state, for saves).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "--num-processes" not in sys.argv:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=8").strip()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import object_stores  # noqa: E402
from page_cache import evict, files_under, warm  # noqa: E402
import workloads  # noqa: E402


def status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def remove(path: str) -> None:
    if object_stores.is_remote(path):
        object_stores.delete_prefix(path)
    else:
        shutil.rmtree(path, ignore_errors=True)


def stored_bytes(path: str) -> int:
    if object_stores.is_remote(path):
        return object_stores.prefix_bytes(path)
    return sum(os.path.getsize(f) for f in files_under(path))


def exists(path: str) -> bool:
    return object_stores.exists(path) if object_stores.is_remote(path) else os.path.exists(path)


def get_leaf(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def verify(tool, workload: str, scale: str, loaded) -> bool:
    """Spot check: the first and last leaves equal the values that were saved."""
    import numpy as np
    leaves = workloads.leaves(workload, scale)
    for leaf in (leaves[0], leaves[-1]):
        value = get_leaf(loaded, leaf.path)
        if tool.framework == "torch":
            import torch
            rows = workloads.torch_rows(workload, leaf)
            if rows is not None:  # a DTensor: check this rank's shard
                value = value.to_local()
            value = value.view(torch.int16).numpy() if value.dtype == torch.bfloat16 else value.numpy()
            expected = workloads.leaf_values(leaf, rows)
            expected = expected.view(np.int16) if leaf.dtype == "bfloat16" else expected
        else:
            expected = workloads.leaf_values(leaf)
            for shard in value.addressable_shards:
                if np.asarray(shard.data).tobytes() != expected[shard.index].tobytes():
                    return False
            continue
        if value.shape != expected.shape or value.tobytes() != expected.tobytes():
            return False
    return True


def run_floor(op: str, workload: str, scale: str, root: str, drop_caches: bool) -> dict:
    """The floors: W6's (stall_floors.py), the object stores' (s3_floor.py,
    gcs_floor.py), and the rest, disk and memory (floors.py)."""
    if workload == "W6":
        import stall_floors
        return stall_floors.run(op, scale, reset_peak_rss)
    if op in ("upload", "download"):
        floor = __import__("gcs_floor" if workload == "W10" else "s3_floor")
        run = floor.upload if op == "upload" else floor.download
        return {"bytes": workloads.state_bytes(workload, scale)} | run(
            root, workload, scale, reset_peak_rss)
    import floors
    return floors.run(op, workload, scale, root, drop_caches, reset_peak_rss)


def run_model_load(tool_name: str, op: str, scale: str, root: str, drop_caches: bool) -> dict:
    """W7: the safetensors model that the suite wrote under ROOT loaded onto
    FSDP (load_*) or the (2, 4) mesh (reshard_*), then every leaf's every
    shard compared with its expected bytes (outside the clock)."""
    import jax

    import model_loaders
    import safetensors_files
    if tool_name not in model_loaders.TOOLS:
        raise NotApplicable(f"{tool_name} has no safetensors loader")
    tool = model_loaders.make(tool_name)
    result: dict = {"version": tool.version(), "bytes": workloads.state_bytes("W7", scale)}
    jax.devices()
    result["runtime_rss_kib"] = status_kib("VmRSS")
    folder = safetensors_files.model_dir(root)
    if not os.path.exists(safetensors_files.index_path(root)):
        raise FileNotFoundError(f"{folder}: the suite writes the model first "
                                "(safetensors_files.py)")
    if op.endswith("_cold"):
        result["cold"] = evict(folder, drop_caches)
    else:
        warm(folder)
    target = workloads.jax_target("W7", scale, "tp" if op.startswith("reshard") else "fsdp")
    gc.collect()
    result["rss_before_kib"] = status_kib("VmRSS")
    reset_peak_rss()
    start = time.perf_counter()
    loaded = tool.load(root, target, scale)
    result["seconds"] = time.perf_counter() - start
    result["peak_rss_kib"] = status_kib("VmHWM")
    result["verified"] = verify_model(loaded, target, scale)
    return result


def verify_model(loaded, target, scale: str) -> bool:
    """Every shard of every leaf equals the expected values, bit for bit,
    and sits on the target's sharding."""
    import numpy as np

    import model_loaders
    for leaf in workloads.leaves("W7", scale):
        value = model_loaders.lookup(loaded, leaf)
        want = get_leaf(target, leaf.path)
        if value.shape != want.shape or value.dtype != want.dtype:
            return False
        if not value.sharding.is_equivalent_to(want.sharding, len(want.shape)):
            return False
        expected = workloads.leaf_values(leaf)
        for shard in value.addressable_shards:
            if np.asarray(shard.data).tobytes() != expected[shard.index].tobytes():
                return False
    return True


def run_tool(tool_name: str, op: str, workload: str, scale: str, root: str,
             drop_caches: bool) -> dict:
    if workload == "W7":
        return run_model_load(tool_name, op, scale, root, drop_caches)
    import tools
    tool = tools.make(tool_name)
    join = object_stores.join if object_stores.is_remote(root) else os.path.join
    base = join(root, tool_name, workload)
    ckpt = join(base, "ckpt")
    result: dict = {"version": tool.version()}
    if workload != "W6":
        result["bytes"] = workloads.state_bytes(workload, scale)
    if tool.framework == "jax":
        import jax
        jax.devices()
    elif JOB == "torch":
        workloads.start_dtensor()
    result["runtime_rss_kib"] = status_kib("VmRSS")
    if op == "save_tiny":
        return result | save_tiny(tool, base)
    if workload == "W6":
        import training_loop
        return result | training_loop.run(tool, op, scale, join(base, op), reset_peak_rss,
                                          status_kib)
    if op in ("save", "async_save"):
        state = tools.state_for(tool, workload, scale)
        if tool.framework == "jax":
            tools.block_until_ready(state)
        path = ckpt if op == "save" else join(base, "async")
        remove(path)
        if not object_stores.is_remote(base):
            os.makedirs(base, exist_ok=True)
        start = begin_timing(tool, op, result, "save")
        if op == "save":
            tool.save(path, state)
            result["seconds"] = time.perf_counter() - start
        else:
            wait = tool.save_async(path, state)
            result["seconds"] = time.perf_counter() - start
            wait()
            result["total_seconds"] = time.perf_counter() - start
        result["stored_bytes"] = stored_bytes(path)
        if op == "async_save":
            tool.close()
            remove(path)
        return result
    if op == "reload_warm":
        return result | reload_warm(tool, ckpt, workload, scale)
    if op == "sk_load_warm":  # this tool's checkpoint loaded by shardkeep's load_orbax
        tool = tools.make("shardkeep")
        tool.load = tool.load_orbax
    layout = "tp" if op.startswith("reshard") else "fsdp"
    if tool.framework == "torch" and layout == "tp":
        raise NotApplicable("DCP holds plain (unsharded) tensors in one process: no resharding")
    if not exists(ckpt):
        raise FileNotFoundError(f"{ckpt}: run the save op of {tool_name} {workload} first")
    if op.endswith("_cold"):
        result["cold"] = evict(ckpt, drop_caches)
    elif op.endswith("_warm"):
        warm(ckpt)
    target = tools.target_for(tool, workload, scale, layout)
    start = begin_timing(tool, op, result, "load")
    loaded = tool.load(ckpt, target)
    result["seconds"] = time.perf_counter() - start
    result["peak_rss_kib"] = status_kib("VmHWM")
    result["verified"] = verify(tool, workload, scale, loaded)
    return result


RELOADS = 10


def reload_warm(tool, ckpt: str, workload: str, scale: str) -> dict:
    """The state loaded ``RELOADS`` times in one process, each load after
    the first into the live state it replaces (``tool.reload``; a tool
    without one loads onto the live arrays as its target), as evaluation
    after training or serving new weights does. "seconds" is the median of
    the loads after the first, "max_seconds" the slowest of them."""
    import statistics
    import tools
    if not exists(ckpt):
        raise FileNotFoundError(f"{ckpt}: run the save op first")
    warm(ckpt)
    reload = getattr(tool, "reload", tool.load)
    result: dict = {}
    start = begin_timing(tool, "reload_warm", result, "load")
    live = tool.load(ckpt, tools.target_for(tool, workload, scale, "fsdp"))
    times = [time.perf_counter() - start]
    for _ in range(RELOADS - 1):
        start = time.perf_counter()
        live = reload(ckpt, live)
        times.append(time.perf_counter() - start)
    result.update(seconds=statistics.median(times[1:]), max_seconds=max(times[1:]),
                  first_seconds=times[0], all_seconds=times,
                  peak_rss_kib=status_kib("VmHWM"),
                  verified=verify(tool, workload, scale, live))
    return result


def begin_timing(tool, op: str, result: dict, barrier_name: str) -> float:
    """Readies ``tool`` for ``op``, records the RSS before it, meets the other
    processes of the job and resets the peak RSS; returns the start time."""
    tool.prepare(op)
    gc.collect()
    result["rss_before_kib"] = status_kib("VmRSS")
    barrier(barrier_name)
    reset_peak_rss()
    return time.perf_counter()


def save_tiny(tool, base: str, count: int = 5) -> dict:
    """Per-save fixed cost: saves of one 8x8 array sharded over all devices
    (one warm-up, then the median of ``count``). In a multi-process job the
    difference to one process is the coordination overhead."""
    import statistics

    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    if tool.framework != "jax":
        raise NotApplicable("save_tiny is measured for the JAX tools")
    sharding = NamedSharding(workloads.fsdp_mesh(), P("fsdp"))
    tree = {"x": jax.make_array_from_callback(
        (8, 8), sharding, lambda index: np.ones((8, 8), np.float32)[index])}
    tool.prepare("save")
    os.makedirs(base, exist_ok=True)
    times = []
    for i in range(count + 1):
        path = os.path.join(base, f"tiny{i}")
        barrier(f"tiny{i}")
        start = time.perf_counter()
        tool.save(path, tree)
        times.append(time.perf_counter() - start)
    return {"seconds": statistics.median(times[1:]), "all_seconds": times}


JOB = None  # "jax" or "torch" in a multi-process job: how its processes meet


def barrier(name: str) -> None:
    """All processes of a multi-process job meet here (no-op alone)."""
    if JOB == "jax":
        from jax._src import distributed
        distributed.global_state.client.wait_at_barrier(f"bench-{name}", 600_000)
    elif JOB == "torch":
        import torch.distributed as dist
        dist.barrier()


def join_job(tool: str, coordinator: str, num_processes: int, process_id: int) -> None:
    """Joins the other workers: jax.distributed for the JAX tools, a
    torch.distributed gloo group for DCP (rank 0 hosts the TCP store at the
    coordinator address)."""
    global JOB
    import tools
    if tool in tools.TORCH_TOOLS:
        import datetime

        import torch.distributed as dist
        # gloo would pick the interface of the hostname; this job is loopback only.
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://{coordinator}",
                                world_size=num_processes, rank=process_id,
                                timeout=datetime.timedelta(seconds=600))
        JOB = "torch"
    else:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_force_host_platform_device_count=4").strip()
        import jax
        jax.distributed.initialize(coordinator, num_processes=num_processes,
                                   process_id=process_id)
        JOB = "jax"


class NotApplicable(Exception):
    pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tool")
    parser.add_argument("workload", choices=["W1", "W2", "W3", "W4", "W5", "W6", "W7", "W10"])
    parser.add_argument("op")
    parser.add_argument("--scale", default="small", choices=sorted(workloads.LLAMA_SCALES))
    parser.add_argument("--root", required=True,
                        help="folder for checkpoints and floor files (s3://bucket for W5, "
                        "gs://bucket for W10)")
    parser.add_argument("--out", required=True, help="JSON file to write ('-' for stdout)")
    parser.add_argument("--drop-caches", action="store_true",
                        help="cold ops drop the whole page cache (root only)")
    parser.add_argument("--num-processes", type=int, default=1,
                        help="worker of a multi-process job (multiprocess.py starts these)")
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--coordinator", default=None)
    args = parser.parse_args(argv)
    if args.num_processes > 1:
        join_job(args.tool, args.coordinator, args.num_processes, args.process_id)
    if not object_stores.is_remote(args.root):
        args.root = os.path.abspath(args.root)

    baseline_kib = status_kib("VmRSS")
    record = {"tool": args.tool, "workload": args.workload, "op": args.op,
              "scale": args.scale, "pid": os.getpid(), "process_id": args.process_id}
    try:
        if args.tool == "floor":
            record.update(run_floor(args.op, args.workload, args.scale, args.root,
                                    args.drop_caches))
        else:
            record.update(run_tool(args.tool, args.op, args.workload, args.scale, args.root,
                                   args.drop_caches))
        record.setdefault("peak_rss_kib", status_kib("VmHWM"))
        record["baseline_rss_kib"] = baseline_kib
        record["ok"] = True
    except NotApplicable as e:
        record.update(ok=False, not_applicable=True, error=str(e))
    except Exception as e:  # reported in the results, with its type
        import traceback
        traceback.print_exc()
        record.update(ok=False, error=f"{type(e).__name__}: {e}")
    text = json.dumps(record, indent=1)
    if args.out == "-":
        print(text)
    else:
        with open(args.out, "w") as f:
            f.write(text)
    return 0 if record["ok"] or record.get("not_applicable") else 1


if __name__ == "__main__":
    sys.exit(main())
