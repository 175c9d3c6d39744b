"""One slot's own Ray, checked (bench/acceptance_slots.sh; `acceptance_gpu.sh OUT ray_probe HOLD_S`).

A driver's `ray.init()` as the tests and dagrl's runs start it: dagrl's driver passes
address="local" (a new cluster whatever runs on the host); a bare `ray.init()` joins a cluster
only through RAY_ADDRESS or the address file of a `ray start` in Ray's temp dir, which is under the
slot's own TMPDIR. The probe starts a local Ray with no address, as a test might, and checks:

- its session directory is under this slot's TMPDIR (so its sockets, logs and address file are);
- no RAY_ADDRESS steers it elsewhere;
- on a GPU host, Ray counts exactly the slot's cards, and a one-GPU task lands on one of them;
- it stays alive for HOLD_S seconds, a task every second: a neighbour slot's `ray stop` or
  cluster start would end or disturb it.

Prints `PROBE {json}` (GCS address, session directory, cards, checks) and appends the group's row
to OUT/rows.md in docs/gpu_acceptance.md's columns (steps: checks passed/total).

    python bench/ray_probe.py OUT HOLD_S DEVICE
"""

from __future__ import annotations

import json
import os
import sys
import time


def task_card() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def ping() -> int:
    return os.getpid()


def probe(hold_s: float) -> tuple[dict, dict[str, bool]]:
    """(what the driver's Ray is, check name -> passed)."""
    import ray

    cards = [c for c in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if c]
    ray.init(num_cpus=1, include_dashboard=False, configure_logging=False, log_to_driver=False)
    session = ray._private.worker._global_node.get_session_dir_path()
    gpus = int(ray.cluster_resources().get("GPU", 0))
    info = {
        "gcs": ray.get_runtime_context().gcs_address,
        "session": session,
        "cards": cards,
        "ray_gpus": gpus,
        "pid": os.getpid(),
    }
    tmp = os.path.realpath(os.environ.get("TMPDIR", "/tmp"))
    checks = {
        "session under the slot's TMPDIR": os.path.realpath(session).startswith(tmp + os.sep),
        "no RAY_ADDRESS": not os.environ.get("RAY_ADDRESS"),
    }
    if gpus:  # a GPU host: Ray sees the slot's cards, and nothing else
        checks["Ray counts the slot's cards"] = not cards or gpus == len(cards)
        on_card = ray.get(ray.remote(num_gpus=1)(task_card).remote())
        info["task_card"] = on_card
        checks["a GPU task lands on a slot's card"] = not cards or on_card in cards
    print("PROBE_UP " + json.dumps(info), flush=True)  # what a hold cut short still shows

    remote_ping = ray.remote(num_cpus=0)(ping)
    alive, end = True, time.time() + hold_s
    while alive and time.time() < end:
        try:
            ray.get(remote_ping.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - whatever ended the cluster, the check failed
            alive = False
        time.sleep(1)
    checks[f"alive for {hold_s:g} s"] = alive
    ray.shutdown()
    return info, checks


def main() -> None:
    out, hold_s, device = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    os.makedirs(out, exist_ok=True)
    info, checks = probe(hold_s)
    failed = [name for name, ok in checks.items() if not ok]
    print("PROBE " + json.dumps({**info, "checks": checks}), flush=True)
    with open(os.path.join(out, "rows.md"), "a") as f:
        passed = len(checks) - len(failed)
        f.write(f"| ray_probe | {device} | {int(bool(failed))} | {passed}/{len(checks)} | | | |\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
