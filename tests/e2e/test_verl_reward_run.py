"""A verl user's custom reward, as docs/compat.md shows it: `python -m dagrl.main
custom_reward_function.path=my_reward.py custom_reward_function.name=compute_score
+custom_reward_function.reward_kwargs.format_score=0.1`, one real step on the built-in task, the
score the one verl's call gives."""

from __future__ import annotations

import sys
import textwrap

from tests.conftest import main_in_process
from tests.e2e.test_grpo_run import FAST, read_metrics

# docs/compat.md's function, recording what it was called with
VERL_REWARD = """
CALLS = []

def compute_score(data_source, solution_str, ground_truth, extra_info=None, format_score=0.0):
    answer = solution_str.strip().split()[-1] if solution_str.strip() else ""
    CALLS.append((data_source, extra_info["index"], answer == ground_truth))
    return {"score": 1.0 if answer == ground_truth else format_score, "acc": answer == ground_truth}
"""


def test_a_verl_compute_score_file_scores_a_real_step(tmp_path, monkeypatch, capsys, ray_local):
    (tmp_path / "my_reward.py").write_text(textwrap.dedent(VERL_REWARD))
    monkeypatch.chdir(tmp_path)  # the file where the reader saved it (a relative path)
    code, printed = main_in_process(
        capsys,
        *FAST,
        "trainer.total_training_steps=1",
        "custom_reward_function.path=my_reward.py",
        "custom_reward_function.name=compute_score",
        "+custom_reward_function.reward_kwargs.format_score=0.1",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    )
    assert code == 0, printed[-3000:]
    calls = sys.modules["dagrl_plugin_my_reward"].CALLS
    assert len(calls) == 16 and {source for source, _, _ in calls} == {"dagrl/arith"}
    rights = [right for _, _, right in calls]
    assert any(rights)  # the tiny model answers about a third right at T=1
    [row] = read_metrics(tmp_path / "run")
    expected = sum(1.0 if right else 0.1 for right in rights) / len(rights)
    assert abs(row["reward/mean"] - expected) < 1e-6
