"""Checks of the run's outside world that fail before any worker starts: the output directory
(creatable, writable, room for one checkpoint), the checkpoint resume_mode names, the Ray address.

Each failure is a ConfigError naming the key, the value and the fix. Nothing here creates files.
"""

from __future__ import annotations

import os
import shutil
import socket
import time

from dagrl.config.placement import Plan
from dagrl.config.roles import Role
from dagrl.config.schema import DagrlConfig
from dagrl.errors import ConfigError
from dagrl.registry import BACKENDS
from dagrl.trainer import checkpoint

RAY_CONNECT_TIMEOUT_S = 10.0


def check_run_outside(cfg: DagrlConfig, plan: Plan, params: int | None) -> None:
    """All preflight checks. `params`: the model's parameter count (None skips the space check)."""
    ancestor = check_output_dir(cfg.trainer.default_local_dir)
    # a dry run prints the plan, often on another machine than the one that trains: no disk figure
    if cfg.trainer.save_freq > 0 and params is not None and not cfg.trainer.dry_run:
        check_free_space(cfg, plan, params, ancestor)
    check_resume_mode(cfg.trainer.resume_mode)
    check_ray_address(cfg.trainer.ray_address)


def check_output_dir(value: str) -> str:
    """The directory must be creatable and writable; returns its nearest existing ancestor (itself
    when it exists)."""
    key = "trainer.default_local_dir"
    if not value or not value.strip():
        raise ConfigError(key, value, "set it to a directory for checkpoints and metrics")
    path = os.path.abspath(os.path.expanduser(value))
    ancestor = path
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        where = "is a file" if ancestor == path else f"cannot be created: {ancestor} is a file"
        raise ConfigError(key, value, f"{where}; point it at a directory (it is created if missing)")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        why = (
            "is on a read-only filesystem"
            if os.statvfs(ancestor).f_flag & os.ST_RDONLY
            else "is not writable"
        )
        raise ConfigError(key, value, f"{ancestor} {why}; point it at a directory this user can write")
    return ancestor


def checkpoint_bytes(cfg: DagrlConfig, plan: Plan, params: int) -> tuple[float, str] | None:
    """(bytes, how they were counted) of one checkpoint: params × bytes × (1 + factor), the bytes
    and the optimizer factor from the train backend's registered `checkpoint` estimate; save_hf
    adds the weights again, a critic its own weights and optimizer state. None when the backend
    brings no estimate."""
    entry = BACKENDS.find(Role.train, cfg.actor_rollout_ref.actor.strategy)
    if entry is None or entry.checkpoint is None:
        return None
    width, factor = entry.checkpoint(cfg, plan.specs.get(Role.train), plan.roles.get(Role.train))
    if cfg.trainer.save_hf:
        factor += 1
    critic = plan.specs.get(Role.critic)
    critic_entry = BACKENDS.find(Role.critic, critic.backend) if critic is not None else None
    if critic_entry is not None and critic_entry.checkpoint is not None:
        # PPO's critic: its weights and optimizer state, counted at the actor's size (its default model)
        factor += 1 + critic_entry.checkpoint(cfg, critic, plan.roles.get(Role.critic))[1]
    how = f"{params / 1e6:.1f}M params × {width} bytes × (1 + {factor:g} optimizer/export/critic factor)"
    return params * width * (1 + factor), how


def check_free_space(cfg: DagrlConfig, plan: Plan, params: int, ancestor: str) -> None:
    size = checkpoint_bytes(cfg, plan, params)
    if size is None:  # a plugin train backend without a checkpoint estimate
        return
    need, how = size
    free = shutil.disk_usage(ancestor).free
    if free < need:
        raise ConfigError(
            "trainer.default_local_dir",
            cfg.trainer.default_local_dir,
            f"one checkpoint needs about {need / 2**30:.2f} GiB ({how}) but {free / 2**30:.2f} GiB are"
            f" free at {ancestor}; free space, point it at a larger disk, or set trainer.save_freq=-1",
        )


def check_resume_mode(value: str) -> None:
    if value in ("auto", "disable"):
        return
    problem = checkpoint.damage(os.path.expanduser(value), hashes=False)  # hashes: at resume
    if problem:
        raise ConfigError(
            "trainer.resume_mode",
            value,
            f"not a usable checkpoint ({problem}); use auto, disable, or a global_step_N directory",
        )


def resolve_ray_address(value: str | None) -> str | None:
    """The address `ray.init` joins for trainer.ray_address: "auto" means an existing cluster, as
    in Ray: RAY_ADDRESS when set, else the one `ray start` recorded in <ray temp
    dir>/ray_current_cluster. No cluster there is a ConfigError (never a local Ray instead; Ray
    itself would also join any Ray it finds running on this machine, e.g. another user's job)."""
    if value != "auto":
        return value
    found = os.environ.get("RAY_ADDRESS", "").strip()
    if found and found != "auto":
        return found
    record = ray_cluster_record()
    try:
        with open(record) as f:
            found = f.read().strip()
    except OSError:
        found = ""
    if not found:
        raise ConfigError(
            "trainer.ray_address",
            value,
            f"auto joins a running cluster, and there is none: RAY_ADDRESS is unset and {record} does"
            " not exist; start one with `ray start --head` (other nodes: `ray start --address=<head>:6379`),"
            " or leave trainer.ray_address unset for a local Ray of this run's own",
        )
    return found


def ray_cluster_record() -> str:
    """Where `ray start` records the cluster address on this machine (Ray's own helper when Ray is
    importable, which it is wherever dagrl runs)."""
    try:
        from ray._private.utils import get_ray_address_file

        return get_ray_address_file(None)
    except Exception:  # a Ray without the helper: its long-standing default
        return "/tmp/ray/ray_current_cluster"


def check_ray_address(value: str | None, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> None:
    """A host:port address must be a Ray GCS: ray.init waits forever on one that does not accept
    TCP, or that accepts it and is something else (and ignores SIGTERM meanwhile). The GCS is a
    gRPC server, which answers an HTTP/2 client preface with a SETTINGS frame; anything else is
    refused here. "auto" is resolved first (`resolve_ray_address`) and the address it finds probed
    the same way; ray:// client addresses are left to Ray."""
    address = resolve_ray_address(value)
    if not address or address == "local" or "://" in address:
        return
    found = "" if address == value else f" (auto found {address!r} in {_where_found()})"
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            "trainer.ray_address", value, f"use host:port of the Ray head (GCS), or auto{found}"
        )
    start = time.monotonic()
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
            if not _speaks_grpc(conn):
                raise ConfigError(
                    "trainer.ray_address",
                    value,
                    f"something answers there{found} but it is not a Ray GCS (no gRPC reply); pass the"
                    " address `ray start --head` prints (port 6379 unless --port says otherwise), or auto",
                )
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise ConfigError(
            "trainer.ray_address",
            value,
            f"nothing answers there{found} ({why} after {time.monotonic() - start:.1f}s); start the cluster"
            " with `ray start --head` and pass the address it prints, or leave it unset for a local Ray",
        ) from None


def _where_found() -> str:
    env = os.environ.get("RAY_ADDRESS", "").strip()
    return "RAY_ADDRESS" if env and env != "auto" else ray_cluster_record()


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # + empty SETTINGS
_SETTINGS = 4


def _speaks_grpc(conn: socket.socket) -> bool:
    """Whether the peer replies to an HTTP/2 preface with a SETTINGS frame (frame type at byte 3)."""
    try:
        conn.sendall(_HTTP2_PREFACE)
        header = b""
        while len(header) < 9:
            chunk = conn.recv(9 - len(header))
            if not chunk:
                return False  # closed on us
            header += chunk
    except OSError:  # silent past the timeout, or reset
        return False
    return header[3] == _SETTINGS
