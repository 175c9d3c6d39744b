#!/usr/bin/env bash
# GKD with one of ms-swift's three placements, after checking that this machine shows enough GPUs.
#
#   bash run_scripts/gkd/run.sh CONFIG [overrides...]
#
# CONFIG: a preset name (rollout_colocate_teacher_colocate | rollout_separate_teacher_colocate |
#         rollout_colocate_teacher_standalone, or gkd/<name>; conf/experiment/gkd/<name>.yaml), or the
#         path of a YAML file of your own, in dagrl's keys or ms-swift's Ray form, run as it is written
#         (python -m dagrl.main --config FILE), e.g. examples/ms_swift/rollout_colocate_teacher_colocate.yaml.
# Dotted overrides go last, e.g.
#   CUDA_VISIBLE_DEVICES=0,1 bash run_scripts/gkd/run.sh rollout_colocate_teacher_standalone \
#     actor_rollout_ref.model.path=/models/Qwen3-0.6B teacher.model=/models/Qwen3-8B \
#     data.train_files=~/data/gsm8k/train.parquet data.val_files=~/data/gsm8k/test.parquet
#
# The GPUs the placement needs come from dagrl's own plan (a dry run of the same command):
# colocate: the train GPUs; separate: train + rollout; standalone teacher: + teacher.gpus.
# They are compared with CUDA_VISIBLE_DEVICES (or nvidia-smi's count when it is unset).
# With trainer.dry_run=true only the plan is printed and no GPU is needed.
set -euo pipefail
CONFIG=${1:?usage: run.sh CONFIG [overrides...] (CONFIG: a preset under conf/experiment/gkd/ or a .yaml file)}
shift
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PRESETS="$ROOT/dagrl/conf/experiment/gkd"
NAME=$(basename "${CONFIG%.yaml}")
if [ -f "$CONFIG" ] && [ "$(cd "$(dirname "$CONFIG")" && pwd)" != "$PRESETS" ]; then
    EXPERIMENT=(--config "$CONFIG")  # the user's own file, never the shipped preset of that name
else
    case "$CONFIG" in
        "$NAME" | "$NAME.yaml" | "gkd/$NAME" | "gkd/$NAME.yaml") ;;  # dagrl names the nearest preset if none
        *) [ -f "$CONFIG" ] || { echo "run.sh: no such file: $CONFIG" >&2; exit 2; } ;;
    esac
    EXPERIMENT=("experiment=gkd/$NAME")
fi
PY=${PYTHON:-python3}

if [[ " $* " == *" trainer.dry_run=true "* ]]; then
    exec "$PY" -m dagrl.main "${EXPERIMENT[@]}" "$@"
fi

# the plan of this exact command: "cluster: N node(s) × G GPU(s), U used" and one line per group
PLAN=$("$PY" -m dagrl.main "${EXPERIMENT[@]}" "$@" trainer.dry_run=true 2>&1) || { echo "$PLAN" >&2; exit 1; }
NEEDED=$(echo "$PLAN" | sed -n 's/^cluster: .*, \([0-9][0-9]*\) used$/\1/p' | tail -n 1)
if [ -z "$NEEDED" ]; then
    echo "$PLAN" >&2
    echo "run.sh: could not read the GPU count from the plan above" >&2
    exit 1
fi
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    VISIBLE=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c '[^[:space:]]' || true)
    WHERE="CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES exposes $VISIBLE"
else
    VISIBLE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    WHERE="nvidia-smi lists $VISIBLE"
fi
if [ "$VISIBLE" -lt "$NEEDED" ]; then
    echo "$PLAN" | grep -E '^(cluster|group|  [a-z_]+:)' >&2
    echo "run.sh: $NAME needs $NEEDED GPU(s) (the plan above); $WHERE." \
        "Expose $NEEDED GPUs (e.g. CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((NEEDED - 1)))) or shrink the plan" \
        "(trainer.n_gpus_per_node, placement.gpus.*, teacher.gpus)." >&2
    exit 1
fi
exec "$PY" -m dagrl.main "${EXPERIMENT[@]}" "$@"
