"""Engine and device failures inside real Ray workers end the run with one line naming role,
rank, DAG node, phase and the settings to change; the full traceback goes to <run dir>/dagrl.log.

The failures are real exceptions raised in real workers by a plugin (tests/plugins/device_faults.py):
`torch.OutOfMemoryError` in the actor update, vLLM's free-memory ValueError while the rollout
engine starts. The GPU-side originals: tests/reliability/test_engine_errors_gpu.py.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from dagrl.core.device_faults import CUDA_OOM, NCCL, VLLM_MEMORY, DeviceFault, classify, named_faults

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_classify_by_type_and_text():
    import torch

    from tests.plugins.device_faults import OOM, VLLM

    assert classify(torch.OutOfMemoryError(OOM)) == CUDA_OOM
    assert classify(ValueError(VLLM)) == VLLM_MEMORY
    assert classify(ValueError("No available memory for the cache blocks. Try increasing")) == VLLM_MEMORY
    # vLLM's cuMem allocator mapping its KV cache at a wake (the 0.6B default's step-2 failure)
    wake = "CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163"
    assert classify(RuntimeError(wake)) == CUDA_OOM
    assert classify(RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error")) == NCCL
    assert classify(RuntimeError("[Rank 1] Watchdog caught collective operation timeout")) == NCCL
    assert classify(ValueError("gpu_memory_utilization must be in (0, 1]")) is None
    assert classify(KeyError("prompts")) is None


def test_named_faults_carry_where_and_the_traceback_through_pickle():
    import pickle

    import torch

    with pytest.raises(DeviceFault) as err:
        with named_faults("train", 3, "train_step"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    fault = pickle.loads(pickle.dumps(err.value))
    assert (fault.kind, fault.role, fault.rank, fault.phase) == (CUDA_OOM, "train", 3, "train_step")
    assert "Traceback" in fault.details and "OutOfMemoryError" in fault.details
    with pytest.raises(KeyError):  # anything else passes unchanged
        with named_faults("train", 0, "train_step"):
            raise KeyError("x")


ARGS = [
    "external_plugins=[tests.plugins.device_faults]",
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.progress_bar=false",
    "trainer.logger=[console]",
]


def test_oom_in_the_update_is_one_line_on_the_console(tmp_path, ray_local, capsys):
    """The command line's main() in this process, on the session's Ray, one CPU worker
    (train+rollout colocated): the actor update raises; the console shows one line, the log file
    the traceback (a fresh interpreter with a Ray of its own prints the same, ~15 s later)."""
    from dagrl.main import main

    with pytest.raises(SystemExit) as exit_:
        main([*ARGS, "trainer.experiment_name=fault-oom-update", f"trainer.default_local_dir={tmp_path}"])
    assert exit_.value.code == 2
    printed = capsys.readouterr()
    out = printed.out + printed.err
    line = [ln for ln in printed.out.splitlines() if ln.strip()][-1]
    log = tmp_path / "dagrl.log"
    where = r"error: CUDA out of memory: role train, rank 0 \(node .*, pid \d+, GPU none\)"
    assert re.match(where, line), line
    assert "DAG node actor_update (kind actor_update), phase train_step" in line, line
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (now" in line, line
    assert "gradient_checkpointing" in line and "gpu_memory_utilization" in line, line
    assert line.endswith(f"full traceback in {log}"), line
    assert "Traceback" not in out, out[-3000:]  # the console has the line, not the traceback
    text = log.read_text()
    assert "Traceback" in text and "torch.OutOfMemoryError: CUDA out of memory" in text
    assert "_failing_train_step" in text  # the worker's own frames


def test_vllm_refusing_to_start_is_one_line(tmp_path, ray_local, capsys):
    """In this process, on the session's Ray: building the rollout backend raises vLLM's ValueError."""
    from dagrl.main import main

    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_:
        main([*ARGS, "trainer.experiment_name=fault-vllm-start", f"trainer.default_local_dir={tmp_path}"])
    seconds = time.perf_counter() - start
    assert exit_.value.code == 2
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()][-1]
    assert line.startswith("error: vLLM refused to start: not enough GPU memory: role rollout, rank 0"), line
    assert "no DAG node (the workers were starting), phase setup (building its backend)" in line, line
    assert "actor_rollout_ref.rollout.gpu_memory_utilization (now" in line and "offload" in line, line
    assert line.endswith(f"full traceback in {tmp_path / 'dagrl.log'}"), line
    assert "less than desired GPU memory utilization" in (tmp_path / "dagrl.log").read_text()
    assert seconds < 60, seconds


def _cfg():
    from tests.conftest import compose_config

    return compose_config(
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    )


# (kind, phase, role, parts of the line): what each failure tells the user to change
LEVERS = [
    (
        CUDA_OOM,
        "train_step",
        "train",
        [
            "ppo_micro_batch_size_per_gpu (now 8)",
            "gradient_checkpointing=true",
            "actor.offload=true",
            "gpu_memory_utilization (now 0.6)",
        ],
    ),
    (
        CUDA_OOM,
        "forward_logprobs",
        "ref",
        [
            "rollout.log_prob_micro_batch_size_per_gpu (now",
            "ref.log_prob_micro_batch_size_per_gpu",
            "teacher.offload=true",
        ],
    ),
    (CUDA_OOM, "teacher_topk", "teacher", ["teacher.log_prob_micro_batch_size_per_gpu"]),
    (
        CUDA_OOM,
        "generate",
        "rollout",
        ["gpu_memory_utilization (now 0.6)", "max_num_seqs", "max_response_length"],
    ),
    (CUDA_OOM, "setup (building its backend)", "train", ["placement=separate", "actor.offload=true"]),
    (
        VLLM_MEMORY,
        "setup (building its backend)",
        "rollout",
        [
            "gpu_memory_utilization (now 0.6)",
            "actor_rollout_ref.actor.offload=true",
            "placement=separate",
            "max_model_len",
        ],
    ),
    (
        CUDA_OOM,
        "_copy_local",
        "train+rollout",
        ["could not map its weights or KV cache", "gpu_memory_utilization (now 0.6)", "placement=separate"],
    ),
    (NCCL, "train_step", "train", ["another rank", "NCCL_DEBUG=INFO"]),
    (NCCL, "setup (joining the process group)", "train+rollout", ["NCCL_SOCKET_IFNAME"]),
]


@pytest.mark.parametrize("kind, phase, role, parts", LEVERS, ids=[f"{c[0]}-{c[1]}" for c in LEVERS])
def test_each_failure_names_where_and_its_levers(kind, phase, role, parts):
    from dagrl.core.device_faults import device_error

    error = device_error(
        DeviceFault(kind, role, 1, phase, "Error: x", "Traceback ..."), _cfg(), "node 10.0.0.1"
    )
    error.node = "actor_update (kind actor_update)"
    error.log_path = "/runs/a/dagrl.log"
    line = str(error)
    assert "\n" not in line
    assert (
        f"role {role}, rank 1 (node 10.0.0.1), DAG node actor_update (kind actor_update), phase {phase}"
        in line
    )
    assert line.endswith("; full traceback in /runs/a/dagrl.log")
    for part in parts:
        assert part in line, f"{part!r} not in: {line}"
