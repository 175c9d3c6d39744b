"""Teacher nodes run for whatever objective reads their outputs, not for a list of algorithm
names: a plugin objective that reads the teacher's top-k gets the teacher_logprob node."""

from __future__ import annotations

import pytest

from dagrl.core.dag import load_dag_specs, prune_disabled
from dagrl.objectives import TokenRequest, register_objective
from tests.conftest import compose_config


class TopkReader:
    required_keys = ("response_mask", "teacher_topk_ids", "teacher_topk_logprobs")
    optional_keys = ()
    request = TokenRequest(logprobs=True)


@pytest.fixture
def topk_reader(monkeypatch):
    """The plugin objective, registered for this test only (the registry is restored after)."""
    from dagrl.registry import OBJECTIVES

    monkeypatch.setattr(OBJECTIVES, "_entries", dict(OBJECTIVES._entries))
    register_objective("test_topk_reader")(lambda cfg: TopkReader())


def nodes(*overrides: str) -> list[str]:
    cfg = compose_config(*overrides)
    return sorted(s.name for s in prune_disabled(load_dag_specs(cfg.dag)[1], cfg))


def test_a_plugin_objective_reading_the_teachers_topk_gets_the_teacher_node(topk_reader):
    assert "teacher_logprob" in nodes("algorithm.name=test_topk_reader", "teacher.model=/t")
    assert "teacher_logprob" not in nodes()  # GRPO reads no teacher
