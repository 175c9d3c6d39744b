"""The torch critic on the shipped tiny model (CPU, in process): its values sit on the [B, R] grid
of the responses (the position predicting each token), its update fits the returns, and a save
restores weights, head, optimizer and RNG exactly. The GPU tests of both critics
(tests/backends/*/test_critic_gpu.py) take their batch and their device-figure checks from here."""

from __future__ import annotations

import torch

from dagrl.backends import build_backend, device_memory
from dagrl.config.role_specs import role_spec
from dagrl.config.validate import resolve_defaults
from dagrl.core.batch import Batch
from dagrl.core.worker import ParallelContext
from tests.conftest import compose_config


def critic(*overrides: str):
    cfg = compose_config("algorithm=ppo", *overrides)
    resolve_defaults(cfg)
    return build_backend(role_spec(cfg, "critic"), ParallelContext(0, 1, torch.device("cpu")))


def batch(rows: int = 4, prompt: int = 3, response: int = 4) -> Batch:
    gen = torch.Generator().manual_seed(0)
    prompt_mask = torch.ones(rows, prompt, dtype=torch.long)
    prompt_mask[0, 0] = 0  # left padding
    response_mask = torch.ones(rows, response, dtype=torch.long)
    response_mask[1, -1] = 0  # a shorter response
    return Batch(
        {
            "prompts": torch.randint(2, 200, (rows, prompt), generator=gen),
            "prompt_mask": prompt_mask,
            "responses": torch.randint(2, 200, (rows, response), generator=gen),
            "response_mask": response_mask,
        }
    )


def assert_device_figures(phases: dict[str, dict]) -> None:
    """Each critic phase's figures (backends/device_memory.py) under the plan's name for it: the
    card in use at its end (within the card), the phase's own allocator peak (within that) and its
    calls to the driver."""
    card = torch.cuda.mem_get_info()[1] / 2**30
    for phase, metrics in phases.items():
        used = metrics[f"{phase}/device_memory_used_gib"]
        assert 0 < used <= card, (phase, metrics)
        assert 0 < metrics[f"{phase}/peak_added_gib"] <= used, (phase, metrics)
        counts = ("alloc_retries", "device_mallocs", "device_frees")
        assert all(metrics[f"{phase}/{count}"] >= 0 for count in counts), (phase, metrics)


def assert_logged_device_figures(steps: list[dict]) -> None:
    """A run's steps log both critic phases' card in use, within the card."""
    card = torch.cuda.mem_get_info()[1] / 2**30
    for phase in ("values", "critic_update"):
        assert all(0 < r[f"{phase}/device_memory_used_gib"] <= card for r in steps), phase


def having(b: Batch, **tensors) -> Batch:
    return Batch({**b.tensors, **tensors})


def test_value_of_a_token_is_read_where_the_token_is_predicted():
    backend, b = critic(), batch()
    values = backend.compute_values(b)[0]["values"]
    assert values.shape == (4, 4)
    # response token 0 is predicted from the prompt alone: changing it moves values from column 1 on
    responses = b["responses"].clone()
    responses[:, 0] = (responses[:, 0] + 1) % 200 + 2
    changed = having(b, responses=responses)
    moved = backend.compute_values(changed)[0]["values"]
    torch.testing.assert_close(moved[:, 0], values[:, 0])
    assert not torch.allclose(moved[:, 1], values[:, 1])
    head = backend.model.head  # HF's token-classification init: normal(0.02), zero bias
    assert float(head.bias.detach().abs().max()) == 0.0 and 0.01 < float(head.weight.detach().std()) < 0.03


def test_update_fits_the_returns():
    backend, b = critic("critic.optim.lr=1e-3", "critic.optim.lr_warmup_steps=0"), batch()
    b = having(b, returns=torch.ones(4, 4) * b["response_mask"])
    losses = []
    for _ in range(4):
        values, values_metrics = backend.compute_values(b)
        metrics = backend.train_step(having(b, values=values["values"]))[1]
        losses.append(metrics["critic/vf_loss"])
    assert losses[-1] < 0.5 * losses[0], losses
    assert values_metrics == {} and not device_memory.card_figures(metrics)  # none on a CPU device


def test_save_and_load_restore_the_critic_exactly(tmp_path):
    b = having(batch(), returns=torch.ones(4, 4))
    first = critic("critic.optim.lr=1e-3")
    b = having(b, values=first.compute_values(b)[0]["values"])
    first.train_step(b)
    first.save(str(tmp_path))
    second = critic("critic.optim.lr=1e-3", "trainer.seed=7")  # another head until it loads
    second.load(str(tmp_path))
    assert second.steps == first.steps == 1
    first.train_step(b), second.train_step(b)  # the restored Adam moments and step count act alike
    for p, q in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(p, q)
