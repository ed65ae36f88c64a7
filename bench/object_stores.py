"""Paths of the object-store workloads (W5 on S3, W10 on GCS): which store a
path is on, and the chores the harness does there, by the path's scheme."""

from __future__ import annotations

import gcs_objects
import s3_objects


def is_remote(path: str) -> bool:
    return s3_objects.is_s3(path) or gcs_objects.is_gs(path)


def join(url: str, *parts: str) -> str:
    return "/".join([url.rstrip("/")] + [p.strip("/") for p in parts])


def _module(url: str):
    return gcs_objects if gcs_objects.is_gs(url) else s3_objects


def prefix_bytes(url: str) -> int:
    return _module(url).prefix_bytes(url)


def exists(url: str) -> bool:
    return _module(url).exists(url)


def delete_prefix(url: str, env=None) -> None:
    _module(url).delete_prefix(url, env)
