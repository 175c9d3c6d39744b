"""The stop flag and the safe point, in-process (the real signals to a CLI run: tests/e2e/test_faults.py)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from dagrl.errors import Interrupted
from dagrl.trainer import interrupt


class FakeTrainer:
    """Only what stop_if_requested reads: the step, the last saved step and save()."""

    def __init__(self, step: int, saved_step: int):
        self.step, self.saved_step, self.saves = step, saved_step, 0

    def save(self) -> str:
        self.saves += 1
        self.saved_step = self.step
        return f"/ckpt/global_step_{self.step}"


def test_first_signal_sets_the_flag_and_the_safe_point_saves_once():
    before = signal.getsignal(signal.SIGTERM)
    with interrupt.stop_signals():
        t = FakeTrainer(step=3, saved_step=2)
        interrupt.stop_if_requested(t)  # nothing asked: carries on
        assert t.saves == 0
        os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (main) thread's handler
        with pytest.raises(Interrupted, match="stopped by SIGTERM after step 3; final checkpoint") as info:
            interrupt.stop_if_requested(t)
        assert info.value.exit_code == 143 and t.saves == 1
        with pytest.raises(Interrupted, match=r"its checkpoint \(step 3\) was already written"):
            interrupt.stop_if_requested(t)
        assert t.saves == 1
        with pytest.raises(Interrupted, match="nothing trained yet"):
            interrupt.stop_if_requested(FakeTrainer(0, 0))
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_outside_the_main_thread_nothing_is_installed():
    errors = []

    def body():
        try:
            with interrupt.stop_signals():
                interrupt.install()
        except Exception as exc:  # signal.signal raises ValueError outside the main thread
            errors.append(exc)

    th = threading.Thread(target=body)
    th.start()
    th.join()
    assert errors == []
