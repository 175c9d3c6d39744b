"""Checkpoint directories: atomic commit, the tracker, crash leftovers, trimming, and fallbacks."""

from __future__ import annotations

import os
import shutil

from dagrl.trainer.checkpoint import TRACKER, commit, latest, read_state, staging_dir, trim


def save(root: str, step: int, keep: int | None = None) -> str:
    """A fake checkpoint: a weights file in actor/ plus the trainer state."""
    staging = staging_dir(root, step)
    os.makedirs(os.path.join(staging, "actor"))
    with open(os.path.join(staging, "actor", "weights.bin"), "w") as f:
        f.write(f"weights of step {step}")
    return commit(root, staging, step, {"global_step": step}, keep)


def listing(root: str) -> list[str]:
    return sorted(os.listdir(root))


def tracker_step(root: str) -> int:
    with open(os.path.join(root, TRACKER)) as f:
        return int(f.read())


def test_commit_writes_step_dir_and_tracker(tmp_path):
    root = str(tmp_path)
    path = save(root, 3)
    assert path == os.path.join(root, "global_step_3")
    assert listing(root) == ["global_step_3", TRACKER]  # no staging dir or temp tracker left behind
    assert tracker_step(root) == 3
    assert read_state(path) == {"global_step": 3}
    with open(os.path.join(path, "actor", "weights.bin")) as f:
        assert f.read() == "weights of step 3"
    assert latest(root) == path


def test_latest_of_empty_or_missing_root(tmp_path):
    assert latest(str(tmp_path)) is None
    assert latest(str(tmp_path / "never_created")) is None


def test_crash_mid_save_keeps_previous_and_next_commit_cleans(tmp_path):
    root = str(tmp_path)
    good = save(root, 1)
    # the process dies while writing step 2: a staging dir with partial contents, never committed
    leftover = staging_dir(root, 2)
    with open(os.path.join(leftover, "partial.bin"), "w") as f:
        f.write("half a tensor")
    assert latest(root) == good
    assert tracker_step(root) == 1
    # after resume, the next save seals its own staging dir and removes the leftover
    path = save(root, 2)
    assert not os.path.exists(leftover)
    assert listing(root) == ["global_step_1", "global_step_2", TRACKER]
    assert latest(root) == path
    assert not os.path.exists(os.path.join(path, "partial.bin"))


def test_resaving_a_step_replaces_it_whole(tmp_path):
    root = str(tmp_path)
    first = save(root, 5)
    with open(os.path.join(first, "stale.txt"), "w") as f:
        f.write("from the first save")
    second = save(root, 5)
    assert second == first
    assert not os.path.exists(os.path.join(second, "stale.txt"))
    assert read_state(second) == {"global_step": 5}


def test_trim_keeps_newest(tmp_path):
    root = str(tmp_path)
    for step in (10, 2, 30, 20):  # numeric order, not the order of saving or of names
        save(root, step, keep=None)
    assert listing(root) == ["global_step_10", "global_step_2", "global_step_20", "global_step_30", TRACKER]
    trim(root, keep=2)
    assert listing(root) == ["global_step_20", "global_step_30", TRACKER]
    # commit trims as it goes
    save(root, 40, keep=2)
    assert listing(root) == ["global_step_30", "global_step_40", TRACKER]


def test_a_fresh_run_beside_an_earlier_runs_higher_steps_keeps_its_own_saves(tmp_path):
    """resume_mode=disable in a directory an earlier run left at step 100: the new run's saves
    (5, 10, 15) are trimmed among themselves; step 100 is not theirs to delete, nor a reason to
    delete the save just written."""
    root = str(tmp_path)
    save(root, 100, keep=2)
    save(root, 5, keep=2)
    assert listing(root) == ["global_step_100", "global_step_5", TRACKER]
    save(root, 10, keep=2)
    save(root, 15, keep=2)
    assert listing(root) == ["global_step_10", "global_step_100", "global_step_15", TRACKER]
    assert latest(root).endswith("global_step_15")  # the tracker names the last save


def test_keep_none_or_zero_keeps_all(tmp_path):
    root = str(tmp_path)
    for step in (1, 2, 3):
        save(root, step, keep=0)
    trim(root, keep=None)
    assert listing(root) == ["global_step_1", "global_step_2", "global_step_3", TRACKER]


def test_tracker_to_deleted_dir_falls_back_to_newest_complete(tmp_path):
    root = str(tmp_path)
    for step in (1, 2, 3):
        save(root, step)
    shutil.rmtree(os.path.join(root, "global_step_3"))  # e.g. removed by hand
    # step 2 exists but is incomplete (no trainer_state.json), so step 1 is the newest usable one
    os.remove(os.path.join(root, "global_step_2", "trainer_state.json"))
    assert tracker_step(root) == 3
    assert latest(root) == os.path.join(root, "global_step_1")


def test_tracker_missing_falls_back_to_newest(tmp_path):
    root = str(tmp_path)
    for step in (9, 11):
        save(root, step)
    os.remove(os.path.join(root, TRACKER))
    assert latest(root) == os.path.join(root, "global_step_11")  # 11 > 9 numerically
