"""Token-budget micro-batches (verl's use_dynamic_bsz) on the megatron backend: micro-batches of
varying row counts and lengths through the pipelined schedule (PP2, gloo on CPU) give the torch
backend's fixed-micro-batch log-probs, loss and updated weights."""

from __future__ import annotations

import pytest

from tests.backends.megatron.test_backend import (
    COMMON,
    M,
    _check_against_reference,
    _logprobs_then_step,
    _torch_reference,
    make_batch,
    megatron_config,
)
from tests.conftest import compose_config
from tests.megatron_cpu_patch import run_distributed

pytest.importorskip("megatron.core")

BUDGET = (
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=17",
    "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=23",
)


def test_pp2_token_budget_matches_fixed_micro_batches_of_the_torch_backend():
    reference = _torch_reference(compose_config(*COMMON), make_batch())
    cfg = megatron_config(f"{M}.pipeline_model_parallel_size=2", *BUDGET)
    results = run_distributed(_logprobs_then_step, 2, cfg, reference[0])
    _check_against_reference(results, reference)
