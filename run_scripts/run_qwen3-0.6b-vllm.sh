#!/usr/bin/env bash
# GRPO on GSM8K with a Qwen3-0.6B-sized model on one GPU, vLLM rollout colocated with the trainer:
# the settings of the one-H100 side-by-side against TRL (docs/perf.md, "vLLM rollout").
#
# Every setting is an environment variable with a default; dotted overrides go last:
#   MODEL_PATH=/models/Qwen3-0.6B bash run_scripts/run_qwen3-0.6b-vllm.sh trainer.seed=3
#   STRATEGY=megatron bash run_scripts/run_qwen3-0.6b-vllm.sh     # megatron trainer, same engine settings
#   LEAN=1 bash run_scripts/run_qwen3-0.6b-vllm.sh                # engine asleep + trainer offloaded between
#                                                                  # phases: for models that do not fit twice
#   DRY_RUN=1 bash run_scripts/run_qwen3-0.6b-vllm.sh             # the plan only, no GPU needed
# Data: python3 examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-$HOME/models/Qwen3-0.6B}
TRAIN_FILE=${TRAIN_FILE:-$HOME/data/gsm8k/train.parquet}
VAL_FILE=${VAL_FILE:-$HOME/data/gsm8k/test.parquet}
STRATEGY=${STRATEGY:-torch}
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-32}   # prompts; one mini-batch of them: the update is on-policy
ROLLOUT_N=${ROLLOUT_N:-8}
MICRO=${MICRO:-16}                         # responses per forward/backward (MAX_TOKENS=0)
# tokens per forward/backward (verl's use_dynamic_bsz): GSM8K's ~380-token sequences give ~21 per
# micro-batch, and the memory plan (docs/memory.md) holds for any response length up to the maximum
MAX_TOKENS=${MAX_TOKENS:-8192}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-512}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-1024}
LR=${LR:-1e-6}
GPU_MEMORY_UTILIZATION=${GPU_MEMORY_UTILIZATION:-0.4}
DRY_RUN=${DRY_RUN:-0}

R=actor_rollout_ref.rollout
A=actor_rollout_ref.actor
if [ "${LEAN:-0}" = 1 ]; then
    MEMORY="$R.free_cache_engine=true $R.sleep_level=2 $A.offload=true"
else  # a 0.6B trainer (~9 GiB: bf16 weights and grads, fp32 masters and Adam) and a 32 GiB engine fit on one 80 GiB card together
    MEMORY="$R.free_cache_engine=false $A.offload=false"
fi
BUDGET=()
[ "$MAX_TOKENS" != 0 ] && BUDGET=($A.use_dynamic_bsz=true $A.ppo_max_token_len_per_gpu="$MAX_TOKENS")
DRY=()
[ "$DRY_RUN" = 1 ] && DRY=(trainer.dry_run=true)
PY=${PYTHON:-python3}  # the interpreter (a virtual environment's python, say)

"$PY" -m dagrl.main \
    data.train_files="$TRAIN_FILE" data.val_files="$VAL_FILE" \
    data.train_batch_size="$TRAIN_BATCH_SIZE" data.max_prompt_length="$MAX_PROMPT_LENGTH" \
    data.max_response_length="$MAX_RESPONSE_LENGTH" \
    actor_rollout_ref.model.path="$MODEL_PATH" actor_rollout_ref.model.dtype=bfloat16 \
    $A.strategy="$STRATEGY" $A.optim.lr="$LR" $A.ppo_mini_batch_size="$TRAIN_BATCH_SIZE" \
    $A.ppo_micro_batch_size_per_gpu="$MICRO" $A.recompute_old_logprobs=false \
    $R.name=vllm $R.n="$ROLLOUT_N" $R.gpu_memory_utilization="$GPU_MEMORY_UTILIZATION" $MEMORY \
    trainer.device=cuda trainer.n_gpus_per_node=1 \
    "${BUDGET[@]}" "${DRY[@]}" "$@"
