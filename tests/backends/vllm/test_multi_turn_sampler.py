"""The vLLM multi-turn sampler against a fake engine shaped like vLLM 0.26's in-process V1
`LLMEngine` (vllm cannot be imported here): requests enter as engine inputs with one seed per
(episode, turn) and FINAL_ONLY outputs; `add_request` returns an internal id with a random
suffix while `step()`'s outputs carry the id as given; unfinished and foreign outputs are skipped."""

from __future__ import annotations

import enum
import sys
from types import SimpleNamespace

import pytest


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingParams:
    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)


class FakeEngine:
    """Finishes one request per step, first in first out, sampling `max_tokens` ids (its key)."""

    def __init__(self):
        self.queue, self.added = [], []

    def add_request(self, request_id, prompt, params):
        assert prompt["type"] == "token" and all(isinstance(i, int) for i in prompt["prompt_token_ids"])
        self.added.append((request_id, prompt, params))
        self.queue.append((request_id, params))
        return f"{request_id}-1a2b3c4d"  # vLLM appends a random suffix to its internal id

    def step(self):
        outputs = [SimpleNamespace(request_id="someone-else", finished=True, outputs=[])]
        if self.queue:
            request_id, params = self.queue.pop(0)
            ids = [7] * params.max_tokens
            sample = SimpleNamespace(token_ids=ids, logprobs=SimpleNamespace(logprobs=[-0.5] * len(ids)))
            outputs.append(SimpleNamespace(request_id=request_id, finished=True, outputs=[sample]))
        outputs.append(SimpleNamespace(request_id="episode-9-turn-0-99", finished=False, outputs=[]))
        return outputs


@pytest.fixture
def sampler(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(SamplingParams=SamplingParams))
    monkeypatch.setitem(
        sys.modules,
        "vllm.inputs",
        SimpleNamespace(tokens_input=lambda ids: {"type": "token", "prompt_token_ids": ids}),
    )
    monkeypatch.setitem(
        sys.modules, "vllm.sampling_params", SimpleNamespace(RequestOutputKind=RequestOutputKind)
    )
    from dagrl.backends.vllm.multi_turn import MAX_TURN_SEEDS, VLLMStepSampler

    kwargs = {"temperature": 1.0, "max_tokens": 999, "logprobs": 0, "flat_logprobs": True}
    engine = FakeEngine()
    return (
        VLLMStepSampler(SimpleNamespace(llm_engine=engine), kwargs, seed_base=1 << 16),
        engine,
        MAX_TURN_SEEDS,
    )


def test_requests_enter_the_engine_one_by_one_and_come_back_when_finished(sampler):
    sampler, engine, per_episode = sampler
    sampler.submit(0, [1, 2, 3], max_tokens=2)
    sampler.submit(1, [4, 5], max_tokens=3)
    assert sampler.in_flight() == 2
    got = [s for _ in range(2) for s in sampler.poll()]
    assert [(s.key, s.token_ids, s.logprobs) for s in got] == [
        (0, [7, 7], [-0.5] * 2),
        (1, [7, 7, 7], [-0.5] * 3),
    ]
    assert sampler.in_flight() == 0
    sampler.submit(0, [1, 2, 3, 7, 7, 9], max_tokens=1)  # episode 0's second turn
    assert [s.key for s in sampler.poll()] == [0]
    params = [p for _, _, p in engine.added]
    assert [p.seed for p in params] == [(1 << 16) + 0, (1 << 16) + per_episode, (1 << 16) + 1]
    assert all(p.output_kind is RequestOutputKind.FINAL_ONLY and p.flat_logprobs for p in params)
    assert [p.max_tokens for p in params] == [2, 3, 1]  # the turn's budget, not the kwargs' 999
    assert engine.added[2][1]["prompt_token_ids"] == [1, 2, 3, 7, 7, 9]
