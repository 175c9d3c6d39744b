#!/usr/bin/env bash
# GRPO on GSM8K with Qwen3-8B, trained by the megatron backend (TP2 × PP4 on one 8-GPU node).
#
# Every setting below is an environment variable with a default; anything else goes on the
# command line as a dotted override, appended last:
#   MODEL_PATH=/models/Qwen3-8B TP=4 PP=2 bash run_scripts/run_qwen3-8b-megatron.sh trainer.seed=3
#   DRY_RUN=1 bash run_scripts/run_qwen3-8b-megatron.sh    # print the placement plan and memory, start nothing
# Data: python3 examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k
#
# Multi-node: start Ray yourself (`ray start --head` on the head node, `ray start --address=<head>:6379`
# on each worker node), then run this script on the head node with NNODES set; it joins that cluster
# (trainer.ray_address=auto) and places the workers through it. There is no other launcher.
set -euo pipefail

MODEL_PATH=${MODEL_PATH:-$HOME/models/Qwen3-8B}
TRAIN_FILE=${TRAIN_FILE:-$HOME/data/gsm8k/train.parquet}
VAL_FILE=${VAL_FILE:-$HOME/data/gsm8k/test.parquet}

# batch sizes count prompts; micro-batches count responses (prompts × ROLLOUT_N)
TRAIN_BATCH_SIZE=${TRAIN_BATCH_SIZE:-128}
PPO_MINI_BATCH_SIZE=${PPO_MINI_BATCH_SIZE:-32}
PPO_MICRO_BATCH_SIZE_PER_GPU=${PPO_MICRO_BATCH_SIZE_PER_GPU:-8}
LOG_PROB_MICRO_BATCH_SIZE_PER_GPU=${LOG_PROB_MICRO_BATCH_SIZE_PER_GPU:-16}
ROLLOUT_N=${ROLLOUT_N:-8}
MAX_PROMPT_LENGTH=${MAX_PROMPT_LENGTH:-512}
MAX_RESPONSE_LENGTH=${MAX_RESPONSE_LENGTH:-1024}
LR=${LR:-1e-6}
USE_KL_LOSS=${USE_KL_LOSS:-True}

# megatron: DP = GPUs / (TP × PP × CP); VPP (virtual stages per PP rank) empty = no interleaving
TP=${TP:-2}
PP=${PP:-4}
VPP=${VPP:-null}
CP=${CP:-1}
SP=${SP:-True}
DIST_OPT=${DIST_OPT:-True}
PARAM_OFFLOAD=${PARAM_OFFLOAD:-False}
GRAD_OFFLOAD=${GRAD_OFFLOAD:-False}
OPTIMIZER_OFFLOAD=${OPTIMIZER_OFFLOAD:-False}

ROLLOUT_NAME=${ROLLOUT_NAME:-vllm}  # vllm (TP 2 by default), or hf (one model per GPU: ROLLOUT_TP=1)
if [[ $ROLLOUT_NAME == hf ]]; then ROLLOUT_TP=${ROLLOUT_TP:-1}; else ROLLOUT_TP=${ROLLOUT_TP:-2}; fi
GPU_MEM_UTIL=${GPU_MEM_UTIL:-0.5}
ENGINE=()  # keys only vLLM reads: dagrl refuses them beside the hf rollout, where they would do nothing
if [[ $ROLLOUT_NAME == vllm ]]; then ENGINE+=(actor_rollout_ref.rollout.gpu_memory_utilization="$GPU_MEM_UTIL"); fi

NNODES=${NNODES:-1}
N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-8}
if [[ $NNODES -gt 1 ]]; then RAY_ADDRESS=${RAY_ADDRESS:-auto}; else RAY_ADDRESS=${RAY_ADDRESS:-null}; fi
LOGGER=${LOGGER:-'[console,tensorboard]'}
PROJECT_NAME=${PROJECT_NAME:-dagrl_gsm8k}
EXPERIMENT_NAME=${EXPERIMENT_NAME:-qwen3-8b_megatron_tp${TP}_pp${PP}_n${ROLLOUT_N}}
SAVE_FREQ=${SAVE_FREQ:-20}
TEST_FREQ=${TEST_FREQ:-5}
TOTAL_EPOCHS=${TOTAL_EPOCHS:-15}
TOTAL_STEPS=${TOTAL_STEPS:-null}  # null = run TOTAL_EPOCHS
RESUME_MODE=${RESUME_MODE:-auto}
CKPT_DIR=${CKPT_DIR:-checkpoints/$PROJECT_NAME/$EXPERIMENT_NAME}

PY=${PYTHON:-python3}  # the interpreter (a virtual environment's python, say)
EXTRA=()
if [[ ${DRY_RUN:-0} == 1 ]]; then EXTRA+=(trainer.dry_run=true); fi

set -x
"$PY" -m dagrl.main \
    data.train_files="$TRAIN_FILE" \
    data.val_files="$VAL_FILE" \
    data.train_batch_size="$TRAIN_BATCH_SIZE" \
    data.max_prompt_length="$MAX_PROMPT_LENGTH" \
    data.max_response_length="$MAX_RESPONSE_LENGTH" \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.model.dtype=bfloat16 \
    actor_rollout_ref.actor.strategy=megatron \
    actor_rollout_ref.actor.optim.lr="$LR" \
    actor_rollout_ref.actor.ppo_mini_batch_size="$PPO_MINI_BATCH_SIZE" \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu="$PPO_MICRO_BATCH_SIZE_PER_GPU" \
    actor_rollout_ref.actor.use_kl_loss="$USE_KL_LOSS" \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size="$TP" \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size="$PP" \
    actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size="$VPP" \
    actor_rollout_ref.actor.megatron.context_parallel_size="$CP" \
    actor_rollout_ref.actor.megatron.sequence_parallel="$SP" \
    actor_rollout_ref.actor.megatron.use_distributed_optimizer="$DIST_OPT" \
    actor_rollout_ref.actor.megatron.param_offload="$PARAM_OFFLOAD" \
    actor_rollout_ref.actor.megatron.grad_offload="$GRAD_OFFLOAD" \
    actor_rollout_ref.actor.megatron.optimizer_offload="$OPTIMIZER_OFFLOAD" \
    actor_rollout_ref.ref.megatron.param_offload="$PARAM_OFFLOAD" \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu="$LOG_PROB_MICRO_BATCH_SIZE_PER_GPU" \
    actor_rollout_ref.rollout.name="$ROLLOUT_NAME" \
    actor_rollout_ref.rollout.n="$ROLLOUT_N" \
    actor_rollout_ref.rollout.tensor_model_parallel_size="$ROLLOUT_TP" \
    "${ENGINE[@]}" \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu="$LOG_PROB_MICRO_BATCH_SIZE_PER_GPU" \
    trainer.device=cuda \
    trainer.nnodes="$NNODES" \
    trainer.n_gpus_per_node="$N_GPUS_PER_NODE" \
    trainer.ray_address="$RAY_ADDRESS" \
    trainer.logger="$LOGGER" \
    trainer.project_name="$PROJECT_NAME" \
    trainer.experiment_name="$EXPERIMENT_NAME" \
    trainer.save_freq="$SAVE_FREQ" \
    trainer.test_freq="$TEST_FREQ" \
    trainer.total_epochs="$TOTAL_EPOCHS" \
    trainer.total_training_steps="$TOTAL_STEPS" \
    trainer.resume_mode="$RESUME_MODE" \
    trainer.default_local_dir="$CKPT_DIR" \
    "${EXTRA[@]}" \
    "$@"
