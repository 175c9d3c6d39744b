"""Faults injected into real `python -m dagrl.main` runs: signals to the driver, a killed worker,
a full disk.

Each signal or killed-worker test starts the CLI in its own process (its own local Ray), waits for
a step line, injects the fault, and checks the exit code, the one line that explains it, the
seconds to exit, that the checkpoint on disk verifies, and that no process of the run outlives it.
The full disk needs no process of its own: its command line runs in this process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from dagrl.trainer import checkpoint
from tests.conftest import main_in_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAST = [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.rollout.n=4",
    "trainer.logger=[console]",
    "trainer.progress_bar=false",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.total_training_steps=500",  # far more than any test waits for
]


class Run:
    """A CLI run whose output is collected line by line on a thread."""

    def __init__(self, out_dir, *overrides: str):
        env = dict(os.environ, PYTHONPATH=REPO, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dagrl.main", *FAST, f"trainer.default_local_dir={out_dir}", *overrides],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(ln.startswith(prefix) for ln in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"no line starting {prefix!r}:\n" + "\n".join(self.lines[-40:]))
            time.sleep(0.02)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def exit(self, timeout_s: float = 90) -> tuple[int, float]:
        """(exit code, seconds from now to the exit)."""
        start = time.monotonic()
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("the run did not exit:\n" + "\n".join(self.lines[-40:])) from None
        self.reader.join(timeout=10)
        return rc, time.monotonic() - start

    def line(self, prefix: str) -> str:
        hits = [ln for ln in self.lines if ln.startswith(prefix)]
        assert hits, f"no line starting {prefix!r}:\n" + "\n".join(self.lines[-40:])
        return hits[-1]


def assert_no_orphans(procs: list[psutil.Process], timeout_s: float = 20) -> None:
    """Every process the run started (Ray daemons, workers) is gone or a reaped-by-nobody zombie."""
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    alive = [p for p in alive if _running(p)]
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_sigint_then_sigterm_stop_with_final_checkpoint_and_resume_skips_damaged(tmp_path):
    """Ctrl-C after step 2 → final checkpoint, exit 130. A truncated newer checkpoint is then
    skipped on resume (falling back to the Ctrl-C one, saying so); SIGTERM → checkpoint, exit 143."""
    run = Run(tmp_path)
    run.wait_for("step    2")
    procs = run.descendants()
    run.proc.send_signal(signal.SIGINT)
    rc, seconds = run.exit()
    print(f"SIGINT: exit {rc} after {seconds:.1f}s")
    assert rc == 130, "\n".join(run.lines[-30:])
    stop = run.line("stopped by SIGINT after step ")
    step = int(stop.split("after step ")[1].split(";")[0])
    assert step >= 2 and f"final checkpoint {tmp_path}/global_step_{step}" in stop
    assert checkpoint.damage(str(tmp_path / f"global_step_{step}")) is None
    assert "Traceback" not in "\n".join(run.lines)
    assert_no_orphans(procs)

    # a newer checkpoint whose weights file was truncated (e.g. a crash of the storage)
    import shutil

    bad = tmp_path / f"global_step_{step + 50}"
    shutil.copytree(tmp_path / f"global_step_{step}", bad)
    os.truncate(bad / "actor" / "model.safetensors", 1000)
    (tmp_path / checkpoint.TRACKER).write_text(str(step + 50))

    run = Run(tmp_path)
    run.wait_for(f"step {step + 1:>4}")
    procs = run.descendants()
    run.proc.send_signal(signal.SIGTERM)
    rc, seconds = run.exit()
    print(f"SIGTERM: exit {rc} after {seconds:.1f}s")
    assert rc == 143, "\n".join(run.lines[-30:])
    assert f"checkpoint {bad} is damaged (actor/model.safetensors has 1000 bytes" in run.line(
        "resume: checkpoint"
    )
    assert run.line("resumed from") == f"resumed from {tmp_path}/global_step_{step} at step {step}"
    last = int(run.line("stopped by SIGTERM after step ").split("after step ")[1].split(";")[0])
    assert last > step and checkpoint.pick(str(tmp_path), "auto") == str(tmp_path / f"global_step_{last}")
    assert_no_orphans(procs)


@pytest.mark.slow
def test_killed_worker_ends_run_with_one_line(tmp_path):
    run = Run(tmp_path)
    run.wait_for("step    1")
    procs = run.descendants()
    workers = [p for p in procs if p.name().startswith("ray::Worker")]
    assert workers, [p.name() for p in procs]
    os.kill(workers[0].pid, signal.SIGKILL)
    rc, seconds = run.exit(timeout_s=60)
    print(f"worker SIGKILL: exit {rc} after {seconds:.1f}s")
    print("\n".join(run.lines[-3:]))
    assert rc == 2
    line = run.line("error: worker died: ")
    assert re.match(
        rf"error: worker died: role train\+rollout, rank 0, node [\d.]+ \(pid {workers[0].pid}\): ", line
    )
    assert "its worker process has died" in line and len(line) < 400, line
    assert seconds < 60
    assert_no_orphans(procs)


@pytest.mark.slow
def test_disk_full_at_a_worker_save_is_named_and_cleaned(ray_local, tmp_path, capsys):
    """A 14 MiB disk holds one checkpoint of the tiny model (~10 MiB with AdamW state: preflight
    passes) but not two: the second save fails inside the worker (torch.save: "iostream error")."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=14m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.decode().strip()})")
    try:
        # no signal or process to watch here: the command line in this process, on the session's Ray
        argv = [
            *FAST,
            f"trainer.default_local_dir={mnt}",
            "trainer.save_freq=1",
            "trainer.total_training_steps=3",
        ]
        rc, out = main_in_process(capsys, *argv)
        assert rc == 2, out
        hits = [
            ln
            for ln in out.splitlines()
            if ln.startswith("error: No space left on device while writing actor/")
        ]
        assert hits, out[-3000:]
        line = hits[-1]
        print(line)
        assert "for checkpoint global_step_2" in line and "freed the partial checkpoint" in line, line
        assert "(during saving step 2); full traceback in" in line, line
        # the run's log holds the traceback (main writes it, as for every error during a run)
        assert sorted(os.listdir(mnt)) == ["dagrl.log", "global_step_1", checkpoint.TRACKER, "metrics.jsonl"]
        assert checkpoint.pick(str(mnt), "auto") == str(mnt / "global_step_1")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
def test_second_signal_exits_at_once_without_checkpoint(tmp_path):
    run = Run(tmp_path)
    run.wait_for("step    1")
    procs = run.descendants()
    run.proc.send_signal(signal.SIGINT)
    run.wait_for("SIGINT received: stopping after the current step", timeout_s=30)
    run.proc.send_signal(signal.SIGINT)
    rc, seconds = run.exit(timeout_s=30)
    print(f"second SIGINT: exit {rc} after {seconds:.1f}s")
    assert rc == 130
    run.line("second SIGINT: stopping now, without a final checkpoint")
    assert not any(n.startswith("global_step_") for n in os.listdir(tmp_path))
    assert_no_orphans(procs)
