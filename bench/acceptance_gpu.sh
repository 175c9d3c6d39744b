#!/usr/bin/env bash
# The GPU runs the open acceptance items still need, one group per call (each under 10 minutes on
# one H100; the 8B run on one H200), from the repo root with ../shared/gpu's packages in /root/site:
#
#   bash bench/acceptance_gpu.sh OUT tests_a      # multi-turn log-probs, the contract's vllm case, megatron
#   bash bench/acceptance_gpu.sh OUT tests_b      # offload, mixed precision, engine errors, vllm, teacher, judge
#   bash bench/acceptance_gpu.sh OUT side         # TRL vs dagrl defaults / fast, and fast at BEFORE (same call)
#   bash bench/acceptance_gpu.sh OUT real 4b megatron   # Qwen3-4B shape GRPO with the defaults (H100);
#   bash bench/acceptance_gpu.sh OUT real 4b torch      #   also 1.7b, and 8b megatron on one H200
#   bash bench/acceptance_gpu.sh OUT memory       # the memory plan's three held-out configurations
#   bash bench/acceptance_gpu.sh OUT throughput   # sampler + RM prompts/s, multi-turn with the python tool
#
# Each prints its summary lines; logs stay in OUT. BEFORE (for side) = a checkout of the code to
# compare with (default .base, the starting point).
set -u
OUT=${1:?OUT}
WHAT=${2:?tests_a, tests_b, side, real, memory or throughput}
mkdir -p "$OUT"
export PYTHONPATH=/root/site:$(pwd):${PYTHONPATH:-} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 \
  RAY_AUTH_MODE=disabled
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

tests() {  # tests NAME FILES...
    local name=$1
    shift
    timeout 560 python3 -m pytest -q -p no:cacheprovider -m gpu --durations=0 "$@" >"$OUT/$name.log" 2>&1
    echo "== $name rc=$?"
    grep -E "passed|failed|^(FAILED|ERROR)" "$OUT/$name.log" | tail -n 12
}

case $WHAT in
tests_a)
    tests tests_a tests/backends/vllm/test_multi_turn_gpu.py tests/backends/test_contract.py \
        tests/backends/megatron/test_backend_gpu.py tests/backends/megatron/test_logprobs_gpu.py \
        tests/backends/megatron/test_spec_gpu.py
    ;;
tests_b)
    tests tests_b tests/backends/torch/test_offload_gpu.py tests/backends/test_mixed_precision_gpu.py \
        tests/reliability/test_engine_errors_gpu.py tests/backends/vllm/test_vllm_gpu.py \
        tests/backends/vllm/test_teacher_gpu.py tests/rewards/test_judge_gpu.py
    ;;
side)  # fast at BEFORE first, then now: the order on the machine is part of the comparison
    BEFORE=${BEFORE:-$(pwd)/.base} bash bench/vllm_gpu.sh side "$OUT/side" trl fast_before fast default \
        | grep -E "^==|SIDE" | cut -c1-600
    ;;
real)  # real SHAPE SETUP: the model is built first (a minute at 4B), then the run has the rest
    python3 bench/real_size_gpu.py --shape "${3:?shape}" --timeout 420 "${4:?setup}" | tee -a "$OUT/real.log" | cut -c1-1500
    ;;
memory)
    timeout 560 python3 bench/memory_plan_gpu.py --only 1.7b-megatron 0.6b-torch-teacher 0.6b-megatron-teacher \
        >"$OUT/memory.log" 2>&1
    grep -E "^\{|rror" "$OUT/memory.log" | cut -c1-1500
    ;;
throughput)
    timeout 280 python3 bench/sample_gpu.py --out /tmp/sample_bench >"$OUT/sample.log" 2>&1
    tail -n 3 "$OUT/sample.log" | cut -c1-1500
    [ -f /tmp/q06/config.json ] || python3 tools/random_qwen3.py /tmp/q06 --hidden 1024 --layers 28 --heads 16 \
        --kv-heads 8 --intermediate 3072 --vocab 151936 --head-dim 128 >/dev/null
    timeout 280 python3 bench/multi_turn_gpu.py --model /tmp/q06 --tool python --reps 2 >"$OUT/multi_turn.log" 2>&1
    grep -E "MULTI_TURN|rror" "$OUT/multi_turn.log" | tail -n 4 | cut -c1-1500
    ;;
*) echo "unknown: $WHAT" ;;
esac
