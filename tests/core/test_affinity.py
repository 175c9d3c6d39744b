"""dagrl/core/affinity.py (trainer.cpu_affinity=gpu_local): the GPU's CPU list as sysfs and
nvidia-smi write it, the rule that a pin never widens what the process may use, every thread of a
real process pinned (threads started later inherit it), and a worker's start on GPU and CPU."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from dagrl.config.enums import CpuAffinity
from dagrl.core import affinity
from dagrl.core.affinity import GpuCpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---- reading the host ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, cpus",
    [
        ("0-15,32-47", set(range(16)) | set(range(32, 48))),
        ("0-55,112-167\n", set(range(56)) | set(range(112, 168))),
        ("3", {3}),
        ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}),
        ("", set()),
        ("N/A", set()),
    ],
)
def test_cpulists_read_as_sysfs_and_nvidia_smi_write_them(text, cpus):
    assert affinity.parse_cpulist(text) == cpus
    assert affinity.parse_cpulist(affinity.compact(cpus)) == cpus


def test_a_cpulist_is_written_back_in_ranges_and_nonsense_is_refused():
    assert affinity.compact({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    for bad in ("0-", "a-b", "5-3", "1,,2", "0-3:2"):
        with pytest.raises(ValueError, match="not a cpulist"):
            affinity.parse_cpulist(bad)


def test_this_machines_own_cpulists_parse_to_its_cpus():
    """Every local_cpulist of this machine's PCI devices and every NUMA node's cpulist."""
    paths = glob.glob("/sys/bus/pci/devices/*/local_cpulist") + glob.glob(
        "/sys/devices/system/node/node*/cpulist"
    )
    if not paths:
        pytest.skip("no sysfs cpulists on this machine")
    for path in paths:
        cpus = affinity.parse_cpulist(open(path).read())
        assert cpus and cpus <= set(range(os.cpu_count())), path


TOPO = (
    "\x1b[4m\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tSYS\t0-47,96-143\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\t48-95,144-191\t1\t\tN/A\n"
    "NIC0\tSYS\tSYS\t X \t\t\t\t\n\nLegend:\n\n  X    = Self\n"
)


def test_the_gpus_cpu_affinity_comes_from_its_row_of_nvidia_smi_topo():
    assert affinity.topo_affinity(TOPO, 0) == "0-47,96-143"
    assert affinity.topo_affinity(TOPO, 1) == "48-95,144-191"
    assert affinity.topo_affinity(TOPO, 2) == ""
    assert affinity.topo_affinity("No devices were found", 0) == ""
    # older drivers: CPU Affinity the last column, the header's underline closing on it
    old = "\x1b[4m\tGPU0\tmlx5_0\tCPU Affinity\x1b[0m\nGPU0\t X \tPHB\t0-15,32-47\n"
    assert affinity.topo_affinity(old, 0) == "0-15,32-47"


def test_pci_ids_become_sysfs_names():
    assert affinity.sysfs_bus_id("00000000:19:00.0") == "0000:19:00.0"
    assert affinity.sysfs_bus_id("00000001:AB:00.0\n") == "0001:ab:00.0"
    assert affinity.pci_address(0, 0x19, 0) == "0000:19:00.0"  # torch's pci_domain/bus/device_id
    assert affinity.pci_address(1, 0xAB, 0x1F) == "0001:ab:1f.0"
    smi = "0, 00000000:19:00.0\n1, 00000000:3B:00.0\n"
    assert affinity.smi_cards(smi) == [(0, "0000:19:00.0"), (1, "0000:3b:00.0")]
    assert affinity.smi_cards("") == [] and affinity.smi_cards("No devices were found") == []


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A sysfs tree of two cards (one without local_cpulist) and an nvidia-smi, in place of the machine's."""
    monkeypatch.setattr(affinity, "PCI_DEVICES", str(tmp_path))
    (tmp_path / "0000:19:00.0").mkdir()
    (tmp_path / "0000:19:00.0" / "local_cpulist").write_text("0-47,96-143\n")
    (tmp_path / "0000:9b:00.0").mkdir()
    calls: list[tuple[str, ...]] = []

    def smi(*args: str) -> str:
        calls.append(args)
        if args[0] == "topo":
            return TOPO
        listed = {"0": "0, 00000000:19:00.0", "1": "1, 00000000:9B:00.0"}  # --query-gpu=index,pci.bus_id
        return listed.get(args[1], "") if args[0] == "-i" else "\n".join(listed.values())

    monkeypatch.setattr(affinity, "smi", smi)
    return calls


def test_the_gpus_cpus_come_from_sysfs_else_from_nvidia_smi_topo(host, tmp_path, monkeypatch):
    local = affinity.gpu_local_cpus("0000:19:00.0")  # torch's address: sysfs, nvidia-smi not asked
    assert local.cpus == set(range(48)) | set(range(96, 144)) and local.source.endswith(
        "0000:19:00.0/local_cpulist"
    )
    assert host == []
    local = affinity.gpu_local_cpus("0000:9b:00.0")  # no local_cpulist: its nvidia-smi row
    assert local == GpuCpus(
        frozenset(range(48, 96)) | frozenset(range(144, 192)), "0000:9b:00.0", "nvidia-smi topo -m"
    )
    monkeypatch.setenv(
        "CUDA_VISIBLE_DEVICES", "1,0"
    )  # no address from torch: the visible card, by nvidia-smi
    assert affinity.gpu_local_cpus().source == "nvidia-smi topo -m" and ("-i", "1") in [c[:2] for c in host]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert affinity.gpu_local_cpus().source.endswith("0000:19:00.0/local_cpulist")
    (tmp_path / "0000:9b:00.0" / "local_cpulist").write_text("garbled\n")  # not a cpulist: as if absent
    assert affinity.gpu_local_cpus("0000:9b:00.0").source == "nvidia-smi topo -m"
    nothing = affinity.gpu_local_cpus("0000:aa:00.0")  # a card neither knows
    assert (
        nothing.cpus == set()
        and nothing.source.startswith("nothing read: ")
        and "0000:aa:00.0" in nothing.source
    )


def test_without_sysfs_or_nvidia_smi_nothing_is_read():
    """This machine: no such card in sysfs, and nvidia-smi missing or without that card."""
    local = affinity.gpu_local_cpus("ffff:ff:1f.0")
    assert local.cpus == set() and local.source.startswith("nothing read: ")


# ---- the intersection rule -----------------------------------------------------------------------
def test_a_pin_never_widens_the_processs_cpus_nor_empties_them():
    allowed = os.sched_getaffinity(0)  # this machine's real affinity
    outside = {max(allowed) + 1, max(allowed) + 64}  # CPUs this process may not use
    one = {min(allowed)}
    assert affinity.pin_choice(one | outside, allowed) == (
        one,
        None if one != allowed else "the affinity is the GPU's already",
    )
    assert affinity.pin_choice(allowed | outside, allowed) == (allowed, "the affinity is the GPU's already")
    assert affinity.pin_choice(outside, allowed) == (set(), "no GPU-local CPU in the affinity")
    assert affinity.pin_choice(set(), allowed) == (set(), "the GPU's local CPUs could not be read")


def thread_masks() -> set[frozenset[int]]:
    """The CPU sets this process's threads have (threads come and go; their masks should not change)."""
    return {frozenset(os.sched_getaffinity(tid)) for tid in affinity.thread_ids()}


def test_a_pin_that_would_change_nothing_leaves_every_thread_as_it_was():
    allowed = os.sched_getaffinity(0)
    before = thread_masks()
    far = GpuCpus(frozenset({max(allowed) + 1}), "0000:19:00.0", "test")
    pin = affinity.pin_to_gpu(far)
    assert pin.unchanged == "no GPU-local CPU in the affinity" and pin.threads == 0
    assert "unchanged, no GPU-local CPU in the affinity" in pin.line() and "GPU 0000:19:00.0" in pin.line()
    assert (
        affinity.pin_to_gpu(GpuCpus(frozenset(allowed), "x", "test")).unchanged
        == "the affinity is the GPU's already"
    )
    assert affinity.pin_to_gpu(GpuCpus(frozenset(), "x", "nothing read: y")).unchanged.startswith(
        "the GPU's local"
    )
    assert thread_masks() == before


# ---- every thread of a real process --------------------------------------------------------------
def run_child(code: str) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout.strip().splitlines()[-1])


SLEEPERS = """
import json, os, threading
from dagrl.core import affinity
from dagrl.core.affinity import GpuCpus

done = threading.Event()
def sleeper(ids, ready):
    ids.append(threading.get_native_id())
    ready.wait()
    done.wait()
def start(n):
    ids, ready = [], threading.Barrier(n + 1)
    for _ in range(n):
        threading.Thread(target=sleeper, args=(ids, ready), daemon=True).start()
    ready.wait()
    return ids
allowed = os.sched_getaffinity(0)
subset = {min(allowed)} if len(allowed) > 1 else set(allowed)  # a strict subset where there is one
before = start(3)
"""


def test_every_thread_of_a_process_is_pinned_and_later_threads_inherit_it():
    code = (
        SLEEPERS
        + """
local = GpuCpus(frozenset(subset | {max(allowed) + 1}), "0000:19:00.0", "test")  # one CPU not allowed
pin = affinity.pin_to_gpu(local)
after = start(2)
masks = {tid: sorted(os.sched_getaffinity(tid)) for tid in affinity.thread_ids()}
print(json.dumps({"subset": sorted(subset), "allowed": sorted(allowed), "masks": masks,
                  "before": before, "after": after, "threads": pin.threads, "line": pin.line()}))
"""
    )
    out = run_child(code)
    subset, masks = out["subset"], {int(t): m for t, m in out["masks"].items()}
    assert len(masks) == 6 and out["threads"] == 4  # the main thread and three sleepers, then two more
    assert set(out["before"]) | set(out["after"]) < set(masks)
    assert all(mask == subset for mask in masks.values()), masks
    assert f"4 threads pinned to CPUs {affinity.compact(subset)}" in out["line"]


def test_a_gpu_worker_pins_its_threads_as_it_starts(tmp_path):
    """The worker's start on a card whose sysfs entry says `subset` (the address torch would give)."""
    code = (
        SLEEPERS
        + f"""
import torch
from dagrl.core.worker import RoleParts, Worker, WorkerParts
os.makedirs("{tmp_path}/0000:19:00.0")
open("{tmp_path}/0000:19:00.0/local_cpulist", "w").write(affinity.compact(subset))
affinity.PCI_DEVICES = "{tmp_path}"
affinity.torch_bus_id = lambda device: "0000:19:00.0"
parts = WorkerParts.pack([], {{"train": RoleParts(spec="train")}})
worker = Worker(parts, ["train"], 0, 1, "cuda", 1, build=None, cpu_affinity=affinity.CpuAffinity.gpu_local)
after = start(1)
masks = {{tid: sorted(os.sched_getaffinity(tid)) for tid in affinity.thread_ids()}}
print(json.dumps({{"subset": sorted(subset), "masks": masks, "pinned": sorted(worker.pin.pinned)}}))
"""
    )
    out = run_child(code)
    assert out["pinned"] == out["subset"]
    assert all(mask == out["subset"] for mask in out["masks"].values()), out["masks"]


# ---- the setting on each device ------------------------------------------------------------------
def test_on_a_cpu_device_gpu_local_does_nothing_and_says_so_once(monkeypatch, capsys):
    import torch

    from dagrl import console
    from dagrl.core.worker import RoleParts, Worker, WorkerParts

    monkeypatch.setattr(console, "_said", set())
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # a GPU worker's, undone after
    assert affinity.worker_affinity(CpuAffinity.gpu_local, "cpu") == CpuAffinity.none
    assert affinity.worker_affinity(CpuAffinity.gpu_local, "cpu") == CpuAffinity.none
    out = capsys.readouterr().out
    assert out.count("trainer.cpu_affinity=gpu_local: CPU workers keep their CPUs") == 1
    assert affinity.worker_affinity(CpuAffinity.gpu_local, "cuda") == CpuAffinity.gpu_local
    assert affinity.worker_affinity(CpuAffinity.none, "cuda") == CpuAffinity.none

    def unread(*args):
        raise AssertionError("nothing is read for a worker that pins nothing")

    monkeypatch.setattr(affinity, "gpu_local_cpus", unread)
    before = thread_masks()
    parts = WorkerParts.pack([], {"train": RoleParts(spec="train")})
    threads = torch.get_num_threads()
    assert Worker(parts, ["train"], 0, 1, "cpu", threads, cpu_affinity=CpuAffinity.gpu_local).pin is None
    assert Worker(parts, ["train"], 0, 1, "cuda", threads, cpu_affinity=CpuAffinity.none).pin is None
    assert thread_masks() == before and capsys.readouterr().out == ""


def test_a_gpu_worker_whose_cards_cpus_cannot_be_read_is_left_as_it_was(monkeypatch, capsys):
    """A machine without a GPU as a GPU worker would see it: no CUDA, no nvidia-smi; one line says so."""
    import shutil

    import torch

    from dagrl.core.worker import RoleParts, Worker, WorkerParts

    if torch.cuda.is_available() or shutil.which("nvidia-smi"):
        pytest.skip("a GPU host: the card's CPUs would be read and this process pinned")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    before = thread_masks()
    parts = WorkerParts.pack([], {"train": RoleParts(spec="train")})
    worker = Worker(
        parts, ["train"], 0, 1, "cuda", torch.get_num_threads(), cpu_affinity=CpuAffinity.gpu_local
    )
    assert worker.pin.unchanged == "the GPU's local CPUs could not be read"
    lines = [line for line in capsys.readouterr().out.splitlines() if "cpu affinity" in line]
    assert len(lines) == 1 and "unchanged, the GPU's local CPUs could not be read" in lines[0]
    assert thread_masks() == before
