"""Contract: an objective written outside dagrl (here, in tests/) is what the train backend runs
and what the actor_update node asks the DAG for; the backend hands it exactly its declared keys."""

from __future__ import annotations

import pytest
import torch

from dagrl.algos import LossAggMode, agg_loss
from dagrl.config.schema import Algorithm
from dagrl.objectives import TokenRequest, micro_batch_weights
from dagrl.objectives.base import _OBJECTIVES, ObjectiveEntry
from tests.backends.test_update_loop import make_batch, torch_backend


class Reinforce:
    """-A × log p on the sampled tokens (no ratio, no clip), token mean."""

    required_keys = ("response_mask", "advantages")
    optional_keys = ("old_logprobs", "ref_logprobs")
    request = TokenRequest(logprobs=True)

    def __init__(self):
        self.seen: list[set[str]] = []

    def micro_batch_weights(self, mini, micro_batches):
        return micro_batch_weights(mini, micro_batches, per_token=True)

    def loss(self, mb, out):
        self.seen.append(mb.keys())
        assert out.entropy is None  # not requested, not computed
        loss = agg_loss(-mb["advantages"] * out.logprobs, mb["response_mask"], LossAggMode.token_mean)
        return loss, {"actor/pg_loss": loss.detach()}


@pytest.fixture
def reinforce(monkeypatch):
    """Reinforce registered in place of grpo for this test (the Algorithm enum is closed)."""
    objective = Reinforce()
    monkeypatch.setitem(_OBJECTIVES, Algorithm.grpo, ObjectiveEntry(lambda cfg: objective, lambda cfg: None))
    return objective


def test_backend_runs_a_plugin_objective(reinforce):
    backend = torch_backend()
    assert backend.objective is reinforce
    batch = make_batch(backend)
    before = [p.detach().clone() for p in backend.model.parameters()]
    _, metrics = backend.train_step(
        batch.select(["prompts", "prompt_mask", "responses", "response_mask", "advantages"])
    )
    assert reinforce.seen and all(keys == {"response_mask", "advantages"} for keys in reinforce.seen)
    assert set(metrics) >= {"actor/pg_loss", "actor/grad_norm", "actor/lr"}
    assert "actor/entropy" not in metrics
    assert any(not torch.equal(a, b) for a, b in zip(before, backend.model.parameters()))


def test_plugin_objective_gets_the_sampled_token_logprobs(reinforce):
    # the backend hands the objective the log-probs of the sampled tokens: its loss equals
    # -sum(A * log p * mask) / sum(mask) computed from what forward_logprobs returns
    backend = torch_backend()
    batch = make_batch(backend)
    logprobs, _ = backend.forward_logprobs(batch, "old_logprobs")
    mask = batch["response_mask"].float()
    expected = -(batch["advantages"] * logprobs["old_logprobs"] * mask).sum() / mask.sum()
    backend.model.train()
    out = backend.forward_backward([batch], [1.0])
    assert float(out[0]["actor/pg_loss"]) == pytest.approx(float(expected), rel=1e-5)


def test_update_node_asks_the_dag_for_the_plugin_keys(reinforce):
    from dagrl.nodes.update import ActorUpdateNode
    from tests.conftest import compose_config

    required, optional = ActorUpdateNode.inputs_for(compose_config())
    assert required == ("prompts", "prompt_mask", "responses", "response_mask", "advantages")
    assert optional == ("old_logprobs", "ref_logprobs")
