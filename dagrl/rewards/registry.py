"""Name -> reward function registry, and the default reward for each known data source.

A reward function scores one response: ``fn(solution_str, ground_truth, extra_info) -> float``.
Built-in rewards register themselves on import of ``dagrl.rewards``; user rewards register
the same way from a module listed in ``external_plugins``.
"""

from __future__ import annotations

from collections.abc import Callable

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


def get_reward(name: str) -> RewardFn:
    """Return the reward registered as ``name``; raise ``ConfigError`` listing known names if absent."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(registered_rewards())
        raise ConfigError(
            key="reward.functions",
            value=name,
            fix=(
                f"use one of: {known}, or register your own with @register_reward "
                "in a module listed in external_plugins"
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
    if lowered in _MATH_SOURCES or "math" in lowered or "deepscaler" in lowered:
        return "math"
    raise DataError(
        f"no default reward for data_source {data_source!r}: set reward.functions "
        f"(known rewards: {', '.join(registered_rewards())})"
    )
