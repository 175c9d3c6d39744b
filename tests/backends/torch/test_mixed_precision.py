"""bf16 trains on the torch backend: fp32 master weights and AdamW state (mixed_precision.py),
their CPU offload (the same numbers through host buffers), checkpoints and offload that keep them.

Before the masters AdamW ran on the bf16 weights: 3 steps at lr 1e-6 changed 1.4 % of the tiny
model's weights, and the update was 99.6 % off fp32's (tests/backends/precision_check.py)."""

from __future__ import annotations

import pytest
import torch

from tests.backends.precision_check import LR, STEPS, assert_update_matches_fp32, flat_update
from tests.backends.test_update_loop import make_batch, torch_backend

BF16 = "actor_rollout_ref.model.dtype=bfloat16"
CPU_OFFLOAD = "actor_rollout_ref.actor.optimizer_cpu_offload=true"


def _trained_weights(backend) -> list[torch.Tensor]:
    """The weights the optimizer updates: the fp32 masters where there are any."""
    tensors = getattr(backend.optimizer, "masters", None) or list(backend.model.parameters())
    return [t.detach().clone() for t in tensors]


def _update(*overrides: str):
    backend = torch_backend(*LR, *overrides)
    batch = make_batch(backend)
    before = _trained_weights(backend)
    for _ in range(STEPS):
        backend.train_step(batch)
    return backend, flat_update(before, _trained_weights(backend))


@pytest.fixture(scope="module")
def fp32_update():
    backend, update = _update()
    assert backend.optimizer.masters is backend.optimizer.params  # fp32: no copy
    return update


@pytest.fixture(scope="module")
def bf16_update():
    return _update(BF16)


def test_bf16_update_matches_fp32(fp32_update, bf16_update):
    backend, update = bf16_update
    assert_update_matches_fp32(update, fp32_update)
    for p, m in zip(backend.model.parameters(), backend.optimizer.masters):
        assert p.dtype == torch.bfloat16 and m.dtype == torch.float32
        assert torch.equal(p.detach(), m.to(torch.bfloat16))  # the weights are the rounded masters


def test_optimizer_cpu_offload_matches_resident_step(bf16_update):
    """On CPU the host is the same memory, but the offload path runs: gradients copied into the
    host buffers, the fused host AdamW, the weights rounded through the staging buffers."""
    resident, _ = bf16_update
    offloaded, _ = _update(BF16, CPU_OFFLOAD)
    assert offloaded.optimizer.host == torch.device("cpu") and resident.optimizer.host is None
    for a, b in zip(resident.model.parameters(), offloaded.model.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(resident.optimizer.masters, offloaded.optimizer.masters):
        assert torch.equal(a, b)


def test_resume_continues_from_the_masters_bit_identically(tmp_path):
    """save after step 1, load into a fresh backend, step 2: the same masters, weights and moments."""
    first = torch_backend(*LR, BF16)
    batch = make_batch(first)
    first.train_step(batch)
    first.save(str(tmp_path))
    second = torch_backend(*LR, BF16)
    second.load(str(tmp_path))
    for backend in (first, second):
        backend.train_step(batch)
    for a, b in zip(first.optimizer.masters, second.optimizer.masters):
        assert torch.equal(a, b)
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(a, b)
    moments = [(s["exp_avg"], s["exp_avg_sq"]) for s in first.optimizer.state.values()]
    again = [(s["exp_avg"], s["exp_avg_sq"]) for s in second.optimizer.state.values()]
    assert all(torch.equal(x, y) for pair_a, pair_b in zip(moments, again) for x, y in zip(pair_a, pair_b))


def test_offload_moves_the_masters_and_forward_only_roles_have_none(bf16_update):
    backend, _ = bf16_update
    moved = {id(t) for t in backend._state_tensors()}
    assert all(id(m) in moved for m in backend.optimizer.masters)
    assert all(id(v) in moved for s in backend.optimizer.state.values() for k, v in s.items() if k != "step")
    from dataclasses import replace

    from dagrl.backends.torch.train import TorchTrainBackend

    ref_spec = replace(backend.spec, name="ref", kind="ref", trains=False)
    ref = TorchTrainBackend(replace(ref_spec, train=replace(backend.settings, update=None)), backend.ctx)
    assert ref.optimizer is None and not any(p.requires_grad for p in ref.model.parameters())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_adam_state_exists_from_the_start_and_the_steps_are_those_of_a_lazy_one(dtype):
    """The moments are created with the optimizer (mixed_precision._create_moments: made inside
    the first step, they pin cached GPU segments for the whole run); the weights after three steps
    equal, bit for bit, those of an optimizer whose state AdamW creates lazily."""
    from dagrl.backends.torch.mixed_precision import MasterWeightsAdamW
    from dagrl.config.schema import OptimConfig

    optim = OptimConfig(lr=1e-2, weight_decay=0.1)
    torch.manual_seed(0)
    init = [torch.randn(8, 4, dtype=dtype), torch.randn(5, dtype=dtype)]
    eager_params = [torch.nn.Parameter(t.clone()) for t in init]
    lazy_params = [torch.nn.Parameter(t.clone()) for t in init]
    eager = MasterWeightsAdamW(eager_params, optim)
    states = list(eager.inner.state.values())
    assert len(states) == 2 and all(int(s["step"]) == 0 for s in states)
    assert all(not s["exp_avg"].any() and not s["exp_avg_sq"].any() for s in states)
    assert all(torch.equal(p, t) for p, t in zip(eager_params, init))  # making it moved nothing
    lazy = MasterWeightsAdamW(lazy_params, optim)
    lazy.inner.state.clear()  # as AdamW leaves it until its first step
    for step in range(3):
        grads = [
            torch.randn(t.shape, dtype=dtype, generator=torch.Generator().manual_seed(step)) for t in init
        ]
        for opt, params in ((eager, eager_params), (lazy, lazy_params)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step(max_norm=1.0)
            opt.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(eager_params, lazy_params))
    assert all(torch.equal(a, b) for a, b in zip(eager.masters, lazy.masters))


def _zero_step_moments(opt) -> None:
    """The state as it was created before: AdamW's own first step, at lr 0 on zero gradients, its
    step count set back to 0 (the reference the direct creation must equal)."""
    opt.inner.state.clear()
    lrs = [group["lr"] for group in opt.inner.param_groups]
    for group in opt.inner.param_groups:
        group["lr"] = 0.0
    for m in opt.masters:
        m.grad = torch.zeros_like(m)
    opt.inner.step()
    for m in opt.masters:
        m.grad = None
    for group, lr in zip(opt.inner.param_groups, lrs):
        group["lr"] = lr
    for state in opt.inner.state.values():
        state["step"].zero_()


def _assert_same_optimizer(a, b) -> None:
    """Weights, masters and every state tensor equal in dtype, device, shape and bits, in the same
    order, and the same checkpoint bytes."""
    import io

    for x, y in zip([*a.params, *a.masters], [*b.params, *b.masters], strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)
    for m, n in zip(a.masters, b.masters, strict=True):
        sa, sb = a.inner.state[m], b.inner.state[n]
        assert list(sa) == list(sb) == ["step", "exp_avg", "exp_avg_sq"]
        for key in sa:
            x, y = sa[key], sb[key]
            assert (x.dtype, x.device, x.shape) == (y.dtype, y.device, y.shape), key
            assert torch.equal(x, y), key
    saved = []
    for opt in (a, b):
        buffer = io.BytesIO()
        torch.save(opt.state_dict(), buffer)
        saved.append(buffer.getvalue())
    assert saved[0] == saved[1]


@pytest.mark.parametrize(
    "dtype, host",
    [(torch.bfloat16, "cpu"), (torch.bfloat16, None), (torch.float32, None)],
    ids=["bf16-host-step", "bf16", "fp32-in-place"],
)
def test_adam_state_made_directly_equals_the_zero_step_one_and_trains_identically(dtype, host):
    """MasterWeightsAdamW on a small Qwen3 makes m, v and the step count directly (zeros, no step);
    they equal those the lr-0 step on zero gradients made (dtype, device, shape, bits, checkpoint
    bytes), and three steps later so does everything. Paths: the fused host step, the fused step
    on the masters' device, the plain step of AdamW on fp32 parameters in place."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from dagrl.backends.torch.mixed_precision import MasterWeightsAdamW
    from dagrl.config.schema import OptimConfig

    config = Qwen3Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    optim = OptimConfig(lr=1e-3, weight_decay=0.1)
    host = torch.device(host) if host else None
    torch.manual_seed(0)
    direct_model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    reference_model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    reference_model.load_state_dict(direct_model.state_dict())
    direct = MasterWeightsAdamW(list(direct_model.parameters()), optim, host)
    reference = MasterWeightsAdamW(list(reference_model.parameters()), optim, host)
    _zero_step_moments(reference)
    assert bool(direct.inner.param_groups[0]["fused"]) == (dtype == torch.bfloat16)
    _assert_same_optimizer(direct, reference)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        grads = [torch.randn(p.shape, generator=g).to(dtype) for p in direct.params]
        for opt in (direct, reference):
            for p, grad in zip(opt.params, grads):
                p.grad = grad.clone()
            opt.step(max_norm=1.0)
            opt.zero_grad()
    assert all(int(s["step"]) == 3 for s in direct.inner.state.values())
    _assert_same_optimizer(direct, reference)
