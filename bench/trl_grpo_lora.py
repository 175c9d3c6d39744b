"""TRL 1.16's GRPOTrainer with a PEFT LoRA adapter, colocated vLLM, on the side-by-side's model and
prompts (.anchors/build_anchor.py writes both; README there): the reference for dagrl's LoRA step.

Same shape as the full-parameter anchor (32 prompts x 8 completions x 256 tokens, ignore_eos,
gradient checkpointing, vLLM at 0.35 with sleep mode, beta 0) plus `peft_config`: rank LORA_RANK
(64), alpha 2 x rank, every linear layer, lr 1e-5. dagrl runs the same adapter with
`actor_rollout_ref.model.lora_rank=64 lora_alpha=128 target_modules=all-linear` (bench/acceptance_gpu.sh
side_lora). Run under `torchrun --nproc_per_node 1`; prints `SIDE {...}` (median over steps 2..N).
"""

from __future__ import annotations

import json
import os
import time

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

MODEL = os.environ.get("ANCHOR_MODEL", "/tmp/anchor_q06b")
RANK = int(os.environ.get("LORA_RANK", 64))
PROMPTS, GROUP, LENGTH = int(os.environ.get("ANCHOR_PROMPTS", 32)), 8, int(os.environ.get("ANCHOR_LEN", 256))
VOCAB = 151936


def prompts() -> Dataset:
    """512 prompts of 120 random words of the model's word-level vocabulary (the anchor's rows)."""
    gen = torch.Generator().manual_seed(0)
    rows = [
        " ".join(f"w{int(t)}" for t in torch.randint(10, VOCAB, (120,), generator=gen)) for _ in range(512)
    ]
    return Dataset.from_dict({"prompt": rows})


def length_reward(completions, **_):
    return [-abs(100 - len(c.split())) / 100 for c in completions]


class StepClock(TrainerCallback):
    def __init__(self):
        self.marks = [time.time()]

    def on_step_end(self, args, state, control, **kwargs):
        torch.cuda.synchronize()
        self.marks.append(time.time())


def main() -> None:
    args = GRPOConfig(
        output_dir="/tmp/trl_lora_out",
        per_device_train_batch_size=64,
        gradient_accumulation_steps=PROMPTS * GROUP // 64,
        num_generations=GROUP,
        max_completion_length=LENGTH,
        learning_rate=1e-5,
        bf16=True,
        gradient_checkpointing=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=0.35,
        vllm_enable_sleep_mode=True,
        generation_kwargs={"ignore_eos": True},
        max_steps=int(os.environ.get("ANCHOR_STEPS", 5)),
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        beta=0.0,
        seed=0,
    )
    peft = LoraConfig(
        r=RANK, lora_alpha=2 * RANK, target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM"
    )
    clock = StepClock()
    trainer = GRPOTrainer(
        model=MODEL,
        reward_funcs=length_reward,
        args=args,
        train_dataset=prompts(),
        callbacks=[clock],
        peft_config=peft,
    )
    trainer.train()
    steps = [round(b - a, 2) for a, b in zip(clock.marks, clock.marks[1:])]
    warm = sorted(steps[1:] or steps)
    median = warm[len(warm) // 2]
    print("SIDE " + json.dumps({
        "system": f"trl-lora-r{RANK}", "step_s": steps, "median_step_s": median,
        "completion_tok_per_s": round(PROMPTS * GROUP * LENGTH / median),
        "peak_GiB": round(torch.cuda.max_memory_allocated() / 2**30, 1),
    }), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
