"""PPO with a critic end to end on the CPU (shipped tiny model; actor, rollout and critic colocated
on one worker): the critic warms up alone, then both learn, and a resumed run equals the straight
one, critic included. The learning figures (40 steps) are README's."""

from __future__ import annotations

import torch

from tests.e2e.test_grpo_run import resume_matches


def test_ppo_resume_reproduces_uninterrupted_run_critic_included(ray_local, tmp_path):
    """4 steps == 2 + resume + 2 (the critic's weights, head, Adam state and step count restored:
    otherwise its values, the GAE advantages and every later metric differ); step 1 is the warm-up."""
    from safetensors.torch import load_file

    rows = resume_matches(tmp_path, "algorithm=ppo", "trainer.critic_warmup=1", weights=True)
    assert rows[0]["actor/critic_warmup"] == 1.0 and "actor/pg_loss" not in rows[0]
    assert all("actor/pg_loss" in r and "critic/vf_loss" in r for r in rows[1:])
    assert all(r["critic/vf_loss"] > 0 for r in rows)
    critics = [tmp_path / run / "global_step_4" / "critic" for run in ("straight", "resumed")]
    ours, theirs = (load_file(d / "model.safetensors") for d in critics)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    heads = [torch.load(d / "value_head.pt", weights_only=True) for d in critics]
    assert all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])


def test_ppo_over_multi_turn_episodes_credits_each_turn(ray_local, tmp_path):
    """dag=ppo_multi_turn, one step: the critic values the policy's tokens of three-turn episodes
    (observations attended, not valued) and, with turn_reward_mode=turn, the environment's 0.25 per
    answer reaches GAE's returns (the placement by turn is hand-checked in tests/nodes)."""
    from dagrl.main import run
    from tests.conftest import compose_config
    from tests.e2e.test_grpo_run import FAST, read_metrics

    mt = "actor_rollout_ref.rollout.multi_turn"
    run(
        compose_config(
            *FAST,
            "algorithm=ppo",
            "dag=ppo_multi_turn",
            "external_plugins=[tests/plugins/quiz_env.py]",
            f"{mt}.enable=true",
            f"{mt}.environment=quiz",
            f"{mt}.max_tool_response_length=8",
            f"{mt}.turn_reward_mode=turn",
            "data.max_response_length=48",
            "trainer.total_training_steps=1",
            f"trainer.default_local_dir={tmp_path}",
        )
    )
    [row] = read_metrics(tmp_path)
    assert row["multi_turn/assistant_turns"] == 3.0 and row["critic/vf_loss"] > 0
    # γ = λ = 1: every policy token's return is its reward-to-go: at least the last answer's 0.25
    assert row["critic/returns/mean"] >= 0.25


def test_ppo_with_megatron_actor_and_megatron_critic(ray_local, tmp_path):
    """critic.strategy=megatron beside the megatron actor on one CPU worker (gloo), two steps: the
    values and critic_update nodes run on it, its figures are logged, and the checkpoint holds its
    sharded state (megatron's format) beside the actor's."""
    from dagrl.main import run
    from tests.conftest import compose_config
    from tests.e2e.test_grpo_run import read_metrics
    from tests.e2e.test_megatron_run import MEGATRON

    run(
        compose_config(
            *MEGATRON,
            "algorithm=ppo",
            "critic.strategy=megatron",
            "critic.megatron.param_dtype=float32",
            "data.max_response_length=8",
            "trainer.total_training_steps=2",
            "trainer.save_freq=2",
            f"trainer.default_local_dir={tmp_path}",
        )
    )
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["critic/vf_loss"] > 0 and "actor/pg_loss" in r for r in rows)
    assert rows[0]["critic/vpred_mean"] != rows[1]["critic/vpred_mean"]  # the critic trained
    assert (tmp_path / "global_step_2" / "critic" / ".metadata").exists()
