"""The vLLM rollout engine on a GPU, against the hf rollout and the torch trainer on the shipped tiny
model: greedy outputs, EOS handling, log-probs, in-GPU weight refresh and sleep / staged wake-up.

One engine per process (vLLM's sleep-mode allocator is a process singleton), shared by the tests.
It starts as users get it, compiled with CUDA graphs: the one in-process GPU test whose engine
sleeps, wakes in stages and takes new weights in place under captured graphs (the others start
eager, in seconds). max_num_seqs=64, the test's prompts, keeps the graphs captured to 19 batch
sizes instead of 51. Run on the GPU machine:
    python -m pytest -m gpu tests/backends/vllm/test_vllm_gpu.py
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("vllm")

from dagrl.backends.hf.rollout import HFRolloutBackend  # noqa: E402
from dagrl.backends.torch.train import TorchTrainBackend  # noqa: E402
from dagrl.backends.vllm.rollout import VLLMRolloutBackend  # noqa: E402
from dagrl.config.role_specs import role_spec  # noqa: E402
from dagrl.core.batch import Batch  # noqa: E402
from dagrl.core.worker import ParallelContext  # noqa: E402
from tests.conftest import compose_config  # noqa: E402
from tests.train_backends import train_backend  # noqa: E402

DTYPE = os.environ.get("DAGRL_TEST_VLLM_DTYPE", "float32")
CTX = ParallelContext(0, 1, torch.device("cuda", 0))


@pytest.fixture(scope="module")
def cfg():
    return compose_config(
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.calculate_log_probs=true",  # compared with the trainer's below
        f"actor_rollout_ref.model.dtype={DTYPE}",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "actor_rollout_ref.rollout.sleep_level=1",
        "actor_rollout_ref.rollout.max_num_seqs=64",  # the 64 prompts below in one engine step
        "actor_rollout_ref.rollout.val_kwargs.do_sample=false",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "trainer.device=cuda",
    )


@pytest.fixture(scope="module")
def engines(cfg):
    spec = role_spec(cfg, "rollout")
    vllm_backend = VLLMRolloutBackend(spec, CTX)
    hf_backend = HFRolloutBackend(spec, CTX)
    trainer = train_backend(TorchTrainBackend, cfg, CTX)
    yield vllm_backend, hf_backend, trainer
    vllm_backend.shutdown()


@pytest.fixture(scope="module")
def prompts(cfg):
    from dagrl.backends.hf_model import load_tokenizer, resolve_model_path
    from dagrl.data.builtin import generate_rows
    from dagrl.data.parquet import PromptDataset
    from dagrl.trainer.loop import collate

    tok = load_tokenizer(resolve_model_path(None))
    data = PromptDataset.from_rows(generate_rows("test", 64, 1), tok, max_prompt_length=32, source="test")
    return collate([data[i] for i in range(64)], tok.pad_token_id, 1, 0)


def greedy(backend, prompts) -> Batch:
    out, _ = backend.generate(prompts.select(["prompts", "prompt_mask"]), seed=0, validate=True)
    return out


def test_greedy_matches_hf_and_keeps_eos(engines, prompts):
    vllm_backend, hf_backend, _ = engines
    ours, ref = greedy(vllm_backend, prompts), greedy(hf_backend, prompts)
    same = (ours["responses"] * ours["response_mask"] == ref["responses"] * ref["response_mask"]).all(1)
    assert same.float().mean() >= 0.95, f"{int((~same).sum())} of 64 greedy rows differ from the hf rollout"
    assert torch.equal(ours["response_mask"][same], ref["response_mask"][same])
    last = ours["response_mask"].sum(1) - 1
    ended = last < ours["responses"].shape[1] - 1  # stopped before max_response_length: at EOS
    eos = set(vllm_backend.eos_ids)
    assert ended.any(), "the tiny model answers and stops; no row ended"
    assert all(int(ours["responses"][i, last[i]]) in eos for i in torch.nonzero(ended)[:, 0])


def test_sampled_logprobs_match_the_trainer(engines, prompts):
    vllm_backend, _, trainer = engines
    batch = prompts.select(["prompts", "prompt_mask"])
    out, metrics = vllm_backend.generate(batch, seed=3)
    assert metrics["rollout/tokens_per_s"] > 0
    scored, _ = trainer.forward_logprobs(batch.union(out), "old_logprobs")
    mask = out["response_mask"].bool()
    diff = (scored["old_logprobs"] - out["rollout_logprobs"])[mask].abs()
    tol = 2e-3 if DTYPE == "float32" else 5e-2
    assert diff.mean() < tol and diff.max() < 50 * tol, (float(diff.mean()), float(diff.max()))


def test_same_seed_same_samples(engines, prompts):
    vllm_backend, _, _ = engines
    batch = prompts.select(["prompts", "prompt_mask"])
    a, _ = vllm_backend.generate(batch, seed=11)
    b, _ = vllm_backend.generate(batch, seed=11)
    c, _ = vllm_backend.generate(batch, seed=12)
    assert torch.equal(a["responses"], b["responses"])
    assert not torch.equal(a["responses"], c["responses"])


def test_one_request_samples_a_prompts_n_rows(engines, cfg, monkeypatch):
    """16 prompts × 4 samples as the worker gets them (runs of 4, `Batch.repeats`): 16 requests of
    n=4 reach the engine, each row is its prompt's (the trainer scores it as the engine sampled it),
    the rows draw with the seeds one request per row had (vLLM seeds sample i with seed + i: the
    same rows but where the batch's numerics differ), and a seed repeats its samples."""
    import pickle

    from dagrl.backends.hf_model import load_tokenizer, resolve_model_path
    from dagrl.data.builtin import generate_rows
    from dagrl.data.parquet import PromptDataset
    from dagrl.trainer.loop import collate

    vllm_backend, _, trainer = engines
    tok = load_tokenizer(resolve_model_path(None))
    data = PromptDataset.from_rows(generate_rows("test", 16, 2), tok, max_prompt_length=32, source="test")
    rows = collate([data[i] for i in range(16)], tok.pad_token_id, 4, 0).select(["prompts", "prompt_mask"])
    batch = pickle.loads(pickle.dumps(rows.compacted())).expanded()  # what Worker.call hands it
    assert batch.repeats == {"prompts": 4, "prompt_mask": 4}
    sent = []
    real = vllm_backend.llm.generate

    def counting(prompts, params, **kwargs):
        sent.append((len(prompts), {p.n for p in params}))
        return real(prompts, params, **kwargs)

    monkeypatch.setattr(vllm_backend.llm, "generate", counting)
    out, _ = vllm_backend.generate(batch, seed=5)
    again, _ = vllm_backend.generate(batch, seed=5)
    other, _ = vllm_backend.generate(batch, seed=6)
    per_row, _ = vllm_backend.generate(Batch(dict(batch.tensors)), seed=5)  # no runs: 64 requests
    assert sent == [(16, {4})] * 3 + [(64, {1})]
    assert torch.equal(out["responses"], again["responses"])
    assert not torch.equal(out["responses"], other["responses"])
    same = (out["responses"] == per_row["responses"]).all(1).float().mean()
    assert same >= 0.9, f"only {float(same):.0%} of the rows equal their one-request-per-row draw"
    scored, _ = trainer.forward_logprobs(batch.union(out), "old_logprobs")
    mask = out["response_mask"].bool()
    diff = (scored["old_logprobs"] - out["rollout_logprobs"])[mask].abs()
    tol = 2e-3 if DTYPE == "float32" else 5e-2
    assert diff.mean() < tol and diff.max() < 50 * tol, (float(diff.mean()), float(diff.max()))


def test_staged_refresh_from_sleep_loads_new_weights(engines, prompts):
    vllm_backend, hf_backend, trainer = engines
    with torch.no_grad():  # new weights the engine has never seen
        for p in trainer.model.parameters():
            p.mul_(1.0 + 0.05 * torch.randn_like(p))
    free_awake = torch.cuda.mem_get_info()[0]
    vllm_backend.offload()
    assert vllm_backend.asleep
    assert torch.cuda.mem_get_info()[0] > free_awake, "sleep freed no GPU memory"
    vllm_backend.begin_weight_update()
    nbytes = vllm_backend.load_weights(trainer.export_weights())
    vllm_backend.finish_weight_update()
    assert nbytes > 0 and not vllm_backend.asleep
    for phase in ("asleep", "weights_awake", "before_kv", "awake"):
        assert f"memory/rollout_{phase}_free_gib" in vllm_backend.memory
    hf_backend.load_weights(trainer.export_weights())
    ours, ref = greedy(vllm_backend, prompts), greedy(hf_backend, prompts)
    same = (ours["responses"] * ours["response_mask"] == ref["responses"] * ref["response_mask"]).all(1)
    assert same.float().mean() >= 0.95


def test_direct_layout_learnt_from_vllm_equals_its_loader(engines):
    """The separate placement's direct refresh: the map learnt from vLLM's own loader, then new
    weights packed in vLLM's layout and copied into its parameters equal what the loader writes."""
    from dagrl.backends.weight_layout import (
        RecipeBuilder,
        bucket_bytes,
        pack_into,
        plan_buckets,
        sources_for,
        unpack_into,
    )

    vllm_backend, _, trainer = engines
    vllm_backend.onload()
    params = vllm_backend.engine_params()
    builder = RecipeBuilder(params)
    for bucket in trainer.export_weights():
        builder.observe(bucket, lambda probes: vllm_backend.load_weights([probes]))
        vllm_backend.load_weights([bucket])
        builder.verify(bucket)
    slots = builder.finish()
    assert slots is not None, builder.reason
    assert any(len(s.pieces) == 3 for s in slots), "vLLM fuses q/k/v into one parameter"
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.mul_(1.0 + 0.05 * torch.randn_like(p))
    vllm_backend.load_weights(trainer.export_weights())
    want = {name: p.detach().clone() for name, p in params.items()}
    with torch.no_grad():
        for p in params.values():
            p.zero_()
    plan = plan_buckets(slots, 2**20)
    for i, sources in enumerate(sources_for(plan, trainer.export_weights())):
        buffer = torch.empty(bucket_bytes(plan[i]), dtype=torch.uint8, device="cuda")
        pack_into(plan[i], sources, buffer)
        unpack_into(plan[i], buffer, params)
    assert all(torch.equal(params[name], w) for name, w in want.items())
