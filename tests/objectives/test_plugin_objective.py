"""Contract: an objective written outside dagrl (tests/plugins/reinforce_objective.py, registered
by name from an external_plugins module, no patching) is what the train backend runs when
algorithm.name names it, and what the actor_update node asks the DAG for; the backend hands it
exactly its declared keys."""

from __future__ import annotations

import pytest
import torch

from dagrl.config.validate import check_names
from dagrl.core.plugins import LOADED, load_plugins
from dagrl.errors import ConfigError
from dagrl.registry import OBJECTIVES
from tests.backends.test_update_loop import make_batch, torch_backend
from tests.conftest import compose_config

PLUGIN = "tests.plugins.reinforce_objective"
SELECT = ("algorithm.name=reinforce", f"external_plugins=[{PLUGIN}]")


@pytest.fixture(scope="module")
def plugin():
    """The plugin module, loaded as a run loads external_plugins (it registers `reinforce`)."""
    load_plugins([PLUGIN])
    return LOADED[PLUGIN]


@pytest.fixture
def reinforce(plugin):
    """A torch train backend whose objective is the plugin's, chosen by algorithm.name."""
    backend = torch_backend(*SELECT)
    assert backend.objective is plugin.BUILT[-1]
    return backend


def test_backend_runs_a_plugin_objective(reinforce):
    backend, objective = reinforce, reinforce.objective
    batch = make_batch(backend)
    before = [p.detach().clone() for p in backend.model.parameters()]
    _, metrics = backend.train_step(
        batch.select(["prompts", "prompt_mask", "responses", "response_mask", "advantages"])
    )
    assert objective.seen and all(keys == {"response_mask", "advantages"} for keys in objective.seen)
    assert set(metrics) >= {"actor/pg_loss", "actor/grad_norm", "actor/lr"}
    assert "actor/entropy" not in metrics
    assert any(not torch.equal(a, b) for a, b in zip(before, backend.model.parameters()))


def test_plugin_objective_gets_the_sampled_token_logprobs(reinforce):
    # the backend hands the objective the log-probs of the sampled tokens: its loss equals
    # -sum(A * log p * mask) / sum(mask) computed from what forward_logprobs returns
    backend = reinforce
    batch = make_batch(backend)
    logprobs, _ = backend.forward_logprobs(batch, "old_logprobs")
    mask = batch["response_mask"].float()
    expected = -(batch["advantages"] * logprobs["old_logprobs"] * mask).sum() / mask.sum()
    backend.model.train()
    out = backend.forward_backward([batch], [1.0])
    assert float(out[0]["actor/pg_loss"]) == pytest.approx(float(expected), rel=1e-5)


def test_update_node_asks_the_dag_for_the_plugin_keys(plugin):
    from dagrl.nodes.update import ActorUpdateNode

    required, optional = ActorUpdateNode.inputs_for(compose_config(*SELECT))
    assert required == ("prompts", "prompt_mask", "responses", "response_mask", "advantages")
    assert optional == ("old_logprobs", "ref_logprobs", "response_attention_mask")


def test_plugin_name_is_checked_like_a_builtin(plugin):
    assert "reinforce" in OBJECTIVES
    check_names(compose_config(*SELECT))  # registered: accepted
    with pytest.raises(ConfigError) as exc:
        check_names(compose_config("algorithm.name=reinforc"))
    assert exc.value.key == "algorithm.name" and "did you mean 'reinforce'" in str(exc.value)
