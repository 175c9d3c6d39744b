"""Checkpoint directories: written atomically, sealed with a manifest, verified before resume.

Layout: <default_local_dir>/global_step_<N>/{actor/, trainer_state.json, manifest.json} and
<default_local_dir>/latest_checkpointed_iteration.txt. A checkpoint is written into a hidden
staging directory; every file and directory in it is fsynced and recorded (size, SHA-256) in
manifest.json before it is renamed into place, then the tracker file is replaced. A crash at any
point leaves the previous checkpoint intact and the tracker pointing at it; a save that fails
(disk full, no permission) removes its staging directory and says what happened in plain words.
Resume verifies the checkpoint it picks against the manifest and falls back to the previous
intact one, saying so.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable

from dagrl.errors import CheckpointError
from dagrl.trainer import manifest
from dagrl.trainer.logger import log

TRACKER = "latest_checkpointed_iteration.txt"
STATE = "trainer_state.json"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


def save(root: str, step: int, write: Callable[[str], None], trainer_state: dict, keep: int | None) -> str:
    """`write(staging_dir)` fills a staging dir (workers write into it); then it is sealed and
    committed as global_step_<step>. Returns the final path.

    A failure the user can fix (no space, no permission, read-only filesystem) becomes a
    CheckpointError naming the file and the fix; the partial checkpoint is removed either way.
    """
    staging = None
    try:
        os.makedirs(root, exist_ok=True)
        staging = staging_dir(root, step)
        write(staging)
        return commit(root, staging, step, trainer_state, keep)
    except Exception as exc:
        cause = _os_cause(exc, staging or root)
        # which file failed and how much was written: read before the partial dir goes
        failed = _failed_file(staging, cause[1]) if cause else None
        partial = _tree_bytes(staging) if staging else 0
        if staging:
            shutil.rmtree(staging, ignore_errors=True)
        if cause is None:
            raise
        raise CheckpointError(_save_failure(root, staging, step, cause[0], failed, partial)) from exc


def staging_dir(root: str, step: int) -> str:
    path = os.path.join(root, f".tmp-global_step_{step}-{uuid.uuid4().hex[:8]}")
    os.makedirs(path)
    return path


def commit(root: str, staging: str, step: int, trainer_state: dict, keep: int | None) -> str:
    """Seal a filled staging dir (state, manifest, fsyncs) as global_step_<step>; returns its path."""
    manifest.write_synced(os.path.join(staging, STATE), json.dumps(trainer_state, indent=1))
    manifest.seal(staging)
    final = os.path.join(root, f"global_step_{step}")
    if os.path.exists(final):  # re-saving a step (e.g. after resume): replace it whole
        shutil.rmtree(final)
    os.replace(staging, final)
    _atomic_write(os.path.join(root, TRACKER), str(step))
    manifest.fsync_dir(root)
    trim(root, keep, upto=step)
    return final


def pick(root: str, resume_mode: str) -> str | None:
    """The checkpoint to resume from for trainer.resume_mode, verified; None to start fresh.

    auto: the tracker's step, then the others newest first; a damaged one is reported and
    skipped. A path: that checkpoint, or a CheckpointError if it is damaged.
    """
    if resume_mode == "disable":
        return None
    if resume_mode != "auto":
        path = os.path.expanduser(resume_mode)
        problem = damage(path)
        if problem:
            raise CheckpointError(
                f"trainer.resume_mode={resume_mode!r}: checkpoint {path} is damaged: {problem}; point"
                f" resume_mode at another global_step_N dir, or use resume_mode=auto to take the newest"
                " intact one"
            )
        return path
    damaged = []
    for path in _candidates(root):
        problem = damage(path)
        if problem is None:
            if damaged:
                log(f"resume: falling back to the previous intact checkpoint {path}")
            return path
        # renamed aside so trimming never keeps it in place of an intact one (nothing is deleted)
        aside = os.path.join(root, f"damaged_{os.path.basename(path)}_{uuid.uuid4().hex[:6]}")
        os.replace(path, aside)
        log(f"resume: checkpoint {path} is damaged ({problem}); moved it to {aside}")
        damaged.append(f"{os.path.basename(path)}: {problem}")
    if damaged:
        raise CheckpointError(
            f"no intact checkpoint under {root} ({'; '.join(damaged)}); remove the damaged ones, or set"
            " trainer.resume_mode=disable to start from step 0"
        )
    return None


def latest(root: str) -> str | None:
    """The newest intact checkpoint under root, or None (damaged ones are reported and skipped)."""
    try:
        return pick(root, "auto")
    except CheckpointError:
        return None


def damage(path: str, hashes: bool = True) -> str | None:
    """None if `path` is a complete checkpoint whose files match its manifest; else the problem."""
    if not os.path.isdir(path):
        return "it is not a directory"
    if not os.path.isfile(os.path.join(path, STATE)):
        return f"{STATE} is missing (not a checkpoint, or its save was interrupted)"
    return manifest.check(path, hashes)


def read_state(path: str) -> dict:
    with open(os.path.join(path, STATE)) as f:
        return json.load(f)


def trim(root: str, keep: int | None, upto: int | None = None) -> None:
    """Keep the newest `keep` checkpoints; drop leftovers of interrupted saves. After a save of
    step `upto`, only checkpoints up to it count: higher steps are an earlier run's that went
    further (trainer.resume_mode=disable in the same directory) and are left alone; trimming by
    step alone deleted each new save at once."""
    for name in os.listdir(root):
        if name.startswith(".tmp-global_step_"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    if keep is None or keep <= 0:
        return
    steps = sorted(s for s in _steps(root) if upto is None or s <= upto)
    for step in steps[:-keep]:
        shutil.rmtree(os.path.join(root, f"global_step_{step}"), ignore_errors=True)


def _candidates(root: str) -> list[str]:
    steps = sorted(_steps(root), reverse=True)
    tracker = os.path.join(root, TRACKER)
    if os.path.isfile(tracker):
        try:
            with open(tracker) as f:
                tracked = int(f.read().strip())
        except ValueError:
            tracked = None
        if tracked in steps:  # the tracker first: it names the last save that completed
            steps.remove(tracked)
            steps.insert(0, tracked)
    return [os.path.join(root, f"global_step_{s}") for s in steps]


def _steps(root: str) -> list[int]:
    if not os.path.isdir(root):
        return []
    return [int(m.group(1)) for m in map(_STEP_DIR.match, os.listdir(root)) if m]


def _atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    manifest.write_synced(tmp, text)
    os.replace(tmp, path)


# ---- why a save failed ---------------------------------------------------------------------------
_USER_FIXABLE = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS}
_ERRNO_TEXT = re.compile(r"\[Errno (\d+)\]|os error (\d+)")


def _os_cause(exc: BaseException, where: str) -> tuple[int, str | None] | None:
    """(errno, file) when a save failed for a reason the user can fix, else None.

    Workers' errors arrive through Ray (the original is `.cause`) and often without an errno:
    torch.save reports a full disk as "iostream error". So: an OSError in the exception chain,
    then an errno in the text (safetensors: "os error 28"), then the filesystem itself.
    """
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _USER_FIXABLE:
            return e.errno, e.filename
        m = _ERRNO_TEXT.search(str(e))
        if m and int(m.group(1) or m.group(2)) in _USER_FIXABLE:
            return int(m.group(1) or m.group(2)), None
        todo += [getattr(e, "cause", None), e.__cause__, e.__context__]
    return _probe(where)


def _probe(where: str) -> tuple[int, None] | None:
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    if st.f_flag & os.ST_RDONLY:
        return errno.EROFS, None
    if not os.access(where, os.W_OK):
        return errno.EACCES, None
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    return (errno.ENOSPC, None) if free < (1 << 20) else None


def _failed_file(staging: str | None, filename: str | None) -> str | None:
    """The failing file relative to the staging dir: from the error, else the newest entry."""
    if not staging:
        return filename
    if filename and os.path.abspath(filename).startswith(os.path.abspath(staging)):
        return os.path.relpath(filename, staging)
    return filename or _newest_file(staging)


def _save_failure(
    root: str, staging: str | None, step: int, code: int, failed: str | None, partial: int
) -> str:
    what = f" while writing {failed}" if failed else ""
    freed = f"freed the partial checkpoint ({partial / 2**20:.1f} MiB)" if staging else "nothing was written"
    if code in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(root).free / 2**20
        fix = (
            f"{free:.1f} MiB are free there now; free space, lower"
            " trainer.max_actor_ckpt_to_keep, or set trainer.default_local_dir to a larger disk"
        )
    elif code == errno.EROFS:
        fix = "the filesystem is read-only; set trainer.default_local_dir to a writable directory"
    else:
        fix = "make the directory writable for this user, or set trainer.default_local_dir elsewhere"
    return f"{os.strerror(code)}{what} for checkpoint global_step_{step} in {root}; {freed}; {fix}"


def _newest_file(directory: str) -> str | None:
    """The entry written last: the file being written when the disk filled up, or the directory
    it was in when the writer removed it (safetensors does). Directories end with a slash."""
    best = None
    for r, dirs, names in os.walk(directory):
        for n in names + dirs:
            p = os.path.join(r, n)
            try:
                t = os.stat(p).st_mtime_ns
            except OSError:
                continue
            if best is None or t >= best[0]:
                best = (t, os.path.relpath(p, directory) + (os.sep if n in dirs else ""))
    return best[1] if best else None


def _tree_bytes(directory: str) -> int:
    total = 0
    for r, _, names in os.walk(directory):
        for n in names:
            try:
                total += os.lstat(os.path.join(r, n)).st_size
            except OSError:
                pass
    return total
