"""A spare Ray worker kept ready for the test session's next run (test infrastructure only).

Most of an in-process run's cost on CI's 2 cores is its worker's start: a process that imports
torch, transformers and dagrl (3-6 s of CPU) before the actor's constructor runs. Ray hands an actor an
idle worker of the driver's job if it has one, but starts idle workers only when the driver
connects; after that, every actor waits for a fresh process. A run's driver mostly waits on its
workers, so one core is idle for much of a run: this keeper asks the raylet to start a worker
whenever none is idle (its PrestartWorkers call, which Ray's Python API does not expose), and the
session's Ray preloads `PRELOAD` into every worker it starts. The next run's first actor then
finds a process with its imports done. The actor's code, its constructor and everything a test
checks are the same; only when the imports happened moves. Measured, paired on the 2-core box
(13 tests of 1-step runs: test_multi_turn_distill_run, the estimator presets, test_run_failures,
DAPO, packing): 92.5 / 91.9 s without, 78.9 / 81.3 s with.

Best effort: if the raylet or the call is not there (another Ray version), the keeper stops and
the session runs as it would without it; a Ray whose GCS refuses `system_config()`'s settings (it
exits, and ray.init times out after ~30 s) is started again without them, once a session.
"""

from __future__ import annotations

import threading

# what every worker of a run imports before it builds its backends (dagrl/core/worker.py, the torch
# train backend, the hf rollout, the shipped models' Qwen2 classes); nothing that patches or
# registers beyond what those imports do in every run's worker anyway
PRELOAD = (
    "torch",
    "transformers",
    "transformers.models.qwen2.modeling_qwen2",
    "dagrl.core.worker",
    "dagrl.backends.torch.train",
    "dagrl.backends.hf.rollout",
)
POLL_S = 0.5
usable = True  # False once a Ray refused system_config() (tests/conftest.py: start_local_ray)
STARTING_S = 5.0
KEEP_ALIVE_S = 3600  # Ray would otherwise reap an idle worker above its soft limit after ~1 s


def system_config() -> dict:
    """ray.init's `_system_config` for the session's Ray: every worker it starts imports PRELOAD.
    The two workers Ray would start when the driver connects are not started: watched, the first
    run's actor was not given one (their PRELOAD was ~12 s of CPU for nothing); the keeper's are."""
    return {"preload_python_modules": list(PRELOAD), "prestart_worker_first_driver": False}


def keep_one_spare() -> threading.Event:
    """Start the keeper for the Ray this process is connected to; set the returned event to stop
    it (it also stops by itself when that Ray is shut down)."""
    stop = threading.Event()
    threading.Thread(target=_keep, args=(stop,), name="spare-ray-worker", daemon=True).start()
    return stop


def _keep(stop: threading.Event) -> None:
    import ray

    try:
        node = ray._private.worker._global_node
        raylet = _raylet_process(node)
        prestart = _prestarter(node, ray._private.worker.global_worker.current_job_id.binary())
    except Exception:  # noqa: BLE001 - another Ray's internals: run without a spare
        return
    while not stop.wait(POLL_S):
        if ray._private.worker._global_node is not node or not raylet.is_running():
            return  # the session's Ray was shut down (a test that needs a cluster of its own)
        try:
            if not _spares(raylet):
                prestart()
                # the raylet forks it a moment later: do not ask twice for the same spare
                for _ in range(int(STARTING_S / POLL_S)):
                    if _spares(raylet) or stop.wait(POLL_S):
                        break
        except Exception:  # noqa: BLE001 - the Ray went away between the check and the call
            return


def _raylet_process(node):
    import psutil

    return psutil.Process(node.all_processes["raylet"][0].process.pid)


def _spares(raylet) -> int:
    """Worker processes of the raylet that no actor or task holds: idle, or still starting."""
    import psutil

    count = 0
    for proc in raylet.children():
        try:
            if proc.name() == "ray::IDLE" or "default_worker.py" in " ".join(proc.cmdline()):
                count += 1
        except psutil.Error:
            continue
    return count


def _prestarter(node, job_id: bytes):
    import grpc
    from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc

    stub = node_manager_pb2_grpc.NodeManagerServiceStub(
        grpc.insecure_channel(f"{node.node_ip_address}:{node.node_manager_port}")
    )
    request = node_manager_pb2.PrestartWorkersRequest(
        language=common_pb2.PYTHON, job_id=job_id, keep_alive_duration_secs=KEEP_ALIVE_S, num_workers=1
    )
    return lambda: stub.PrestartWorkers(request, timeout=10)
