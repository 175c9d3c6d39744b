"""Reward functions written for TRL's GRPOTrainer work as dagrl rewards, by name from a plugin file."""

from __future__ import annotations

import math
import textwrap

from dagrl.core.plugins import load_plugins
from dagrl.rewards import RewardComposer, RewardTerm
from dagrl.rewards.registry import RewardForm, get_reward, reward_form

PLUGIN = '''
SEEN = {}

def exact_sum(completions, ground_truth, **kwargs):
    """TRL form: one call per batch, dataset columns as keyword lists."""
    SEEN.update(kwargs, ground_truth=ground_truth)
    return [1.0 if c.strip() == g else 0.0 for c, g in zip(completions, ground_truth)]

def only_long(completions, **kwargs):
    return [None if len(c) < 3 else 0.5 for c in completions]
'''


def test_trl_rewards_by_name_next_to_dagrl_form(tmp_path):
    path = tmp_path / "trl_rewards.py"
    path.write_text(textwrap.dedent(PLUGIN))
    load_plugins([str(path)])
    assert reward_form(get_reward("exact_sum")) == RewardForm.trl
    assert reward_form(get_reward("arith")) == RewardForm.per_response

    composer = RewardComposer(
        [RewardTerm("exact_sum", 1.0), RewardTerm("only_long", 2.0), RewardTerm("arith")]
    )
    assert composer.wants_prompts
    totals, raw = composer.score_batch(
        ["dagrl/arith", "dagrl/arith"],
        ["82", "1000"],
        ["82", "17"],
        [{"a": 37}, {"a": 8}],
        prompts=["37+45=", "8+9="],
        completion_ids=[[5, 6], [7, 8, 9]],
    )
    assert raw["exact_sum"] == [1.0, 0.0]
    assert math.isnan(raw["only_long"][0]) and raw["only_long"][1] == 0.5  # None: does not apply
    assert raw["arith"][0] == 1.0 and raw["arith"][1] == 0.0
    assert totals == [1.0 + 1.0, 0.0 + 2 * 0.5 + 0.0]
    import dagrl_plugin_trl_rewards as plugin

    seen = plugin.SEEN
    assert seen["prompts"] == ["37+45=", "8+9="] and seen["completion_ids"] == [[5, 6], [7, 8, 9]]
    assert seen["data_source"] == ["dagrl/arith"] * 2 and seen["a"] == [37, 8]
    assert seen["ground_truth"] == ["82", "17"]
