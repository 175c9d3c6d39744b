"""The standalone teacher's conversion of vLLM prompt log-probs into [B, R, K] top-k tensors, against
hand-made outputs shaped like vLLM 0.26's (vllm/logprobs.py: dicts of Logprob per position, or
FlatLogprobs), and its engine and sampling arguments."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest
import torch

from dagrl.backends.vllm.convert import prompt_logprobs_to_topk, teacher_request_ids
from dagrl.backends.vllm.engine_args import teacher_llm_kwargs, teacher_sampling_kwargs
from dagrl.backends.vllm.teacher import scoring_inputs
from dagrl.config.role_specs import role_spec
from dagrl.config.roles import ModelSpec
from dagrl.core.batch import Batch
from tests.conftest import compose_config


@dataclass
class Logprob:  # vllm.logprobs.Logprob
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FlatLogprobs:  # vllm.logprobs.FlatLogprobs: what append_fast builds (no de-duplication)
    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int | None] = field(default_factory=list)

    def append(self, entries: list[tuple[int, float, int]] | None) -> None:
        self.start_indices.append(len(self.logprobs))
        for token, lp, rank in entries or []:
            self.token_ids.append(token)
            self.logprobs.append(lp)
            self.ranks.append(rank)
        self.end_indices.append(len(self.logprobs))

    def __len__(self) -> int:
        return len(self.start_indices)

    def __getitem__(self, i: int) -> dict[int, Logprob]:
        span = range(self.start_indices[i], self.end_indices[i])
        return {self.token_ids[j]: Logprob(self.logprobs[j], self.ranks[j]) for j in span}


def position(actual: int, actual_rank: int, top: list[tuple[int, float]], actual_lp: float | None = None):
    """One prompt position as vLLM fills it: the actual token first (its true rank), then the
    top-k with ranks 1..k. Returns the entries as (token, logprob, rank) in insertion order."""
    lp = dict(top).get(actual, actual_lp)
    return [(actual, lp, actual_rank)] + [(tok, v, r + 1) for r, (tok, v) in enumerate(top)]


def as_dict(entries):
    """vLLM's dict form: a token already inserted keeps its place; the later value wins."""
    if entries is None:
        return None
    out: dict[int, Logprob] = {}
    for token, lp, rank in entries:
        out[token] = Logprob(lp, rank)
    return out


def as_flat(positions):
    flat = FlatLogprobs()
    for entries in positions:
        flat.append(entries)
    return flat


# Request 0: prompt [5, 6] + response [7, 8, 9] (K = 2): entry 0 None, entry i predicts token i.
REQ0 = [
    None,
    position(6, 1, [(6, -0.1), (3, -2.5)]),  # a prompt position: not read
    position(7, 3, [(1, -0.5), (2, -1.0)], actual_lp=-2.0),  # actual 7 outside the top-2: 3 entries
    position(8, 1, [(8, -0.2), (4, -1.9)]),  # actual 8 is the best: 2 entries as a dict
    position(9, 2, [(0, -0.3), (9, -1.4)]),  # actual 9 second: its rank 2 decides the order
]
EXPECTED0_IDS = [[1, 2], [8, 4], [0, 9]]
EXPECTED0_LP = [[-0.5, -1.0], [-0.2, -1.9], [-0.3, -1.4]]
# Request 1 (OPSD): a 3-token teacher prompt [5, 5, 5] + response [4] (the student's prompt was shorter).
REQ1 = [None, position(5, 1, [(5, -0.1), (1, -3.0)]), position(5, 1, [(5, -0.1), (1, -3.0)])]
REQ1 += [position(4, 2, [(3, -0.7), (4, -0.9)])]


@pytest.mark.parametrize("form", ["dict", "flat"])
def test_prompt_logprobs_become_topk_on_the_response_grid(form):
    convert = (lambda p: [as_dict(e) for e in p]) if form == "dict" else as_flat
    ids, logprobs, missing = prompt_logprobs_to_topk(
        [convert(REQ0), convert(REQ1)], prompt_lens=[2, 3], response_lens=[3, 1], k=2, width=4
    )
    assert ids.shape == logprobs.shape == (2, 4, 2) and ids.dtype == torch.long
    assert logprobs.dtype == torch.float32 and missing == 0
    assert ids[0, :3].tolist() == EXPECTED0_IDS
    assert torch.allclose(logprobs[0, :3], torch.tensor(EXPECTED0_LP))
    assert ids[1, 0].tolist() == [3, 4] and torch.allclose(logprobs[1, 0], torch.tensor([-0.7, -0.9]))
    # response padding: ids 0..K-1 at log(1/(K+1)), a finite stand-in the mask zeroes
    assert ids[0, 3].tolist() == [0, 1] and ids[1, 1:].tolist() == [[0, 1]] * 3
    assert torch.allclose(logprobs[1, 1:], torch.full((3, 2), -math.log(3)))


def test_the_dict_form_is_sorted_by_rank_whatever_the_insertion_order():
    # actual token 9 in the top-k keeps its first place in the dict but carries its top-k rank
    entry = as_dict(position(9, 2, [(0, -0.3), (9, -1.4)]))
    assert list(entry) == [9, 0]
    ids, logprobs, _ = prompt_logprobs_to_topk([[None, entry]], [1], [1], k=2, width=1)
    assert ids[0, 0].tolist() == [0, 9] and logprobs[0, 0].tolist() == pytest.approx([-0.3, -1.4])


def test_an_actual_token_tied_into_the_topk_ranks_is_not_taken_for_a_topk_entry():
    # the actual token shares rank 2 with a different top-2 token (a tie): 3 entries, the first dropped
    entry = as_dict([(7, -1.0, 2), (1, -0.5, 1), (2, -1.0, 2)])
    ids, _, _ = prompt_logprobs_to_topk([[None, entry]], [1], [1], k=2, width=1)
    assert ids[0, 0].tolist() == [1, 2]


def test_missing_positions_are_counted_and_filled():
    short = [None, as_dict(position(7, 1, [(7, -0.1), (1, -2.0)]))]  # one entry for two response tokens
    ids, logprobs, missing = prompt_logprobs_to_topk([short], [1], [2], k=2, width=2)
    assert missing == 1
    assert ids[0, 0].tolist() == [7, 1] and ids[0, 1].tolist() == [0, 1]
    assert torch.isfinite(logprobs).all()


def test_entries_that_are_not_a_topk_are_an_error():
    entry = as_dict([(7, -1.0, 9), (1, -0.5, 1)])  # top-2 asked, one top entry returned
    with pytest.raises(AssertionError, match="not a top-2"):
        prompt_logprobs_to_topk([[None, entry]], [1], [1], k=2, width=1)
    with pytest.raises(AssertionError, match="entries for top-2"):
        prompt_logprobs_to_topk([[None, as_dict([(1, -0.5, 1)])]], [1], [1], k=2, width=1)


def test_flat_form_with_a_nonuniform_layout_is_read_per_position():
    flat = as_flat(REQ0)
    flat.start_indices[3] += 1  # as if one position held k entries: the block fast path does not apply
    ids, _, _ = prompt_logprobs_to_topk([flat], [2], [3], k=2, width=3)
    assert ids[0, 0].tolist() == EXPECTED0_IDS[0] and ids[0, 2].tolist() == EXPECTED0_IDS[2]


def test_requests_are_prompt_then_response_ids_and_opsd_reads_the_teacher_prompt():
    batch = Batch(
        {
            "prompts": torch.tensor([[0, 5, 6], [0, 0, 4]]),
            "prompt_mask": torch.tensor([[0, 1, 1], [0, 0, 1]]),
            "responses": torch.tensor([[7, 8, 9], [3, 0, 0]]),
            "response_mask": torch.tensor([[1, 1, 1], [1, 0, 0]]),
        }
    )
    requests, lens = teacher_request_ids(*scoring_inputs(batch), batch["responses"], batch["response_mask"])
    assert requests == [[5, 6, 7, 8, 9], [4, 3]] and lens == [2, 1]
    opsd = batch.union(
        Batch(
            {
                "teacher_prompts": torch.tensor([[5, 5, 5], [0, 1, 2]]),
                "teacher_prompt_mask": torch.tensor([[1, 1, 1], [0, 1, 1]]),
            }
        )
    )
    requests, lens = teacher_request_ids(*scoring_inputs(opsd), opsd["responses"], opsd["response_mask"])
    assert requests == [[5, 5, 5, 7, 8, 9], [1, 2, 3]] and lens == [3, 2]


def test_teacher_engine_and_sampling_arguments():
    cfg = compose_config(
        "teacher.model=/t",
        "teacher.placement=standalone",
        "teacher.gpus=2",
        "teacher.tensor_model_parallel_size=2",
        "+teacher.engine_kwargs.max_logprobs=64",
        "data.max_prompt_length=100",
        "data.max_response_length=28",
    )
    spec = replace(role_spec(cfg, "teacher"), model=ModelSpec("/t", "bf16", None))
    kwargs = teacher_llm_kwargs(spec, "/t")
    assert kwargs["tensor_parallel_size"] == 2 and kwargs["dtype"] == "bfloat16"
    assert kwargs["max_logprobs"] == 64 and kwargs["max_model_len"] == 129
    assert kwargs["distributed_executor_backend"] == "external_launcher" and not kwargs["enable_sleep_mode"]
    sp = teacher_sampling_kwargs(64)
    assert (sp["prompt_logprobs"], sp["max_tokens"], sp["flat_logprobs"]) == (64, 1, True)


def test_replica_metrics_take_the_slowest_time_and_add_throughput():
    from dagrl.nodes.teacher import replica_metrics

    merged = replica_metrics(
        [
            {"teacher/score_s": 2.0, "teacher/tokens_per_s": 100.0},
            {"teacher/score_s": 3.0, "teacher/tokens_per_s": 50.0, "teacher/missing_positions": 1.0},
        ]
    )
    assert merged == {"teacher/score_s": 3.0, "teacher/tokens_per_s": 150.0, "teacher/missing_positions": 1.0}
