"""The episode loop with a scripted sampler: token in, token out; limits; the length budget."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from dagrl.rollout.episodes import EpisodeLimits, Sample, run_episodes
from dagrl.rollout.template import TurnTemplate, truncate, turn_template
from dagrl.tools.base import StepResult

EOS = 1


@pytest.fixture(scope="module")
def tok():
    from dagrl.backends.hf_model import load_tokenizer
    from dagrl.data.builtin import tiny_model_path

    return load_tokenizer(tiny_model_path())


class ScriptedSampler:
    """Answers each request of episode k with the next of its scripted turns (ids)."""

    turn_synchronous = False

    def __init__(self, scripts):
        self.scripts, self.pending, self.contexts = scripts, [], []

    def submit(self, key, context, max_tokens):
        self.contexts.append((key, list(context), max_tokens))
        self.pending.append((key, max_tokens))

    def poll(self):
        pending, self.pending = self.pending, []
        out = []
        for key, max_tokens in pending:
            ids = self.scripts[key].pop(0)[:max_tokens]
            out.append(Sample(key, ids, [-0.5] * len(ids)))
        return out

    def in_flight(self):
        return len(self.pending)


class Echo:
    """Replies to every turn with a fixed observation; never done."""

    def __init__(self, text="7", done_after=99):
        self.text, self.done_after, self.steps = text, done_after, 0

    def reset(self, row):
        return None

    def step(self, action):
        self.steps += 1
        return StepResult(self.text, reward=1.0, done=self.steps >= self.done_after)


def limits(width=64, turns=4, user_turns=4, obs=8):
    return EpisodeLimits(width, turns, user_turns, obs, "right", (EOS,))


def play(tok, scripts, envs, lim, prompt=(9, 9)):
    template = turn_template(tok, "tool", "k")
    sampler = ScriptedSampler(scripts)
    with ThreadPoolExecutor(2) as pool:
        trajs = run_episodes(
            sampler,
            [list(prompt)] * len(scripts),
            envs,
            [{}] * len(scripts),
            template,
            lambda ids: tok.decode(ids, skip_special_tokens=True),
            lambda s: tok.encode(s, add_special_tokens=False),
            lim,
            pool,
        )
    return trajs, sampler, template


def test_template_delimiters_of_the_tiny_model(tok):
    t = turn_template(tok, "tool", "k")
    assert tok.decode(list(t.observation_prefix)) == "<|tool|>"
    assert tok.decode(list(t.observation_suffix)) == "<|end|><|assistant|>"


def test_sampled_ids_survive_where_retokenizing_would_change_them(tok):
    """The policy spelled `<|end|>` out of seven byte tokens (then sampled the real EOS): decoded
    and tokenized again that text is the one special token, so a loop that re-renders its
    history would train on ids the policy never sampled. The loop keeps them as sampled."""
    spelled = tok.encode("<", add_special_tokens=False) + tok.encode("|end|>", add_special_tokens=False)
    assert len(spelled) == 7
    turn = [*tok.encode("12", add_special_tokens=False), *spelled, EOS]
    retokenized = tok.encode(tok.decode(turn), add_special_tokens=False)
    assert retokenized != turn  # the drift a re-tokenizing loop would suffer
    trajs, sampler, template = play(tok, [[turn, [EOS]]], [Echo()], limits(turns=2))
    t = trajs[0]
    obs = template.observation_ids(tok.encode("7", add_special_tokens=False))
    assert t.tokens == turn + obs + [EOS]
    assert t.policy == [1] * len(turn) + [0] * len(obs) + [1]
    assert sampler.contexts[1][1] == [9, 9, *turn, *obs]  # the second turn continued the sampled ids
    assert t.logprobs == [-0.5] * len(turn) + [0.0] * len(obs) + [-0.5]
    assert t.turn == [0] * (len(turn) + len(obs)) + [1]


def test_turn_limits_and_stop_reasons(tok):
    turn = [20, EOS]
    trajs, _, _ = play(
        tok, [[turn] * 9 for _ in range(3)], [Echo(), Echo(done_after=2), Echo()], limits(turns=3)
    )
    assert [t.turns for t in trajs] == [3, 2, 3]
    assert [t.stop for t in trajs] == ["max_assistant_turns", "done", "max_assistant_turns"]
    assert trajs[0].turn_rewards == [1.0, 1.0, 1.0]
    trajs, _, _ = play(tok, [[turn] * 9], [Echo()], limits(turns=5, user_turns=1))
    assert trajs[0].turns == 2 and trajs[0].observations == 1 and trajs[0].stop == "max_user_turns"


def test_length_budget_bounds_the_whole_episode(tok):
    """Each turn may sample what the earlier ones left of max_response_length; an observation
    that would leave no room ends the episode; a turn cut by the budget (no EOS) ends it too."""
    long_turn = [20] * 10 + [EOS]
    trajs, sampler, template = play(tok, [[long_turn] * 9], [Echo("1234")], limits(width=40, turns=9))
    t = trajs[0]
    assert len(t.tokens) <= 40 and t.stop == "length"
    budgets = [b for _, _, b in sampler.contexts]
    assert budgets[0] == 40 and all(b2 < b1 for b1, b2 in zip(budgets, budgets[1:]))
    obs_len = len(template.observation_ids(tok.encode("1234", add_special_tokens=False)))
    assert budgets[1] == 40 - 11 - obs_len


def test_observation_truncation_sides():
    ids = list(range(10))
    assert truncate(ids, 4, "right") == [0, 1, 2, 3]
    assert truncate(ids, 4, "left") == [6, 7, 8, 9]
    assert truncate(ids, 5, "middle") == [0, 1, 2, 8, 9]
    assert truncate(ids, 20, "middle") == ids


def test_raising_environment_ends_only_its_episode(tok):
    class Broken(Echo):
        def step(self, action):
            raise KeyError("state")

    trajs, _, _ = play(tok, [[[20, EOS]] * 3, [[20, EOS]] * 3], [Broken(), Echo(done_after=2)], limits())
    assert trajs[0].stop == "done" and trajs[0].info == {"env/errors": 1.0, "env/errors/KeyError": 1.0}
    assert trajs[1].turns == 2


def test_template_observation_ids_are_prefix_content_suffix():
    t = TurnTemplate((5, 6), (7,))
    assert t.observation_ids([1, 2]) == [5, 6, 1, 2, 7]


def test_turn_cut_at_max_tokens_per_turn_goes_on(tok):
    """A turn cut by multi_turn.max_tokens_per_turn still reaches the environment and the
    episode goes on; one cut by the episode's own budget ends it."""
    lim = EpisodeLimits(64, 3, 3, 8, "right", (EOS,), max_tokens_per_turn=3)
    trajs, sampler, _ = play(tok, [[[20] * 10] * 3], [Echo()], lim)
    assert trajs[0].turns == 3 and trajs[0].stop == "max_assistant_turns"
    assert [b for _, _, b in sampler.contexts] == [3, 3, 3]
    assert sum(trajs[0].policy) == 9
