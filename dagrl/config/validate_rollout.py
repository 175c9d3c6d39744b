"""Rules on the rollout that hold for every engine (an engine's own are its backend's, e.g.
dagrl/backends/vllm/rules.py), checked before Ray starts."""

from __future__ import annotations

from dagrl.config.roles import Role
from dagrl.config.schema import DagrlConfig, RolloutConfig
from dagrl.errors import ConfigError
from dagrl.registry import BACKENDS

R = "actor_rollout_ref.rollout"


def old_logprob_pass(cfg: DagrlConfig) -> bool:
    """Whether the step runs a separate old-log-prob pass: actor.recompute_old_logprobs, or for
    null (auto) only where the update is off-policy (several mini-batches or epochs) or the
    advantage reads them before the update (use_kl_in_reward, distill_reward). On-policy, the
    update's own forward gives them, detached: the same numbers without a second forward."""
    a, algo = cfg.actor_rollout_ref.actor, cfg.algorithm
    if a.recompute_old_logprobs is not None:
        return a.recompute_old_logprobs
    on_policy = a.ppo_mini_batch_size == cfg.data.train_batch_size and a.ppo_epochs == 1
    return not on_policy or algo.use_kl_in_reward or bool(algo.distill_reward.coef)


A = "actor_rollout_ref.actor"


def rollout_logprobs_read(cfg: DagrlConfig) -> list[str]:
    """What in the step reads the rollout engine's log-probs (empty: nothing but the mismatch
    metrics, which alone do not turn them on)."""
    rc, readers = cfg.algorithm.rollout_correction, []
    if rc.rollout_is is not None or rc.rollout_rs is not None:
        readers.append("algorithm.rollout_correction (rollout_is / rollout_rs)")
    # the student's log-probs of the distill reward without that pass (nodes/reward_terms.py)
    if cfg.algorithm.distill_reward.coef and not old_logprob_pass(cfg):
        readers.append(f"algorithm.distill_reward with {A}.recompute_old_logprobs=false")
    return readers


def rollout_logprobs_on(cfg: DagrlConfig) -> bool:
    """rollout.calculate_log_probs, auto (None) resolved: on where the step reads them. vLLM's
    per-token log-probs cost the decode loop's host work (45 % of a 32x8x256 rollout on an H200)."""
    asked = cfg.actor_rollout_ref.rollout.calculate_log_probs
    return bool(rollout_logprobs_read(cfg)) if asked is None else asked


def greedy_setting(cfg: DagrlConfig) -> tuple[str, object, str] | None:
    """(key, value, how to sample instead) of the rollout setting that makes decoding greedy, so
    that every response to a prompt is the same; None when the rollout samples. do_sample=false
    comes first: it is what the user wrote (resolve_defaults has set temperature 0 for it)."""
    r = cfg.actor_rollout_ref.rollout
    if not r.do_sample:
        return f"{R}.do_sample", False, "set do_sample=true"
    if r.temperature == 0:
        return f"{R}.temperature", r.temperature, "raise temperature (e.g. 1.0)"
    if r.top_k == 1:
        return f"{R}.top_k", r.top_k, "set top_k=-1 (off) or > 1"
    return None


def check_logprob_readers(cfg: DagrlConfig, specs) -> None:
    """A node of the DAG that requires the rollout's log-probs (a plugin's, or a custom DAG's) while
    calculate_log_probs is off would read the engine's zeros: refused, naming the node, before Ray.
    The built-in readers turn the auto on themselves (rollout_logprobs_read)."""
    if cfg.actor_rollout_ref.rollout.calculate_log_probs:
        return
    for spec in specs:
        if "rollout_logprobs" in (spec.required_inputs or ()):
            raise ConfigError(
                f"{R}.calculate_log_probs",
                cfg.actor_rollout_ref.rollout.calculate_log_probs,
                f"node {spec.name!r} (kind {spec.kind}) of dag {cfg.dag} requires rollout_logprobs, the"
                " rollout engine's log-probs, which are off here; set calculate_log_probs=true",
            )


def refuse_rollout_correction(cfg: DagrlConfig) -> None:
    """For an objective without a policy-gradient term (GKD, OPSD, SFT): rollout_correction would
    reweight nothing while the engine's log-probs it asks for slow every rollout."""
    rc = cfg.algorithm.rollout_correction
    for name in ("rollout_is", "rollout_rs"):
        value = getattr(rc, name)
        if value is not None:
            raise ConfigError(
                f"algorithm.rollout_correction.{name}",
                value.value,
                f"algorithm={cfg.algorithm.name} has no policy-gradient term to correct; remove it (null)",
            )


def check_off_policy_settings(cfg: DagrlConfig) -> None:
    """Skipping the old-log-prob pass and the rollout correction: each only where it is sound."""
    a, rc = cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction
    if a.recompute_old_logprobs is False:
        if a.ppo_mini_batch_size != cfg.data.train_batch_size or a.ppo_epochs != 1:
            raise ConfigError(
                f"{A}.recompute_old_logprobs",
                False,
                "the old log-probs may only come from the update's own forward when the update is on-policy:"
                f" set {A}.ppo_mini_batch_size = data.train_batch_size ({cfg.data.train_batch_size}) and"
                f" {A}.ppo_epochs=1, or keep recompute_old_logprobs=true",
            )
        if cfg.algorithm.use_kl_in_reward:
            raise ConfigError(
                f"{A}.recompute_old_logprobs",
                False,
                "algorithm.use_kl_in_reward needs the old log-probs before the update; keep recompute_old_logprobs=true",
            )
    P = "algorithm.rollout_correction"
    readers = rollout_logprobs_read(cfg)
    if readers and cfg.actor_rollout_ref.rollout.calculate_log_probs is False:
        raise ConfigError(
            f"{R}.calculate_log_probs",
            False,
            f"{readers[0]} reads the rollout engine's log-probs; set calculate_log_probs=true or leave it"
            " null (auto)",
        )
    lower = rc.rollout_rs_threshold_lower
    if lower is not None and lower > rc.rollout_rs_threshold:
        raise ConfigError(
            f"{P}.rollout_rs_threshold",
            (lower, rc.rollout_rs_threshold),
            "need 0 < rollout_rs_threshold_lower <= rollout_rs_threshold (e.g. 0.5 and 2.0)",
        )


def check_overlap_placement(cfg: DagrlConfig, colocated_with_train: bool) -> None:
    """Overlap needs the rollout on devices of its own: colocated roles take turns on one GPU."""
    r = cfg.actor_rollout_ref.rollout
    if r.overlap_steps and colocated_with_train:
        raise ConfigError(
            f"{R}.overlap_steps",
            r.overlap_steps,
            "the rollout shares the trainer's devices, so the two cannot run at once; use placement=separate"
            " (rollout on its own GPUs) or overlap_steps=0",
        )


def check_engine_keys(cfg: DagrlConfig) -> None:
    """A rollout key that only some engines read (each registers its own: `reads=`), set away from
    its default while rollout.name's engine does not read it, would do nothing: refused."""
    r, default = cfg.actor_rollout_ref.rollout, RolloutConfig()
    readers: dict[str, list[str]] = {}
    for name in BACKENDS.names(Role.rollout.value):
        for key in BACKENDS.find(Role.rollout.value, name).reads:
            readers.setdefault(key, []).append(name)
    for key, names in readers.items():
        value = _dotted(r, key)
        if r.name in names or value == _dotted(default, key):
            continue
        raise ConfigError(
            f"{R}.{key}",
            value,
            f"only the {' / '.join(names)} rollout reads it and {R}.name={r.name} does not: remove it,"
            f" or set {R}.name={names[0]}",
        )


def _dotted(section, key: str):
    for part in key.split("."):
        section = section[part] if isinstance(section, dict) else getattr(section, part)
    return section
