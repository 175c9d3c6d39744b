#!/usr/bin/env bash
# GKD's three placements (conf/experiment/gkd/*.yaml) on 2 GPUs, as recorded in docs/perf.md:
# a Qwen3-0.6B-shape student (hidden 1024, 28 layers, 16 heads, 8 KV heads, intermediate 3072,
# vocabulary 151,936) distilled from a Qwen3-1.7B-shape teacher (hidden 2048, intermediate 6144),
# both with random weights built into $OUT/models (tools/random_qwen3.py), on the built-in prompts
# with 256-token responses (ignore_eos: random models rarely stop).
#
#   bash bench/gkd_placements.sh OUT [preset...]   # default: all three
#   bash bench/gkd_placements.sh OUT four          # 4 GPUs: the standalone preset with 2 teacher
#                                                  #   replicas (teacher.gpus=2) beside 2 train GPUs
#
# Run from the repo root on a 2-GPU machine with vLLM 0.26 installed (../shared/gpu's parts in
# /root/site). Per preset: OUT/<preset>.log, the run's metrics.jsonl, nvidia-smi samples every
# 0.5 s, and one summary line (bench/gkd_placements.py): median step / teacher / weight-sync seconds
# over steps 2.., peak memory used on each GPU.
set -uo pipefail
OUT=${1:-/tmp/gkd_placements}
shift || true
[ $# -gt 0 ] || set -- rollout_colocate_teacher_colocate rollout_separate_teacher_colocate \
    rollout_colocate_teacher_standalone
mkdir -p "$OUT"
export PYTHONPATH=/root/site:$(pwd):${PYTHONPATH:-} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 \
  RAY_AUTH_MODE=disabled
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0,1}
STEPS=${STEPS:-4}
STUDENT=$OUT/models/student TEACHER=$OUT/models/teacher
[ -f "$STUDENT/config.json" ] || python3 tools/random_qwen3.py "$STUDENT" --hidden 1024 --layers 28 \
    --heads 16 --kv-heads 8 --intermediate 3072 --vocab 151936 >/dev/null
[ -f "$TEACHER/config.json" ] || python3 tools/random_qwen3.py "$TEACHER" --hidden 2048 --layers 28 \
    --heads 16 --kv-heads 8 --intermediate 6144 --vocab 151936 --seed 1 >/dev/null
R=actor_rollout_ref.rollout A=actor_rollout_ref.actor
COMMON="actor_rollout_ref.model.path=$STUDENT teacher.model=$TEACHER trainer.total_training_steps=$STEPS \
trainer.test_freq=-1 trainer.val_before_train=false trainer.save_freq=-1 trainer.progress_bar=false \
trainer.logger=[console] data.train_batch_size=16 $A.ppo_mini_batch_size=16 $R.n=4 \
data.max_response_length=256 $R.ignore_eos=true $A.ppo_micro_batch_size_per_gpu=8 \
teacher.log_prob_micro_batch_size_per_gpu=8 algorithm.gkd.gkd_logits_topk=64"
# EAGER=1: vLLM without CUDA graphs (engine start ~20 s instead of ~100 s; slower decoding)
[ "${EAGER:-0}" = 1 ] && COMMON="$COMMON $R.enforce_eager=true"
declare -a SUMMARY
EXTRA=""
if [ "$1" = four ]; then
    export CUDA_VISIBLE_DEVICES=0,1,2,3
    set -- rollout_colocate_teacher_standalone
    EXTRA="trainer.n_gpus_per_node=4 teacher.gpus=2"
    OUT=$OUT/four
    mkdir -p "$OUT"
fi
for preset in "$@"; do
    dir=$OUT/$preset
    rm -rf "$dir" && mkdir -p "$dir"
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits -lms 500 >"$dir/nvsmi.csv" &
    smi=$!
    start=$SECONDS
    timeout 900 bash run_scripts/gkd/run.sh "$preset" $COMMON $EXTRA trainer.default_local_dir="$dir" >"$OUT/$preset.log" 2>&1
    rc=$?
    kill "$smi" 2>/dev/null
    wait "$smi" 2>/dev/null
    echo "== $preset rc=$rc $((SECONDS - start))s"
    grep -E "^step|rror" "$OUT/$preset.log" | tail -n 5
    if [ -f "$dir/metrics.jsonl" ]; then
        line=$(python3 bench/gkd_placements.py "$preset" "$dir/metrics.jsonl" "$dir/nvsmi.csv")
        echo "$line"
        SUMMARY+=("$line rc=$rc")
    else
        SUMMARY+=("GKD_PLACEMENT $preset rc=$rc (no metrics)")
    fi
done
printf '%s\n' "${SUMMARY[@]}"
