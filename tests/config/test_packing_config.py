"""actor_rollout_ref.model.use_remove_padding: the combinations validate refuses, and those it lets through."""

from __future__ import annotations

from tests.config.test_megatron_config import M, checked, expect_error, megatron, model, no_te, with_te  # noqa: F401

PACK = "actor_rollout_ref.model.use_remove_padding=true"


def test_packing_is_off_by_default_and_valid_on_the_torch_backend():
    assert checked().actor_rollout_ref.model.use_remove_padding is False
    assert checked(PACK).actor_rollout_ref.model.use_remove_padding is True


def test_torch_packing_refuses_remote_code(tmp_path):
    expect_error(
        "actor_rollout_ref.model.use_remove_padding",
        "use_remove_padding=false",
        PACK,
        "actor_rollout_ref.model.trust_remote_code=true",
    )


def test_megatron_packing_refuses_the_te_spec(model, with_te):  # noqa: F811
    expect_error(f"{M}.layer_spec", "use layer_spec=sdpa", *megatron(model, PACK, f"{M}.layer_spec=te"))
    for spec in ("auto", "sdpa", "local"):  # auto means sdpa when packing (backends/megatron/train.py)
        checked(*megatron(model, PACK, f"{M}.layer_spec={spec}"))


def test_megatron_packing_with_trust_remote_code_is_fine(model, no_te):  # noqa: F811
    # megatron builds its own model: nothing of the repository's modelling code runs
    checked(*megatron(model, PACK, "actor_rollout_ref.model.trust_remote_code=true"))
