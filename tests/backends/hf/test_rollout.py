"""dagrl.backends.hf.rollout: rollout.ignore_eos keeps sampling past EOS, as vLLM does."""

from __future__ import annotations

import json
import shutil

import torch

from dagrl.core.batch import Batch
from tests.conftest import compose_config

R = "actor_rollout_ref.rollout"
LENGTH = 6


def _rollout(model: str, *overrides: str):
    from dagrl.backends.hf.rollout import HFRolloutBackend
    from dagrl.config.role_specs import role_spec
    from dagrl.config.validate import resolve_defaults
    from dagrl.core.worker import ParallelContext

    cfg = compose_config(
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        f"data.max_response_length={LENGTH}",
        f"{R}.temperature=0",
        *overrides,
    )
    resolve_defaults(cfg)
    return HFRolloutBackend(role_spec(cfg, "rollout"), ParallelContext(0, 1, torch.device("cpu")))


def _prompts() -> Batch:
    prompts = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    return Batch({"prompts": prompts, "prompt_mask": (prompts != 0).long()})


def test_ignore_eos_samples_to_the_full_length(tmp_path):
    """The shipped tiny model, greedy, with its first answer tokens made EOS: a response ends after
    one token, unless ignore_eos, where it runs on from the same token to max_response_length."""
    from dagrl.backends.hf_model import resolve_model_path

    model = tmp_path / "model"
    shutil.copytree(resolve_model_path(None), model)
    first, _ = _rollout(str(model)).generate(_prompts(), seed=1)
    config = json.loads((model / "generation_config.json").read_text())
    config["eos_token_id"] = sorted({config["eos_token_id"], *first["responses"][:, 0].tolist()})
    (model / "generation_config.json").write_text(json.dumps(config))

    stopped, _ = _rollout(str(model)).generate(_prompts(), seed=1)
    assert stopped["response_mask"].sum(1).tolist() == [1, 1]
    kept, _ = _rollout(str(model), f"{R}.ignore_eos=true").generate(_prompts(), seed=1)
    assert kept["response_mask"].sum(1).tolist() == [LENGTH, LENGTH]
    assert torch.equal(kept["responses"][:, 0], first["responses"][:, 0])
