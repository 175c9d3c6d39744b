"""The Ray actor behind every pool: one per device slot of a colocate group.

A worker hosts one backend per role of its group (train, ref, rollout, ...). Colocated roles
therefore share the process and its device; before a role runs, the others hand the device over
(offload to CPU / sleep) when the device is a GPU. Weight sync between colocated roles is an
in-process copy; between separate groups, a broadcast from train rank 0 (weight_broadcast.py).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

import torch


@dataclass
class ParallelContext:
    """What a backend knows about its place in the pool. Only backends/megatron builds more."""

    rank: int
    world_size: int
    device: torch.device
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


class Worker:
    """Not decorated: pools wrap it with ray.remote and the bundle's resources."""

    def __init__(self, cfg, roles: list[str], rank: int, world_size: int, device_kind: str, threads: int):
        self.cfg, self.roles, self.rank, self.world_size = cfg, list(roles), rank, world_size
        self.device_kind = device_kind
        self.backends: dict = {}
        self.active: str | None = None
        self.weight_group = None  # BroadcastGroup: train rank 0 and the workers of a separate rollout pool
        torch.set_num_threads(max(1, threads))
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # one "Loading weights" bar per worker and load is noise

    # ---- setup -------------------------------------------------------------------------------
    def node_info(self) -> dict:
        import ray

        ctx = ray.get_runtime_context()
        return {
            "node_id": ctx.get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "pid": os.getpid(),
        }

    def free_port(self) -> int:
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def setup(self, master_addr: str, master_port: int) -> dict:
        """Join the pool's process group (gloo on CPU, NCCL on GPU), then build each role's backend."""
        if self.device_kind == "cuda":
            device = torch.device("cuda", 0)  # Ray sets CUDA_VISIBLE_DEVICES to this bundle's GPU
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        if self.world_size > 1 and not torch.distributed.is_initialized():
            backend = "nccl" if self.device_kind == "cuda" else "gloo"
            torch.distributed.init_process_group(
                backend,
                init_method=f"tcp://{master_addr}:{master_port}",
                rank=self.rank,
                world_size=self.world_size,
            )
        ctx = ParallelContext(self.rank, self.world_size, device)
        self.device = device
        from dagrl.backends import build_backend
        from dagrl.core.plugins import load_plugins

        # plugins run in every worker too: what they register or patch must exist where backends run
        load_plugins(list(self.cfg.external_plugins))

        start = time.perf_counter()
        for role in self.roles:
            self.backends[role] = build_backend(self.cfg, role, ctx)
        self.active = self.roles[-1]
        return {"build_s": time.perf_counter() - start}

    # ---- calls -------------------------------------------------------------------------------
    def dp_info(self, role: str) -> tuple[int, int, bool]:
        """(dp_rank, dp_size, returns_output) of this worker for a role."""
        return self.backends[role].dp_info()

    def call(self, role: str, method: str, *args, **kwargs):
        self._activate(role)
        return getattr(self.backends[role], method)(*args, **kwargs)

    def _activate(self, role: str) -> None:
        """Colocated roles take turns on a GPU: the others move their state off the device first."""
        if self.active == role or self.device_kind != "cuda" or len(self.backends) == 1:
            self.active = role
            return
        self._release_others(role)
        self.backends[role].onload()
        self.active = role

    def _release_others(self, role: str) -> None:
        if self.device_kind != "cuda" or len(self.backends) == 1:
            return
        # offload() returns False when the backend keeps its state resident (nothing was freed);
        # then the cache stays too, and the next phase does not pay for fresh cudaMallocs
        freed = [backend.offload() for other, backend in self.backends.items() if other != role]
        if any(f is not False for f in freed):
            torch.cuda.empty_cache()

    # ---- weight sync -------------------------------------------------------------------------
    def sync_weights_local(self, src: str, dst: str) -> dict:
        """Colocated: src's current weights into dst without leaving the device, in stages so the
        GPU never holds dst's old weights, the new ones and dst's KV cache at once: dst wakes its
        weights only, loads src's tensors in place, src leaves the device, then dst takes the rest.
        """
        self._activate(src)
        dst_backend = self.backends[dst]
        dst_backend.begin_weight_update()
        nbytes = dst_backend.load_weights(self.backends[src].export_weights())
        self._release_others(dst)
        dst_backend.finish_weight_update()
        self.active = dst
        return {"bytes": nbytes}

    def weight_group_init(self, host: str, port: int, rank: int, world_size: int) -> float:
        """Join the trainer → rollout broadcast group; returns its plain broadcast GB/s."""
        from dagrl.backends.weight_broadcast import BroadcastGroup

        self.weight_group = BroadcastGroup(host, port, rank, world_size, self.device)
        return self.weight_group.bandwidth_gbps()

    def send_weights(self, src: str) -> dict:
        """Separate: every train worker exports (megatron gathers its shards collectively); the one
        in the broadcast group sends each bucket to every rollout worker."""
        self._activate(src)
        buckets = self.backends[src].export_weights()
        if self.weight_group is None:
            for _ in buckets:  # take part in the collective export, keep nothing
                pass
            return {"bytes": 0}
        return {"bytes": self.weight_group.send(buckets)}

    def receive_weights(self, dst: str) -> dict:
        self._activate(dst)
        backend = self.backends[dst]
        backend.begin_weight_update()
        nbytes = self.weight_group.receive(lambda bucket: backend.load_weights([bucket]))
        backend.finish_weight_update()
        return {"bytes": nbytes}

    def shutdown(self) -> None:
        for backend in self.backends.values():
            close = getattr(backend, "shutdown", None)  # engines that hold GPU memory and threads
            if close is not None:
                close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
