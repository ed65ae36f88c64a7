"""The chaos suite's small runs (docs/S3.md, "Chaos suite"): saves, loads,
a CheckpointManager with keep_last, `shardkeep cp` and `shardkeep gc`
through a proxy injecting seeded random faults, then the checks of
chaos_workload.py with the faults off. Each case fixes its seed, so a
failure replays; scripts/chaos_run.py runs the same workload longer."""

from __future__ import annotations

import dataclasses
import os

import boto3
import botocore.config
import botocore.exceptions
import pytest

import chaos_states
import shardkeep as sk
from chaos_workload import ChaosRun
from s3_chaos import TRANSIENT, RandomFaults
from s3_fault_proxy import Fault
from s3_server import ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY
from test_cli import cli_tool

ROUNDS = 6
MAX_DELAY_S = 0.5


def _through(proxy, s3) -> sk.S3Settings:
    return dataclasses.replace(s3.settings, endpoint_url=proxy.endpoint_url)


@pytest.mark.parametrize("seed, rates, timeout_s", [
    # Errors, resets, cut bodies, lost answers and delays: most operations
    # ride through by retrying, some run out of time and raise.
    pytest.param(11, TRANSIENT, 2.0, id="transient"),
    # Stored bytes read back wrong: a load raises CorruptionError.
    pytest.param(12, {"flip_get": 0.25}, 4.0, id="flipped-reads"),
    # Bytes stored wrong: the store must refuse them (Content-MD5), or the
    # save must not commit them.
    pytest.param(13, {"flip_put": 0.25}, 4.0, id="flipped-uploads"),
])
def test_chaos(s3, s3_proxy, seed, rates, timeout_s):
    s3.expect_open_uploads = True  # the run counts them among its leftovers
    env = dict(os.environ)  # the s3 fixture's: the server itself, the test keys
    plan = RandomFaults(seed, rates, max_delay_s=MAX_DELAY_S, stall_s=2 * timeout_s)
    run = ChaosRun(proxy=s3_proxy, plan=plan,
                   client=s3.client, bucket=s3.name, faulty=_through(s3_proxy, s3),
                   direct=s3.settings, cli=cli_tool(),
                   env={**env, "AWS_ENDPOINT_URL": s3_proxy.endpoint_url}, env_direct=env,
                   seed=seed, timeout_s=timeout_s,
                   io_threads=1)  # one writer: the same requests every run
    figures = run.run(rounds=ROUNDS)
    print(figures.report())
    assert sum(figures.faults.values()) > 0, figures.report()
    assert not figures.problems(), figures.report()


def test_loads_of_metadata_with_a_flipped_bit_raise_or_are_exact(s3, s3_proxy):
    # Most flips in a checkpointable's meta.json break its JSON; those in
    # a scalar's digits, a string or a key change the values it describes,
    # which a load must notice all the same. Each answer has one bit
    # flipped, at a different place every load.
    state = chaos_states.build("plain", 5)
    url = s3.url("flipped-metadata")
    sk.save(url, state)
    s3_proxy.chaos(RandomFaults(21, {"flip_get": 1.0}, paths=r"/meta\.json$"))
    options = sk.Options(s3=_through(s3_proxy, s3), timeout_s=10.0)
    outcomes, wrong = [], []
    for _ in range(300):
        try:
            difference = chaos_states.difference(sk.load(url, options=options), state)
        except sk.ShardkeepError as e:
            outcomes.append(type(e).__name__)
            continue
        outcomes.append("exact" if difference is None else "wrong")
        if difference is not None:
            wrong.append(difference)
    s3_proxy.chaos(None)
    assert s3_proxy.tally()["flipped"] >= 300  # a reader may ask again after a mismatch
    assert wrong == [], (f"{len(wrong)} of 300 loads returned wrong values "
                         f"({ {o: outcomes.count(o) for o in set(outcomes)} }):\n" +
                         "\n".join(wrong))


def test_the_proxy_damages_bodies_where_it_is_told(s3, s3_proxy):
    # The suite's verdicts rest on the proxy doing what its faults say.
    # boto3 through the proxy, sending no checksums of its own, so that the
    # server stores what reaches it.
    client = boto3.client(
        "s3", endpoint_url=s3_proxy.endpoint_url, region_name=REGION,
        aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key=SECRET_ACCESS_KEY,
        config=botocore.config.Config(
            s3={"addressing_style": "path"}, retries={"total_max_attempts": 1},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required"))
    s3_proxy.flip(method="PUT", path="/up", offset=1)
    client.put_object(Bucket=s3.name, Key="up", Body=b"hello")
    assert s3.get("up") == b"hdllo"  # 'e' with its lowest bit turned

    s3.client.put_object(Bucket=s3.name, Key="down", Body=bytes(100))
    s3_proxy.flip(method="GET", path="/down", at=0.5)
    assert client.get_object(Bucket=s3.name, Key="down")["Body"].read() == (
        bytes(50) + b"\x01" + bytes(49))
    assert s3.get("down") == bytes(100)  # stored intact

    s3_proxy.inject(Fault("cut", at=0.3), method="GET", path="/down")
    with pytest.raises(botocore.exceptions.BotoCoreError):
        client.get_object(Bucket=s3.name, Key="down")["Body"].read()

    s3_proxy.inject(Fault("lost"), method="PUT", path="/lost")
    with pytest.raises(botocore.exceptions.BotoCoreError):
        client.put_object(Bucket=s3.name, Key="lost", Body=b"applied")
    assert s3.get("lost") == b"applied"  # the server took it; its answer never came

    s3_proxy.inject(Fault("cut", at=0.5), method="PUT", path="/half")
    with pytest.raises(botocore.exceptions.BotoCoreError):
        client.put_object(Bucket=s3.name, Key="half", Body=bytes(1 << 16))
    assert "half" not in s3.keys()  # an upload cut short is not stored
    # Counted, not listed: the proxy records a request after relaying its
    # answer, so one the client has done with may be recorded after the next.
    assert s3_proxy.tally() == {"flipped": 2, "cut": 2, "lost": 1}, s3_proxy.seen
