#!/usr/bin/env bash
# The two- and four-GPU acceptance (issues 30 and 34), one group per call (each under 10 minutes),
# from the repo root with ../shared/gpu's packages in /root/site (install: 5 calls
# `bash .gpu/partNN/install.sh`, as for bench/acceptance_gpu.sh). Every group appends its rows to
# OUT/rows.md in docs/gpu_acceptance.md's columns (the device column names the card count) and
# prints one `ROW {...}` JSON line per run (bench/multi_gpu_rows.py: step 1's loss and grad norm,
# medians of weight-sync GB/s, log-prob mismatch, per-phase seconds, tokens/s, MFU);
# `python bench/acceptance_record.py OUT...` writes the page.
#
# Call sequence (minutes: machine time per call, models built on first use into /tmp/dagrl_models):
#   kind nvidia-h100-x2 (2x H100; the H200 pair gives the same rows but for `big14`):
#     1. bash bench/acceptance_multi_gpu.sh OUT separate    # ~8: 2g-0.6b-separate, -overlap, raw NCCL
#                                                            #   broadcast of the same bytes (>= 0.8 of it)
#     2. bash bench/acceptance_multi_gpu.sh OUT dp2         # ~7: 1g-0.6b-colocate (CUDA_VISIBLE_DEVICES=0)
#                                                            #   then 2g-0.6b-dp2 at twice the batch: scaling;
#                                                            #   the colocated mismatch beside `separate`'s
#     3. bash bench/acceptance_multi_gpu.sh OUT tp          # ~8: 1g-0.6b-megatron, 2g TP2+SP (vLLM TP2):
#                                                            #   step 1 loss / grad norm side by side, MFU
#     4. bash bench/acceptance_multi_gpu.sh OUT pp          # ~5: 2g PP2 beside 1g-0.6b-megatron (from `tp`)
#     5. bash bench/acceptance_multi_gpu.sh OUT gkd3        # ~9: ms-swift's three YAMLs via run.sh, 0.6B/1.7B
#     6. bash bench/acceptance_multi_gpu.sh OUT big         # ~9: Qwen3-8B shape, megatron TP2+SP, vLLM TP2
#                                                            #   (building the 16 GB of random weights: ~2)
#     7. bash bench/acceptance_multi_gpu.sh OUT two_nodes   # ~4: two raylets, one card each, separate
#   kind nvidia-h200-x2, only if held: bash bench/acceptance_multi_gpu.sh OUT big14   # ~9: 14B shape
#     (the plan: 85 GiB of 141 per card, 248 GiB of host memory: the 256 GiB host is the limit)
#   kind nvidia-h100-x4 (when lent):
#     8. bash bench/acceptance_multi_gpu.sh OUT gkd4_colocate  # ~9: 1.7B/4B, top-k 64 and full vocabulary
#     9. bash bench/acceptance_multi_gpu.sh OUT gkd4_split     # ~9: rollout separate (2+2); teacher
#                                                              #   standalone (2 + 2 vLLM replicas)
#    10. bash bench/acceptance_multi_gpu.sh OUT mega8b         # ~9: siiRL's script, TP2 x PP2, 10 steps straight
#    11. bash bench/acceptance_multi_gpu.sh OUT mega8b_resume  # ~9: the same, save at 5 and resume to 10;
#                                                              #   compared step by step with `mega8b`;
#                                                              #   then the 8-GPU TP2 x PP4 plan (dry run)
#    12. bash bench/acceptance_multi_gpu.sh OUT dp4            # ~7: 0.6B DP=1 (one card) and DP=4: scaling
# Expected device time: 2 GPUs ~50 min + install (~2 per machine start) = two 30-minute sessions
# (calls 1-4, then 5-7); 4 GPUs ~43 min = two sessions (8-10, then 11-12). Each call <= 10 min.
#
# Every group's commands plan on the CPU in tests/bench/test_multi_gpu_rows.py.
set -u
OUT=${1:?OUT}
WHAT=${2:?separate, dp2, tp, pp, gkd3, big, big14, two_nodes, gkd4_colocate, gkd4_split, mega8b, mega8b_resume or dp4}
mkdir -p "$OUT"
export PYTHONPATH=/root/site:$(pwd):${PYTHONPATH:-} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 \
  RAY_AUTH_MODE=disabled
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

rows() {  # rows NAME...: bench/multi_gpu_rows.py, its ROW lines
    ROW_TIMEOUT=${ROW_TIMEOUT:-270} python3 bench/multi_gpu_rows.py "$OUT" "$@" 2>&1 | grep -E "^(ROW|PLAN)|rror" | cut -c1-2500
}
field() {  # field ROW KEY: a figure of a row's JSON (OUT/ROW.json), empty when absent
    python3 -c "import json,sys; r=json.load(open('$OUT/$1.json')); print(r.get('$2', r['median'].get('$2', '')))" 2>/dev/null
}
pair() {  # pair A B: step 1 and medians of two rows side by side, and their per-step comparison
    python3 bench/multi_gpu_rows.py --compare "$OUT" "$1" "$2" | cut -c1-1500
}

case $WHAT in
separate)
    rows 2g-0.6b-separate 2g-0.6b-separate-overlap
    BYTES=$(field 2g-0.6b-separate weight_sync/bytes)
    # the same bytes between the same two cards, raw: the sync's GB/s should be >= 0.8 of this
    [ -n "$BYTES" ] && timeout 120 python3 bench/nccl_broadcast.py --bytes "${BYTES%.*}" | tee "$OUT/nccl.log"
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
    rows 2g-0.6b-megatron-pp2
    pair 1g-0.6b-megatron 2g-0.6b-megatron-pp2
    ;;
gkd3)
    ROW_TIMEOUT=${ROW_TIMEOUT:-170} rows 2g-gkd-colocate 2g-gkd-separate 2g-gkd-standalone
    ;;
big)
    ROW_TIMEOUT=${ROW_TIMEOUT:-420} rows 2g-8b-megatron-tp2
    ;;
big14)
    ROW_TIMEOUT=${ROW_TIMEOUT:-480} rows 2g-14b-megatron-tp2
    ;;
two_nodes)  # two raylets on this host, each seeing one card; the run joins them (ray_address=auto)
    python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1
    CUDA_VISIBLE_DEVICES=0 python3 -m ray.scripts.scripts start --head --num-gpus=1 --port=6379 \
        --include-dashboard=false --disable-usage-stats >"$OUT/ray_head.log" 2>&1
    CUDA_VISIBLE_DEVICES=1 python3 -m ray.scripts.scripts start --address=127.0.0.1:6379 --num-gpus=1 \
        --disable-usage-stats >"$OUT/ray_worker.log" 2>&1
    python3 -c "import ray; ray.init(address='auto'); print('ray nodes', [(n['NodeID'][:8], n['Resources'].get('GPU')) for n in ray.nodes() if n['Alive']])"
    KEEP_RAY=1 rows 2n-0.6b-separate
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
    ROW_TIMEOUT=${ROW_TIMEOUT:-500} rows 4g-8b-tp2pp2
    ;;
mega8b_resume)
    rm -rf /tmp/mg_8b_resume
    ROW_TIMEOUT=${ROW_TIMEOUT:-240} rows 4g-8b-tp2pp2-save5 4g-8b-tp2pp2-resume10
    pair 4g-8b-tp2pp2 4g-8b-tp2pp2-resume10  # steps 6..10 of the resumed run against the straight one
    rows 8g-8b-tp2pp4-plan  # beside 4g-8b-tp2pp2's per-stage peaks (its plan: OUT/8g-8b-tp2pp4-plan.plan)
    ;;
dp4)
    rows 1g-0.6b-colocate 4g-0.6b-dp4
    echo "scaling (1g step / 4g step at four times the batch): $(field 1g-0.6b-colocate median_step_s) / $(field 4g-0.6b-dp4 median_step_s)"
    ;;
*) echo "unknown: $WHAT"; exit 2 ;;
esac
python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1
nvidia-smi --query-gpu=memory.used --format=csv,noheader
