"""One process of a multi-process test job (started by harness.run_job).

argv[1] is a JSON spec: coordinator, num_processes, process_id, scenario,
args, heartbeat_timeout_s, shutdown_timeout_s. The environment (XLA_FLAGS,
JAX_PLATFORMS) is set by the harness before JAX is imported.
"""

import atexit
import importlib
import json
import os
import sys
import traceback

import jax

RESULT_PREFIX = "SHARDKEEP_RESULT "


def main() -> None:
    spec = json.loads(sys.argv[1])
    # Collectives between the processes of a CPU job (load-and-broadcast,
    # the local tier's peer copies) need gloo, chosen before initialize.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=spec["coordinator"], num_processes=spec["num_processes"],
        process_id=spec["process_id"], initialization_timeout=60,
        heartbeat_timeout_seconds=spec["heartbeat_timeout_s"],
        shutdown_timeout_seconds=spec["shutdown_timeout_s"])
    try:
        result = _scenario(spec["scenario"])(**spec["args"])
    except BaseException:  # noqa: BLE001 - report everything, then die.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip JAX's shutdown barrier, which would wait for the others.
        os._exit(1)
    print(RESULT_PREFIX + json.dumps({"process": spec["process_id"], "result": result}),
          flush=True)
    if isinstance(result, dict) and result.get("survivors"):
        # A peer is dead, so JAX's shutdown barrier would wait for it until
        # its own timeout. Exit without it, but process 0 (which runs the
        # coordination service) last: the others die when it goes away.
        _finish_without_peers(spec["process_id"], result["survivors"])
        os._exit(0)
    jax.distributed.shutdown()
    # Skip the interpreter's teardown: gloo's threads can abort a process
    # there (SIGABRT, "terminate called without an active exception") after
    # its work is done and reported, a known race of gloo's shutdown. The
    # exit handlers (saves still in flight) run first, as at a normal exit.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _scenario(name: str):
    """"function" from scenarios.py, or "module:function" from a module
    beside this file. Imported after initialize: scenarios may touch devices."""
    module_name, _, function = name.rpartition(":")
    module = importlib.import_module(module_name or "scenarios")
    return getattr(module, function)


def _finish_without_peers(me: int, survivors: list[int]) -> None:
    from shardkeep.job import distributed

    bridge = distributed.coordination()
    if me != 0:
        bridge.set(f"harness/printed/{me}", "1")
        return
    for p in survivors:
        if p != 0:
            bridge.get(f"harness/printed/{p}", 30.0)


if __name__ == "__main__":
    main()
