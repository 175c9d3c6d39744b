"""Checkpoint directories, written atomically and trimmed.

Layout: <default_local_dir>/global_step_<N>/{actor/, trainer_state.json} and
<default_local_dir>/latest_checkpointed_iteration.txt. A checkpoint is written into a hidden
temporary directory and renamed into place when complete, then the tracker file is replaced;
a crash at any point leaves the previous checkpoint intact and the tracker pointing at it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid

TRACKER = "latest_checkpointed_iteration.txt"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def staging_dir(root: str, step: int) -> str:
    path = os.path.join(root, f".tmp-global_step_{step}-{uuid.uuid4().hex[:8]}")
    os.makedirs(path)
    return path


def commit(root: str, staging: str, step: int, trainer_state: dict, keep: int | None) -> str:
    """Seal a filled staging dir as global_step_<step>; returns its final path."""
    _write_json(os.path.join(staging, "trainer_state.json"), trainer_state)
    final = os.path.join(root, f"global_step_{step}")
    if os.path.exists(final):  # re-saving a step (e.g. after resume): replace it whole
        shutil.rmtree(final)
    os.replace(staging, final)
    _atomic_write(os.path.join(root, TRACKER), str(step))
    _fsync_dir(root)
    trim(root, keep)
    return final


def latest(root: str) -> str | None:
    """The newest complete checkpoint under root, or None."""
    tracker = os.path.join(root, TRACKER)
    if os.path.isfile(tracker):
        with open(tracker) as f:
            path = os.path.join(root, f"global_step_{int(f.read().strip())}")
        if os.path.isfile(os.path.join(path, "trainer_state.json")):
            return path
    steps = sorted(_steps(root), reverse=True)
    for step in steps:
        path = os.path.join(root, f"global_step_{step}")
        if os.path.isfile(os.path.join(path, "trainer_state.json")):
            return path
    return None


def read_state(path: str) -> dict:
    with open(os.path.join(path, "trainer_state.json")) as f:
        return json.load(f)


def trim(root: str, keep: int | None) -> None:
    """Keep the newest `keep` checkpoints; drop leftovers of interrupted saves."""
    for name in os.listdir(root):
        if name.startswith(".tmp-global_step_"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    if keep is None or keep <= 0:
        return
    for step in sorted(_steps(root))[:-keep]:
        shutil.rmtree(os.path.join(root, f"global_step_{step}"), ignore_errors=True)


def _steps(root: str) -> list[int]:
    if not os.path.isdir(root):
        return []
    return [int(m.group(1)) for m in map(_STEP_DIR.match, os.listdir(root)) if m]


def _write_json(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
