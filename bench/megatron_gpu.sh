#!/usr/bin/env bash
# The megatron backend's GPU checks and benchmarks, as recorded in docs/perf.md.
#
#   bash bench/megatron_gpu.sh one OUT   # 1 GPU: gpu tests, mcore loop local vs sdpa, GRPO colocated
#   bash bench/megatron_gpu.sh two OUT   # 2 GPUs: gpu tests, GRPO TP2+SP and PP2 colocated
#   bash bench/megatron_gpu.sh update OUT  # 1 GPU: gpu tests, log-prob kernel, the actor update alone
#                                          # (bench/megatron_update.py) paired with the plain loop at
#                                          # the GRPO shape, GRPO colocated
#   bash bench/megatron_gpu.sh update2 OUT # 2 GPUs: gpu tests, the paired update at TP2+SP and at PP2,
#                                          # GRPO TP2+SP colocated
#   bash bench/megatron_gpu.sh loops2 OUT  # 2 GPUs: plain mcore loops TP2+SP / PP2 at the GRPO shape
#   bash bench/megatron_gpu.sh script OUT  # 2 GPUs: run_scripts/run_qwen3-8b-megatron.sh (TP2, hf
#                                          # rollout, parquet from examples/) 2 steps + save, resume to 3
#
# Every step writes OUT/<name>.log and goes on when one fails (the summary lists exit codes).
# GRPO model: random-init Qwen3 architecture, hidden 1024, 28 layers, 8 heads x 128, tied,
# 508M parameters (bench/grpo_gpu.py); 32 prompts x 8 responses of 256 tokens, micro-batch 16.
# The plain megatron loop runs the same shape: 16 micro-batches of 16 x 288 tokens per step.
set -uo pipefail
MODE=${1:?one or two}
OUT=${2:-/tmp/megatron_gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
M=actor_rollout_ref.actor.megatron
OFFLOAD="$M.param_offload=true $M.grad_offload=true $M.optimizer_offload=true"
SHAPE="--hidden 1024 --layers 28 --heads 8 --query-groups 4 --head-dim 128 --ffn 3072 --tie-embeddings"
LOOP="--seq-len 288 --micro-batch 16 --num-micro-batches 16 --steps 6 --warmup 2"
declare -a SUMMARY

step() {  # step NAME TIMEOUT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    SUMMARY+=("$name rc=$rc $((SECONDS - start))s")
    echo "== $name rc=$rc $((SECONDS - start))s"
    tail -n 4 "$OUT/$name.log"
}

if [ "$MODE" = one ]; then
    step pytest_gpu 240 python -m pytest -q -m gpu -p no:cacheprovider -x \
        tests/backends/megatron/test_backend_gpu.py tests/backends/megatron/test_spec_gpu.py \
        tests/backends/megatron/test_logprobs_gpu.py
    step loop_local_752m 90 python bench/mcore_loop.py --spec local
    step loop_sdpa_752m 90 python bench/mcore_loop.py --spec sdpa
    step loop_sdpa_grpo_shape 90 python bench/mcore_loop.py --spec sdpa $SHAPE $LOOP
    step grpo_megatron_1gpu 300 python bench/grpo_gpu.py --strategy megatron --out /tmp/b1 --steps 3 $OFFLOAD
elif [ "$MODE" = update ]; then
    # the actor update beside the plain loop in one process, alternating steps (--with-loop)
    UPD="--out /tmp/mu --steps 7 --warmup 2 --with-loop"
    step pytest_gpu 240 python -m pytest -q -m gpu -p no:cacheprovider \
        tests/backends/megatron/test_logprobs_gpu.py tests/backends/megatron/test_backend_gpu.py
    step logprob_kernel 120 python bench/logprob_kernel.py
    step update_paired 150 python bench/megatron_update.py $UPD
    step update_paired_offload 150 python bench/megatron_update.py $UPD --offload
    step grpo_megatron_1gpu 300 python bench/grpo_gpu.py --strategy megatron --out /tmp/b1 --steps 3 $OFFLOAD
elif [ "$MODE" = update2 ]; then
    UPD="--out /tmp/mu --steps 6 --warmup 2 --with-loop --offload"
    step pytest_gpu 150 python -m pytest -q -m gpu -p no:cacheprovider \
        tests/backends/megatron/test_backend_gpu.py -k "two_gpu or sequence_parallel"
    step update_tp2_sp 150 torchrun --nproc-per-node 2 bench/megatron_update.py $UPD --tp 2 --sp
    step update_pp2 150 torchrun --nproc-per-node 2 bench/megatron_update.py $UPD --pp 2
    step grpo_megatron_tp2 200 python bench/grpo_gpu.py --strategy megatron --out /tmp/b2 --steps 3 \
        trainer.n_gpus_per_node=2 $M.tensor_model_parallel_size=2 $M.sequence_parallel=true $OFFLOAD
elif [ "$MODE" = loops2 ]; then
    step loop_sdpa_tp2_sp 120 torchrun --nproc-per-node 2 bench/mcore_loop.py --spec sdpa --tp 2 --sp $SHAPE $LOOP
    step loop_sdpa_pp2 120 torchrun --nproc-per-node 2 bench/mcore_loop.py --spec sdpa --pp 2 $SHAPE $LOOP
elif [ "$MODE" = script ]; then
    step data 60 python examples/data_preprocess/builtin_arith.py --local_dir /tmp/arith
    [ -d /tmp/b2/model ] || step model 120 python -c "import sys; sys.path.insert(0, 'bench'); \
        from grpo_gpu import build_model; import os; os.makedirs('/tmp/b2', exist_ok=True); build_model('/tmp/b2', 1024, 28, 151936)"
    export MODEL_PATH=/tmp/b2/model TRAIN_FILE=/tmp/arith/train.parquet VAL_FILE=/tmp/arith/test.parquet \
        TRAIN_BATCH_SIZE=32 PPO_MINI_BATCH_SIZE=16 PPO_MICRO_BATCH_SIZE_PER_GPU=16 \
        LOG_PROB_MICRO_BATCH_SIZE_PER_GPU=32 ROLLOUT_N=8 MAX_PROMPT_LENGTH=64 MAX_RESPONSE_LENGTH=256 \
        NNODES=1 N_GPUS_PER_NODE=2 TP=2 PP=1 SP=True ROLLOUT_NAME=hf SAVE_FREQ=2 TEST_FREQ=-1 \
        CKPT_DIR=/tmp/script_ckpt
    rm -rf /tmp/script_ckpt
    step script_2_steps 240 env TOTAL_STEPS=2 bash run_scripts/run_qwen3-8b-megatron.sh trainer.val_before_train=false
    step script_resume_to_3 240 env TOTAL_STEPS=3 bash run_scripts/run_qwen3-8b-megatron.sh trainer.val_before_train=false
    ls -la /tmp/script_ckpt /tmp/script_ckpt/* >"$OUT/ckpt_listing.txt" 2>&1
else
    step pytest_gpu 240 python -m pytest -q -m gpu -p no:cacheprovider \
        tests/backends/megatron/test_backend_gpu.py -k "two_gpu or sequence_parallel"
    step grpo_megatron_tp2 240 python bench/grpo_gpu.py --strategy megatron --out /tmp/b2 --steps 3 \
        trainer.n_gpus_per_node=2 $M.tensor_model_parallel_size=2 $M.sequence_parallel=true $OFFLOAD
    step grpo_megatron_pp2 240 python bench/grpo_gpu.py --strategy megatron --out /tmp/b3 --steps 3 \
        trainer.n_gpus_per_node=2 $M.pipeline_model_parallel_size=2 $OFFLOAD
fi
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
