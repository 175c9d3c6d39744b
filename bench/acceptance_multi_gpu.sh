#!/usr/bin/env bash
# The two- and four-GPU acceptance (issues 30 and 34), one group per call (each under 10 minutes):
#
#   bash bench/acceptance_multi_gpu.sh OUT GROUP        (GROUP: the call sequence below; one OUT for all)
#
# Run from the repo root with ../shared/gpu's packages in /root/site (install: 5 calls
# `bash .gpu/partNN/install.sh`, as for bench/acceptance_gpu.sh). Every group appends its rows to
# OUT/rows.md in docs/gpu_acceptance.md's columns (the device column names the card count) and
# prints one `ROW {...}` JSON line per run (bench/multi_gpu_rows.py: step 1's loss and grad norm,
# medians of weight-sync GB/s, log-prob mismatch, per-phase seconds, tokens/s, MFU);
# `python bench/acceptance_record.py OUT...` writes the page.
#
# Call sequence (minutes: the worst case, every row at its ROW_TIMEOUT; typical ~2/3 of it). Random
# weights are built on first use into /tmp/dagrl_models (in a process of their own: 0.6B ~10 s,
# 8B ~1 min, 14B ~2 min, on the GPU), the gsm8k parquet of the script rows from the test fixtures.
#   kind nvidia-h100-x2 (2x H100; an H200 pair gives the same rows and also `big14`):
#     1. separate       ~9: first the weight broadcast alone (bench/weight_broadcast_gpu.py, < 60 s,
#                           OUT/weight_broadcast.log: a plain broadcast of a 0.6B and an 8B shape's
#                           bytes, the single-buffer and the pipelined direct paths, GB/s and the
#                           ratio to the plain one, weights checked equal); then 2g-0.6b-separate,
#                           -overlap (32x8x256, 10 steps); a raw NCCL broadcast of the sync's bytes,
#                           same cards, same call: weight_sync/GBps >= 0.8 of it
#     2. dp2            ~9: 1g-0.6b-colocate (CUDA_VISIBLE_DEVICES=0), 2g-0.6b-dp2 at 64 prompts:
#                           scaling = 1g step / 2g step; the colocated mismatch beside separate's
#     3. tp             ~9: 1g-0.6b-megatron, 2g TP2+SP with vLLM TP2: step 1 side by side, MFU
#     4. pp             ~9: 2g PP2 beside 1g-0.6b-megatron (`tp`'s, else run first); the 2-GPU megatron
#                           tests (log-probs of a fixed batch at TP2, PP2, TP2+SP equal one GPU's)
#     5. gkd3a          ~9: ms-swift's colocate/colocate (sized to 2) and separate YAMLs via run.sh
#     6. gkd3b          ~7: ms-swift's standalone-teacher YAML (1 + 1): the teacher's tokens/s
#     7. big            ~10: Qwen3-8B shape, megatron TP2+SP, vLLM TP2, optimizer on the host (the plan's)
#     8. two_nodes      ~6: two raylets (one card each), separate placement, each role's node checked
#     comm              ~2: what NCCL's communicators hold per card (bench/comm_memory.py, TP2 and PP2)
#   kind nvidia-h200-x2 only:  big14  ~10: the 14B shape (plan: 85 of 141 GiB per card, 248 GiB of
#                           host memory on a 256 GiB host: the host is the limit)
#   kind nvidia-h100-x4 (when lent):
#     9. gkd4_colocate  ~9: 1.7B student / 4B teacher on 4 GPUs, top-k 64 and the full vocabulary
#    10. gkd4_split     ~9: rollout separate (2 + 2); teacher standalone (2 + 2 vLLM replicas)
#    11. mega8b         ~10: siiRL's script, TP2 x PP2 + SP + distributed optimizer, 10 steps straight;
#                           then the 8-GPU TP2 x PP4 plan (dry run, per device beside its peaks)
#    12. mega8b_save    ~6: the same, 5 steps, saved at 5 (the 8B start ~3 min, the save ~1)
#    13. mega8b_resume  ~6: resumed from it to 10, step by step beside `mega8b` (same warm machine)
#    14. dp4            ~9: 0.6B DP=1 (one card) and DP=4 at the same per-GPU batch: scaling
# Expected device time: 2 GPUs ~70 min worst case (~45 typical) + ~2 per machine start and the
# install: three 30-minute sessions (1-3, 4-6, 7-8); 4 GPUs ~55 (~40 typical): two sessions (11-14, 9-10 with
# the GKD rows' divergence at lr 5e-5).
#
# OUT is the call's own folder ($OUT of the device tool). Rows' JSON are also kept in
# /tmp/dagrl_multi_gpu_rows on the machine: `dp2` reads `separate`'s mismatch, `pp` compares with
# `tp`'s one-GPU run (it runs that row itself where none is kept) and `mega8b_resume` with `mega8b`
# (and from `mega8b_save`'s checkpoint), so run those on the same warm machine.
# Every group's commands plan on the CPU in tests/bench/test_multi_gpu_rows.py.
#
# On card pairs beside other groups (bench/acceptance_slots.sh, which sets ACCEPTANCE_SLOT,
# ACCEPTANCE_DEADLINE and CUDA_VISIBLE_DEVICES): the rows' CUDA_VISIBLE_DEVICES are the first cards
# of the slot's list, there is no `ray stop` (it would end the neighbours' Rays), and a row gets at
# most the time left before the deadline. two_nodes, separate, dp2 and dp4 run alone (the slot
# runner refuses them beside others: see its header).
set -u
OUT=${1:?OUT}
WHAT=${2:?separate, dp2, tp, pp, gkd3a, gkd3b, big, big14, comm, two_nodes, gkd4_colocate, gkd4_split, mega8b, mega8b_save, mega8b_resume or dp4}
mkdir -p "$OUT"
export PYTHONPATH=/root/site:$(pwd):${PYTHONPATH:-} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 \
  RAY_AUTH_MODE=disabled VLLM_ALLREDUCE_USE_SYMM_MEM=0  # no NVLink multicast on shared hosts
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null

. "$(dirname "$0")/slot_lib.sh"  # stop_ray, limit
# the cards this call may use: the slot's list, else every card of the host
CARDS=${CUDA_VISIBLE_DEVICES:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | paste -sd, -)}
CARDS=${CARDS:-0,1}

rows() {  # rows NAME...: bench/multi_gpu_rows.py, its ROW lines
    ROW_TIMEOUT=${ROW_TIMEOUT:-250} python3 bench/multi_gpu_rows.py "$OUT" "$@" 2>&1 | grep -E "^(ROW|PLAN)|rror" | cut -c1-2500
}
# every row's JSON is also kept on the machine (KEEP): a later call compares with an earlier one's rows
KEEP=${MULTI_GPU_KEEP:-/tmp/dagrl_multi_gpu_rows}
field() {  # field ROW KEY: a figure of a row's JSON (KEEP/ROW.json), empty when absent
    python3 -c "import json,sys; r=json.load(open('$KEEP/$1.json')); print(r.get('$2', r['median'].get('$2', '')))" 2>/dev/null
}
pair() {  # pair A B: two rows' per-step loss, grad norm and reward side by side, the largest gap
    python3 bench/multi_gpu_rows.py --compare "$KEEP" "$1" "$2" | tee -a "$OUT/compare.log" | cut -c1-1500
}

case $WHAT in
separate)
    # the broadcast alone first: the pipelined direct path against a plain broadcast of the same bytes
    CUDA_VISIBLE_DEVICES=$(echo "$CARDS" | cut -d, -f1,2) timeout 75 python3 bench/weight_broadcast_gpu.py 2>&1 | tee "$OUT/weight_broadcast.log" | cut -c1-600
    # 300: on a fresh machine the first row's start takes ~140 s (s32 cut it at 220 s, step 8)
    ROW_TIMEOUT=${ROW_TIMEOUT:-300} rows 2g-0.6b-separate 2g-0.6b-separate-overlap
    BYTES=$(field 2g-0.6b-separate weight_sync/bytes)
    # the same bytes between the same two cards, raw: the sync's GB/s should be >= 0.8 of this
    [ -n "$BYTES" ] && CUDA_VISIBLE_DEVICES=$(echo "$CARDS" | cut -d, -f1,2) timeout 60 python3 bench/nccl_broadcast.py --bytes "${BYTES%.*}" | tee "$OUT/nccl.log"
    echo "sync GB/s: $(field 2g-0.6b-separate weight_sync/GBps) floor: $(field 2g-0.6b-separate weight_sync/broadcast_floor_GBps)"
    ;;
dp2)
    rows 1g-0.6b-colocate 2g-0.6b-dp2
    echo "scaling (1g step / 2g step at twice the batch): $(field 1g-0.6b-colocate median_step_s) / $(field 2g-0.6b-dp2 median_step_s)"
    echo "log-prob mismatch colocated: $(field 1g-0.6b-colocate rollout_corr/logprob_abs_diff_mean)" \
        "separate: $(field 2g-0.6b-separate rollout_corr/logprob_abs_diff_mean 2>/dev/null)"
    ;;
tp)
    rows 1g-0.6b-megatron 2g-0.6b-megatron-tp2-sp
    pair 1g-0.6b-megatron 2g-0.6b-megatron-tp2-sp
    ;;
pp)
    # the one-GPU row it compares with, where no earlier call of this machine ran tp
    [ -f "$KEEP/1g-0.6b-megatron.json" ] || rows 1g-0.6b-megatron
    ROW_TIMEOUT=${ROW_TIMEOUT:-300} rows 2g-0.6b-megatron-pp2
    pair 1g-0.6b-megatron 2g-0.6b-megatron-pp2
    # the fixed-batch checks (the same rows through one GPU and through two): megatron's log-probs at
    # TP2, PP2 and TP2+SP against one GPU; they skip on a one-GPU machine, so only here do they run
    CUDA_VISIBLE_DEVICES=$(echo "$CARDS" | cut -d, -f1,2) timeout "$(limit 220)" python3 -m pytest -q -p no:cacheprovider -m gpu tests/backends/megatron/test_backend_gpu.py \
        tests/backends/megatron/test_spec_gpu.py -k "two_gpu or tp2" >"$OUT/tests_2gpu.log" 2>&1
    CODE=$?
    SUMMARY=$(grep -E "[0-9]+ (passed|failed|error)" "$OUT/tests_2gpu.log" | tail -n 1)
    echo "== 2-GPU tests rc=$CODE: $SUMMARY"; grep -E "^(FAILED|ERROR)" "$OUT/tests_2gpu.log" | cut -c1-300
    PASSED=$(echo "$SUMMARY" | grep -oE "[0-9]+ passed" | grep -oE "[0-9]+")
    TOTAL=$(echo "$SUMMARY" | grep -oE "[0-9]+ (passed|failed|error)" | awk '{s += $1} END {print s + 0}')
    echo "| tests_2gpu (megatron TP2 / PP2 / TP2+SP vs one GPU) | 2× $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1) | $CODE | ${PASSED:-0}/${TOTAL:-0} | | | |" >>"$OUT/rows.md"
    ;;
gkd3a)  # run.sh dry-runs the plan itself before each run (its GPU check): ~15 s a row more
    ROW_TIMEOUT=${ROW_TIMEOUT:-240} rows 2g-gkd-colocate 2g-gkd-separate
    ;;
gkd3b)
    ROW_TIMEOUT=${ROW_TIMEOUT:-380} rows 2g-gkd-standalone
    ;;
big)
    ROW_TIMEOUT=${ROW_TIMEOUT:-480} rows 2g-8b-megatron-tp2
    ;;
comm)  # what NCCL's communicators hold per card outside torch's allocator (bench/comm_memory.py):
    # megatron at TP2 and at PP2, each in four modes (lazy, split, split sharing resources, 2 CTAs)
    CODE=0; DONE=0
    for LAYOUT in tp pp; do
        CUDA_VISIBLE_DEVICES=$(echo "$CARDS" | cut -d, -f1,2) timeout "$(limit 150)" python3 bench/comm_memory.py \
            --megatron "$LAYOUT" >>"$OUT/comm_memory.log" 2>&1 && DONE=$((DONE + 1)) || CODE=$?
    done
    grep "^COMM" "$OUT/comm_memory.log" | cut -c1-2500
    echo "| comm_memory (NCCL communicators: TP2, PP2) | 2× $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1) | $CODE | $DONE/2 | | | |" >>"$OUT/rows.md"
    ;;
big14)
    ROW_TIMEOUT=${ROW_TIMEOUT:-480} rows 2g-14b-megatron-tp2
    ;;
two_nodes)  # two raylets on this host, each seeing one card; the run joins them (ray_address=auto)
    python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1  # alone on the host (never beside slots)
    CUDA_VISIBLE_DEVICES=$(echo "$CARDS" | cut -d, -f1) python3 -m ray.scripts.scripts start --head --num-gpus=1 --port=6379 \
        --include-dashboard=false --disable-usage-stats >"$OUT/ray_head.log" 2>&1
    CUDA_VISIBLE_DEVICES=$(echo "$CARDS" | cut -d, -f2) python3 -m ray.scripts.scripts start --address=127.0.0.1:6379 --num-gpus=1 \
        --disable-usage-stats >"$OUT/ray_worker.log" 2>&1
    python3 -c "import ray; ray.init(address='auto'); print('ray nodes', [(n['NodeID'][:8], n['Resources'].get('GPU')) for n in ray.nodes() if n['Alive']])"
    ROW_TIMEOUT=${ROW_TIMEOUT:-300} rows 2n-0.6b-separate
    # each role's pool says where it landed: train and rollout on different raylets, one card each
    grep -E "^placed" "$OUT/2n-0.6b-separate.log"
    python3 - "$OUT/2n-0.6b-separate.log" <<'EOF'
import re, sys
nodes = {m.group(1): m.group(2) for m in re.finditer(r"^placed (\S+): rank 0 node (\w+)", open(sys.argv[1]).read(), re.M)}
ok = len(nodes) == 2 and len(set(nodes.values())) == 2
print("PLACEMENT", "ok" if ok else "WRONG", nodes)
EOF
    ;;
gkd4_colocate)
    ROW_TIMEOUT=${ROW_TIMEOUT:-260} rows 4g-gkd-colocate-top64 4g-gkd-colocate-full
    ;;
gkd4_split)
    ROW_TIMEOUT=${ROW_TIMEOUT:-260} rows 4g-gkd-separate 4g-gkd-standalone
    ;;
mega8b)
    ROW_TIMEOUT=${ROW_TIMEOUT:-480} rows 4g-8b-tp2pp2
    rows 8g-8b-tp2pp4-plan  # beside 4g-8b-tp2pp2's per-stage peaks (its plan: OUT/8g-8b-tp2pp4-plan.plan)
    ;;
mega8b_save)  # a checkpoint of ~115 GB (bf16 weights, fp32 mains, Adam's two moments): one on the disk
    rm -rf /tmp/mg_8b_resume
    ROW_TIMEOUT=${ROW_TIMEOUT:-400} rows 4g-8b-tp2pp2-save5
    ;;
mega8b_resume)
    ROW_TIMEOUT=${ROW_TIMEOUT:-400} rows 4g-8b-tp2pp2-resume10
    pair 4g-8b-tp2pp2 4g-8b-tp2pp2-resume10  # steps 6..10 of the resumed run against the straight one
    ;;
dp4)
    rows 1g-0.6b-colocate 4g-0.6b-dp4
    echo "scaling (1g step / 4g step at four times the batch): $(field 1g-0.6b-colocate median_step_s) / $(field 4g-0.6b-dp4 median_step_s)"
    ;;
*) echo "unknown: $WHAT"; exit 2 ;;
esac
if [ "$WHAT" = two_nodes ]; then  # the raylets it started itself (alone on the host)
    python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1
else
    stop_ray
fi
[ -n "${ACCEPTANCE_SLOT:-}" ] || nvidia-smi --query-gpu=memory.used --format=csv,noheader
