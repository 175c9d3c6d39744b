"""Trajectories -> the batch's fixed-width tensors, and the rollout's multi-turn metrics."""

from __future__ import annotations

import torch

from dagrl.rollout.episodes import Trajectory

STOP_REASONS = ("done", "length", "max_assistant_turns", "max_user_turns")


def trajectories_to_tensors(trajs: list[Trajectory], width: int, max_turns: int, pad_id: int) -> dict:
    """[B, width] responses (every token after the prompt), response_mask (1 on policy tokens),
    response_attention_mask (1 on every real token: what the trainer's forward attends to),
    rollout_logprobs (0 off the policy's tokens), turn_ids (the assistant turn a token belongs to,
    its observation included; -1 on padding); [B] env_rewards; [B, max_turns] turn_rewards."""
    rows = len(trajs)
    out = {
        "responses": torch.full((rows, width), pad_id, dtype=torch.long),
        "response_mask": torch.zeros((rows, width), dtype=torch.long),
        "response_attention_mask": torch.zeros((rows, width), dtype=torch.long),
        "rollout_logprobs": torch.zeros((rows, width), dtype=torch.float32),
        "turn_ids": torch.full((rows, width), -1, dtype=torch.long),
        "turn_rewards": torch.zeros((rows, max_turns), dtype=torch.float32),
        "env_rewards": torch.zeros(rows, dtype=torch.float32),
    }
    for i, t in enumerate(trajs):
        n = len(t.tokens)
        assert n <= width, f"episode {i}: {n} tokens, more than data.max_response_length={width}"
        out["responses"][i, :n] = torch.as_tensor(t.tokens, dtype=torch.long)
        out["response_mask"][i, :n] = torch.as_tensor(t.policy, dtype=torch.long)
        out["response_attention_mask"][i, :n] = 1
        out["rollout_logprobs"][i, :n] = torch.as_tensor(t.logprobs, dtype=torch.float32)
        out["turn_ids"][i, :n] = torch.as_tensor(t.turn, dtype=torch.long)
        out["turn_rewards"][i, : t.turns] = torch.as_tensor(t.turn_rewards, dtype=torch.float32)
        out["env_rewards"][i] = sum(t.turn_rewards)
    return out


def episode_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Means per episode: turns, observations, the environments' numeric info (tool calls, errors,
    timeouts); the policy's share of the tokens; the share of each stop reason. Means, so that
    replicas' figures average (the rollout node takes their mean)."""
    n = max(len(trajs), 1)
    metrics = {
        "multi_turn/assistant_turns": sum(t.turns for t in trajs) / n,
        "multi_turn/observations": sum(t.observations for t in trajs) / n,
        "multi_turn/policy_token_share": sum(sum(t.policy) for t in trajs)
        / max(sum(len(t.tokens) for t in trajs), 1),
    }
    for reason in STOP_REASONS:
        metrics[f"multi_turn/stop_{reason}"] = sum(t.stop == reason for t in trajs) / n
    keys = {k for t in trajs for k in t.info}
    for k in sorted(keys):
        metrics[k] = sum(t.info.get(k, 0.0) for t in trajs) / n
    return metrics
