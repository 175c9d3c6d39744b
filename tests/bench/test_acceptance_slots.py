"""bench/acceptance_slots.sh: acceptance groups beside each other on one host, one card each.

On the CPU: two slots at once, each a real driver's local Ray (the `ray_probe` group), prove the
isolation the GPU slots rely on (each driver's cluster its own, in the slot's TMPDIR, alive while
the neighbour starts and ends its own); one slot's second group is cut by the deadline and says
so; the rows merge and one tarball holds every log. No nvidia-smi is needed. The estimate
(bench/slot_estimate.py) refuses a call that cannot finish, and the documented plans pass it."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
sys.path.insert(0, BENCH)
import acceptance_slots as slots  # noqa: E402
import multi_gpu_rows  # noqa: E402
import slot_estimate  # noqa: E402


def refused(*specs: str) -> list[str]:
    return slots.refusals([slots.parse_slot(s) for s in specs])


def test_slot_spec_reads_cards_groups_and_arguments():
    slot = slots.parse_slot("2,3:dp2")
    assert (slot.cards, slot.groups, slot.key) == (["2", "3"], [["dp2"]], "2_3")
    slot = slots.parse_slot("0:handover+matrix 4b-torch 1.7b-torch")
    assert slot.groups == [["handover"], ["matrix", "4b-torch", "1.7b-torch"]]
    with pytest.raises(ValueError, match="CARDS:GROUP"):
        slots.parse_slot("tests_c")


def test_slots_that_cannot_share_a_host_are_refused():
    assert refused("0:tests_a", "1:handover+tests_c", "2:matrix 4b-torch", "3:docs_a") == []
    assert refused("0:side") == []  # alone: a call of one slot
    (why,) = refused("0:side", "1:tests_c")
    assert why.startswith("slot 0: side runs alone") and "ratio of timings" in why
    (why,) = refused("0,1:two_nodes", "2:tests_c")
    assert "6379" in why
    (why,) = refused("0:dp2")
    assert "dp2 needs 2 cards" in why
    (why,) = refused("0:tests_c", "0:tests_d")
    assert "card 0 is in slots 0 and 0" in why
    (why,) = refused("0,1:tp", "2,3:tp")
    assert "tp is in slots 0,1 and 2,3" in why
    assert refused("0:tests_c", "1:tests_a") == []  # test_spec_gpu.py takes its slot's card and a free port
    (why,) = refused("0:tests_z")
    assert "unknown group 'tests_z'" in why
    (why,) = refused("0:matrix 4b-torch 4b-megatron-80g")
    assert "matrix rows ['4b-megatron-80g']" in why and "4b-megatron-80gib" in why
    (why,) = refused("0:matrix")
    assert "matrix rows missing" in why
    assert refused("0:files tests_c tests/backends/vllm/test_lora_megatron_gpu.py") == []
    (why,) = refused("0:files tests_c")
    assert "name the files to run" in why
    (why,) = refused("0:files tests/backends/vllm/test_lora_megatron_gpu.py")
    assert "files needs a tests group first" in why
    (why,) = refused("0:files tests_c tests/backends/vllm/test_lora_megatron.py")
    assert "test_lora_megatron.py is not a test file" in why


def test_the_spread_group_owns_the_host_and_gets_the_anchors():
    """Its figures are the decode loop's CPU seconds: alone only, with .anchors/ in its copy."""
    assert refused("0:spread") == []
    (why,) = refused("0:spread", "1:tests_c")
    assert why.startswith("slot 0: spread runs alone") and "CPU-bound" in why
    (why,) = refused("1:tests_c", "0:spread")
    assert why.startswith("slot 0: spread runs alone")
    assert "spread".startswith(slots.NEEDS_ANCHORS)


def test_a_files_group_runs_only_the_files_named_and_only_its_groups(tmp_path):
    """What a deadline left of a tests group runs as a row of its own, named by its files."""
    # as in a slot: no `ray stop` (other Rays of this host are not the test's), no nvidia-smi
    env = {**os.environ, "ACCEPTANCE_SLOT": "files"}
    env.pop("ACCEPTANCE_DEADLINE", None)
    script = os.path.join(BENCH, "acceptance_gpu.sh")
    run = subprocess.run(
        ["bash", script, str(tmp_path), "files", "tests_c", "tests/backends/vllm/test_lora_megatron_gpu.py"],
        cwd=os.path.dirname(BENCH), env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "== tests/backends/vllm/test_lora_megatron_gpu.py" in run.stdout
    assert "test_lora_gpu.py" not in run.stdout  # the group's other file
    (row,) = open(tmp_path / "rows.md").read().splitlines()
    assert row.startswith("| tests_c: test_lora_megatron_gpu | ")
    assert (tmp_path / "tests_c.backends_vllm_test_lora_megatron_gpu.log").exists()
    wrong = subprocess.run(
        ["bash", script, str(tmp_path), "files", "tests_c", "tests/backends/vllm/test_vllm_gpu.py"],
        cwd=os.path.dirname(BENCH), env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert wrong.returncode == 2 and "is not one of tests_c's" in wrong.stdout


def documented_calls() -> list[tuple[dict[str, str], list[str], bool]]:
    """Every command of bench/acceptance_slots.sh's header, in order: (its environment settings,
    its slots, whether the text before it since the last command names a fresh machine)."""
    import shlex

    header = open(os.path.join(BENCH, "acceptance_slots.sh")).read()
    header = header[: header.index("\nset -u")]
    # with or without environment settings in front (ROW_TIMEOUT=480 bash ...)
    # (a value may be quoted: SPREAD_SETTINGS="ours numa")
    command = re.compile(
        r'^#\s+((?:[A-Z_]+=(?:"[^"]*"|\S+)\s+)*)bash bench/acceptance_slots\.sh \$OUT (.+)$', re.M
    )
    calls, last = [], 0
    for m in command.finditer(header):
        env = dict(pair.split("=", 1) for pair in shlex.split(m.group(1)))
        calls.append((env, shlex.split(m.group(2)), "fresh machine" in header[last : m.start()]))
        last = m.end()
    return calls


def test_the_documented_call_plan_is_accepted():
    """Every command of the header would start: the refusals, and the estimate with the call's
    SLOTS_SECONDS and ROW_TIMEOUT, on the machine the commands before it leave (fresh again where
    the text says so: a new lease)."""
    calls = documented_calls()
    assert len(calls) >= 20, calls  # the regex still finds the plans
    assert sum(fresh for *_, fresh in calls) >= 4  # FIRST's lease, the CALL PLAN, x2's two
    host = slot_estimate.Host()
    for env, specs, fresh in calls:
        if fresh:
            host = slot_estimate.Host()
        call = [slots.parse_slot(spec) for spec in specs]
        assert slots.refusals(call) == [], specs
        total, row_timeout = float(env.get("SLOTS_SECONDS", 580)), float(env.get("ROW_TIMEOUT", 420))
        estimates = [slot_estimate.estimate(s, host, row_timeout) for s in call]
        over = slot_estimate.refusals(estimates, total, slots.END_RESERVE_S, row_timeout)
        assert over == [], (specs, over)
        host = slot_estimate.after(host, call)


def estimated(host: slot_estimate.Host, *specs: str, total: float = 580, row_timeout: float = 420):
    call = [slots.parse_slot(spec) for spec in specs]
    estimates = [slot_estimate.estimate(s, host, row_timeout) for s in call]
    return estimates, slot_estimate.refusals(estimates, total, slots.END_RESERVE_S, row_timeout)


def test_a_slot_past_its_deadline_is_refused_with_what_to_do():
    """Session 29's first call as it was packed (SLOTS_SECONDS=550, a fresh machine): its deadline
    cut 4b-torch and docs_a. Refused now, a line per slot: the estimate, the deadline, the fixes."""
    estimates, over = estimated(
        slot_estimate.Host(), "0:ray_probe+matrix 8b-megatron-lora 4b-torch", "1:ray_probe+docs_a",
        "2:ray_probe+tests_b1", total=550,
    )  # fmt: skip
    lora, docs, tests = estimates
    assert [line.split(":")[0] for line in over] == ["slot 0", "slot 1"], over
    assert over[0].startswith(
        f"slot 0: ~{lora.seconds:.0f} s estimated, past its deadline of 530 s (SLOTS_SECONDS 550 less 20)"
    )
    assert "move a group" in over[0] and "files GROUP FILE" in over[0] and "SLOTS_OVER=1" in over[0]
    assert lora.seconds > 570 and "raise SLOTS_SECONDS" not in over[0]  # no deadline would hold it
    # docs_a on empty caches: past the 506 s session 29 and session 21 cut it at, within one call
    assert 506 < docs.seconds <= 570 and f"raise SLOTS_SECONDS to {math.ceil(docs.seconds) + 20}" in over[1]
    # tests_b1, measured on fresh machines: nothing added for the empty caches
    assert tests.cold and tests.seconds == 14 + sum(slot_estimate.FILES["tests_b1"].values())


def test_a_row_past_row_timeout_is_refused():
    """8b-megatron needs more than ROW_TIMEOUT's 420 s for its 10 steps (session 29 cut it at 9)."""
    warm = slot_estimate.Host({"8b"}, {"0"})
    run = slot_estimate.ROWS["8b-megatron"].run.warm
    assert 420 < run < 480
    (estimate,), over = estimated(warm, "0:matrix 8b-megatron")
    assert estimate.seconds <= 560 and estimate.over_timeout == [("8b-megatron", run)]
    assert over == [
        f"slot 0: matrix row 8b-megatron runs ~{run:.0f} s, past ROW_TIMEOUT 420 (it would be cut before"
        " its last step): set ROW_TIMEOUT=480; SLOTS_OVER=1 runs it anyway"
    ]
    assert estimated(warm, "0:matrix 8b-megatron", row_timeout=480)[1] == []
    # on empty caches it compiles first: past 480 too, and past one call with its build
    _, over = estimated(slot_estimate.Host(), "0:matrix 8b-megatron", total=590, row_timeout=480)
    assert len(over) == 2 and "past its deadline of 570 s" in over[0] and "ROW_TIMEOUT=540" in over[1], over


def test_a_build_counts_once_per_slot_and_call():
    """The first slot builds a model, the others wait on its lock: each slot that needs it counts
    it once, however many of its rows use it; a call after it counts none."""
    build, rows = slot_estimate.BUILD_S, slot_estimate.ROWS
    host = slot_estimate.Host(set(), {"0", "1", "2"})
    (two_rows, waits, none), _ = estimated(
        host,
        "0:matrix 8b-megatron 8b-torch-lora",
        "1:matrix 8b-megatron-lora+matrix 8b-torch-lora",
        "2:docs_b",
    )
    assert [p for p in two_rows.parts if "build" in p] == [f"the 8b build {build['8b']}"]
    assert two_rows.seconds == build["8b"] + sum(
        rows[r].prep + rows[r].run.warm for r in ("8b-megatron", "8b-torch-lora")
    )
    assert [p for p in waits.parts if "build" in p] == [f"the 8b build {build['8b']}"]
    assert not [p for p in none.parts if "build" in p]
    call = [slots.parse_slot("0:matrix 8b-megatron 8b-torch-lora"), slots.parse_slot("3:ray_probe")]
    later = slot_estimate.after(host, call)
    assert later.built == {"8b"} and later.warm == {"0", "1", "2"}  # ray_probe compiles nothing
    (again,), _ = estimated(later, "0:matrix 8b-torch-lora gkd-0.6b-1.7b")
    assert [p for p in again.parts if "build" in p] == [
        f"the 0.6b build {build['0.6b']}",
        f"the 1.7b build {build['1.7b']}",
    ]
    (handover,), _ = estimated(later, "0:handover")
    assert handover.seconds == build["0.6b"] + slot_estimate.GROUPS["handover"].warm


def test_the_machine_says_what_is_built_and_which_caches_are_filled(tmp_path):
    models, root = tmp_path / "models", tmp_path / "slots"
    (models / "qwen3-4b").mkdir(parents=True)
    (models / "qwen3-4b" / "config.json").write_text("{}")
    (models / "qwen3-8b.partial").mkdir()  # a build cut half-way is not a model
    (root / "0" / "cache" / "vllm" / "torch_compile_cache").mkdir(parents=True)
    (root / "0" / "cache" / "vllm" / "torch_compile_cache" / "graph.py").write_text("")
    (root / "1" / "cache" / "triton").mkdir(parents=True)  # folders, no file: nothing compiled
    (root / "2_3" / "tmp").mkdir(parents=True)
    host = slot_estimate.read_host(str(root), str(models))
    assert host.built == {"4b"} and host.warm == {"0"}
    (warm, cold, share), _ = estimated(
        host, "0:docs_a", "1:docs_a", "2:files tests_b2 tests/rewards/test_judge_gpu.py"
    )
    docs_a, judge = (
        slot_estimate.GROUPS["docs_a"],
        slot_estimate.FILES["tests_b2"]["tests/rewards/test_judge_gpu.py"],
    )
    assert (warm.seconds, warm.cold, cold.seconds, cold.cold) == (docs_a.warm, False, docs_a.cold, True)
    assert share.seconds == judge + slot_estimate.COLD_S  # its share of tests_b2, and the cold allowance
    assert slot_estimate.read_host(str(tmp_path / "none"), str(tmp_path / "none")) == slot_estimate.Host()


def test_every_group_row_and_file_has_a_figure():
    assert slots.ONE_GPU - {"matrix", "files"} | set(slots.MULTI_GPU) <= set(slot_estimate.GROUPS)
    assert slots.matrix_rows() == set(slot_estimate.ROWS)
    import gpu_matrix

    for name, (shape, *_) in gpu_matrix.ROWS.items():
        assert slot_estimate.ROWS[name].shapes == (shape,), name
    for name, (base, _) in gpu_matrix.CARD_ROWS.items():
        assert slot_estimate.ROWS[name].shapes == slot_estimate.ROWS[base].shapes
    assert {s for r in slot_estimate.ROWS.values() for s in r.shapes} <= set(slot_estimate.BUILD_S)
    script = open(os.path.join(BENCH, "acceptance_gpu.sh")).read()
    for group in slots.TESTS_GROUPS:
        (files,) = re.findall(rf"^{group.upper()}=\(([^)]*)\)", script, re.M)
        assert files.split() == list(slot_estimate.FILES[group]), group


def test_the_estimate_runs_on_a_machine_without_torch_or_a_gpu(tmp_path):
    """`--estimate` is the CPU's check before a call: no torch, no nvidia-smi, nothing started."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no torch on this machine')\n")
    env = {
        "PATH": os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin",
        "PYTHONPATH": str(tmp_path / "site"),
        "SLOTS_ROOT": str(tmp_path / "slots"),
        "SLOTS_SECONDS": "590",
        "ROW_TIMEOUT": "480",
    }
    script = os.path.join(BENCH, "acceptance_slots.py")

    def check(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, script, "--estimate", *args], env=env, capture_output=True, text=True, timeout=60
        )

    over = check("--fresh", "0:matrix 8b-megatron", "1:docs_b")
    assert over.returncode == 2, over.stdout + over.stderr
    row, build = slot_estimate.ROWS["8b-megatron"], slot_estimate.BUILD_S["8b"]
    cold, warm = row.prep + row.run.at(True), row.prep + row.run.warm
    assert (
        f"slot 0: ~{build + cold:.0f} s (the 8b build {build} + 8b-megatron {cold:.0f}, caches empty)"
        in over.stdout
    )
    assert f"refused:\n  slot 0: ~{build + cold:.0f} s estimated, past its deadline of 570 s" in over.stdout
    fits = check("--warm", "0:matrix 8b-megatron", "1:docs_b")
    assert fits.returncode == 0 and fits.stdout.endswith("accepted\n"), fits.stdout + fits.stderr
    assert f"slot 0: ~{warm:.0f} s (8b-megatron {warm:.0f})" in fits.stdout
    typo = check("0:matrix 8b-megatorn")
    assert typo.returncode == 2 and "matrix rows ['8b-megatorn']" in typo.stdout
    assert not (tmp_path / "slots").exists()  # nothing prepared


def test_two_host_heavy_rows_are_refused_in_one_call():
    """8b-torch beside 4b-megatron-80gib filled a 251 GiB host (session 28): one such row a call,
    in one slot or in two; beside any other group it runs."""
    both = refused("0:matrix 8b-torch", "1:matrix 4b-megatron-80gib")
    assert len(both) == 1 and "8b-torch (slot 0), 4b-megatron-80gib (slot 1)" in both[0], both
    assert refused("0:matrix 8b-megatron 8b-torch") != []
    assert refused("0:matrix 8b-torch", "1:tests_a") == []
    assert refused("0:matrix 8b-megatron 8b-torch-lora", "1:matrix 4b-torch") == []


def case_labels(script: str) -> set[str]:
    """The group names a script's `case $WHAT` takes."""
    text = open(os.path.join(BENCH, script)).read()
    body = text[text.index("case $WHAT in") :]
    return {name.strip() for line in re.findall(r"^([a-z0-9_ |]+)\)", body, re.M) for name in line.split("|")}


def test_the_runner_knows_every_group_of_both_scripts():
    assert case_labels("acceptance_gpu.sh") == slots.ONE_GPU
    assert case_labels("acceptance_multi_gpu.sh") == set(slots.MULTI_GPU)


def test_multi_gpu_rows_take_the_slots_cards():
    assert multi_gpu_rows.visible(2, "") == "CUDA_VISIBLE_DEVICES=0,1"
    assert multi_gpu_rows.visible(2, "2,3") == "CUDA_VISIBLE_DEVICES=2,3"
    assert multi_gpu_rows.visible(1, "2,3") == "CUDA_VISIBLE_DEVICES=2"
    with pytest.raises(AssertionError, match="a 4-GPU row given CUDA_VISIBLE_DEVICES=2,3"):
        multi_gpu_rows.visible(4, "2,3")


def probes(tar: tarfile.TarFile, name: str) -> list[dict]:
    text = tar.extractfile(name).read().decode()
    return [json.loads(line.split(" ", 1)[1]) for line in text.splitlines() if line.startswith("PROBE ")]


def run_slots(root: str, seconds: int, *specs: str, **settings: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
        "SLOTS_ROOT": root,
        "SLOTS_SECONDS": str(seconds),
        "SLOTS_MIN_GROUP_S": "1",
        "SLOTS_RAY_STOP": "0",  # other Rays of this host (the test session's) are not the call's
        **settings,
    }
    return subprocess.run(
        ["bash", "bench/acceptance_slots.sh", os.path.join(root, "OUT"), *specs],
        cwd=os.path.join(BENCH, ".."), env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


@pytest.fixture
def root():
    """Ray's socket paths must stay under 107 bytes: a short root, not pytest's tmp_path."""
    path = tempfile.mkdtemp(prefix="sl", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_two_slots_run_at_once_each_with_its_own_ray(root):
    # slot 0 holds its cluster while slot 1 starts and ends its own: a `ray stop` at the end of
    # slot 1's group would end slot 0's, whose probe would then fail
    proc = run_slots(root, 170, "0:ray_probe 4", "1:ray_probe 1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = open(os.path.join(root, "OUT", "rows.md")).read()
    assert "| ray_probe | cpu (card 0) | 0 | 3/3 | | | |" in rows, rows
    assert "| ray_probe | cpu (card 1) | 0 | 3/3 | | | |" in rows, rows
    summary = [line for line in proc.stdout.splitlines() if line.startswith("SLOT ")]
    assert [line.rsplit(" ", 2)[0] for line in summary] == [
        "SLOT 0: ray_probe 4 ok",
        "SLOT 1: ray_probe 1 ok",
    ]
    with tarfile.open(os.path.join(root, "OUT", "logs.tgz")) as tar:
        assert {"slot_0/0.ray_probe.out", "slot_1/0.ray_probe.out"} <= set(tar.getnames())
        (first,), (second,) = probes(tar, "slot_0/ray_probe.log"), probes(tar, "slot_1/ray_probe.log")
    assert first["gcs"] != second["gcs"]  # two clusters, each in its slot's TMPDIR
    assert first["session"].startswith(os.path.join(os.path.realpath(root), "0", "tmp", "ray") + os.sep)
    assert second["session"].startswith(os.path.join(os.path.realpath(root), "1", "tmp", "ray") + os.sep)


def test_a_group_the_deadline_cuts_is_ended_and_says_so(root):
    refused = run_slots(root, 26, "3:ray_probe 600")  # held 600 s: past the estimate, nothing started
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (
        "refused (nothing started):\n  slot 3: ~614 s estimated, past its deadline of 6 s" in refused.stdout
    )
    assert not os.path.exists(os.path.join(root, "OUT")) and not os.path.exists(os.path.join(root, "3"))
    start = time.time()
    proc = run_slots(root, 26, "3:ray_probe 600", SLOTS_OVER="1")  # the groups' deadline: 6 s after the start
    assert time.time() - start < 26
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a cut group is not a pass
    rows = open(os.path.join(root, "OUT", "rows.md")).read()
    assert re.search(
        r"^\| ray_probe 600 \| cpu \(card 3\) \| 124 \| cut by the deadline after \d+ s \|", rows, re.M
    ), rows
    assert "SLOT 3: ray_probe 600 FAILED (rows rc -)" in proc.stdout
    # nothing of it is left running: no process of the slot's copy or its Ray's temp dir
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        if os.path.realpath(root) in cmdline:
            left.append(cmdline.replace("\0", " ")[:200])
    assert not left, left


def test_a_matrix_row_without_time_left_is_recorded_as_not_started(tmp_path, monkeypatch):
    import gpu_matrix

    monkeypatch.setattr(gpu_matrix, "DEADLINE", str(time.time() + 40))  # 30 s left after the row's 10
    assert gpu_matrix.time_left(420)[1] and gpu_matrix.time_left(20) == (20, False)
    assert gpu_matrix.not_started(str(tmp_path), ["4b-torch", "1.7b-torch"]) == []
    rows = (tmp_path / "rows.md").read_text().splitlines()
    assert [r.split("|")[1].strip() for r in rows] == ["4b-torch", "1.7b-torch"]
    assert all("| 124 | not started: " in r for r in rows)
    monkeypatch.setattr(gpu_matrix, "DEADLINE", str(time.time() + 400))
    assert gpu_matrix.not_started(str(tmp_path), ["4b-torch"]) == ["4b-torch"]
    row = {"row": "4b-torch", "device": "H100", "rc": 124, "steps": 3, "median_step_s": 13.0}
    row |= {"peak_gib": {"rollout": 1, "update": 2}, "plan_gib": {"rollout": 1, "update": 2}}
    assert "| 124 | 3, cut by the deadline | 13.0 |" in gpu_matrix.table_row({**row, "cut_by_deadline": True})


def test_slots_building_one_model_at_once_build_it_once(tmp_path, monkeypatch, capsys):
    """bench/real_size_gpu.build from two slots at once: one builds, the other waits for it, and the
    directory appears whole (never a config.json without its weights)."""
    import threading

    import real_size_gpu

    monkeypatch.setitem(real_size_gpu.SHAPES, "tiny", (64, 2, 4, 2, 128))
    paths = []
    threads = [
        threading.Thread(target=lambda: paths.append(real_size_gpu.build(str(tmp_path), "tiny")))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert paths == [str(tmp_path / "qwen3-tiny")] * 2
    assert capsys.readouterr().out.count('"built"') == 1
    assert (tmp_path / "qwen3-tiny" / "model.safetensors").is_file()
    assert not (tmp_path / "qwen3-tiny.partial").exists()


def test_logs_too_large_for_the_tarball_keep_their_ends(tmp_path, monkeypatch):
    """The device tool brings back files of up to 16 MiB: past the limit, each large log's last part."""
    monkeypatch.setattr(slots, "TARBALL_LIMIT", 64 * 1024)
    monkeypatch.setattr(slots, "TAIL_BYTES", 8 * 1024)
    for key in ("0", "1"):
        (tmp_path / key).mkdir()
        (tmp_path / key / "rows.md").write_text("| tests_c | H100 | 0 | 2/2 | | | |\n")
    big = os.urandom(128 * 1024)  # random bytes: gzip cannot shrink them under the limit
    (tmp_path / "1" / "tests_c.log").write_bytes(big)
    tarball = str(tmp_path / "logs.tgz")
    slots.pack(tarball, {key: str(tmp_path / key) for key in ("0", "1")})
    assert os.path.getsize(tarball) <= 64 * 1024
    with tarfile.open(tarball) as tar:
        assert sorted(tar.getnames()) == ["slot_0/rows.md", "slot_1/rows.md", "slot_1/tests_c.log.tail"]
        assert tar.extractfile("slot_1/tests_c.log.tail").read() == big[-8 * 1024 :]


def test_every_gpu_test_file_is_a_groups():
    """A GPU test file no group names never runs on a card: each file marked gpu is run by a group
    of bench/acceptance_gpu.sh (a tests group, as bench/slot_estimate.py times it, or handover and
    docs_a/docs_b by name; the 2-GPU weight broadcast check runs through its bench script in the
    `separate` group)."""
    tests_dir = os.path.join(BENCH, "..", "tests")
    marked = set()
    for root, _, files in os.walk(tests_dir):
        for name in files:
            path = os.path.join(root, name)
            if name.endswith(".py") and re.search(r"pytest\.mark\.gpu\b", open(path).read()):
                marked.add(os.path.relpath(path, os.path.join(tests_dir, "..")))
    script = open(os.path.join(BENCH, "acceptance_gpu.sh")).read()
    arrays = {
        "tests_" + m.group(1).lower(): m.group(2).split()
        for m in re.finditer(r"^TESTS_(\w+)=\(([^)]*)\)", script, re.M)
    }
    assert arrays == {group: list(files) for group, files in slot_estimate.FILES.items()}
    grouped = {f for files in arrays.values() for f in files}
    assert grouped <= marked, grouped - marked
    unnamed = {f for f in marked - grouped if f not in script}
    assert unnamed == {"tests/bench/test_weight_broadcast_bench.py"}, unnamed
