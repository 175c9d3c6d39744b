"""external_plugins: user modules register rewards and node kinds before the DAG is validated."""

from __future__ import annotations

import pytest

from dagrl.core.plugins import load_plugins
from dagrl.errors import ConfigError

PLUGIN = """
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.rewards import register_reward


@register_reward("plugin_len_reward")
def length_reward(solution_str, ground_truth, extra_info):
    return float(len(solution_str))


@register_node_kind("plugin_noop")
class Noop:
    required_inputs = ()
    optional_inputs = ()
    outputs = ()
    remote = False

    def __init__(self, spec, cfg):
        pass

    @staticmethod
    def enabled(cfg):
        return True

    def run(self, runtime, batch):
        return NodeResult(batch)
"""


def test_plugin_file_registers_reward_and_node_kind(tmp_path):
    from dagrl.core.node import node_kinds
    from dagrl.rewards import RewardComposer, RewardTerm

    path = tmp_path / "my_plugin.py"
    path.write_text(PLUGIN)
    load_plugins([str(path)])
    total, raw = RewardComposer([RewardTerm("plugin_len_reward", 0.5)]).score("any", "abcd", "", {})
    assert total == 2.0 and raw == {"plugin_len_reward": 4.0}
    assert "plugin_noop" in node_kinds()


def test_missing_plugin_names_the_key(tmp_path):
    with pytest.raises(ConfigError) as exc:
        load_plugins(["json", str(tmp_path / "absent.py")])
    assert exc.value.key == "external_plugins[1]"
    with pytest.raises(ConfigError) as exc:
        load_plugins(["no_such_module_xyz"])
    assert exc.value.key == "external_plugins[0]" and "PYTHONPATH" in str(exc.value)
