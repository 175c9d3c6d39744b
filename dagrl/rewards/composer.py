"""Combine reward functions into one scalar per response.

A ``RewardComposer`` holds weighted terms (``reward.functions`` in the config). With no terms it
routes each row to the default reward of its ``data_source`` (see ``default_reward_name``).
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any

from dagrl.errors import ConfigError, DataError
from dagrl.rewards.registry import (
    VERL_KEYWORDS,
    RewardFn,
    RewardForm,
    default_reward_name,
    get_reward,
    reward_form,
)

NONFINITE_REWARDS = "train/nonfinite_rewards"  # the step metric: rows whose reward was inf/NaN

_SOLUTION_PREVIEW_CHARS = 200


@dataclass
class RewardTerm:
    """One weighted reward: ``weight * registered_reward[name](..., **kwargs)``."""

    name: str
    weight: float = 1.0
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed on every call (verl's reward_kwargs)


class RewardComposer:
    """Weighted sum of registered rewards; per-source defaults when no terms are given."""

    def __init__(self, terms: list[RewardTerm]):
        """Resolve every term's function now so an unknown name fails before training starts."""
        seen: set[str] = set()
        for index, term in enumerate(terms):
            if term.name in seen:
                raise ConfigError(
                    key=f"reward.functions[{index}].name",
                    value=term.name,
                    fix="list each reward once; give it the combined weight instead",
                )
            seen.add(term.name)
        self.terms = list(terms)
        self._functions: dict[str, RewardFn] = {}
        self._forms: dict[str, RewardForm] = {}
        for index, term in enumerate(terms):
            try:
                fn = get_reward(term.name)
            except ConfigError as exc:  # name the entry of the list, not just the list
                raise ConfigError(f"reward.functions[{index}].name", term.name, exc.fix) from None
            self._forms[term.name] = check_call(fn, term, f"reward.functions[{index}]")
            self._functions[term.name] = fn

    def _terms_for(self, data_source: str) -> list[tuple[RewardTerm, RewardFn]]:
        if self.terms:
            return [(term, self._functions[term.name]) for term in self.terms]
        name = default_reward_name(data_source)
        if name not in self._functions:
            self._functions[name] = get_reward(name)
            self._forms[name] = reward_form(self._functions[name])
        return [(RewardTerm(name), self._functions[name])]

    def score(
        self, data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None
    ) -> tuple[float, dict[str, float]]:
        """Score one response: (weighted sum, {reward name: raw score}).

        A reward function that raises is reported as ``DataError`` naming the reward, the data
        source and the start of the response.
        """
        total, raw_scores = 0.0, {}
        for term, fn in self._terms_for(data_source):
            raw = self._one(term, fn, data_source, solution_str, ground_truth, extra_info)
            raw_scores[term.name] = raw
            total += term.weight * raw
        return total, raw_scores

    def score_batch(
        self,
        data_sources: list[str],
        solutions: list[str],
        ground_truths: list[str],
        extra_infos: list[dict | None],
        prompts: list[str] | None = None,
        completion_ids: list[list[int]] | None = None,
    ) -> tuple[list[float], dict[str, list[float]]]:
        """Score a batch: (weighted sums, {reward name: raw scores}), every list aligned with rows.

        With explicit terms every row has every term (a TRL-form reward's None is NaN and adds 0).
        In default routing a batch mixing sources has rows a reward did not score; those entries are
        NaN so indices stay aligned. `prompts` / `completion_ids` reach TRL-form rewards only. A
        reward that raises is a DataError naming the row (`describe_row`), its data_source and the error.
        """
        lengths = {len(data_sources), len(solutions), len(ground_truths), len(extra_infos)}
        assert len(lengths) == 1, f"score_batch got lists of different lengths: {sorted(lengths)}"
        if self.terms:
            columns = dict(data_source=data_sources, ground_truth=ground_truths, extra_info=extra_infos)
            return self._score_terms(solutions, columns, prompts, completion_ids)
        totals: list[float] = []
        raw_by_name: dict[str, list[float]] = {}
        for row, (source, solution, truth, extra) in enumerate(
            zip(data_sources, solutions, ground_truths, extra_infos)
        ):
            try:
                total, raw_scores = self.score(source, solution, truth, extra)
            except DataError as exc:
                raise DataError(f"{describe_row(row, extra)}: {exc}") from exc.__cause__
            totals.append(total)
            for name, raw in raw_scores.items():
                raw_by_name.setdefault(name, [math.nan] * len(data_sources))[row] = raw
        return totals, raw_by_name

    @property
    def wants_prompts(self) -> bool:
        """Whether a term is in TRL's form (it receives the decoded prompts)."""
        return RewardForm.trl in self._forms.values()

    def _score_terms(self, solutions, columns, prompts, completion_ids):
        n = len(solutions)
        raw_by_name: dict[str, list[float]] = {}
        for term in self.terms:
            fn = self._functions[term.name]
            if self._forms[term.name] == RewardForm.trl:
                raw_by_name[term.name] = _call_trl(term, fn, solutions, columns, prompts, completion_ids)
                continue
            rows = zip(columns["data_source"], solutions, columns["ground_truth"], columns["extra_info"])
            raw_by_name[term.name] = []
            for row, (src, sol, gt, extra) in enumerate(rows):
                try:
                    raw_by_name[term.name].append(self._one(term, fn, src, sol, gt, extra))
                except DataError as exc:
                    raise DataError(f"{describe_row(row, extra)}: {exc}") from exc.__cause__
        # a TRL-form reward's None (not applicable to that row) adds nothing; a NaN a reward
        # returns stays NaN in the total, so the step's non-finite check sees it
        totals = [
            sum(t.weight * raw_by_name[t.name][i] for t in self.terms if raw_by_name[t.name][i] is not None)
            for i in range(n)
        ]
        return totals, {
            name: [math.nan if v is None else v for v in raw] for name, raw in raw_by_name.items()
        }

    def _one(self, term, fn, data_source, solution_str, ground_truth, extra_info) -> float:
        """One response's raw score from a per-response reward (verl's form by keyword, dagrl's
        positionally; the term's kwargs on top); a failure is a DataError naming the reward."""
        extra_info = extra_info or {}
        try:
            if self._forms[term.name] == RewardForm.verl:  # as verl's reward manager calls it
                row = dict(zip(VERL_KEYWORDS, (data_source, solution_str, ground_truth, extra_info)))
                out = fn(**{**row, **term.kwargs})
            else:
                out = fn(solution_str, ground_truth, extra_info, **term.kwargs)
            return _as_score(out)
        except Exception as exc:
            raise DataError(
                f"reward {term.name!r} failed on a row of data_source {data_source!r} "
                f"({type(exc).__name__}: {exc}); "
                f"response starts: {solution_str[:_SOLUTION_PREVIEW_CHARS]!r}"
            ) from exc


def _as_score(out: object) -> float:
    """A per-response reward's result as a float: verl lets compute_score return a dict whose
    "score" is the reward (its other entries are extra information dagrl does not log)."""
    if isinstance(out, dict):
        if "score" not in out:
            raise ValueError(f"it returned a dict without a 'score' entry (keys: {sorted(out)})")
        out = out["score"]
    return float(out)


def check_call(fn, term: RewardTerm, key: str) -> RewardForm:
    """The form of `fn`, after checking that the call the composer will make binds to its
    signature (the term's kwargs included): a reward that cannot take its arguments is refused
    before any worker starts, not on the first batch."""
    form, signature = reward_form(fn), inspect.signature(fn)
    try:
        if form == RewardForm.verl:
            signature.bind(**{**dict.fromkeys(VERL_KEYWORDS), **term.kwargs})
        elif form == RewardForm.per_response:
            signature.bind("", "", {}, **term.kwargs)
        else:  # TRL's: the dataset's columns vary; only the term's own keywords are checked
            signature.bind_partial(completions=[], **term.kwargs)
    except TypeError as exc:
        forms = (
            "verl's compute_score(data_source, solution_str, ground_truth, extra_info=None), dagrl's"
            " fn(solution_str, ground_truth, extra_info) or TRL's fn(completions, **kwargs)"
        )
        if term.kwargs:
            fix = (
                f"{term.name}{signature} cannot take them ({exc}); pass only keywords it names (verl's"
                " custom_reward_function.reward_kwargs.* land here), or give it **kwargs"
            )
            raise ConfigError(f"{key}.kwargs", term.kwargs, fix) from None
        fix = (
            f"{term.name}{signature} cannot be called as a reward ({exc}): write it as {forms}; values"
            f" for parameters of its own go in {key}.kwargs"
        )
        raise ConfigError(f"{key}.name", term.name, fix) from None
    return form


def _call_trl(term, fn, solutions, columns, prompts, completion_ids) -> list[float | None]:
    """One call of a TRL-form reward on the batch: completions, prompts, and the rows' columns
    (plus the keys inside extra_info, as TRL passes every dataset column) as keyword lists, and the
    term's own kwargs."""
    name, kwargs = term.name, dict(columns)
    for key in sorted({k for extra in columns["extra_info"] for k in (extra or {})} - set(columns)):
        kwargs[key] = [(extra or {}).get(key) for extra in columns["extra_info"]]
    if prompts is not None:
        kwargs["prompts"] = prompts
    if completion_ids is not None:
        kwargs["completion_ids"] = completion_ids
    kwargs.update(term.kwargs)
    try:
        out = list(fn(completions=list(solutions), **kwargs))
    except Exception as exc:
        raise DataError(
            f"reward {name!r} (TRL form) failed on a batch ({type(exc).__name__}: {exc})"
        ) from exc
    if len(out) != len(solutions):
        raise DataError(f"reward {name!r} returned {len(out)} scores for {len(solutions)} completions")
    return [None if v is None else float(v) for v in out]


def describe_row(row: int, extra_info: dict | None) -> str:
    """'batch row 3 (extra_info.index=17)': the data row when the file recorded its index (the
    examples/data_preprocess scripts and the built-in task do), else the row's place in the batch."""
    index = (extra_info or {}).get("index")
    return f"batch row {row}" + (f" (extra_info.index={index})" if index is not None else "")


def nonfinite_rows(
    scores: list[float], data_sources: list[str], extra_infos: list[dict | None], limit: int = 5
) -> str | None:
    """None when every score is finite, else which rows are not (the first `limit` of them)."""
    bad = [i for i, s in enumerate(scores) if not math.isfinite(s)]
    if not bad:
        return None
    named = ", ".join(
        f"data_source {data_sources[i]!r} {describe_row(i, extra_infos[i])} = {scores[i]}"
        for i in bad[:limit]
    )
    more = f" and {len(bad) - limit} more" if len(bad) > limit else ""
    return f"{len(bad)} of {len(scores)} responses: {named}{more}"


def mean_by_source(scores: list[float], data_sources: list[str]) -> dict[str, float]:
    """Mean score per data source as metrics: ``{"reward/<data_source>/mean": value}``."""
    assert len(scores) == len(data_sources), "scores and data_sources must be aligned"
    grouped: dict[str, list[float]] = {}
    for score, source in zip(scores, data_sources):
        grouped.setdefault(source, []).append(score)
    return {f"reward/{source}/mean": sum(values) / len(values) for source, values in grouped.items()}
