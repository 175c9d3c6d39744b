"""Does the job fit? Device memory against the plan's estimate, the dataset against the batch size.

Both run in `prepare`, before Ray starts: a dry run prints the memory warning and goes on (the plan
is often made on a laptop for a cluster), a real run refuses; a batch larger than the dataset is
refused by both.
"""

from __future__ import annotations

import os

from dagrl.config.placement import Plan
from dagrl.config.schema import DagrlConfig
from dagrl.config.validate import data_files
from dagrl.errors import ConfigError

ASSUMED_GPU_GIB = 80.0  # a dry run on a machine without a GPU checks against an 80 GB card

LEVERS = (
    "bf16 weights (actor_rollout_ref.model.dtype=bfloat16), tensor/pipeline parallel "
    "(actor_rollout_ref.actor.strategy=megatron, megatron.tensor_model_parallel_size / "
    "pipeline_model_parallel_size), offload (megatron.param_offload / optimizer_offload, or "
    "actor_rollout_ref.actor.offload for torch), the distributed optimizer "
    "(megatron.use_distributed_optimizer=true); or set trainer.gpu_memory_gib if the device is larger"
)


def device_memory_gib(cfg: DagrlConfig) -> tuple[float | None, str]:
    """(GiB per device, where the figure comes from); None when nothing says (a real run without a
    visible GPU, e.g. a driver on a CPU head node)."""
    if cfg.trainer.gpu_memory_gib is not None:
        return cfg.trainer.gpu_memory_gib, "trainer.gpu_memory_gib"
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / 2**30, "the visible GPU"
    if cfg.trainer.dry_run:
        return ASSUMED_GPU_GIB, "assumed; set trainer.gpu_memory_gib"
    return None, ""


def check_memory(cfg: DagrlConfig, plan: Plan) -> str | None:
    """The roles whose estimated GiB per device (plan.memory_gib) exceed the device, as a warning
    for a dry run; a real run raises ConfigError instead. None when everything fits."""
    if plan.device != "cuda" or not plan.memory_gib:
        return None
    capacity, source = device_memory_gib(cfg)
    if capacity is None:
        return None
    over = {role: gib for role, gib in plan.memory_gib.items() if gib > capacity}
    if not over:
        return None
    roles = ", ".join(f"{role} {gib:.1f} GiB" for role, gib in sorted(over.items()))
    message = (
        f"estimated memory per device ({roles}) exceeds the device's {capacity:.0f} GiB ({source});"
        f" levers: {LEVERS}"
    )
    if not cfg.trainer.dry_run:
        raise ConfigError("trainer.gpu_memory_gib", capacity, message)
    return message


def check_dataset_size(cfg: DagrlConfig) -> None:
    """data.train_batch_size must not exceed the training rows (counted from the parquet metadata,
    before over-long prompts are filtered; the loader checks again after filtering)."""
    d = cfg.data
    if d.train_files is None:
        rows, what = d.builtin_train_rows, "data.builtin_train_rows (the built-in task)"
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        paths = [os.path.expanduser(p) for p in data_files(d.train_files)]
        try:
            rows = sum(pq.ParquetFile(p).metadata.num_rows for p in paths if os.path.isfile(p))
        except (pa.ArrowInvalid, OSError):
            return  # not parquet: the loader names the file and the fix, before any worker starts
        what = f"data.train_files ({', '.join(paths)})"
    if d.train_batch_size > rows:
        raise ConfigError(
            "data.train_batch_size",
            d.train_batch_size,
            f"larger than the {rows} rows of {what}; lower data.train_batch_size or add rows",
        )
