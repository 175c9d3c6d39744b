"""bench/acceptance_slots.sh: acceptance groups beside each other on one host, one card each.

On the CPU: two slots at once, each a real driver's local Ray (the `ray_probe` group), prove the
isolation the GPU slots rely on (each driver's cluster its own, in the slot's TMPDIR, alive while
the neighbour starts and ends its own); one slot's second group is cut by the deadline and says
so; the rows merge and one tarball holds every log. No nvidia-smi is needed."""

from __future__ import annotations

import json
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


def test_the_documented_call_plan_is_accepted():
    """Every command of the call plan in bench/acceptance_slots.sh's header would start."""
    import shlex

    header = open(os.path.join(BENCH, "acceptance_slots.sh")).read()
    # with or without environment settings in front (ROW_TIMEOUT=540 bash ...)
    calls = re.findall(r"^#\s+(?:[A-Z_]+=\S+\s+)*bash bench/acceptance_slots\.sh \$OUT (.+)$", header, re.M)
    assert len(calls) >= 5, calls  # the regex still finds the plan
    for call in calls:
        assert refused(*shlex.split(call)) == [], call


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


def run_slots(root: str, seconds: int, *specs: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
        "SLOTS_ROOT": root,
        "SLOTS_SECONDS": str(seconds),
        "SLOTS_MIN_GROUP_S": "1",
        "SLOTS_RAY_STOP": "0",  # other Rays of this host (the test session's) are not the call's
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
    start = time.time()
    proc = run_slots(root, 26, "3:ray_probe 600")  # the groups' deadline: 6 s after the start
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
