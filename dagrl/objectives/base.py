"""Objectives: what the actor update minimises, chosen by `algorithm.name`.

An objective declares which batch keys its loss reads (`required_keys`; the actor_update node
requires them in the DAG, so a missing producer fails before any worker starts; the backend
moves them to the device) and which per-token quantities it wants from the forward pass
(`request`). Both train backends run one shared loop (backends/update_loop.py): per
micro-batch they compute what is asked and call `objective.loss`. Adding an algorithm is one
registered builder, `@register_objective("name")` (in an `external_plugins` module for a plugin),
plus its preset conf/algorithm/<name>.yaml if it wants one; backends, nodes and the loop stay as
they are. `algorithm.name` is checked against the registered names in validate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from torch import Tensor

from dagrl.core.batch import Batch
from dagrl.registry import OBJECTIVES, ObjectiveEntry, _no_rules

if TYPE_CHECKING:
    from dagrl.config.roles import RoleSpec
    from dagrl.config.schema import DagrlConfig


@dataclass(frozen=True)
class FullVocabRequest:
    """What a backend needs for the exact full-vocabulary divergence (see `TokenRequest.full_vocab`)."""

    hidden_key: str  # batch key of the teacher's final hidden states [B, R, H']
    teacher_model: str  # the teacher's model path: the backend loads its output layer from it
    beta: float
    temperature: float


@dataclass(frozen=True)
class TokenRequest:
    """Per-token quantities on the response tokens that an objective asks the forward pass for.

    Backends compute exactly these and nothing else (no entropy pass that nobody reads). Each is
    ``[B, R]`` float32 on the device; values on response padding are arbitrary (mask them).
    Adding a quantity is a field here, one in `TokenOutputs`, and its computation in each train
    backend (which must refuse a request it cannot serve), e.g. the full-vocabulary log-softmax
    handed to the objective in chunks of tokens.
    """

    logprobs: bool = True  # log-prob of each sampled token, differentiable
    entropy: bool = False  # entropy of the predicted distribution at each response position
    entropy_grad: bool = False  # keep entropy's graph: it is in the loss, not only a metric
    # batch key of [B, R, K] token ids: the log-probs (normalised over the whole vocabulary, at
    # `logprobs_at_temperature`) of those ids, differentiable, [B, R, K] (top-k distillation)
    logprobs_at: str | None = None
    logprobs_at_temperature: float = 1.0
    # full-vocabulary distillation: the generalized JSD per response token to a teacher whose final
    # hidden states are under this key ([B, R, H']); the backend recomputes the teacher's logits
    # chunk by chunk with the teacher's output layer, so no [tokens, V] tensor is ever cached
    full_vocab: FullVocabRequest | None = None

    def __post_init__(self) -> None:
        assert self.entropy or not self.entropy_grad, "entropy_grad needs entropy"


@dataclass
class TokenOutputs:
    """What the backend computed for a `TokenRequest`; None where not requested."""

    logprobs: Tensor | None = None  # [B, R]
    entropy: Tensor | None = None  # [B, R]
    logprobs_at: Tensor | None = None  # [B, R, K]
    divergence: Tensor | None = None  # [B, R] full-vocabulary generalized JSD, differentiable
    values: Tensor | None = None  # [B, R] a critic's value head at the positions predicting each token


class Objective(Protocol):
    required_keys: tuple[str, ...]  # batch keys `loss` reads
    optional_keys: tuple[str, ...]  # keys a DAG may hand the update: used when present (metrics), else not
    request: TokenRequest

    def micro_batch_weights(self, mini: Batch, micro_batches: list[Batch]) -> list[float]:
        """Weights that make the micro-batches' weighted losses sum to the mini-batch's loss."""
        ...

    def loss(self, mb: Batch, out: TokenOutputs) -> tuple[Tensor, dict[str, Tensor]]:
        """Scalar loss of one micro-batch and metrics as detached 0-dim device tensors (the loop
        synchronises once per mini-batch). `mb` holds `required_keys` on `out`'s device."""
        ...


def register_objective(name: str, validate: Callable[[DagrlConfig], None] = _no_rules):
    """Register `build(cfg) -> Objective` under `name` (the value of `algorithm.name`), with the
    algorithm's config rules (`validate(cfg)` raises ConfigError)."""

    def wrap(build: Callable[[DagrlConfig], Objective]):
        OBJECTIVES.register(name, ObjectiveEntry(build, validate), same=lambda a, b: a.build is b.build)
        return build

    return wrap


def objective_entry(name: str) -> ObjectiveEntry:
    return OBJECTIVES.get(name)


def build_objective(cfg: DagrlConfig) -> Objective:
    """The objective of `algorithm.name`, built from the config."""
    return objective_entry(cfg.algorithm.name).build(cfg)


def role_objectives(cfg: DagrlConfig, specs: Iterable[RoleSpec]) -> dict[str, Objective]:
    """The objective of each role that trains, built once in the driver: the workers receive it
    with the role's spec (core/worker.py: RoleParts) and never decode the config themselves."""
    return {spec.name: build_objective(cfg) for spec in specs if spec.trains}


def micro_batch_weights(mini: Batch, micro_batches: list[Batch], per_token: bool) -> list[float]:
    """Token share of each micro-batch when the loss is a mean over tokens, row share when it is a
    mean over responses: then the micro-batches' weighted gradients sum to the mini-batch's."""
    if per_token:
        total = float(mini["response_mask"].sum().clamp(min=1))
        return [float(mb["response_mask"].sum()) / total for mb in micro_batches]
    return [len(mb) / len(mini) for mb in micro_batches]
