"""Adapters: one object per tool configuration, all with the same calls.

Each tool saves durably (``save`` returns only once the checkpoint is
complete and on stable storage), saves asynchronously (``save_async``
returns after the blocking phase and gives a ``wait`` callable) and loads
into a target of the same or another sharding. Peers run with their
defaults and with their best documented tuning:

- orbax: ``orbax`` is ``StandardCheckpointer`` as shipped (OCDBT on, zstd
  compression on); ``orbax-nocompress`` turns compression off;
  ``orbax-tuned`` also raises the in-flight byte limits
  (save/restore_concurrent_gb) past the state size. On GPUs Orbax stages
  through pinned host memory by default, as shardkeep does.
- DCP: ``dcp`` is ``FileSystemWriter`` with its defaults (one thread,
  sync_files=True); ``dcp-tuned`` uses thread_count = cores. On an
  ``s3://`` path (W5) DCP goes through fsspec: ``FsspecWriter`` /
  ``FsspecReader`` with the same settings, s3fs pointed at the endpoint in
  AWS_ENDPOINT_URL (credentials from the environment, as boto reads them).
  On a ``gs://`` path (W10) the same through gcsfs, which finds the
  emulator in STORAGE_EMULATOR_HOST (anonymous: the emulator takes none).

Orbax and shardkeep take ``s3://`` and ``gs://`` paths as they are
(Orbax's TensorStore reaches the GCS emulator by TENSORSTORE_GCS_HTTP_URL).
"""

from __future__ import annotations

import dataclasses

import os

import object_stores
import s3_objects
import workloads

JAX_TOOLS = ("shardkeep", "shardkeep-zstd", "shardkeep-baseline", "shardkeep-pageable", "orbax",
             "orbax-nocompress", "orbax-tuned")
TORCH_TOOLS = ("dcp", "dcp-tuned")
PEER_OF = {"orbax": "orbax", "orbax-nocompress": "orbax", "orbax-tuned": "orbax",
           "dcp": "dcp", "dcp-tuned": "dcp"}


def make(name: str):
    if name.startswith("shardkeep"):
        # shardkeep-pageable: device-to-host copies into pageable memory
        # (bench/gpu.py's A/B of pinned staging; the same as shardkeep on CPUs).
        return Shardkeep(compression="zstd" if name.endswith("zstd") else None,
                         pinned_host_staging=False if name.endswith("pageable") else None)
    if name.startswith("orbax"):
        return Orbax(compression=name == "orbax", concurrent_gb=1024 if name == "orbax-tuned" else None)
    if name.startswith("dcp"):
        return Dcp(threads=os.cpu_count() if name == "dcp-tuned" else None)
    raise ValueError(f"unknown tool {name!r}")


def block_until_ready(tree):
    import jax
    return jax.block_until_ready(tree)


class Shardkeep:
    framework = "jax"

    def __init__(self, compression, pinned_host_staging=None):
        import shardkeep
        self.sk = shardkeep
        # Only named when set: a baseline build may predate the option.
        pinned = {} if pinned_host_staging is None else {"pinned_host_staging": pinned_host_staging}
        self.options = shardkeep.Options(compression=compression, **pinned)

    def version(self) -> str:
        from importlib.metadata import version
        return version("shardkeep")

    def prepare(self, op):
        pass

    def close(self):
        pass

    def save(self, path, state):
        self.sk.save(path, state, options=self.options)

    def save_async(self, path, state):
        return self.sk.save_async(path, state, options=self.options).result

    def load(self, path, target):
        return block_until_ready(self.sk.load(path, target, options=self.options))

    def reload(self, path, live):
        """A load into the memory of the live state it replaces."""
        options = dataclasses.replace(self.options, donate_target=True)
        return block_until_ready(self.sk.load(path, live, options=options))

    def load_orbax(self, path, target):
        return block_until_ready(self.sk.load_orbax(path, target, options=self.options))


class Orbax:
    framework = "jax"

    def __init__(self, compression: bool, concurrent_gb: int | None):
        import orbax.checkpoint as ocp
        self.ocp = ocp
        self.compression = compression
        self.concurrent_gb = concurrent_gb
        self._checkpointer = None

    def version(self) -> str:
        from importlib.metadata import version
        return version("orbax-checkpoint")

    def _make_checkpointer(self):
        ocp = self.ocp
        if self.compression and self.concurrent_gb is None:
            return ocp.StandardCheckpointer()
        kwargs = {"use_ocdbt": True, "use_compression": self.compression}
        if self.concurrent_gb is not None:
            kwargs.update(save_concurrent_gb=self.concurrent_gb,
                          restore_concurrent_gb=self.concurrent_gb)
        return ocp.AsyncCheckpointer(ocp.PyTreeCheckpointHandler(**kwargs))

    def prepare(self, op):
        self.checkpointer()

    def checkpointer(self):
        if self._checkpointer is None:
            self._checkpointer = self._make_checkpointer()
        return self._checkpointer

    def _start_save(self, path, state):
        ckptr = self.checkpointer()
        if isinstance(ckptr, self.ocp.StandardCheckpointer):
            ckptr.save(path, state)
        else:
            ckptr.save(path, args=self.ocp.args.PyTreeSave(state))
        return ckptr.wait_until_finished

    def save(self, path, state):
        self._start_save(path, state)()

    def save_async(self, path, state):
        return self._start_save(path, state)

    def load(self, path, target):
        ckptr = self.checkpointer()
        if isinstance(ckptr, self.ocp.StandardCheckpointer):
            return block_until_ready(ckptr.restore(path, target))
        restore_args = self.ocp.checkpoint_utils.construct_restore_args(target)
        return block_until_ready(ckptr.restore(
            path, args=self.ocp.args.PyTreeRestore(item=target, restore_args=restore_args)))

    def close(self):
        if self._checkpointer is not None:
            self._checkpointer.close()


class Dcp:
    framework = "torch"

    def __init__(self, threads: int | None):
        import torch.distributed.checkpoint as dcp
        self.dcp = dcp
        self.threads = threads

    def version(self) -> str:
        import torch
        return torch.__version__

    def _writer(self, path):
        if object_stores.is_remote(path):
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
            return FsspecWriter(path, thread_count=self.threads or 1, sync_files=True,
                                **_fsspec_options(path))
        if self.threads is None:
            return self.dcp.FileSystemWriter(path)
        return self.dcp.FileSystemWriter(path, thread_count=self.threads, sync_files=True)

    def _reader(self, path):
        if object_stores.is_remote(path):
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
            return FsspecReader(path, **_fsspec_options(path))
        return self.dcp.FileSystemReader(path)

    def prepare(self, op):
        if op == "async_save":
            _ensure_single_process_group()

    def close(self):
        pass

    def save(self, path, state):
        self.dcp.save(state, storage_writer=self._writer(path))

    def save_async(self, path, state):
        future = self.dcp.async_save(state, storage_writer=self._writer(path))
        return future.result

    def load(self, path, target):
        self.dcp.load(target, storage_reader=self._reader(path))
        return target


def _fsspec_options(path: str) -> dict:
    """The fsspec file system's settings for the store in the environment.
    gcsfs: anonymous (the emulator, from STORAGE_EMULATOR_HOST). s3fs: its
    endpoint (s3fs takes it as an argument) and region; keys come from the
    environment."""
    if not s3_objects.is_s3(path):
        return {"token": "anon"}
    return {"endpoint_url": os.environ["AWS_ENDPOINT_URL"],
            "client_kwargs": {"region_name": os.environ.get("AWS_REGION", "us-east-1")}}


def _ensure_single_process_group():
    """DCP's async_save needs a process group, even for one process."""
    import tempfile

    import torch.distributed as dist
    if not dist.is_initialized():
        store = dist.FileStore(tempfile.mktemp(prefix="bench-dcp-store-"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)


def state_for(tool, workload: str, scale: str):
    if tool.framework == "torch":
        return workloads.torch_state(workload, scale)
    return workloads.jax_state(workload, scale)


def target_for(tool, workload: str, scale: str, layout: str):
    if tool.framework == "torch":
        return workloads.torch_target(workload, scale)
    return workloads.jax_target(workload, scale, layout)
