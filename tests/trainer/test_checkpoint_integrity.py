"""Manifests, verified resume with fallback, and saves that fail on a real full or read-only disk."""

from __future__ import annotations

import gc
import json
import os
import subprocess

import pytest
import torch

from dagrl.errors import CheckpointError
from dagrl.trainer import checkpoint
from dagrl.trainer.manifest import MANIFEST, check


def write_weights(staging: str, step: int, nbytes: int = 4096) -> None:
    os.makedirs(os.path.join(staging, "actor"))
    torch.save({"w": torch.full((nbytes // 4,), float(step))}, os.path.join(staging, "actor", "weights.pt"))


def save(root: str, step: int) -> str:
    return checkpoint.save(root, step, lambda d: write_weights(d, step), {"global_step": step}, keep=None)


def test_manifest_records_every_file(tmp_path):
    path = save(str(tmp_path), 1)
    with open(os.path.join(path, MANIFEST)) as f:
        files = json.load(f)["files"]
    assert sorted(files) == ["actor/weights.pt", "trainer_state.json"]
    assert files["actor/weights.pt"]["size"] == os.path.getsize(os.path.join(path, "actor", "weights.pt"))
    assert check(path) is None


def test_manifest_detects_truncation_and_changed_bytes(tmp_path):
    path = save(str(tmp_path), 1)
    weights = os.path.join(path, "actor", "weights.pt")
    with open(weights, "r+b") as f:  # same size, one byte flipped: only the hash can tell
        f.seek(2000)
        b = f.read(1)
        f.seek(2000)
        f.write(bytes([b[0] ^ 0xFF]))
    assert "SHA-256" in check(path)
    assert check(path, hashes=False) is None
    os.truncate(weights, 100)
    assert "actor/weights.pt has 100 bytes" in check(path, hashes=False)
    os.remove(weights)
    assert "actor/weights.pt is missing" in check(path)


def test_truncated_latest_falls_back_to_previous_and_says_so(tmp_path, capsys):
    root = str(tmp_path)
    first, second = save(root, 1), save(root, 2)
    os.truncate(os.path.join(second, "actor", "weights.pt"), 10)
    assert checkpoint.pick(root, "auto") == first
    out = capsys.readouterr().out
    assert f"checkpoint {second} is damaged (actor/weights.pt has 10 bytes" in out
    assert f"falling back to the previous intact checkpoint {first}" in out
    # moved aside, so that trimming after the next save cannot keep it instead of an intact one
    assert [n for n in os.listdir(root) if n.startswith("damaged_global_step_2_")]
    save(root, 2)
    checkpoint.trim(root, keep=1)
    assert checkpoint.pick(root, "auto") == second


def test_explicit_damaged_checkpoint_is_refused(tmp_path):
    root = str(tmp_path)
    path = save(root, 1)
    os.truncate(os.path.join(path, "actor", "weights.pt"), 0)
    with pytest.raises(CheckpointError, match=r"resume_mode=.*global_step_1 is damaged: actor/weights.pt"):
        checkpoint.pick(root, path)
    with pytest.raises(CheckpointError, match="no intact checkpoint under"):
        checkpoint.pick(root, "auto")  # the only one is damaged: never silently start from step 0
    assert checkpoint.pick(root, "disable") is None


def test_checkpoint_without_manifest_is_accepted(tmp_path):
    """Checkpoints written before manifests existed still resume."""
    path = save(str(tmp_path), 1)
    os.remove(os.path.join(path, MANIFEST))
    assert checkpoint.pick(str(tmp_path), "auto") == path


def test_unrelated_errors_pass_through_and_partial_is_removed(tmp_path):
    def broken(staging):
        write_weights(staging, 1)
        raise ValueError("a bug, not the disk")

    with pytest.raises(ValueError, match="a bug"):
        checkpoint.save(str(tmp_path), 1, broken, {}, keep=None)
    assert os.listdir(tmp_path) == []


# ---- real filesystems: a 2 MiB tmpfs, full or read-only -------------------------------------------
@pytest.fixture
def small_fs(tmp_path):
    """A 2 MiB tmpfs (needs root and mount permission; skipped where the sandbox refuses)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.decode().strip() or r.returncode})")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("writer", ["torch", "safetensors"])
def test_disk_full_says_so_and_frees_the_partial_checkpoint(small_fs, writer):
    """torch.save reports a full disk as 'iostream error'; the message must still say it plainly."""
    root = str(small_fs / "ckpts")
    save(root, 1)  # a small one that fits

    def big(staging):
        os.makedirs(os.path.join(staging, "actor"))
        tensor = {"w": torch.ones(1 << 20)}  # 4 MiB > the 2 MiB disk
        if writer == "torch":
            torch.save(tensor, os.path.join(staging, "actor", "weights.pt"))
        else:
            from safetensors.torch import save_file

            save_file(tensor, os.path.join(staging, "actor", "model.safetensors"))

    with pytest.raises(CheckpointError) as info:
        checkpoint.save(root, 2, big, {"global_step": 2}, keep=None)
    msg = str(info.value)
    name = "actor/weights.pt" if writer == "torch" else "actor/"  # safetensors removes its file on failure
    assert msg.startswith(f"No space left on device while writing {name} for checkpoint global_step_2")
    assert "freed the partial checkpoint" in msg and "trainer.default_local_dir" in msg
    assert sorted(os.listdir(root)) == ["global_step_1", checkpoint.TRACKER]  # no partial dir left
    assert checkpoint.pick(root, "auto") == os.path.join(root, "global_step_1")
    # the space came back: the next save works (once the failed writer's open file is collected;
    # the traceback held here keeps it open, as any open descriptor keeps a deleted file's blocks)
    del info
    gc.collect()
    save(root, 3)


def test_read_only_dir_says_so(small_fs):
    root = str(small_fs / "ckpts")
    save(root, 1)
    r = subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot remount read-only here ({r.stderr.decode().strip()})")
    # the fix for a read-only filesystem, not the one for a directory this user cannot write
    read_only = "; the filesystem is read-only; set trainer.default_local_dir to a writable directory$"
    with pytest.raises(
        CheckpointError, match=r"^Read-only file system .*for checkpoint global_step_2 .*" + read_only
    ):
        save(root, 2)
    assert sorted(os.listdir(root)) == ["global_step_1", checkpoint.TRACKER]
