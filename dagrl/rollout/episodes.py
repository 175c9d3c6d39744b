"""The multi-turn episode loop, engine-agnostic: generate → environment step → observation → …

    prompt ids ─▶ Sampler.submit ─▶ Sampler.poll ─▶ sampled ids + log-probs (kept as sampled)
                     ▲                                    │ decode (text only for the environment)
                     │                                    ▼
       context = prompt + every turn's ids ◀── observation ids ◀── Environment.step (thread pool)

Each episode advances on its own: as soon as its environment step returns, its next request is
submitted, while others decode or wait on tools. A `Sampler` that batches whole turns (the hf
backend, `turn_synchronous`) gets every ready request at once, in episode order, so a run is
reproducible; the vLLM sampler adds requests to a running engine one by one (continuous batching).

An episode ends when a turn stops short of EOS because the episode's length budget ran out (one
cut at multi_turn.max_tokens_per_turn goes on to the environment), the environment
says done (the `tools` environment: a turn without a tool call), max_assistant_turns policy turns
or max_user_turns observations have been made, or the next observation would not fit
data.max_response_length, which bounds the whole trajectory after the prompt (policy turns,
observations and template tokens together): each turn may use what the earlier ones left.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass, field
from typing import Protocol

from dagrl.errors import DagrlError
from dagrl.rollout.template import TurnTemplate, truncate
from dagrl.tools.base import Environment, StepResult


@dataclass
class Sample:
    key: int
    token_ids: list[int]
    logprobs: list[float]


class Sampler(Protocol):
    turn_synchronous: bool

    def submit(self, key: int, context: list[int], max_tokens: int) -> None:
        """Queue a request: sample at most max_tokens after `context` (token ids)."""
        ...

    def poll(self) -> list[Sample]:
        """Finished requests. A turn-synchronous sampler finishes every queued one; another may
        return after one engine step with none, so that the loop can hand back tool results."""
        ...

    def in_flight(self) -> int: ...


@dataclass
class EpisodeLimits:
    max_response_length: int
    max_assistant_turns: int
    max_user_turns: int
    max_tool_response_length: int
    truncate_side: str
    eos_ids: tuple[int, ...]
    max_tokens_per_turn: int | None = None

    def turn_budget(self, used: int) -> int:
        """Tokens the next turn may sample after `used` tokens of the episode."""
        left = self.max_response_length - used
        return left if self.max_tokens_per_turn is None else min(left, self.max_tokens_per_turn)


@dataclass
class Trajectory:
    """One episode after its prompt: `tokens` with, per token, whether the policy sampled it
    (`policy`), its rollout log-prob (0 on observations) and the assistant turn it belongs to."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    policy: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    observations: int = 0
    stop: str = ""
    info: dict[str, float] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        return len(self.turn_rewards)

    def add(self, ids: list[int], logprobs: list[float] | None, turn: int) -> None:
        self.tokens += ids
        self.policy += [1 if logprobs is not None else 0] * len(ids)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.turn += [turn] * len(ids)


def run_episodes(
    sampler: Sampler,
    prompts: list[list[int]],
    envs: list[Environment],
    rows: list[dict],
    template: TurnTemplate,
    decode: Callable[[list[int]], str],
    encode: Callable[[str], list[int]],
    limits: EpisodeLimits,
    pool: Executor,
) -> list[Trajectory]:
    """Play one episode per prompt to its end; trajectories in prompt order."""
    trajs = [Trajectory(list(p)) for p in prompts]
    for env, row in zip(envs, rows):
        if env.reset(row):  # a plugin environment's contract: the task is in the prompt
            raise DagrlError(
                f"environment {type(env).__name__}: reset() returned a first observation; dagrl starts"
                " each episode from the row's prompt, so put that text into the prompt when preprocessing"
                " (or in a row transform) and return None or '' from reset()"
            )
    for i, t in enumerate(trajs):
        sampler.submit(i, t.prompt, limits.turn_budget(0))
    stepping: dict[Future, int] = {}
    while sampler.in_flight() or stepping:
        if sampler.in_flight() and not (sampler.turn_synchronous and stepping):
            for s in sorted(sampler.poll(), key=lambda s: s.key):
                trajs[s.key].add(s.token_ids, s.logprobs, trajs[s.key].turns)
                stepping[pool.submit(_step, envs[s.key], decode(s.token_ids))] = s.key
        if sampler.turn_synchronous or not sampler.in_flight():
            wait(list(stepping), return_when=ALL_COMPLETED if sampler.turn_synchronous else FIRST_COMPLETED)
        for future, i in sorted(((f, i) for f, i in stepping.items() if f.done()), key=lambda p: p[1]):
            del stepping[future]
            obs = _observation(trajs[i], future.result(), template, encode, limits)
            if obs is not None:
                trajs[i].add(obs, None, trajs[i].turns - 1)
                trajs[i].observations += 1
                sampler.submit(i, trajs[i].prompt + trajs[i].tokens, limits.turn_budget(len(trajs[i].tokens)))
    return trajs


def _step(env: Environment, action: str) -> StepResult:
    try:
        return env.step(action)
    except Exception as e:  # an environment's failure ends its episode, never the run
        return StepResult(None, done=True, info={"env/errors": 1.0, f"env/errors/{type(e).__name__}": 1.0})


def _observation(
    t: Trajectory, result: StepResult, template, encode, limits: EpisodeLimits
) -> list[int] | None:
    """Record the step; the next observation's ids, or None when the episode ends here."""
    t.turn_rewards.append(float(result.reward))
    for k, v in result.info.items():
        if isinstance(v, (int, float)):
            t.info[k] = t.info.get(k, 0.0) + float(v)
    turn_len = t.turn.count(t.turns - 1)  # the last policy turn (no observation after it yet)
    ended_by_eos = bool(t.tokens) and t.tokens[-1] in limits.eos_ids
    cut_per_turn = limits.max_tokens_per_turn is not None and turn_len >= limits.max_tokens_per_turn
    stop = (
        "length" if not ended_by_eos and not cut_per_turn
        else "done" if result.done or result.observation is None
        else "max_assistant_turns" if t.turns >= limits.max_assistant_turns
        else "max_user_turns" if t.observations >= limits.max_user_turns
        else ""
    )  # fmt: skip
    if stop:
        t.stop = stop
        return None
    content = truncate(encode(result.observation), limits.max_tool_response_length, limits.truncate_side)
    obs = template.observation_ids(content)
    if len(t.tokens) + len(obs) >= limits.max_response_length:  # no room left for the policy to answer
        t.stop = "length"
        return None
    return obs
