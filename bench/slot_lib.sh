# Sourced by bench/acceptance_gpu.sh and bench/acceptance_multi_gpu.sh: what a group needs to run
# beside others on one host (bench/acceptance_slots.sh sets ACCEPTANCE_SLOT and ACCEPTANCE_DEADLINE).

stop_ray() {  # what a run left of Ray on this host: not beside other slots (it would end theirs)
    [ -n "${ACCEPTANCE_SLOT:-}" ] || python3 -m ray.scripts.scripts stop --force >/dev/null 2>&1
}

limit() {  # limit SECONDS: SECONDS, or fewer where the slot's deadline comes first (10 s kept for the row)
    local left
    [ -n "${ACCEPTANCE_DEADLINE:-}" ] || { echo "$1"; return; }
    left=$(( ${ACCEPTANCE_DEADLINE%.*} - $(date +%s) - 10 ))
    [ "$left" -lt 1 ] && left=1  # `timeout 0` would mean no limit at all
    [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
