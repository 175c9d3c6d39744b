"""A node that requires the rollout engine's log-probs gets real ones or the run is refused before
Ray: rollout.calculate_log_probs' auto turns them on for the built-in readers (a rollout correction,
the distill reward without the old-log-prob pass), and a plugin's node that reads them while they
are off is named (it would otherwise read the engine's zeros)."""

from __future__ import annotations

import pytest

from dagrl.config.validate import resolve_defaults, validate
from dagrl.errors import ConfigError
from dagrl.trainer.setup import prepare
from tests.config.test_config import REPO
from tests.conftest import compose_config

R = "actor_rollout_ref.rollout"


@pytest.fixture(scope="module")
def probe_dag(tmp_path_factory):
    """The shipped GRPO DAG with the probe (tests/plugins/logprob_probe.py) beside the update."""
    root = tmp_path_factory.mktemp("probe")
    grpo = (REPO / "dagrl" / "conf" / "dags" / "grpo.yaml").read_text()
    probe = "  probe:\n    kind: logprob_probe\n    inputs: [rollout_logprobs, response_mask]\n"
    (root / "probe.yaml").write_text(grpo.rstrip("\n") + "\n" + probe)
    return str(root / "probe.yaml"), "tests.plugins.logprob_probe"


def planned(dag: str, plugin: str, *overrides: str):
    return prepare(
        compose_config(f"dag={dag}", f"external_plugins=[{plugin}]", "trainer.dry_run=true", *overrides)
    )


def test_a_plugin_node_reading_the_engines_log_probs_while_they_are_off_is_named(probe_dag):
    with pytest.raises(ConfigError) as info:
        planned(*probe_dag)  # auto: nothing built in reads them, so off
    assert info.value.key == f"{R}.calculate_log_probs"
    assert "node 'probe' (kind logprob_probe)" in str(info.value) and "calculate_log_probs=true" in str(
        info.value
    )
    with pytest.raises(ConfigError):
        planned(*probe_dag, f"{R}.calculate_log_probs=false")
    prepared = planned(*probe_dag, f"{R}.calculate_log_probs=true")
    assert "probe" in {n.name for n in prepared.dag.nodes}


def test_objectives_without_a_policy_gradient_refuse_a_rollout_correction():
    """GKD, OPSD and SFT would reweight nothing, while the auto asks the engine for its log-probs."""
    for algorithm in ("gkd", "opsd", "sft"):
        cfg = compose_config(f"algorithm={algorithm}", "algorithm.rollout_correction.rollout_rs=token")
        resolve_defaults(cfg)
        with pytest.raises(ConfigError) as info:
            validate(cfg)
        assert info.value.key == "algorithm.rollout_correction.rollout_rs", algorithm
        assert f"algorithm={algorithm} has no policy-gradient term" in str(info.value)
