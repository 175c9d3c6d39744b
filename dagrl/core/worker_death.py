"""A dead Ray worker, told in one line: its role, rank, node and the last error it left.

Ray's ActorDiedError names an actor id and a paragraph of possible causes; a user needs to know
which of their roles died, where, and why. The "why" is the last line the worker printed to its
stderr log (a Python fatal error, an OOM kill notice, a NCCL abort), or Ray's own reason when
that log is not on this machine.
"""

from __future__ import annotations

import glob
import os
import re

from dagrl.errors import WorkerDiedError

_DEAD_BECAUSE = re.compile(r"The actor is dead because ([^.\n]*)")
_EXIT_DETAIL = re.compile(r"Worker exit detail: ([^.\n]*)")


def worker_died(exc: Exception, pools: list) -> WorkerDiedError:
    """The WorkerDiedError for a RayActorError raised by a call into one of `pools`."""
    actor_id = getattr(exc, "actor_id", None)
    for pool in pools:
        for rank, actor in enumerate(pool.actors):
            if actor_id is not None and actor._actor_id.hex() == actor_id:
                info = pool.infos[rank] if rank < len(pool.infos) else {}
                return WorkerDiedError(
                    f"worker died: role {'+'.join(pool.roles)}, rank {rank}, node {info.get('ip', '?')}"
                    f" (pid {info.get('pid', '?')}): {last_error(exc, info.get('pid'))}"
                )
    return WorkerDiedError(f"worker died (actor {actor_id}): {last_error(exc, None)}")


def last_error(exc: Exception, pid: int | None) -> str:
    """Ray's reason in a few words (first sentences only: the rest is a list of possible causes),
    then the last line the worker wrote to its stderr, when its log is on this machine."""
    text = str(exc)
    because, detail = _DEAD_BECAUSE.search(text), _EXIT_DETAIL.search(text)
    reason = because.group(1).strip() if because else text.strip().splitlines()[0]
    if detail:
        reason += f" ({detail.group(1).strip()})"
    line = _last_log_line(pid) if pid else None
    return f"{reason}; last line of its log: {line}" if line else reason


def _last_log_line(pid: int) -> str | None:
    """The last non-blank line of the worker's stderr log in this machine's Ray session, if any."""
    try:
        import ray

        logs = ray._private.worker.global_worker.node.get_logs_dir_path()
    except Exception:  # not the node that started Ray, or Ray already shut down
        logs = "/tmp/ray/session_latest/logs"
    for path in glob.glob(os.path.join(logs, f"worker-*-{pid}.err")):
        try:
            with open(path, errors="replace") as f:
                lines = [ln.strip() for ln in f.readlines()[-50:]]
        except OSError:
            continue
        # Ray writes ":task_name:" / ":actor_name:" markers into the log; they are not errors
        lines = [ln for ln in lines if ln and not re.match(r"^:\w+:", ln)]
        if lines:
            return lines[-1]
    return None
