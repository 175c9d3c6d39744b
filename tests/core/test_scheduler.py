"""The scheduler runs independent nodes concurrently, feeds each node only its inputs, and re-raises errors."""

from __future__ import annotations

import textwrap
import threading
import time

import pytest
import torch

from dagrl.core.batch import Batch, declare_key
from dagrl.core.dag import build_dag, load_dag_specs
from dagrl.core.node import NodeResult, register_node_kind
from dagrl.core.runtime import Runtime
from dagrl.core.scheduler import Scheduler
from tests.conftest import compose_config

SLEEP_S = 0.5

declare_key("schedtest_a", "[B] test output of schedtest_sleep_a")
declare_key("schedtest_b", "[B] test output of schedtest_sleep_b")
declare_key("schedtest_sum", "[B] schedtest_a + schedtest_b")

EVENTS: list[tuple[str, str, float]] = []  # (node, "start"|"end", time)
SEEN: dict[str, set[str]] = {}  # node -> keys of the batch it was given
_lock = threading.Lock()


def _record(name: str, what: str) -> None:
    with _lock:
        EVENTS.append((name, what, time.perf_counter()))


class _Sleeper:
    required_inputs = ("prompts",)
    optional_inputs = ()
    remote = False
    value = 0.0

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        SEEN[self.spec.name] = batch.keys()
        _record(self.spec.name, "start")
        time.sleep(SLEEP_S)
        _record(self.spec.name, "end")
        return NodeResult(
            Batch({self.outputs[0]: torch.full((len(batch),), self.value)}), {self.spec.name: 1.0}
        )


@register_node_kind("schedtest_sleep_a")
class SleepA(_Sleeper):
    outputs = ("schedtest_a",)
    value = 1.0


@register_node_kind("schedtest_sleep_b")
class SleepB(_Sleeper):
    outputs = ("schedtest_b",)
    value = 2.0


@register_node_kind("schedtest_sum")
class Sum:
    required_inputs = ("schedtest_a", "schedtest_b")
    optional_inputs = ()
    outputs = ("schedtest_sum",)
    remote = False

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        SEEN[self.spec.name] = batch.keys()
        _record(self.spec.name, "start")
        return NodeResult(Batch({"schedtest_sum": batch["schedtest_a"] + batch["schedtest_b"]}))


@register_node_kind("schedtest_fail")
class Fail:
    required_inputs = ("prompts",)
    optional_inputs = ()
    outputs = ()
    remote = False

    def __init__(self, spec, cfg):
        self.spec = spec

    @staticmethod
    def enabled(cfg) -> bool:
        return True

    def run(self, runtime, batch):
        raise ValueError("schedtest node failed on purpose")


@register_node_kind("schedtest_liar")
class Liar(Fail):
    """Declares no outputs but returns one."""

    def run(self, runtime, batch):
        return NodeResult(Batch({"schedtest_a": torch.zeros(len(batch))}))


def make_scheduler(tmp_path, nodes: str) -> Scheduler:
    path = tmp_path / "dag.yaml"
    path.write_text("source: [prompts, data_source]\n" + textwrap.dedent(nodes))
    source, specs = load_dag_specs(str(path))
    dag = build_dag(str(path), source, specs, roles_with_pool=set())
    return Scheduler(dag, Runtime(cfg=compose_config()))


def data_batch(rows: int = 4) -> Batch:
    return Batch({"prompts": torch.ones(rows, 3, dtype=torch.long)}, {"data_source": ["x"] * rows})


FAN_IN = """
nodes:
  total:
    kind: schedtest_sum
    inputs: [schedtest_a, schedtest_b]
    outputs: [schedtest_sum]
  a:
    kind: schedtest_sleep_a
    inputs: [prompts]
    outputs: [schedtest_a]
  b:
    kind: schedtest_sleep_b
    inputs: [prompts]
    outputs: [schedtest_b]
"""


def test_independent_nodes_run_concurrently(tmp_path):
    EVENTS.clear()
    SEEN.clear()
    scheduler = make_scheduler(tmp_path, FAN_IN)
    try:
        start = time.perf_counter()
        out, metrics = scheduler.run(data_batch(), step=1)
        wall = time.perf_counter() - start
    finally:
        scheduler.close()
    assert SLEEP_S <= wall < 0.9, f"two {SLEEP_S}s nodes took {wall:.2f}s: they did not overlap"
    # both sleepers started before either finished; the consumer started after both finished
    times = {(n, w): t for n, w, t in EVENTS}
    assert max(times["a", "start"], times["b", "start"]) < min(times["a", "end"], times["b", "end"])
    assert times["total", "start"] >= max(times["a", "end"], times["b", "end"])
    # each node saw exactly its declared inputs; the consumer saw both outputs
    assert SEEN == {"a": {"prompts"}, "b": {"prompts"}, "total": {"schedtest_a", "schedtest_b"}}
    assert torch.equal(out["schedtest_sum"], torch.full((4,), 3.0))
    assert out.keys() == {"prompts", "data_source", "schedtest_a", "schedtest_b", "schedtest_sum"}
    assert metrics["a"] == 1.0 and metrics["b"] == 1.0
    assert metrics["timing_s/a"] >= SLEEP_S and metrics["timing_s/total"] < SLEEP_S
    assert metrics["timing_s/step"] >= SLEEP_S
    # the two sleepers ran alongside each other: about one sleep of node time beyond the wall time
    assert 0.8 * SLEEP_S < metrics["timing_s/overlapped"] < 1.2 * SLEEP_S + 0.05


def test_node_error_propagates(tmp_path):
    scheduler = make_scheduler(
        tmp_path,
        """
        nodes:
          boom:
            kind: schedtest_fail
            inputs: [prompts]
    """,
    )
    from dagrl.core.failures import RunFailure

    try:
        with pytest.raises(RunFailure, match="ValueError: schedtest node failed on purpose") as raised:
            scheduler.run(data_batch(), step=1)
    finally:
        scheduler.close()
    assert raised.value.where == "DAG node boom (kind schedtest_fail, on the driver)"
    assert isinstance(raised.value.__cause__, ValueError)  # the traceback main logs


def test_undeclared_output_asserts(tmp_path):
    scheduler = make_scheduler(
        tmp_path,
        """
        nodes:
          liar:
            kind: schedtest_liar
            inputs: [prompts]
    """,
    )
    try:
        with pytest.raises(AssertionError, match=r"node liar produced \['schedtest_a'\], declared \[\]"):
            scheduler.run(data_batch(), step=1)
    finally:
        scheduler.close()
