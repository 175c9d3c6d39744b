"""The Ray actor behind every pool: one per device slot of a colocate group.

A worker hosts one backend per role of its group (train, ref, rollout, ...). Colocated roles
therefore share the process and its device; before a role runs, the others hand the device over
(offload to CPU / sleep) when the device is a GPU. The driver calls backend methods by their
declared name (`call`, from RoleHandle.call) or runs a service function here (`run`, e.g. the
weight sync in dagrl/backends/weight_sync.py). Outputs the driver asks it to keep stay in its
`store` until their run ends (dagrl/core/residency.py).
"""

from __future__ import annotations

import gc
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import torch

from dagrl.config.enums import CpuAffinity
from dagrl.config.roles import RoleSpec
from dagrl.core.affinity import apply_cpu_affinity
from dagrl.core.batch import Batch
from dagrl.core.residency import Keep, WorkerStore


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


@dataclass
class RoleParts:
    """What a worker builds one role's backend from: the role's spec as the plan resolved it (the
    plan's automatic choices included) and, for a trained role, the objective its update minimises,
    built once in the driver. The worker never sees the config."""

    spec: RoleSpec
    objective: Any = None


@dataclass
class WorkerParts:
    """A worker's whole input: the plugin modules to import, then its roles' parts. The parts
    travel pickled and are opened after the plugins are imported, so a plugin's objective or spec
    type resolves in the worker as in the driver."""

    plugins: list[str]
    roles: bytes  # ray.cloudpickle of dict[role, RoleParts]

    @staticmethod
    def pack(plugins: list[str], roles: dict[str, RoleParts]) -> WorkerParts:
        from ray import cloudpickle

        return WorkerParts(list(plugins), cloudpickle.dumps(roles))

    def open(self) -> dict[str, RoleParts]:
        from ray import cloudpickle

        return cloudpickle.loads(self.roles)


class Worker:
    """Not decorated: pools wrap it with ray.remote and the bundle's resources."""

    def __init__(
        self,
        parts: WorkerParts,
        roles: list[str],
        rank: int,
        world_size: int,
        device_kind: str,
        threads: int,
        build=None,
        cpu_affinity: CpuAffinity = CpuAffinity.none,
    ):
        """build(spec, ctx, objective) -> backend: given by the launcher (backends sit above core);
        cpu_affinity: trainer.cpu_affinity as the pool resolved it for this device."""
        self.parts, self.roles, self.rank, self.world_size = parts, list(roles), rank, world_size
        self.specs: dict[str, RoleSpec] = {}  # each role's spec, once the parts are opened (setup)
        self.build = build
        self.device_kind = device_kind
        self.backends: dict = {}
        self.active: str | None = None
        self.weight_group = None  # BroadcastGroup: train rank 0 and the workers of a separate rollout pool
        self.store = WorkerStore()  # outputs kept here for the rest of their run
        self.takes_turns = False  # some role here has left the GPU for another: hand-overs settle it
        self.memory: dict[str, float] = {}  # the device at each hand-over since the last report
        if device_kind == "cuda":
            expandable_segments()
        # first, while the process has few threads: the ones torch and the engines start inherit it
        self.pin = apply_cpu_affinity(cpu_affinity, device_kind)
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
        from dagrl.core.device_faults import named_faults

        group = "+".join(self.roles)
        with named_faults(group, self.rank, "setup (joining the process group)"):
            self._join_group(master_addr, master_port)
        ctx = ParallelContext(self.rank, self.world_size, self.device)
        from dagrl.core.plugins import load_plugins

        # plugins run in every worker too: what they register or patch must exist where backends run
        load_plugins(self.parts.plugins)

        start = time.perf_counter()
        self.build_roles(ctx, hand_over=self.device_kind == "cuda")
        return {"build_s": time.perf_counter() - start}

    def _join_group(self, master_addr: str, master_port: int) -> None:
        if self.device_kind == "cuda":
            device = torch.device("cuda", 0)  # Ray sets CUDA_VISIBLE_DEVICES to this bundle's GPU
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        self.device = device
        if self.world_size > 1 and not torch.distributed.is_initialized():
            backend = "nccl" if self.device_kind == "cuda" else "gloo"
            torch.distributed.init_process_group(
                backend,
                init_method=f"tcp://{master_addr}:{master_port}",
                rank=self.rank,
                world_size=self.world_size,
            )

    def build_roles(self, ctx: ParallelContext, hand_over: bool) -> None:
        """Build each role's backend in `self.roles` order (the pool gives engines that reserve a
        share of the device first: backends.registry.startup_order). With `hand_over` (colocated
        on a GPU) every role but the last gives the device up as soon as it is built, so the next
        one starts on a device that holds only what the earlier roles keep while idle: an engine
        sleeps before the trainer's weights land, and is never asked for its pool while they sit
        there."""
        from dagrl.core.device_faults import named_faults

        parts = self.parts.open()
        self.specs = {role: parts[role].spec for role in self.roles}
        for i, role in enumerate(self.roles):
            with named_faults(role, self.rank, "setup (building its backend)"):
                self.backends[role] = self.build(parts[role].spec, ctx, parts[role].objective)
            if hand_over and i < len(self.roles) - 1:
                self.takes_turns |= self.backends[role].offload() is not False
        self.active = self.roles[-1]
        if hand_over:
            self.settle()  # what loading left cached goes back before the first phase
        if self.device_kind == "cuda":
            freeze_heap()

    # ---- calls -------------------------------------------------------------------------------
    def dp_info(self, role: str) -> tuple[int, int, bool]:
        """(dp_rank, dp_size, returns_output) of this worker for a role; every rank is its own DP
        rank when the backend does not say otherwise (plugin backends)."""
        backend = self.backends[role]
        if hasattr(backend, "dp_info"):
            return backend.dp_info()
        return self.rank, self.world_size, True

    def call(self, role: str, method: str, *args, keep: Keep | None = None, **kwargs):
        """Run a backend method. Columns sent as their distinct rows are expanded, held pieces in
        the data (first argument) are read from this worker's store or the object store; with
        `keep`, the outputs it names are stored here or handed over and come back as pieces (`keep`
        is the driver's, never passed on to the backend)."""
        from dagrl.core.device_faults import named_faults

        with named_faults(role, self.rank, method):
            backend = self.activate(role)
            if args and isinstance(args[0], Batch):  # a prompt's n samples came as the prompt
                args = (args[0].expanded(), *args[1:])
            if args and isinstance(args[0], Batch) and args[0].held:
                args = (self.store.resolve(args[0], self.dp_info(role)[0]), *args[1:])
            if keep is not None and keep.store and args:
                self.store.keep_inputs(args[0], keep)  # later calls of this run send their pieces only
            result = getattr(backend, method)(*args, **kwargs)
        if keep is None:
            return result
        dp_rank, dp_size, returns = self.dp_info(role)
        return self.store.keep(result, keep, dp_rank, dp_size, returns)

    def fetch_local(self, run: str, key: str):
        """This worker's piece of a kept column (the driver reads one after all)."""
        return self.store.get(run, key)

    def drop_local(self, run: str) -> int:
        """Free a run's kept columns (its step ended, or failed)."""
        return self.store.drop(run)

    def run(self, fn, *args, **kwargs):
        """Run a module-level service function with this worker as its first argument."""
        from dagrl.core.device_faults import named_faults

        with named_faults("+".join(self.roles), self.rank, fn.__name__):
            return fn(self, *args, **kwargs)

    def activate(self, role: str):
        """Give the device to `role` and return its backend. Colocated roles take turns on a GPU:
        the others move their state off the device first."""
        if self.active == role or self.device_kind != "cuda" or len(self.backends) == 1:
            self.active = role
            return self.backends[role]
        self.release_others(role)
        self.backends[role].onload()
        self.active = role
        return self.backends[role]

    def release_others(self, role: str) -> None:
        """Every role but `role` moves its state off the GPU (no-op on CPU or alone), then the
        device is settled whatever they report (see `settle`)."""
        if self.device_kind != "cuda" or len(self.backends) == 1:
            return
        for other, backend in self.backends.items():
            if other != role:
                self.takes_turns |= backend.offload() is not False
        self.settle(f"to_{role}")

    def settle(self, point: str | None = None) -> None:
        """Finish a hand-over on a GPU where roles take turns: collect garbage and return torch's
        cached blocks to the driver. An engine maps its pool through the driver (vLLM's cuMem
        allocator), so blocks torch keeps cached for a phase that ended (activations, logits, a
        sync's buckets) are memory the engine cannot get, whatever the backends kept; a role that
        stays resident keeps its tensors, not its cache. Where every role stays resident (an
        engine that never sleeps), nothing wakes, and the cache serves the next phase.
        `point` names the device sample taken after it: allocated, reserved and in use (GiB)."""
        if self.device_kind != "cuda":
            return
        if self.takes_turns:
            gc.collect()
            torch.cuda.empty_cache()
        if point is not None:
            free, total = torch.cuda.mem_get_info()
            self.memory[f"memory/{point}/allocated_gib"] = torch.cuda.memory_allocated() / 2**30
            self.memory[f"memory/{point}/reserved_gib"] = torch.cuda.memory_reserved() / 2**30
            self.memory[f"memory/{point}/in_use_gib"] = (total - free) / 2**30

    def memory_report(self) -> dict[str, float]:
        """The hand-over samples since the last report (the driver asks once per step)."""
        report, self.memory = self.memory, {}
        return report

    def shutdown(self) -> None:
        for backend in self.backends.values():
            close = getattr(backend, "shutdown", None)  # engines that hold GPU memory and threads
            if close is not None:
                close()
        gc.unfreeze()  # what the roles built is garbage now: the collector may see it again
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def expandable_segments() -> None:
    """Let torch's allocator grow and shrink its segments in place on a GPU worker (unless the
    user's PYTORCH_CUDA_ALLOC_CONF says otherwise): set before the process's first CUDA
    allocation. With fixed segments, a phase that allocates a few tensors of one large size (a
    micro-batch's logits and their gradient, 9.3 GiB each at 64 rows x 512 tokens x 151,936)
    leaves segments its later requests cannot reuse, and the device held 9.5 GiB above the
    update's allocator peak at its end (0.6B, 64x8x512, one H100). vLLM reads the same variable
    and turns the setting off around its sleep-mode pool (CuMemAllocator.use_memory_pool), so
    the engine's weights and KV cache keep fixed pages."""
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def freeze_heap() -> None:
    """Move what building the roles allocated out of the garbage collector's scans, as vLLM does
    for its own heap at the engine's start (freeze_gc_heap). The engine is built first and
    freezes the heap it sees; the trainer's modules, parameters and imports come after it, and
    every full collection while the engine generates (its per-token outputs fill the oldest
    generation) would walk them again. Objects still die by reference count; shutdown unfreezes."""
    gc.collect()
    gc.freeze()
