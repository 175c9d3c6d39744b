"""Engine and device failures inside a worker, told in one line: which role, rank, DAG node and
phase failed, what it was, and the settings that change it.

Three kinds are recognised: vLLM refusing to start for want of GPU memory (its ValueError about
gpu_memory_utilization / free memory / KV cache), CUDA running out of memory
(`torch.OutOfMemoryError`) and NCCL failures or collective timeouts. Where the exception type is
known, in the worker (`Worker.setup`, `Worker.call`, `Worker.run`), it becomes a `DeviceFault`
that carries its role, rank, phase and the full traceback as text (exceptions cross Ray by
pickle, which drops tracebacks). On the driver, `WorkerPool.get` turns the RayTaskError that
carries it (or, for a call that bypassed the worker's wrapper, Ray's traceback text) into a
`DeviceError`; the scheduler adds the DAG node; `main` writes the traceback to
`<trainer.default_local_dir>/dagrl.log` and prints the one line, exit code 2.
"""

from __future__ import annotations

import re
import traceback
from contextlib import contextmanager

from dagrl.errors import DagrlError

CUDA_OOM, VLLM_MEMORY, NCCL = "cuda_oom", "vllm_memory", "nccl"

WHAT = {
    CUDA_OOM: "CUDA out of memory",
    VLLM_MEMORY: "vLLM refused to start: not enough GPU memory",
    NCCL: "NCCL collective failed or timed out",
}

_VLLM_MEMORY = (
    "less than desired GPU memory utilization",
    "No available memory for the cache blocks",
    "KV cache is needed, which is larger than the available KV cache memory",
    "Insufficient memory for the KV cache",
)
_NCCL = re.compile(r"\bNCCL\b|ProcessGroupNCCL|Watchdog caught collective operation timeout|DistBackendError")


def classify(exc: BaseException) -> str | None:
    """CUDA_OOM, VLLM_MEMORY, NCCL or None, from the exception's type (when it is known) and text."""
    import torch

    seen: list[BaseException] = []
    while exc is not None and len(seen) < 8:  # the chain: an engine may wrap its cause
        if isinstance(exc, torch.OutOfMemoryError):
            return CUDA_OOM
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return classify_text(" | ".join(f"{type(e).__name__}: {e}" for e in seen))


def classify_text(text: str) -> str | None:
    """The same from a traceback's text (the driver's view of a worker's error)."""
    if any(m in text for m in _VLLM_MEMORY):
        return VLLM_MEMORY
    # torch's allocator, or vLLM's cuMem allocator mapping its pool at a wake (cumem_allocator.cpp)
    if "OutOfMemoryError" in text or "CUDA out of memory" in text or "CUDA Error: out of memory" in text:
        return CUDA_OOM
    if _NCCL.search(text):
        return NCCL
    return None


class DeviceFault(Exception):
    """Raised in a worker in place of a recognised engine/device error; picklable by its args."""

    def __init__(self, kind: str, role: str, rank: int, phase: str, summary: str, details: str):
        super().__init__(kind, role, rank, phase, summary, details)
        self.kind, self.role, self.rank, self.phase = kind, role, rank, phase
        self.summary, self.details = summary, details

    def __str__(self) -> str:
        return f"{WHAT[self.kind]} in role {self.role}, rank {self.rank}, phase {self.phase}: {self.summary}"


@contextmanager
def named_faults(role: str, rank: int, phase: str):
    """Inside a worker: a recognised engine/device error leaves as a DeviceFault naming where it
    happened; every other exception passes unchanged."""
    try:
        yield
    except DeviceFault:
        raise
    except Exception as exc:
        kind = classify(exc)
        if kind is None:
            raise
        raise DeviceFault(kind, role, rank, phase, first_line(exc), traceback.format_exc()) from None


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


class DeviceError(DagrlError):
    """A worker's engine or device failure as one line; `details` (the tracebacks) go to the run's
    log file, whose path `log_path` adds to the line once main has written it."""

    def __init__(self, fault: DeviceFault, where: str, levers: str):
        self.fault, self.where, self.levers = fault, where, levers
        self.node: str | None = None  # "actor_update (kind actor_update)", set by the scheduler
        self.details = fault.details
        self.log_path: str | None = None
        self.plan_hint = ""  # what the memory plan expected in this phase (set by the trainer)
        super().__init__(str(fault))

    def __str__(self) -> str:
        f = self.fault
        node = f"DAG node {self.node}" if self.node else "no DAG node (the workers were starting)"
        line = (
            f"{WHAT[f.kind]}: role {f.role}, rank {f.rank} ({self.where}), {node}, phase {f.phase}:"
            f" {f.summary}; {self.levers}"
        )
        if self.plan_hint:
            line += f"; the memory plan for this phase: {self.plan_hint}"
        return line + (f"; full traceback in {self.log_path}" if self.log_path else "")


# the calls in which a sleeping engine wakes (the colocated weight refresh, a generate's onload)
WAKE_PHASES = ("_copy_local", "begin_weight_update", "finish_weight_update", "onload")


def device_error(fault: DeviceFault, cfg, where: str) -> DeviceError:
    return DeviceError(fault, where, levers(fault.kind, fault.phase, fault.role, cfg))


def levers(kind: str, phase: str, role: str, cfg) -> str:
    """The settings that change this failure, with their current values where there is one."""
    a, r = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
    util = f"actor_rollout_ref.rollout.gpu_memory_utilization (now {r.gpu_memory_utilization})"
    if kind == VLLM_MEMORY:
        return (
            f"lower {util} when other roles or processes hold memory on that GPU, keep the colocated"
            f" trainer off it while vLLM starts (actor_rollout_ref.actor.offload=true, now {'auto' if a.offload is None else a.offload};"
            " megatron: actor.megatron.param_offload/optimizer_offload), or give the rollout its own"
            " devices (placement=separate); if the KV cache is what does not fit, raise it or lower"
            " actor_rollout_ref.rollout.max_model_len"
        )
    if kind == NCCL:
        return (
            "another rank may have failed or stopped before this collective (look for its error in the"
            " log); NCCL_DEBUG=INFO names the link and the operation; check that every node reaches the"
            " others (NCCL_SOCKET_IFNAME, firewalls)"
        )
    if phase in ("train_step",):
        return (
            f"lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (now {a.ppo_micro_batch_size_per_gpu}),"
            " turn on actor_rollout_ref.model.gradient_checkpointing=true"
            f" (now {cfg.actor_rollout_ref.model.gradient_checkpointing}), offload (actor.offload=true;"
            f" megatron: actor.megatron.optimizer_offload), or lower {util} (vLLM keeps it while training)"
        )
    if phase in ("forward_logprobs", "teacher_topk", "teacher_hidden"):
        return (
            "lower actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
            f" (now {r.log_prob_micro_batch_size_per_gpu}), actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"
            f" or teacher.log_prob_micro_batch_size_per_gpu, set teacher.offload=true, or lower {util}"
        )
    if phase in WAKE_PHASES:
        return (
            "the engine could not map its weights or KV cache back when it woke: what the colocated"
            f" trainer keeps on the device (the plan's idle figure) and the engine's pool exceed the card;"
            f" lower {util}, offload the trainer while the engine runs (actor.offload=true, now"
            f" {'auto' if a.offload is None else a.offload}; megatron: actor.megatron.param_offload /"
            " optimizer_offload / optimizer_cpu_offload), or give the rollout its own devices"
            " (placement=separate)"
        )
    if phase == "generate":
        return (
            f"lower {util}, actor_rollout_ref.rollout.max_num_seqs (now {r.max_num_seqs}),"
            f" actor_rollout_ref.rollout.micro_batch_size_per_gpu (hf, now {r.micro_batch_size_per_gpu})"
            f" or data.max_response_length (now {cfg.data.max_response_length})"
        )
    return (
        f"lower {util} and the micro-batch sizes (actor.ppo_micro_batch_size_per_gpu, the"
        " log_prob_micro_batch_size_per_gpu keys), offload the trainer (actor.offload=true), or give"
        " roles their own devices (placement=separate)"
    )


def from_task_error(exc: Exception, pool) -> DeviceError | None:
    """The DeviceError for a RayTaskError from a call into `pool`, or None when it is not an
    engine/device failure. The worker's DeviceFault when it sent one; else Ray's traceback text."""
    cause = getattr(exc, "cause", None)
    rank = rank_of(exc, pool)
    if isinstance(cause, DeviceFault):
        fault = cause
    else:
        text = getattr(exc, "traceback_str", "") or str(exc)
        kind = classify_text(text)
        if kind is None:
            return None
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        phase = str(getattr(exc, "function_name", "") or "?").rsplit(".", 1)[-1]
        summary = lines[-1].strip() if lines else kind
        fault = DeviceFault(
            kind, "+".join(pool.roles), rank if rank is not None else -1, phase, summary, text
        )
    info = pool.infos[fault.rank] if 0 <= fault.rank < len(pool.infos) else {}
    gpus = ",".join(info.get("gpu_ids") or []) or "none"
    where = f"node {info.get('ip', '?')}, pid {info.get('pid', '?')}, GPU {gpus}"
    return device_error(fault, pool.cfg, where)


def rank_of(exc: Exception, pool) -> int | None:
    actor_id = getattr(exc, "actor_id", None)
    for rank, actor in enumerate(pool.actors):
        if actor_id is not None and actor._actor_id.hex() == actor_id:
            return rank
    return None
