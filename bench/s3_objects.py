"""The few object-store chores the harness does itself (W5): split an
``s3://bucket/prefix`` URL, total the bytes under a prefix, delete it.

The client is boto3's, configured from the AWS environment variables that
the suite sets for W5 (AWS_ENDPOINT_URL and the credentials): those of
this process, or the mapping ``env`` where a function takes one.
"""

from __future__ import annotations

import os


def is_s3(path: str) -> bool:
    return path.startswith("s3://")


def split(url: str) -> tuple[str, str]:
    """("bucket", "key/prefix") of ``s3://bucket/key/prefix``."""
    bucket, _, key = url[len("s3://"):].partition("/")
    return bucket, key


def client(env=None):
    import boto3
    env = os.environ if env is None else env
    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                        region_name=env.get("AWS_REGION", "us-east-1"))


def _objects(url: str, env=None):
    bucket, prefix = split(url)
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    for page in client(env).get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                    Prefix=prefix):
        yield from page.get("Contents", [])


def prefix_bytes(url: str) -> int:
    return sum(o["Size"] for o in _objects(url))


def exists(url: str) -> bool:
    return next(_objects(url), None) is not None


def delete_prefix(url: str, env=None) -> None:
    bucket, _ = split(url)
    keys = [{"Key": o["Key"]} for o in _objects(url, env)]
    s3 = client(env)
    for start in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": keys[start:start + 1000],
                                                 "Quiet": True})
