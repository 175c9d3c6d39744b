"""The vLLM rollout's rows without vLLM (CPU): one request per prompt samples its n rows, and the
request outputs map back to the rows in collate's order with their own log-probs. The outputs
are built by hand with the fields vLLM 0.26's `RequestOutput` / `CompletionOutput` carry."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest
import torch

from dagrl.backends.vllm.convert import completions_in_row_order, responses_to_tensors
from dagrl.backends.vllm.rollout import samples_per_request
from dagrl.core.batch import Batch


def completion(index: int, ids: list[int]) -> SimpleNamespace:
    """A CompletionOutput: its sample number, sampled ids, one log-prob per id (-(id / 100))."""
    return SimpleNamespace(index=index, token_ids=ids, logprobs=[-t / 100 for t in ids])


def test_request_outputs_map_to_rows_in_order():
    """2 prompts × 3 samples, the completions listed out of sample order: row r * 3 + i is request
    r's sample i, its log-probs beside its tokens."""
    prompts = [[5, 6], [7]]
    outputs = [
        SimpleNamespace(
            prompt_token_ids=[5, 6],
            outputs=[completion(2, [12]), completion(0, [10, 1]), completion(1, [11])],
        ),
        SimpleNamespace(
            prompt_token_ids=[7],
            outputs=[completion(1, [21, 2, 3]), completion(2, [22]), completion(0, [20])],
        ),
    ]
    rows = completions_in_row_order(outputs, 3, prompts)
    assert [c.token_ids[0] for c in rows] == [10, 11, 12, 20, 21, 22]
    responses, mask, logprobs = responses_to_tensors(
        [c.token_ids for c in rows], [c.logprobs for c in rows], width=4, pad_id=0
    )
    assert responses[0].tolist() == [10, 1, 0, 0] and mask[4].tolist() == [1, 1, 1, 0]
    assert torch.allclose(logprobs, -responses.float() / 100)  # each token's own log-prob


def test_an_output_of_another_prompt_or_a_missing_sample_is_refused():
    outputs = [SimpleNamespace(prompt_token_ids=[7], outputs=[completion(0, [1]), completion(1, [2])])]
    with pytest.raises(AssertionError, match="another prompt"):
        completions_in_row_order(outputs, 2, [[5, 6]])
    with pytest.raises(AssertionError, match="expected 0..2"):
        completions_in_row_order(outputs, 3, [[7]])


def test_a_prompts_n_rows_are_one_request_when_they_arrive_as_runs():
    """What the worker hands the backend after a DP split (runs whole), the wire and the worker's
    expansion: one request per prompt when sampling; one per row when greedy or the runs were cut."""
    prompts = Batch({"prompts": torch.arange(8).reshape(4, 2), "prompt_mask": torch.ones(4, 2)})
    batch = prompts.repeat_interleave(4)  # 16 rows
    shard = batch.split(2)[1]
    got = pickle.loads(pickle.dumps(shard.compacted())).expanded()  # Worker.call
    assert torch.equal(got["prompts"], shard["prompts"])
    assert samples_per_request(got, temperature=1.0) == 4
    assert samples_per_request(got, temperature=0.0) == 1  # vLLM refuses greedy with n > 1
    cut = pickle.loads(pickle.dumps(batch.split(8)[0].compacted())).expanded()  # 2 rows of a run
    assert samples_per_request(cut, temperature=1.0) == 1
