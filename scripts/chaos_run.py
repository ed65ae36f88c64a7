#!/usr/bin/env python3
"""The chaos suite's long run (docs/S3.md, "Chaos suite"): the workload of
python/tests/chaos_workload.py through a fault proxy with a seeded random
plan, against a SeaweedFS server of its own, until at least --requests
requests went through the proxy under faults; then the checks with the
faults off, and the figures. Exit status 0 when no promise was broken, 1
otherwise; the same --seed replays a run's fault plan.

    .venv/bin/python scripts/chaos_run.py --requests 2000 --seed 1
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import sys
import tempfile
import time

# Before anything imports jax: the tests' 8 CPU devices.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(_REPO / "python" / "tests"), str(_REPO / "scripts")]

import shardkeep as sk  # noqa: E402
from chaos_workload import ChaosRun  # noqa: E402
from s3_chaos import ALL_KINDS, KINDS, RandomFaults  # noqa: E402
from s3_fault_proxy import FaultProxy  # noqa: E402
from seaweed_server import REGION, SeaweedServer  # noqa: E402

ACCESS_KEY = "AKIASHARDKEEPCHAOS"
SECRET_KEY = "shardkeep-chaos-secret"
BUCKET = "chaos"


def _rates(text: str | None) -> dict[str, float]:
    """"drop=0.05,flip_get=0.02": those rates; None: every kind (ALL_KINDS)."""
    if text is None:
        return dict(ALL_KINDS)
    rates = {}
    for item in text.split(","):
        kind, _, rate = item.partition("=")
        if kind not in KINDS:
            raise SystemExit(f"--rates: unknown kind {kind!r}; known: {', '.join(KINDS)}")
        rates[kind] = float(rate)
    return rates


def _without_seed(argv: list[str]) -> list[str]:
    """The arguments less --seed (as "--seed N" or "--seed=N")."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--seed":
            skip = True
        elif not arg.startswith("--seed="):
            kept.append(arg)
    return kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000,
                        help="requests under faults to reach (default 2000)")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    parser.add_argument("--rates", help="KIND=P,... (default: every kind, "
                        f"{','.join(f'{k}={v}' for k, v in ALL_KINDS.items())})")
    parser.add_argument("--max-delay", type=float, default=2.0,
                        help="longest delay of an answer, seconds (default 2)")
    parser.add_argument("--timeout", type=float, default=4.0,
                        help="Options.timeout_s of the operations under faults (default 4)")
    parser.add_argument("--io-threads", type=int, default=0,
                        help="Options.io_threads of saves; 1 makes a replay's requests "
                        "the same (default: the engine's)")
    parser.add_argument("--workdir", type=pathlib.Path,
                        help="the server's data (default: a temporary folder)")
    args = parser.parse_args()
    rates = _rates(args.rates)
    cli = pathlib.Path(sys.executable).with_name("shardkeep")
    if not cli.exists():
        raise SystemExit(f"no shardkeep tool beside {sys.executable}: pip install "
                         "--no-build-isolation . installs it")

    with tempfile.TemporaryDirectory(prefix="chaos-") as scratch:
        workdir = args.workdir or pathlib.Path(scratch)
        with SeaweedServer(workdir, ACCESS_KEY, SECRET_KEY) as server:
            server.client().create_bucket(Bucket=BUCKET)
            proxy = FaultProxy(server.endpoint_url)
            try:
                direct = sk.S3Settings(endpoint_url=server.endpoint_url, region=REGION,
                                       access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)
                faulty = sk.S3Settings(endpoint_url=proxy.endpoint_url, region=REGION,
                                       access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY)
                env = {**os.environ, **server.env()}
                print(f"seed {args.seed}; rates {rates}; max delay {args.max_delay} s; "
                      f"timeout_s {args.timeout}", flush=True)
                start = time.monotonic()
                run = ChaosRun(proxy=proxy,
                               plan=RandomFaults(args.seed, rates, max_delay_s=args.max_delay,
                                                 stall_s=2 * args.timeout),
                               client=server.client(), bucket=BUCKET, faulty=faulty,
                               direct=direct, cli=str(cli),
                               env={**env, "AWS_ENDPOINT_URL": proxy.endpoint_url},
                               env_direct=env, seed=args.seed, timeout_s=args.timeout,
                               io_threads=args.io_threads,
                               log=lambda line: print(line, flush=True))
                figures = run.run(requests=args.requests)
            finally:
                proxy.close()
    replay = _without_seed(sys.argv[1:])
    print(f"\n{figures.report()}\n{time.monotonic() - start:.0f} s; replay: "
          + shlex.join(["scripts/chaos_run.py", *replay, "--seed", str(args.seed)]))
    return 1 if figures.problems() else 0


if __name__ == "__main__":
    sys.exit(main())
