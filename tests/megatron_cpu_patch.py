"""Test-only monkeypatches that let megatron-core 0.16.1's real code run on CPU under gloo.

megatron-core assumes CUDA in a handful of places. `apply()` patches exactly those, in this
process only, and never edits site-packages. Each patched spot and why:

1. `torch.cuda.current_device` -> `torch.device("cpu")` and `torch.cuda.synchronize` -> no-op
   (process-wide). megatron allocates with `device=torch.cuda.current_device()` in dozens of
   places (tensor_parallel/layers.py and mappings via `parallel_state.get_global_memory_buffer`,
   models/common/embeddings/rotary_pos_embedding.py, pipeline_parallel/p2p_communication.py
   shape and tensor buffers, distributed/param_and_grad_buffer.py grad buffers,
   optimizer/distrib_optimizer.py) and calls `synchronize` after p2p batches; on a CPU build
   both raise "Torch not compiled with CUDA enabled".
2. Module-level `torch` replaced by `_CpuTorch` (a proxy that forwards everything to torch) in
   the modules of `_CPU_TORCH_MODULES`. Two things differ there:
   - `zeros/ones/empty/full/tensor(..., device="cuda")` build on CPU: pipeline_parallel/
     schedules.py (`total_num_tokens`), optimizer/optimizer.py (`found_inf`, `_scale_one`, ...),
     optimizer/clip_grads.py (norm all-reduce), optimizer/grad_scaler.py, transformer/utils.py
     (default causal mask), utils.py (`local_multi_tensor_l2_norm`), distributed/
     param_and_grad_buffer.py.
   - `torch.cuda.manual_seed/get_rng_state/set_rng_state` act on the CPU generator; this is
     what tensor_parallel/random.py's `CudaRNGStatesTracker.add` and
     `model_parallel_cuda_manual_seed` call, so the tracker's named states become CPU states.
3. tensor_parallel/random.py `_get_cuda_rng_state` / `_set_cuda_rng_state` -> CPU generator
   get/set: `CudaRNGStatesTracker.fork` and activation recompute (`CheckpointFunction` via
   `_get_all_rng_states` / `_set_all_rng_states`) go through these module globals.
   A logging filter drops fork's "CPU RNG state changed within GPU RNG context": on CPU the
   "GPU" generator is the CPU one, so that check fires on every fork that draws numbers.
4. Run with CPU tensors passing as CUDA tensors (`t.type()` reads 'torch.cuda.FloatTensor',
   `t.cuda()` returns `t`), only for the duration of: optimizer/distrib_optimizer.py
   `DistributedOptimizer.__init__` and optimizer/optimizer.py
   `Float16OptimizerWithFloat16Params.__init__` (they sort params by `param.type()` and reject
   anything not `torch.cuda.*Tensor`), optimizer/clip_grads.py `clip_grad_by_total_norm_fp32`
   (asserts `grad.type() == 'torch.cuda.FloatTensor'`; also rebound in optimizer/optimizer.py,
   which imported it by name), and models/common/language_module/language_module.py
   `LanguageModule.setup_embeddings_and_output_layer` (`weight.data.cuda()` before the tied
   embedding all-reduce across pipeline stages).

Collectives need no patch: gloo in torch 2.13 implements all_reduce (incl. AVG),
all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single and batch_isend_irecv,
which is what TP, SP, PP and the distributed optimizer use.

Not covered (not on the paths tested in tests/backends/megatron/test_cpu_patch.py): CUDA
streams/events (`overlap_grad_reduce`, `overlap_param_gather`, partial distributed optimizer),
`torch.autocast("cuda")` (`config.enable_autocast`), optimizer/param offload (`.cuda()` reloads),
`tensor_parallel.broadcast_data`, MoE token dispatch, megatron-fsdp, CUDA graphs, TE.

`run_distributed` starts gloo worker processes with the patch applied, for tests.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import gc
import importlib
import logging
import os
import pickle
import queue
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch

_APPLIED = False

_CPU_TORCH_MODULES = (
    "megatron.core.tensor_parallel.random",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.distributed.param_and_grad_buffer",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.grad_scaler",
    "megatron.core.transformer.utils",
    "megatron.core.utils",
)


def apply() -> None:
    """Install every patch in this process; safe to call any number of times.

    A no-arg callable importing nothing heavy at module import, so it also serves as Ray's
    `worker_process_setup_hook`.
    """
    global _APPLIED
    if _APPLIED:
        return
    torch.cuda.current_device = _cpu_device
    torch.cuda.synchronize = _no_synchronize
    for name in _CPU_TORCH_MODULES:
        importlib.import_module(name).torch = _CpuTorch()
    _patch_rng_state_functions()
    _patch_cuda_tensor_checks()
    from dagrl.backends.registry import allow_device

    allow_device("megatron", "cpu")  # dagrl refuses megatron on CPU without this patch
    _APPLIED = True


def _cpu_device() -> torch.device:
    return torch.device("cpu")


def _no_synchronize(device: Any = None) -> None:
    return None


def _cpu_if_cuda(device: Any) -> Any:
    return "cpu" if device is not None and torch.device(device).type == "cuda" else device


def _cpu_factory(factory: Callable) -> Callable:
    def build(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return factory(*args, device=_cpu_if_cuda(device), **kwargs)

    return build


class _CpuCuda:
    """`torch.cuda` whose default generator is the CPU one; everything else is torch.cuda's."""

    manual_seed = staticmethod(torch.manual_seed)

    @staticmethod
    def get_rng_state(device: Any = "cuda") -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
        torch.set_rng_state(new_state)

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _CpuTorch:
    """`torch` as a patched megatron module sees it: "cuda" factories and RNG land on CPU."""

    zeros = staticmethod(_cpu_factory(torch.zeros))
    ones = staticmethod(_cpu_factory(torch.ones))
    empty = staticmethod(_cpu_factory(torch.empty))
    full = staticmethod(_cpu_factory(torch.full))
    tensor = staticmethod(_cpu_factory(torch.tensor))
    cuda = _CpuCuda()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _get_cpu_rng_state(device: Any = None, clone: bool = False, graph_safe: bool = False) -> torch.Tensor:
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: torch.Tensor, device: Any = -1, graph_safe: bool = False) -> None:
    torch.set_rng_state(new_state)


def _is_not_fork_rng_warning(record: logging.LogRecord) -> bool:
    return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


def _patch_rng_state_functions() -> None:
    from megatron.core.tensor_parallel import random as megatron_random

    megatron_random._get_cuda_rng_state = _get_cpu_rng_state
    megatron_random._set_cuda_rng_state = _set_cpu_rng_state
    logging.getLogger(megatron_random.__name__).addFilter(_is_not_fork_rng_warning)


@contextlib.contextmanager
def _cpu_tensors_pass_as_cuda() -> Iterator[None]:
    """Within: a CPU tensor's `.type()` reads 'torch.cuda.FloatTensor' etc.; `.cuda()` returns it."""
    original_type, original_cuda = torch.Tensor.type, torch.Tensor.cuda

    def type_name(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if dtype is None and self.device.type == "cpu":
            return original_type(self).replace("torch.", "torch.cuda.", 1)
        return original_type(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_name
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.type, torch.Tensor.cuda = original_type, original_cuda


def _run_with_cpu_tensors_as_cuda(owner: Any, name: str, *importers: Any) -> None:
    """Wrap `owner.name` in `_cpu_tensors_pass_as_cuda`; `importers` did `from owner import name`."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with _cpu_tensors_pass_as_cuda():
            return original(*args, **kwargs)

    for holder in (owner, *importers):
        setattr(holder, name, wrapped)


def _patch_cuda_tensor_checks() -> None:
    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.optimizer import clip_grads, distrib_optimizer, optimizer

    _run_with_cpu_tensors_as_cuda(distrib_optimizer.DistributedOptimizer, "__init__")
    _run_with_cpu_tensors_as_cuda(optimizer.Float16OptimizerWithFloat16Params, "__init__")
    _run_with_cpu_tensors_as_cuda(clip_grads, "clip_grad_by_total_norm_fp32", optimizer)
    _run_with_cpu_tensors_as_cuda(LanguageModule, "setup_embeddings_and_output_layer")


# ---------------------------------------------------------------------------------------------
# run_distributed: gloo worker processes for tests.


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve(rank: int, world_size: int, tasks: Any, results: Any, parent: int) -> None:
    """One rank of a pool: `apply()` once, then every task put on `tasks` until None.

    Each task gets a process group of its own (a fresh port) and leaves nothing behind: megatron's
    parallel state, dagrl's record of it and every process group are torn down after it (gloo
    keeps threads per group, which would pile up over a session). Exits when the test process
    is gone."""
    torch.set_num_threads(1)  # ranks share 2 cores; more threads only thrash
    # a rank whose test process is gone must not wait at exit for its queues' feeder threads to
    # flush into pipes nobody reads (it hung there in a futex, left behind by every test run)
    results.cancel_join_thread()
    tasks.cancel_join_thread()
    os.setpgid(0, 0)  # a group of its own: close() kills the rank and what it started (checkpoint workers)
    apply()
    while (task := _next_task(tasks, parent)) is not None:
        fn, args, port, timeout_s = task
        try:
            os.environ["MASTER_ADDR"] = "127.0.0.1"
            os.environ["MASTER_PORT"] = str(port)
            torch.distributed.init_process_group(
                "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s)
            )
            # Pickled here with the plain pickler: tensors travel by value, not as shared memory
            # that would vanish with this process.
            results.put((rank, "ok", pickle.dumps(fn(rank, world_size, *args))))
        except BaseException:  # noqa: BLE001 - every failure must reach the parent
            # Reported before teardown: with a peer stuck in a collective, teardown may hang.
            results.put((rank, "error", traceback.format_exc()))
        finally:
            _reset_parallel_state()


def _next_task(tasks: Any, parent: int) -> tuple | None:
    """The next task; None when the pool closes or the test process is gone (no orphans)."""
    while True:
        try:
            return tasks.get(timeout=2.0)
        except queue.Empty:
            if os.getppid() != parent:
                return None


def _reset_parallel_state() -> None:
    if "megatron.core.parallel_state" in sys.modules:
        sys.modules["megatron.core.parallel_state"].destroy_model_parallel()
    if "dagrl.backends.megatron.parallel" in sys.modules:
        sys.modules["dagrl.backends.megatron.parallel"]._initialised = None
        sys.modules["dagrl.backends.megatron.parallel"]._replica_group = None
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # the default group and every group made from it
    gc.collect()  # groups still referenced from dead models keep gloo's threads alive until then


class _RankPool:
    """`world_size` spawned gloo ranks kept for the whole test session: starting a rank (spawn,
    import torch and megatron, patch) costs seconds of a 2-core machine, more than the work of
    most tests. A failed call kills the pool (a peer may be stuck in a collective); the next
    call starts a fresh one."""

    def __init__(self, world_size: int):
        ctx = torch.multiprocessing.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(world_size)]
        self.procs = [
            ctx.Process(target=_serve, args=(rank, world_size, self.tasks[rank], self.results, os.getpid()))
            # not daemonic: megatron's checkpointing starts processes of its own
            for rank in range(world_size)
        ]
        for proc in self.procs:
            proc.start()

    def run(self, fn: Callable, args: tuple, timeout_s: float) -> list:
        port = _free_port()
        for q in self.tasks:
            q.put((fn, args, port, timeout_s))
        outputs, errors = {}, ["interrupted"]
        try:
            outputs, errors = _collect(self.procs, self.results, timeout_s)
        finally:
            if errors:
                self.close()
        if errors:
            raise RuntimeError("run_distributed failed:\n" + "\n".join(errors))
        return [outputs[rank] for rank in range(len(self.procs))]

    @property
    def alive(self) -> bool:
        return all(proc.is_alive() for proc in self.procs)

    def close(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the rank's group: it and its children
            except (ProcessLookupError, PermissionError):
                proc.kill()
        for proc in self.procs:
            proc.join()


_POOLS: dict[int, _RankPool] = {}


@atexit.register
def _close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


def _collect(procs: list, results: Any, timeout_s: float) -> tuple[dict[int, Any], list[str]]:
    """Per-rank results until all ranks reported, one failed or died, or timeout_s passed."""
    outputs: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(outputs) < len(procs):
        try:
            rank, status, payload = results.get(timeout=1.0)
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in outputs]
            if dead:
                return outputs, [f"rank {r} died with exit code {procs[r].exitcode}" for r in dead]
            if time.monotonic() > deadline:
                missing = sorted(set(range(len(procs))) - outputs.keys())
                return outputs, [f"timed out after {timeout_s}s waiting for ranks {missing}"]
            continue
        if status != "ok":
            return outputs, [f"--- rank {rank} ---\n{payload}"]
        outputs[rank] = pickle.loads(payload)
    return outputs, []


def run_distributed(fn: Callable, world_size: int, *args: Any, timeout_s: float = 300) -> list:
    """Run `fn(rank, world_size, *args)` on `world_size` gloo ranks with `apply()`d patches.

    fn must be a top-level (picklable) function and return something picklable; CPU tensors
    are fine. The ranks are processes of a pool kept for the session (one pool per world size),
    each with one thread; every call gets a fresh process group, and megatron's parallel state
    and the groups are torn down after it. fn must leave no other process-wide state behind
    (patched module attributes, environment variables).

    Returns: [fn's result on rank 0, ..., rank world_size - 1].
    Raises: RuntimeError with the failing rank's traceback (the pool is killed and restarts).
    """
    pool = _POOLS.get(world_size)
    if pool is None or not pool.alive:
        pool = _POOLS[world_size] = _RankPool(world_size)
    return pool.run(fn, args, timeout_s)


def tiny_gpt_config(**overrides: Any):
    """A tiny fp32 TransformerConfig for CPU tests: 2 layers, hidden 64, 4 heads in 2 query
    groups, SwiGLU, RMSNorm, no biases or dropout, CPU initialisation (TP shards cut from one
    full master weight, so TP2 starts from TP1's weights). Keyword overrides win."""
    import torch.nn.functional as F
    from megatron.core.transformer import TransformerConfig

    fields: dict[str, Any] = dict(
        num_layers=2,
        hidden_size=64,
        ffn_hidden_size=128,
        num_attention_heads=4,
        num_query_groups=2,
        normalization="RMSNorm",
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        bf16=False,
    )
    fields.update(overrides)
    return TransformerConfig(**fields)
