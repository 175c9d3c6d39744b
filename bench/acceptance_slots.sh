#!/usr/bin/env bash
# Several GPU acceptance groups at once on one multi-GPU host, one card (or one set of cards) each,
# so that one lease of a 4-GPU machine does the work of four one-GPU leases (device time is counted
# per machine-second, whatever the card count). From the repo root, after the install calls:
#
#   bash bench/acceptance_slots.sh OUT SLOT...     SLOT = CARDS:GROUP[+GROUP...]
#   bash bench/acceptance_slots.sh OUT 0:tests_a 1:handover+tests_c 2:"matrix 4b-torch" 3:docs_a
#   bash bench/acceptance_slots.sh OUT 0:tests_b1 1:tests_c 2,3:tp
#
# GROUP is a group of bench/acceptance_gpu.sh (one card) or of bench/acceptance_multi_gpu.sh (2 or
# 4 cards), with its arguments (`matrix ROW...`). A slot's groups run one after the other, the slots
# at once (bench/acceptance_slots.py), each slot with:
#   - a copy of the checkout of its own (no .git, .gpu or earlier runs' outputs/checkpoints; .anchors
#     and .base only for side groups): checkpoints and run directories under the cwd are the slot's;
#   - CUDA_VISIBLE_DEVICES = its cards (the multi-GPU rows' CUDA_VISIBLE_DEVICES are the first cards
#     of that list: bench/multi_gpu_rows.py visible());
#   - TMPDIR = RAY_TMPDIR = a directory of its own (/tmp/dagrl_slots/2_3/tmp, short: Ray's socket
#     paths must stay under 107 bytes): Ray's sessions, sockets and address file, pytest's tmp_path,
#     tempfile's run directories; RAY_ADDRESS unset;
#   - VLLM_CACHE_ROOT, TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR of its own, kept from call to call
#     (/tmp/dagrl_slots/2_3/cache): two slots never compile into one cache at once;
#   - ACCEPTANCE_SLOT (the group scripts then never `ray stop`: it ends every Ray on the host, the
#     neighbours' too) and ACCEPTANCE_DEADLINE: the groups end by SLOTS_SECONDS (default 580) - 20 s
#     after the start; a file or row gets at most the time left and says in its row when the deadline
#     cut it; a group still running at the deadline is ended (its whole session) and the runner
#     writes its row ("cut by the deadline after N s"); a group with < 30 s left is "not started".
# At the end: OUT/rows.md (every slot's rows in docs/gpu_acceptance.md's columns, the device column
# naming the cards; `python bench/acceptance_record.py` reads it as it reads a one-GPU call's),
# OUT/logs.tgz (every log of every slot; a log's last MiB where the whole would pass 15 MiB), one
# SLOT line per slot, then `ray stop --force` once and each card's memory in use.
#
# Isolation, and how it was checked:
#   - Ray: dagrl's driver calls ray.init(address="local") (dagrl/trainer/setup.py) and the tests'
#     session Ray too (tests/conftest.py): always a new cluster. A bare ray.init() joins one only
#     through RAY_ADDRESS (unset here) or a `ray start` address file in Ray's temp dir (the slot's
#     TMPDIR). Each such local Ray dies with its driver (Ray starts it with kill-on-parent-death), so
#     no `ray stop` is needed between files. The `ray_probe` group checks it in the slot: its Ray's
#     session dir is under the slot's TMPDIR, Ray counts the slot's cards only, a GPU task lands on one
#     of them, and the cluster stays up while neighbours start and end theirs. On the CPU:
#     tests/bench/test_acceptance_slots.py (two slots at once, distinct clusters, one slot cut).
#   - Random-weight models: /tmp/dagrl_models is shared on purpose (the 8B's build takes ~45 s): one
#     slot builds under a lock while the others wait, and the directory appears whole
#     (bench/real_size_gpu.py build). Other fixed paths of bench/: multi_gpu_rows' kept rows
#     (/tmp/dagrl_multi_gpu_rows, one file per row: a multi-GPU group twice in one call is refused),
#     /tmp/dagrl_gsm8k and /tmp/mg_8b_resume (4-GPU groups only); throughput and memory now write
#     under TMPDIR.
#   - Groups that must own the host are refused beside other slots (a call of one slot runs them):
#     two_nodes (`ray start --port=6379`, its address file and its `ray stop`); the side-by-sides
#     side, side_64, side_dapo, side_ppo, side_algos, side_lora, side_awake, side_64_awake (a ratio of timings taken one after the other in
#     the call, which neighbours in other phases would skew; and .anchors/side_by_side.sh uses the
#     fixed /tmp/dagrl_side); separate, dp2, dp4 (GB/s against a floor, scaling ratios); spread
#     (bench/spread_group.py: seconds of vLLM's CPU-bound decode loop, which neighbours' CPU work
#     would move; it reads .anchors/ as the side groups do, carry it).
#     Every other row's step seconds are taken beside neighbours (the rows say which cards): they
#     share the host's CPUs, memory bandwidth and PCIe; read their timings as such.
#   - The GPU tests take their slot's cards and free ports (tests/gpu_runs.py) and end only their own
#     runs' process sessions, never a host-wide `ray stop`.
#   - Host memory is shared: each slot's plan still checks the whole host's (trainer.host_memory_gib
#     is detected), so the runner refuses two host-heavy matrix rows in one call (bench/gpu_matrix.py
#     HOST_HEAVY: 8b-torch, 8b-megatron, 4b-megatron-80gib, each 77-159 GiB planned; 8b-torch beside
#     4b-megatron-80gib filled a 251 GiB host in session 28).
#   - Device time: before anything starts the runner prints each slot's estimate (bench/slot_estimate.py:
#     every group's and row's seconds as the slowest host measured them, each model the slot's rows
#     still need built, and empty compile caches on a fresh machine) and refuses a call with a slot
#     past its deadline or a matrix row past ROW_TIMEOUT, a line each with what to do (SLOTS_OVER=1
#     runs it anyway: a cut group costs the whole call and runs again). On the CPU, nothing started,
#     with the call's SLOTS_SECONDS and ROW_TIMEOUT in front:
#       python3 bench/acceptance_slots.py --estimate --fresh SLOT...    (--warm: a later call of a lease)
#     Every command below passes it where it stands (tests/bench/test_acceptance_slots.py: in order,
#     on one machine, fresh again where the text says "fresh machine").
#
# FIRST (after session 37: only one H200 lent since session 33, no 2x or 4x). Session 33 brought back the fixes held
# back in session 32 (a2db017: `git log --grep "Held back"`; CI green); sessions 33, 34 and 35 ran on
# its `dagrl/` the whole one-GPU record that one H200 host holds: ray_probe, tests_a, tests_b1,
# tests_b2, tests_c, tests_d, tests_ppo, handover (its 0.6B row), docs_a, calculator-vllm, docs_b
# and the rows 4b-megatron, 4b-megatron-80gib, 4b-torch, 1.7b-torch, 8b-megatron, 8b-megatron-lora,
# 8b-torch-lora, sample-vllm-rm and gkd-0.6b-1.7b all passed (docs/gpu_acceptance.md "Session 33",
# "Session 34", "Session 35"; those hosts ran each group in ~0.6-0.9x its estimate). `dagrl/` stays
# a2db017's until issues 30 and 34 pass on it: any change of `dagrl/` puts the whole record (the
# CALL PLAN) back. Sessions 36 and 37 ran the side-by-sides on it too (side, side_64, side_64_awake,
# side_lora, side_algos, side_awake): none of them is left.
# What is left, in this order, by the kind `status` lends:
#   1. Of the one-GPU record: 8b-torch, only on a 2x or 4x host (its plan keeps 159.3 GiB on the host;
#      a plan may take 90 % of it: one H200 machine's 126 GiB refuses it, rc 2, session 34). (tests_e,
#      megatron's CPU optimizer against the device's, passed in its own file in session 36.) On 2x
#      H200, in issue 30's last lease (below). On 4x H200, a fresh machine, with issue 30's tp and pp
#      beside it:
#        bash bench/acceptance_slots.sh $OUT 0:ray_probe 2,3:tp
#        SLOTS_SECONDS=600 ROW_TIMEOUT=540 bash bench/acceptance_slots.sh $OUT 0:"matrix 8b-torch" 2,3:pp
#   2. Issue 30 on the same `dagrl/` (the plan counts the communicators; its rows are to read within
#      +-15 % of it; 1g-0.6b-colocate, the separate rows, dp2 and dp4 ask for the engine's log-probs,
#      for the mismatch metric). `separate`'s rows passed on 2x H200 in session 37 (its broadcast:
#      below). On 2x H200, a fresh machine (pp after tp on the same warm machine: it compares with
#      tp's one-GPU row; ~1,565 s at the fresh estimates with the installs):
#        bash bench/acceptance_slots.sh $OUT 0,1:tp
#        bash bench/acceptance_slots.sh $OUT 0,1:pp
#        bash bench/acceptance_slots.sh $OUT 0,1:dp2
#      then a fresh machine (~1,250 s with the installs):
#        bash bench/acceptance_slots.sh $OUT 0,1:gkd3a
#        bash bench/acceptance_slots.sh $OUT 0,1:gkd3b
#        bash bench/acceptance_slots.sh $OUT 0,1:two_nodes
#      then a fresh machine (the 8B's build in big; ~1,100 s with the installs and 1.'s 8b-torch):
#        bash bench/acceptance_slots.sh $OUT 0,1:big
#        SLOTS_SECONDS=600 ROW_TIMEOUT=540 bash bench/acceptance_slots.sh $OUT 0:"matrix 8b-torch"
#      (On 4x H200 tp and pp beside 1.'s probe and 8b-torch, then `0,1:gkd3a 2,3:gkd3b`; dp2 alone,
#      a call of its own; then big and two_nodes.) The separate sync's broadcast read 0.41 of a raw
#      NCCL broadcast of the 0.6B's 1.19 GB in session 32 and 0.53-0.62 on a2db017's recipe in
#      session 37 (the whole sync 14-15 ms a step); issue 30 asks 0.8. The same path alone
#      (bench/weight_broadcast_gpu.py, two 256 MiB buffers) read 0.90 at the 0.6B's bytes and 0.89
#      at the 8B's in the same call: inside the run the wire takes 5.1-5.9 ms against the bench's
#      3.5 (docs/gpu_acceptance.md "Session 37"). To find where: the rows' weight_sync/* parts
#      beside the bench's, e.g. the engine's card busy between steps.
#   3. Issue 34's 4-GPU groups (below, "The 4-GPU groups") on the same `dagrl/`, when a 4-GPU host is
#      lent: mega8b, mega8b_save, mega8b_resume one lease (~1,345 s); gkd4_colocate, gkd4_split and
#      dp4 another (~1,610 s).
#   Issues 30 and 34 close on one `dagrl/`: a change of `dagrl/` between their leases re-runs the
#   rows before it. (side_64_awake, session 36: asleep without recomputation 0.85x the awake
#   engine's step at 64x8x512 on one H200, docs/perf.md.)
# A group a deadline cuts: its rows say which files it did not start; run those with
#   `files GROUP FILE...` (bench/acceptance_gpu.sh), e.g. 0:"files tests_c tests/backends/vllm/test_lora_megatron_gpu.py".
#   Any change of `dagrl/` puts the whole record below (the CALL PLAN) back in front of the final
#   acceptance.
# CALL PLAN for the whole one-GPU record on nvidia-h200-x4 (5 install calls, then 3 calls of ~550,
# ~555 and ~535 s at the estimates; session 31 took 477, 538 and 429 s, 1,618 s held with the
# installs and torch_startup's 73 s: one 30-minute lease):
# docs/gpu_acceptance.md's rows but the side-by-sides, on one commit. ~6,100 card-seconds at
# bench/slot_estimate.py's figures (session 29's 4x H200, the slowest host; session 18's ~4,100).
# At most one host-heavy row a call (8b-torch, 8b-megatron, 4b-megatron-80gib). The groups measured
# on fresh machines (tests_b1, 4b-torch, 4b-megatron-80gib) run first: empty caches add nothing to
# them, while docs_a on empty caches takes ~540 s against ~380.
#   call 1, a fresh machine (ray_probe first on every card: the isolation, checked on the cards; the
#   0.6B, 1.7B and 4B built):
#     bash bench/acceptance_slots.sh $OUT 0:ray_probe+"matrix sample-vllm-rm"+tests_c 1:ray_probe+tests_b1 2:ray_probe+"matrix 4b-torch 1.7b-torch" 3:ray_probe+"matrix 4b-megatron-80gib"
#   call 2 (the 8B built by 8b-torch):
#     ROW_TIMEOUT=480 bash bench/acceptance_slots.sh $OUT 0:"matrix 8b-torch" 1:tests_a+tests_b2 2:"matrix 4b-megatron"+tests_ppo 3:"matrix calculator-vllm"+docs_a
#   call 3 (8b-megatron needs ROW_TIMEOUT ~480: 440 s for its 10 steps):
#     ROW_TIMEOUT=480 bash bench/acceptance_slots.sh $OUT 0:"matrix 8b-torch-lora"+docs_b 1:"matrix 8b-megatron-lora"+tests_d 2:"matrix 8b-megatron" 3:"matrix gkd-0.6b-1.7b"+handover
#   Groups a deadline cut anyway, one per card, e.g. (~291 s with the caches filled; tests_e, the CPU
#   optimizer against the device's, beside tests_c):
#     SLOTS_SECONDS=320 bash bench/acceptance_slots.sh $OUT 0:tests_c+tests_e 1:docs_b 2:tests_d 3:tests_ppo
#   The side-by-sides (issue 31's and issue 29's ratios against TRL) run alone, a call each, on a
#   later lease (side_lora took 313-421 s with 8 steps a system):
#     bash bench/acceptance_slots.sh $OUT 0:side_lora
#     bash bench/acceptance_slots.sh $OUT 0:side
#   On an H100 (nvidia-h100-x1; session 20's lease counted all of its held time): side_64 (~9
#   minutes), "matrix 4b-torch" (~5 with its build) and "matrix 0.6b-64x8x512" (~4) in calls of
#   their own (issue 29's 80 GiB rows; after the 4B row in one call the deadline cut the 0.6B at 8
#   steps in session 20; bench/slot_estimate.py's figures are H200 hosts').
#   A later lease of this kind: the 2-GPU groups of bench/acceptance_multi_gpu.sh that fit card pairs
#   (pp after tp on the same warm machine: it compares with tp's one-GPU row; big: 8B, ~10, may be
#   cut at 9.3, its CPU optimizer ~128 GiB of host):
#     bash bench/acceptance_slots.sh $OUT 0,1:tp 2,3:gkd3a
#     bash bench/acceptance_slots.sh $OUT 0,1:pp 2,3:gkd3b
#   A group that is cut or fails is named in its SLOT line; re-run it (alone or in a slot) next.
# On nvidia-h200-x2 or h100-x2 (2 cards; the lease counts all of its held time): six calls of two
#   slots in two leases of three (~1,600 and ~1,500 s at the estimates with the installs), then
#   tests_d beside the side-by-sides' lease; `dagrl/` unchanged between them (a record names one
#   `dagrl/`). Each lease starts on a fresh machine (its first call on empty caches, the models to
#   build). The first lease:
#     bash bench/acceptance_slots.sh $OUT 0:ray_probe+tests_b1 1:ray_probe+"matrix 4b-megatron-80gib"
#     ROW_TIMEOUT=480 bash bench/acceptance_slots.sh $OUT 0:"matrix 8b-torch" 1:tests_a+tests_b2
#     ROW_TIMEOUT=480 bash bench/acceptance_slots.sh $OUT 0:"matrix 8b-megatron" 1:"matrix 4b-megatron"+docs_b
#   the second, on a fresh machine:
#     bash bench/acceptance_slots.sh $OUT 0:"matrix 4b-torch"+tests_c 1:"matrix 8b-megatron-lora"+tests_e
#     bash bench/acceptance_slots.sh $OUT 0:"matrix sample-vllm-rm gkd-0.6b-1.7b" 1:"matrix 8b-torch-lora"+tests_ppo
#     bash bench/acceptance_slots.sh $OUT 0:"matrix 1.7b-torch"+handover 1:"matrix calculator-vllm"+docs_a
#   and with the side-by-sides (alone, below), on a third:
#     bash bench/acceptance_slots.sh $OUT 0:tests_d
#   (8b-torch and 4b-megatron-80gib in one call filled the 251 GiB host in session 28: one
#   host-heavy row a call.)
# Run alone (a one-GPU lease, or a call of one slot here): side (~7: TRL ~3.5 then dagrl's
#   defaults ~3, 10 steps each at 32x8x256), side_64 (~9: TRL ~5 then dagrl's defaults ~4, 6 steps
#   each at 64x8x512), side_lora (~7), side_ppo (~5); the 2-GPU separate and dp2
#   (~9 each), two_nodes (~6). Seven calls of ~9 minutes in all: not in the x4 lease above.
# The 4-GPU groups (bench/acceptance_multi_gpu.sh) each take a whole 4-GPU host: one per call,
#   gkd4_colocate (~9; 8.5 on 4x H200), gkd4_split (~8), mega8b (~10), mega8b_save and mega8b_resume
#   (~6 each, after mega8b on the same warm machine), dp4 (~9, alone: a scaling ratio): 6 calls, two
#   x4 sessions. On an 8-GPU host two at once:
#     bash bench/acceptance_slots.sh $OUT 0,1,2,3:gkd4_colocate 4,5,6,7:gkd4_split
#     bash bench/acceptance_slots.sh $OUT 0,1,2,3:mega8b 4,5:tp 6,7:gkd3a
#   then mega8b_save, mega8b_resume (same warm machine) and dp4 in calls of one slot.
set -u
OUT=${1:?OUT}
shift
export PYTHONPATH=/root/site:$(pwd):${PYTHONPATH:-} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 \
  RAY_AUTH_MODE=disabled
python3 bench/acceptance_slots.py "$OUT" "$@"
RC=$?
# once, at the very end: whatever a cut run left of Ray (SLOTS_RAY_STOP=0 where other Rays of the
# host are not this call's, as on a shared CPU machine)
[ "${SLOTS_RAY_STOP:-1}" = 0 ] || python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1
# a process the deadline (or ray stop) just killed gives its card back a few seconds later (session
# 26: 49 GiB read right after a cut 8B row, 0 at the next call): wait up to 30 s for every card to
# read under 100 MiB, then print them, and name what still holds memory
if command -v nvidia-smi >/dev/null; then
    for _ in $(seq 30); do
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | awk '$1 >= 100 {busy=1} END {exit !busy}' || break
        sleep 1
    done
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
fi
exit $RC
