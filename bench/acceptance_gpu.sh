#!/usr/bin/env bash
# The GPU acceptance, one group per call (each under 10 minutes on one H100), from the repo root
# with ../shared/gpu's packages in /root/site. Every group appends its rows to OUT/rows.md in the
# columns of docs/gpu_acceptance.md; `python bench/acceptance_record.py OUT...` writes that page.
#
#   bash bench/acceptance_gpu.sh OUT tests_a      # multi-turn log-probs, the contract's vllm case, megatron
#   bash bench/acceptance_gpu.sh OUT tests_b      # tests_b1 then tests_b2:
#   bash bench/acceptance_gpu.sh OUT tests_b1     #   offload, mixed precision, engine errors
#   bash bench/acceptance_gpu.sh OUT tests_b2     #   vllm, teacher, judge
#   bash bench/acceptance_gpu.sh OUT tests_c      # LoRA on vLLM (adapter sync; torch and megatron)
#   bash bench/acceptance_gpu.sh OUT handover     # 0.6B, 32x8x256, 20 steps: hand-overs flat within 1 GiB
#   bash bench/acceptance_gpu.sh OUT tests_d      # DAPO's refill rounds on vLLM colocated (sleep levels 1, 2)
#   bash bench/acceptance_gpu.sh OUT docs_a       # the GPU-only commands README and docs show, 2 steps
#   bash bench/acceptance_gpu.sh OUT docs_b       #   each: half of them per group
#   bash bench/acceptance_gpu.sh OUT matrix ROW.. # bench/gpu_matrix.py rows: 0.6b-32x8x256 (20 steps, the
#                                                 #   hand-over flatness), 0.6b-64x8x512, 1.7b-torch, 4b-torch,
#                                                 #   4b-megatron; 8b-megatron on one H200 (8b-torch on a host
#                                                 #   of >=177 GiB: a 2x/4x one); 4b-megatron-80gib (an H100's
#                                                 #   79.2 GiB on a larger card, a ballast holding the rest); gkd-0.6b-1.7b,
                                                 #   calculator-vllm, sample-vllm-rm (documented runs)
#   bash bench/acceptance_gpu.sh OUT side         # TRL vs dagrl's defaults at 32x8x256, 10 steps each (same call)
#                                                 #   (side and side_64 with SIDE_TRACE=1: bench/gc_trace in every
#                                                 #   process, the summary in OUT/side.gc.out)
#   bash bench/acceptance_gpu.sh OUT side_awake   # dagrl's defaults (engine awake where it fits) vs asleep, same call
#   bash bench/acceptance_gpu.sh OUT side_dapo    # DAPO (2 rounds a step) beside GRPO's defaults, same call
#   bash bench/acceptance_gpu.sh OUT side_lora    # TRL + PEFT against dagrl LoRA, rank 64 (carry .anchors)
#   bash bench/acceptance_gpu.sh OUT side_ppo     # PPO with the critic colocated beside GRPO's defaults, same call
#   bash bench/acceptance_gpu.sh OUT side_algos   # side_dapo and side_ppo in one call: GRPO's defaults, DAPO, PPO
#   bash bench/acceptance_gpu.sh OUT tests_ppo    # the critic on the GPU (tests/backends/{torch,megatron}/test_critic_gpu.py)
#   bash bench/acceptance_gpu.sh OUT tests_e      # megatron's CPU optimizer against the device's (tests/backends/megatron/test_optimizer_gpu.py)
#   bash bench/acceptance_gpu.sh OUT memory       # the memory plan's three held-out configurations
#   bash bench/acceptance_gpu.sh OUT throughput   # sampler + RM prompts/s, multi-turn with the python tool
#   bash bench/acceptance_gpu.sh OUT side_64      # TRL at 64x8x512, then dagrl's defaults at that shape, same call
#   bash bench/acceptance_gpu.sh OUT spread       # the rollout's rep-to-rep spread against levers on vLLM's decode
#                                                 #   loop, one process each (bench/spread_group.py; carry .anchors;
#                                                 #   SPREAD_SECONDS, default 480, its budget)
#   bash bench/acceptance_gpu.sh OUT ray_probe [HOLD_S]  # this slot's own local Ray (bench/ray_probe.py)
#   bash bench/acceptance_gpu.sh OUT files GROUP FILE..  # what a deadline left of a tests group: those
#                                                 #   files of it, one row "GROUP: file, ..." (no other file)
#
# Each test file runs in a pytest process of its own: no test sees what an earlier one left on the
# card (an in-process engine keeps its pool until its process exits).
#
# Beside other groups on one host (bench/acceptance_slots.sh sets ACCEPTANCE_SLOT and
# ACCEPTANCE_DEADLINE): no `ray stop` (it ends every Ray on the host, the neighbours' too; each
# run's local Ray ends with its process), and every file or row gets at most the time left
# before the deadline; a file or row cut by it says so in its row.
set -u
OUT=${1:?OUT}
WHAT=${2:?tests_a, tests_b, tests_b1, tests_b2, tests_c, tests_d, tests_e, tests_ppo, handover, docs_a, docs_b, matrix, side, side_64, side_dapo, side_lora, side_ppo, side_algos, spread, memory, throughput, ray_probe or files}
mkdir -p "$OUT"
export PYTHONPATH=/root/site:$(pwd):${PYTHONPATH:-} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 \
  RAY_AUTH_MODE=disabled
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
DEVICE=${DEVICE:-cpu}
echo "$DEVICE"

. "$(dirname "$0")/slot_lib.sh"  # stop_ray, limit

tests() {  # tests NAME FILES...: one pytest process per file, one row for the group
    local name=$1 passed=0 total=0 rc=0 file short log line p f e cut="" lim want=${FILE_TIMEOUT:-300}
    shift
    for file in "$@"; do
        short=${file#tests/}; short=${short%.py}; short=${short//\//_}  # both critic files are test_critic_gpu.py
        log="$OUT/${name%%:*}.$short.log"  # a files group's name: "GROUP: file, ..."
        lim=$(limit "$want")
        if [ "$lim" -lt 20 ]; then  # no time left for a pytest process to start
            cut="$cut, $short not started (deadline)"; rc=124
            echo "== $file not started: the slot's deadline"
            continue
        fi
        timeout "$lim" python3 -m pytest -q -p no:cacheprovider -m gpu --durations=5 "$file" >"$log" 2>&1
        local code=$?
        [ $code -ne 0 ] && [ $code -ne 5 ] && rc=$code  # 5: nothing collected
        [ $code -eq 124 ] && [ "$lim" -lt "$want" ] && cut="$cut, $short cut by the deadline"
        line=$(grep -E "[0-9]+ (passed|failed|error)" "$log" | tail -n 1)
        p=$(echo "$line" | grep -oE "[0-9]+ passed" | grep -oE "[0-9]+"); f=$(echo "$line" | grep -oE "[0-9]+ failed" | grep -oE "[0-9]+")
        e=$(echo "$line" | grep -oE "[0-9]+ error" | grep -oE "[0-9]+")
        passed=$((passed + ${p:-0})); total=$((total + ${p:-0} + ${f:-0} + ${e:-0}))
        echo "== $file rc=$code: ${line:-no summary}"
        grep -E "^(FAILED|ERROR)" "$log" | cut -c1-300
        stop_ray
    done
    echo "| $name | $DEVICE | $rc | $passed/$total$cut | | | |" >>"$OUT/rows.md"
}

trace_on() {  # trace_on NAME: with SIDE_TRACE=1, every process of the group (TRL's, the driver, Ray's
    # workers, the in-process engine) logs its collector pauses and its threads' CPU (bench/gc_trace)
    [ "${SIDE_TRACE:-0}" = 1 ] || return 0
    export GC_TRACE_DIR="$OUT/$1/gc" PYTHONPATH="$(pwd)/bench/gc_trace:$PYTHONPATH"
}

trace_report() {  # trace_report NAME: the trace's summary per process (OUT/NAME.gc.out), its last line here
    [ -n "${GC_TRACE_DIR:-}" ] || return 0
    env -u GC_TRACE_DIR python3 bench/gc_trace_report.py "$GC_TRACE_DIR" >"$OUT/$1.gc.out" 2>&1
    tail -n 1 "$OUT/$1.gc.out" | cut -c1-600
}

side_row() {  # side_row NAME: the group's row from its SIDE lines (OUT/NAME.side.out, bench/side_row.py)
    grep -E "^==|SIDE|rc=" "$OUT/$1.side.out" | cut -c1-600
    python3 bench/side_row.py "$1" "$DEVICE" "$OUT/$1.side.out" >>"$OUT/rows.md"
}

TESTS_A=(tests/backends/vllm/test_multi_turn_gpu.py tests/backends/test_contract.py
    tests/backends/megatron/test_backend_gpu.py tests/backends/megatron/test_logprobs_gpu.py
    tests/backends/megatron/test_spec_gpu.py)
TESTS_B1=(tests/backends/torch/test_offload_gpu.py tests/backends/test_mixed_precision_gpu.py
    tests/reliability/test_engine_errors_gpu.py)
TESTS_B2=(tests/backends/vllm/test_vllm_gpu.py tests/backends/vllm/test_teacher_gpu.py tests/rewards/test_judge_gpu.py)
TESTS_C=(tests/backends/vllm/test_lora_gpu.py tests/backends/vllm/test_lora_megatron_gpu.py)
TESTS_D=(tests/e2e/test_dapo_gpu.py)
TESTS_PPO=(tests/backends/torch/test_critic_gpu.py tests/backends/megatron/test_critic_gpu.py)
TESTS_E=(tests/backends/megatron/test_optimizer_gpu.py)

group_files() {  # group_files GROUP: the test files of a tests group, one a line
    case $1 in
    tests_a) printf '%s\n' "${TESTS_A[@]}" ;;
    tests_b1) printf '%s\n' "${TESTS_B1[@]}" ;;
    tests_b2) printf '%s\n' "${TESTS_B2[@]}" ;;
    tests_c) printf '%s\n' "${TESTS_C[@]}" ;;
    tests_d) printf '%s\n' "${TESTS_D[@]}" ;;
    tests_ppo) printf '%s\n' "${TESTS_PPO[@]}" ;;
    tests_e) printf '%s\n' "${TESTS_E[@]}" ;;
    esac
}

case $WHAT in
tests_a)
    tests tests_a "${TESTS_A[@]}"
    ;;
tests_b)  # the two halves one after the other (a slot of bench/acceptance_slots.sh takes a half)
    tests tests_b1 "${TESTS_B1[@]}"
    tests tests_b2 "${TESTS_B2[@]}"
    ;;
tests_b1)
    tests tests_b1 "${TESTS_B1[@]}"
    ;;
tests_b2)
    tests tests_b2 "${TESTS_B2[@]}"
    ;;
tests_c)
    tests tests_c "${TESTS_C[@]}"
    ;;
handover)  # the README's configuration, 20 steps: flat hand-overs asserted; also its matrix row
    GPU_MATRIX_ROWS=$OUT/rows.md FILE_TIMEOUT=580 tests handover tests/trainer/test_handover_gpu.py
    ;;
tests_d)
    tests tests_d "${TESTS_D[@]}"
    ;;
docs_a | docs_b)  # half the commands each, one process per command inside the file (each up to 280 s)
    export DOCS_GPU_SHARD=$([ "$WHAT" = docs_a ] && echo 0/2 || echo 1/2)
    FILE_TIMEOUT=${FILE_TIMEOUT:-570} tests "$WHAT" tests/e2e/test_documented_gpu.py
    ;;
files)  # files GROUP FILE...: only these files of GROUP's (each must be one of its own), one row
    shift 2
    GROUP=${1:?files GROUP FILE...}
    shift
    [ $# -gt 0 ] || { echo "files $GROUP: name the files to run"; exit 2; }
    for f in "$@"; do
        group_files "$GROUP" | grep -qx "$f" || { echo "files $GROUP: $f is not one of $GROUP's: $(group_files "$GROUP" | tr '\n' ' ')"; exit 2; }
    done
    tests "$GROUP: $(printf '%s\n' "$@" | sed 's#.*/##; s#\.py$##' | paste -sd, | sed 's/,/, /g')" "$@"
    ;;
matrix)
    shift 2
    ROW_TIMEOUT=${ROW_TIMEOUT:-420} python3 bench/gpu_matrix.py "$OUT" "$@" 2>&1 | grep -E "^ROW|rror" | cut -c1-6000
    ;;
side)  # TRL, then dagrl's defaults (only the engine named), 32x8x256, STEPS each (10: the median is
    # over steps 2..N, so both get nine steps of steady state), same call: the issue's first shape
    trace_on side
    STEPS=${STEPS:-10} bash bench/vllm_gpu.sh side "$OUT/side" trl default >"$OUT/side.side.out" 2>&1
    trace_report side
    side_row side
    ;;
side_awake)  # the defaults against the same with free_cache_engine=true, 32x8x256: what the awake
    # auto gains or loses (on an 80 GiB card it turns recomputation on to fit beside the engine)
    STEPS=${STEPS:-10} bash bench/vllm_gpu.sh side "$OUT/side_awake" default asleep >"$OUT/side_awake.side.out" 2>&1
    side_row side_awake
    ;;
side_lora)  # TRL with a PEFT adapter, then dagrl with the same adapter (rank 64, all-linear), same call
    bash .anchors/side_by_side.sh >/dev/null 2>&1  # builds the anchor's model and rows only
    [ -d /tmp/trlsite ] || python3 -m pip install -q --no-index --no-deps --target /tmp/trlsite .anchors/trl/*.whl
    # 8 steps each (median over steps 2..8): with 5, one slow rollout of four warm steps moved the
    # median by 9 % (session 18: dagrl 4.98, 3.87, 4.98, 4.57 s)
    export ANCHOR_STEPS=${SIDE_LORA_STEPS:-8}
    PYTHONPATH=/tmp/trlsite:$PYTHONPATH timeout 300 torchrun --nproc_per_node 1 bench/trl_grpo_lora.py \
        >"$OUT/trl_lora.log" 2>&1
    grep -E "^SIDE|Error" "$OUT/trl_lora.log" | tail -3 | cut -c1-600
    grep -E "^SIDE" "$OUT/trl_lora.log" | tail -1 >"$OUT/side_lora.side.out"
    stop_ray
    LORA="actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=128"
    LORA="$LORA actor_rollout_ref.model.target_modules=all-linear actor_rollout_ref.actor.optim.lr=1e-5"
    STEPS=$ANCHOR_STEPS OUT=$OUT EXTRA="actor_rollout_ref.rollout.name=vllm $LORA" bash .anchors/side_by_side.sh dagrl \
        >>"$OUT/side_lora.side.out" 2>&1
    side_row side_lora
    ;;
side_dapo)  # GRPO's defaults first, then DAPO: compare their SIDE lines only with each other
    bash bench/vllm_gpu.sh side "$OUT/side_dapo" default dapo >"$OUT/side_dapo.side.out" 2>&1
    side_row side_dapo
    ;;
side_ppo)  # GRPO's defaults first, then PPO (critic colocated): compare their SIDE lines only with each other
    bash bench/vllm_gpu.sh side "$OUT/side_ppo" default ppo >"$OUT/side_ppo.side.out" 2>&1
    side_row side_ppo
    ;;
side_algos)  # side_dapo and side_ppo on one reference run (issue 32's two rows, ~8 minutes)
    bash bench/vllm_gpu.sh side "$OUT/side_algos" default dapo ppo >"$OUT/side_algos.side.out" 2>&1
    side_row side_algos
    ;;
tests_ppo)
    tests tests_ppo "${TESTS_PPO[@]}"
    ;;
tests_e)
    tests tests_e "${TESTS_E[@]}"
    ;;
memory)
    timeout "$(limit 560)" python3 bench/memory_plan_gpu.py --only 1.7b-megatron 0.6b-torch-teacher 0.6b-megatron-teacher \
        --out "${TMPDIR:-/tmp}/dagrl_memory_plan" >"$OUT/memory.log" 2>&1
    grep -E "^\{|rror" "$OUT/memory.log" | cut -c1-1500
    ;;
throughput)
    T=${TMPDIR:-/tmp}  # a slot's own
    timeout "$(limit 280)" python3 bench/sample_gpu.py --out "$T/sample_bench" >"$OUT/sample.log" 2>&1
    tail -n 3 "$OUT/sample.log" | cut -c1-1500
    [ -f "$T/q06/config.json" ] || python3 tools/random_qwen3.py "$T/q06" --hidden 1024 --layers 28 --heads 16 \
        --kv-heads 8 --intermediate 3072 --vocab 151936 --head-dim 128 >/dev/null
    timeout "$(limit 280)" python3 bench/multi_turn_gpu.py --model "$T/q06" --tool python --reps 2 >"$OUT/multi_turn.log" 2>&1
    grep -E "MULTI_TURN|rror" "$OUT/multi_turn.log" | tail -n 4 | cut -c1-1500
    ;;
side_64)  # the side-by-side's second shape, 64 prompts x 8 x 512 tokens: TRL, then dagrl's defaults on
    # the same model and rows (STEPS 6: TRL's first step alone takes over a minute), same call
    trace_on side_64
    ANCHOR_PROMPTS=64 ANCHOR_LEN=512 STEPS=${STEPS:-6} bash bench/vllm_gpu.sh side "$OUT/side_64" trl default64 \
        >"$OUT/side_64.side.out" 2>&1
    trace_report side_64
    side_row side_64
    ;;
side_64_awake)  # default64 against the same told to sleep, 64x8x512, 6 steps each: on a 140 GiB card the
    # awake auto turns recomputation on at this shape, asleep the update fits without it
    ANCHOR_PROMPTS=64 ANCHOR_LEN=512 STEPS=${STEPS:-6} bash bench/vllm_gpu.sh side "$OUT/side_64_awake" default64 asleep64 \
        >"$OUT/side_64_awake.side.out" 2>&1
    side_row side_64_awake
    ;;
spread)  # the rollout's spread (2.0-3.4 s for the same 32x8x256 tokens): bench/generate_spread.py's
    # settings at 32x8x256 (7 reps), one engine per process, then ours and the best at 64x8x512 (4
    # reps) while SPREAD_SECONDS lasts (from the group's start; the slot's deadline first)
    START=$(date +%s)
    if python3 .anchors/build_anchor.py /tmp/anchor_q06b /tmp/anchor_data >"$OUT/spread.anchor.log" 2>&1; then
        python3 bench/spread_group.py "$OUT/spread" --model /tmp/anchor_q06b --data /tmp/anchor_data/train.parquet \
            --deadline $((START + ${SPREAD_SECONDS:-480})) --device "$DEVICE" --rows "$OUT/rows.md" >"$OUT/spread.log" 2>&1
        grep -E "^(==|\| spread)|rror" "$OUT/spread.log" | cut -c1-600
    else
        echo "| spread | $DEVICE | 1 | .anchors/build_anchor.py failed (carry .anchors): spread.anchor.log | | | |" >>"$OUT/rows.md"
        tail -n 3 "$OUT/spread.anchor.log"
    fi
    ;;
ray_probe)  # the check of bench/acceptance_slots.sh: a driver's ray.init() starts this slot's own Ray
    python3 bench/ray_probe.py "$OUT" "${3:-0}" "$DEVICE" 2>&1 | tee -a "$OUT/ray_probe.log" | grep -E "^PROBE|rror"
    ;;
*) echo "unknown: $WHAT"; exit 2 ;;
esac
stop_ray
[ -n "${ACCEPTANCE_SLOT:-}" ] || nvidia-smi --query-gpu=memory.used --format=csv,noheader
