#!/usr/bin/env bash
# The vLLM rollout's GPU checks and benchmarks, as recorded in docs/perf.md. Run from the repo root
# on a GPU machine with ../shared/gpu's parts installed in /root/site (vLLM 0.26.0) and the anchors
# copied to .anchors/ (../shared/anchors/README.md).
#
#   bash bench/vllm_gpu.sh check OUT   # 1 GPU: gpu tests, the default tiny job on vLLM (and with
#                                      #   LoRA), bench/rollout_vs_vllm.py on the side-by-side model
#   bash bench/vllm_gpu.sh side OUT [trl] [fast] [lean] [hf] [default] [dapo] [ppo] [fast_before] [lora] [lora_merged]
#                                      #   1 GPU: the side-by-side, TRL and the chosen dagrl presets (default:
#                                      #   trl fast lean), one command; fast_before runs `fast` from BEFORE=DIR;
#                                      #   lora / lora_merged: `fast` with LoRA (adapter / merged sync), for
#                                      #   TRL run with the same peft_config (LORA_* below)
#   bash bench/vllm_gpu.sh two OUT [sync] [loader] [overlap] [tp2]   # 2 GPUs: separate placement
#                                      #   (direct weight sync; `loader`: through vLLM's load_weights),
#                                      #   with overlap, rollout TP=2 colocated with a TP=2 megatron trainer
#
# Every step writes OUT/<name>.log and goes on when one fails (the summary lists exit codes).
set -uo pipefail
MODE=${1:?check, side or two}
OUT=${2:-/tmp/vllm_gpu}
mkdir -p "$OUT"
export PYTHONPATH=/root/site:$(pwd):${PYTHONPATH:-} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 \
  RAY_AUTH_MODE=disabled
M=/tmp/anchor_q06b D=/tmp/anchor_data
R=actor_rollout_ref.rollout A=actor_rollout_ref.actor
# what a user would pick for a 0.6B model on one 80 GB card: engine and trainer both resident (no
# sleep, no offload: everything fits), the on-policy update's old log-probs from its own forward
FAST="$R.name=vllm $R.gpu_memory_utilization=0.4 $R.free_cache_engine=false $A.offload=false \
$A.recompute_old_logprobs=false $A.ppo_micro_batch_size_per_gpu=16 $R.ignore_eos=true"
# LoRA as the TRL side-by-side takes it: LoraConfig(r=64, lora_alpha=128, target_modules="all-linear")
LORA="$FAST actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=128"
# the memory-lean colocated form: engine asleep (level 2) while the trainer works, trainer offloaded
LEAN="$R.name=vllm $R.gpu_memory_utilization=0.5 $R.free_cache_engine=true $R.sleep_level=2 \
$A.offload=true $A.recompute_old_logprobs=false $A.ppo_micro_batch_size_per_gpu=16 $R.ignore_eos=true"
declare -a SUMMARY

step() {  # step NAME TIMEOUT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    SUMMARY+=("$name rc=$rc $((SECONDS - start))s")
    echo "== $name rc=$rc $((SECONDS - start))s"
    grep -E "^(ROLLOUT_VS_VLLM|SIDE|FLOOR)|passed|failed|rror" "$OUT/$name.log" | tail -n 6
    return $rc
}

side() {  # side NAME EXTRA...
    local name=$1
    shift
    mkdir -p "$OUT/$name"
    # a process left on the GPU by an earlier run would slow this one: name it in the log
    echo "== $name: GPU processes before: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
    step "$name" 420 env OUT="$OUT/$name" EXTRA="$*" bash .anchors/side_by_side.sh dagrl
    cp /tmp/dagrl_side/metrics.jsonl "$OUT/$name/metrics.jsonl" 2>/dev/null && python3 - "$OUT/$name/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
keys = ["weight_sync/s", "weight_sync/bytes", "weight_sync/direct", "weight_sync/broadcast_GBps",
        "weight_sync/broadcast_floor_GBps", "weight_sync/broadcast_vs_floor"]
# the rollout per step beside the allocator's work in it (dagrl/backends/device_memory.py): whether a
# slow generate is one where torch's allocator retried (released its cache) or called the driver
phase = ["timing_s/rollout", "rollout/generate_s", "rollout/alloc_retries", "rollout/device_mallocs",
         "rollout/device_frees", "timing_s/actor_update", "update/alloc_retries", "update/device_mallocs"]
for r in rows:
    if "weight_sync/broadcast_GBps" in r:
        print("SYNC", r["step"], " ".join(f"{k.split('/')[1]}={r[k]:.4g}" for k in keys if k in r))
    print("PHASES", r["step"], " ".join(f"{k}={r[k]:.4g}" for k in phase if k in r))
PY
}

python3 .anchors/build_anchor.py $M $D >/dev/null
case $MODE in
check)
    step gpu_tests 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/backends/vllm/test_vllm_gpu.py
    step tiny_vllm 300 python3 -m dagrl.main trainer.device=cuda $R.name=vllm $R.gpu_memory_utilization=0.3 \
        trainer.default_local_dir=/tmp/tiny_vllm trainer.progress_bar=false
    grep -E "^step|val" "$OUT/tiny_vllm.log" | tail -n 8
    # LoRA: the adapter sync's GPU tests, then a run with the colocated auto (merged weights)
    step lora_gpu_tests 400 python3 -m pytest -q -p no:cacheprovider -m gpu tests/backends/vllm/test_lora_gpu.py
    step tiny_vllm_lora 300 python3 -m dagrl.main trainer.device=cuda $R.name=vllm $R.gpu_memory_utilization=0.3 \
        actor_rollout_ref.model.lora_rank=16 actor_rollout_ref.model.lora_alpha=32 $A.optim.lr=1e-3 \
        actor_rollout_ref.model.dtype=bfloat16 \
        trainer.default_local_dir=/tmp/tiny_vllm_lora trainer.progress_bar=false
    grep -E "^step|val" "$OUT/tiny_vllm_lora.log" | tail -n 8
    step rollout_vs_vllm 400 python3 bench/rollout_vs_vllm.py --model $M --data $D/train.parquet
    ;;
side)
    shift 2
    [ $# -gt 0 ] || set -- trl fast lean
    for what in "$@"; do
        case $what in
        trl) mkdir -p "$OUT/trl"; step trl 420 env OUT="$OUT/trl" bash .anchors/side_by_side.sh trl ;;
        fast) side dagrl_fast $FAST ;;
        default) side dagrl_default $R.name=vllm ;;  # what a user gets with only the engine named
        # the defaults with the engine told to sleep: the plan's choice before the awake auto (an
        # awake engine may take recomputation to fit beside the trainer: this is its price's check)
        asleep) side dagrl_asleep $R.name=vllm $R.free_cache_engine=true ;;
        # the same at the side-by-side's second shape (ANCHOR_PROMPTS=64 ANCHOR_LEN=512 for TRL): one
        # optimizer step over the whole batch, as TRL's gradient accumulation does
        default64) side dagrl_default64 $R.name=vllm data.train_batch_size=64 data.max_response_length=512 \
            $A.ppo_mini_batch_size=64 ;;
        # the same told to sleep: on a 140 GiB card the awake auto takes recomputation at this shape
        # (163.8 GiB without it beside the engine), asleep the update fits without (its price's check)
        asleep64) side dagrl_asleep64 $R.name=vllm data.train_batch_size=64 data.max_response_length=512 \
            $A.ppo_mini_batch_size=64 $R.free_cache_engine=true ;;
        # DAPO beside `default`: the random model's groups all get one reward, so every step samples its
        # 2 rounds (the cap) and refills: the refill path's cost, one extra rollout per step
        dapo) side dagrl_dapo $R.name=vllm algorithm=dapo algorithm.filter_groups.max_num_gen_batches=2 ;;
        # PPO beside `default`: a second 0.6B model (the critic, with a value head) colocated with the
        # actor and the engine, its values pass and update in every step
        ppo) side dagrl_ppo $R.name=vllm algorithm=ppo ;;
        fast_before) export DAGRL_ROOT=${BEFORE:?BEFORE=an older checkout}; side dagrl_fast_before $FAST; unset DAGRL_ROOT ;;
        lean) side dagrl_lean $LEAN ;;
        hf) side dagrl_hf ;;
        lora) side dagrl_lora $LORA ;;
        lora_merged) side dagrl_lora_merged $LORA $R.lora_sync=merged ;;
        lora_adapter) side dagrl_lora_adapter $LORA $R.lora_sync=adapter ;;  # auto's choice apart
        *) echo "unknown side run $what" ;;
        esac
    done
    ;;
two)
    shift 2
    [ $# -gt 0 ] || set -- sync overlap tp2
    SEP="placement=separate trainer.n_gpus_per_node=2 $R.name=vllm $R.gpu_memory_utilization=0.8 \
$A.offload=false $A.recompute_old_logprobs=false $A.ppo_micro_batch_size_per_gpu=16 $R.ignore_eos=true"
    for what in "$@"; do
        case $what in
        sync) side sep_sync $SEP ;;
        loader) side sep_loader $SEP $R.weight_sync_direct=false ;;
        overlap) side sep_overlap $SEP $R.overlap_steps=1 ;;
        tp2) side tp2_colocated trainer.n_gpus_per_node=2 $A.strategy=megatron $A.megatron.tensor_model_parallel_size=2 \
            $R.tensor_model_parallel_size=2 $R.name=vllm $R.gpu_memory_utilization=0.4 $R.free_cache_engine=false \
            $A.recompute_old_logprobs=false $A.ppo_micro_batch_size_per_gpu=16 $R.ignore_eos=true ;;
        *) echo "unknown two run $what" ;;
        esac
    done
    ;;
*) echo "unknown mode $MODE"; exit 2 ;;
esac
printf '%s\n' "${SUMMARY[@]}"
