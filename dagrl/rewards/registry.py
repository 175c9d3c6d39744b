"""Name -> reward function registry, and the default reward for each known data source.

Three forms, told apart by the signature (`reward_form`):

- verl: ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` scores one
  response, called by keyword as verl's reward manager calls it (any function that takes those four
  names, by name or through ``**kwargs``); it returns a float or a dict whose ``"score"`` is the score;
- dagrl: ``fn(solution_str, ground_truth, extra_info) -> float`` scores one response, called
  positionally (the built-in rewards);
- TRL's GRPOTrainer: ``fn(completions, **kwargs) -> list[float]`` (a parameter named
  ``completions``, wherever it stands) scores a batch, with ``prompts``, ``completion_ids`` and the
  dataset's columns (``data_source``, ``ground_truth``, ``extra_info`` and the keys inside
  ``extra_info``) as keyword lists; ``None`` in the result means "does not apply".

Every form also receives its term's ``kwargs`` (``reward.functions[i].kwargs``, verl's
``custom_reward_function.reward_kwargs``) as keywords on every call.

Built-in rewards register themselves on import of ``dagrl.rewards``; user rewards register
the same way from a module listed in ``external_plugins``, or are found there by function name
without a decorator (a verl or TRL reward file works as it is).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from enum import Enum

from dagrl.errors import ConfigError, DataError

RewardFn = Callable[[str, str, dict], float]

_REGISTRY: dict[str, RewardFn] = {}

# Exact data-source names that score with the MATH-style boxed-answer reward.
_MATH_SOURCES = frozenset(
    {
        "lighteval/math",
        "digitallearninggmbh/math-lighteval",
        "huggingfaceh4/math-500",
        "agentica-org/deepscaler-preview-dataset",
    }
)


def register_reward(name: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator registering ``fn`` under ``name``.

    Re-registering the same function (e.g. a module imported twice) is harmless; registering a
    different function under a taken name raises ``ValueError`` so plugins cannot silently shadow
    built-ins.
    """

    def decorate(fn: RewardFn) -> RewardFn:
        existing = _REGISTRY.get(name)
        if existing is not None and existing is not fn and _qualname(existing) != _qualname(fn):
            raise ValueError(
                f"reward {name!r} is already registered to {_qualname(existing)}; "
                f"pick another name for {_qualname(fn)}"
            )
        _REGISTRY[name] = fn
        return fn

    return decorate


def _qualname(fn: Callable) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class RewardForm(str, Enum):
    verl = "verl"  # fn(data_source=, solution_str=, ground_truth=, extra_info=) -> float | {"score": ...}
    per_response = "per_response"  # fn(solution_str, ground_truth, extra_info) -> float
    trl = "trl"  # fn(completions, **kwargs) -> list[float | None]


# the keywords verl's reward manager calls compute_score with
VERL_KEYWORDS = ("data_source", "solution_str", "ground_truth", "extra_info")


def reward_form(fn: Callable) -> RewardForm:
    """TRL's form has a parameter named ``completions``; verl's takes ``data_source``,
    ``solution_str``, ``ground_truth`` and ``extra_info`` by keyword; anything else is dagrl's
    positional per-response form."""
    signature = inspect.signature(fn)
    if "completions" in signature.parameters:
        return RewardForm.trl
    try:
        signature.bind_partial(**dict.fromkeys(VERL_KEYWORDS))
    except TypeError:
        return RewardForm.per_response
    return RewardForm.verl


def get_reward(name: str) -> RewardFn:
    """Return the reward registered as ``name``, else a function of that name in a module listed in
    ``external_plugins``; raise ``ConfigError`` listing known names if there is none."""
    from dagrl.core.plugins import LOADED

    if name in _REGISTRY:
        return _REGISTRY[name]
    found = [getattr(m, name) for m in LOADED.values() if callable(getattr(m, name, None))]
    if found:
        return found[-1]
    known = ", ".join(registered_rewards())
    near = difflib.get_close_matches(name, registered_rewards(), n=1, cutoff=0.6)
    raise ConfigError(
        key="reward.functions",
        value=name,
        fix=(
            (f"did you mean {near[0]!r}? " if near else "")
            + f"use one of: {known}, or define a function of that name (or one decorated with "
            "@register_reward) in a module listed in external_plugins"
        ),
    ) from None


def registered_rewards() -> list[str]:
    """Sorted names of every registered reward."""
    return sorted(_REGISTRY)


def default_reward_name(data_source: str) -> str:
    """Reward used for rows of ``data_source`` when ``reward.functions`` is empty.

    GSM8K-like sources -> ``gsm8k``; dagrl's arithmetic task -> ``arith``; MATH-like sources
    (MATH, MATH-500, DeepScaleR, or any name containing "math"/"deepscaler") -> ``math``.
    """
    lowered = data_source.lower()
    if "gsm8k" in lowered:
        return "gsm8k"
    if lowered == "dagrl/arith":
        return "arith"
    if lowered == "dagrl/calculator":
        return "final_answer"
    if lowered in _MATH_SOURCES or "math" in lowered or "deepscaler" in lowered:
        return "math"
    raise DataError(
        f"no default reward for data_source {data_source!r}: set reward.functions "
        f"(known rewards: {', '.join(registered_rewards())})"
    )
