"""Tools, parsers and the tools environment: failures become observations, never exceptions."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dagrl.tools.base import PARSERS, Tool, lookup
from dagrl.tools.calculator import evaluate
from dagrl.tools.environment import ToolEnvironment, ToolSettings
from dagrl.tools.parsers import parse_hermes


def test_hermes_parser_reads_calls_and_reports_bad_ones():
    text = (
        'I will compute.<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
        '<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}\n</tool_call>'
        "<tool_call>{not json}</tool_call><tool_call>[1]</tool_call>"
    )
    calls = parse_hermes(text)
    assert [(c.name, c.arguments, c.error is None) for c in calls[:2]] == [
        ("calculator", {"expression": "2+3"}, True),
        ("python", {"code": "print(1)"}, True),
    ]
    assert "invalid JSON" in calls[2].error and "name" in calls[3].error
    assert parse_hermes("The answer is 5.") == []


def test_parser_registry_names_the_nearest():
    from dagrl.errors import ConfigError

    assert lookup(PARSERS, "hermes", "k") is parse_hermes
    with pytest.raises(ConfigError, match="did you mean 'hermes'"):
        lookup(PARSERS, "hermess", "actor_rollout_ref.rollout.multi_turn.format")


def _env(tools, timeout=0.5, episode=5.0, parallel=2):
    settings = ToolSettings(parse_hermes, parallel, timeout, episode)
    return ToolEnvironment(settings, {t.name: t for t in tools}, ThreadPoolExecutor(4))


def _call(name, **args) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def test_raising_slow_and_unknown_tools_answer_with_errors():
    def boom(x):
        raise RuntimeError("exploded")

    def slow(x):
        time.sleep(2)
        return "late"

    env = _env([Tool("boom", boom), Tool("slow", slow), Tool("echo", lambda x: x)], parallel=4)
    start = time.perf_counter()
    step = env.step(_call("boom", x=1) + _call("slow", x=1) + _call("nope") + _call("echo", x="hi"))
    assert time.perf_counter() - start < 1.5  # the slow call is cut at its timeout
    lines = step.observation.split("\n")
    assert lines[0] == "Error: RuntimeError: exploded"
    assert "timed out after 0.5 s" in lines[1]
    assert "unknown tool 'nope'" in lines[2] and lines[3] == "hi"
    assert not step.done
    assert step.info == {"tools/calls": 4.0, "tools/errors": 2.0, "tools/timeouts": 1.0}


def test_parallel_calls_run_concurrently_and_excess_is_refused():
    env = _env([Tool("nap", lambda s: time.sleep(s) or "ok")], timeout=2.0, parallel=2)
    start = time.perf_counter()
    step = env.step(_call("nap", s=0.4) * 3)
    assert time.perf_counter() - start < 0.75  # two 0.4 s naps side by side
    assert step.observation.split("\n") == ["ok", "ok", "Error: at most 2 tool calls per turn"]


def test_turn_without_call_ends_and_episode_tool_budget_ends_the_episode():
    env = _env([Tool("nap", lambda s: time.sleep(s) or "ok")], timeout=1.0, episode=0.3)
    assert env.step("42").done
    assert not env.step(_call("nap", s=0.5)).done  # cut at the episode's remaining 0.3 s
    over = env.step(_call("nap", s=0.1))
    assert over.done and over.info == {"tools/episode_timeouts": 1.0}


def test_calculator_is_exact_and_refuses_code():
    assert evaluate("12345678901234567890 + 1") == 12345678901234567891
    assert evaluate("(3+4)*2 - 10 // 3") == 11
    with pytest.raises(ValueError):
        evaluate("__import__('os').system('true')")
    with pytest.raises(ValueError, match="exponent"):
        evaluate("9**9**9")
