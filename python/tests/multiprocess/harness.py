"""Runs a real multi-process JAX job on localhost, one scenario per process.

``run_job`` starts ``num_processes`` copies of ``worker.py``; each calls
``jax.distributed.initialize`` against a coordinator on a free local port,
runs the named function of ``scenarios.py`` and prints one JSON result
line. The harness returns the results in process order, and raises with
every process's stdout and stderr when any process fails, prints no
result, or the job outlives ``timeout``.

How the timeouts interact: JAX's coordination service declares a process
dead when it has sent no heartbeat for ``heartbeat_timeout_s`` and then
terminates every other process of the job. Tests that expect shardkeep to
notice a dead peer (its barriers time out after Options.timeout_s) must
keep ``heartbeat_timeout_s`` well above that timeout, or JAX kills the
survivors first; the default here (60 s) is six times the 10 s the tests
use. ``shutdown_timeout_s`` bounds JAX's shutdown barrier at a clean exit.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

WORKER = pathlib.Path(__file__).with_name("worker.py")
RESULT_PREFIX = "SHARDKEEP_RESULT "


class JobError(AssertionError):
    """A multi-process job failed; the message holds every process's output."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(num_processes: int, devices_per_process: int, scenario: str,
            args: dict | None = None, *, timeout: float = 120.0,
            expect_killed: tuple[int, ...] = (), heartbeat_timeout_s: int = 60,
            shutdown_timeout_s: int = 30) -> list:
    """Runs ``scenarios.<scenario>(**args)`` in every process of a new job.

    Returns each process's result (None for the processes in
    ``expect_killed``, which must die by a signal). Raises JobError if a
    process exits with another status or prints no result, or when the job
    has not finished within ``timeout`` seconds (all processes are killed).
    """
    port = free_port()
    env = dict(os.environ)
    env.update(
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}",
        JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    spec = dict(coordinator=f"127.0.0.1:{port}", num_processes=num_processes,
                scenario=scenario, args=args or {},
                heartbeat_timeout_s=heartbeat_timeout_s,
                shutdown_timeout_s=shutdown_timeout_s)
    with tempfile.TemporaryDirectory(prefix="shardkeep-job-") as logs:
        procs, outs = [], []
        for i in range(num_processes):
            out = open(os.path.join(logs, f"p{i}.out"), "w+")
            err = open(os.path.join(logs, f"p{i}.err"), "w+")
            outs.append((out, err))
            procs.append(subprocess.Popen(
                [sys.executable, str(WORKER), json.dumps({**spec, "process_id": i})],
                stdout=out, stderr=err, env=env, start_new_session=True))
        problem = _wait(procs, timeout, expect_killed)
        texts = []
        for out, err in outs:
            out.seek(0)
            err.seek(0)
            texts.append((out.read(), err.read()))
            out.close()
            err.close()
    results = []
    for i, (proc, (stdout, _)) in enumerate(zip(procs, texts)):
        if i in expect_killed:
            if proc.returncode is None or proc.returncode >= 0:
                problem = problem or f"process {i} was expected to die by a signal"
            results.append(None)
            continue
        lines = [l for l in stdout.splitlines() if l.startswith(RESULT_PREFIX)]
        if proc.returncode != 0:
            problem = problem or f"process {i} exited with status {proc.returncode}"
        elif not lines:
            problem = problem or f"process {i} printed no result"
        else:
            results.append(json.loads(lines[-1][len(RESULT_PREFIX):])["result"])
    if problem:
        raise JobError(_report(f"{scenario} on {num_processes}x{devices_per_process}: "
                               f"{problem}", procs, texts))
    return results


def _wait(procs, timeout: float, expect_killed) -> str | None:
    """Waits for every process; kills them all on timeout or first failure."""
    deadline = time.monotonic() + timeout
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return None
        failed = [i for i, c in enumerate(codes)
                  if c is not None and c != 0 and i not in expect_killed]
        now = time.monotonic()
        if failed and failed_at is None:
            failed_at = now
        # A failed process leaves the others waiting at a barrier: give
        # them a moment to report, then stop them.
        if failed_at is not None and now - failed_at > 5:
            _kill_all(procs)
            return f"process {failed[0]} failed (status {codes[failed[0]]}); killed the rest"
        if now > deadline:
            _kill_all(procs)
            return f"job did not finish within {timeout} s; killed it"
        time.sleep(0.05)


def _kill_all(procs) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


def _report(headline: str, procs, texts) -> str:
    parts = [headline]
    for i, (proc, (stdout, stderr)) in enumerate(zip(procs, texts)):
        parts.append(f"--- process {i} (status {proc.returncode}) stdout ---\n{stdout}"
                     f"--- process {i} stderr ---\n{stderr}")
    return "\n".join(parts)
