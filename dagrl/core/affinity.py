"""A GPU worker's threads on the CPUs local to its GPU (trainer.cpu_affinity=gpu_local).

vLLM's decode loop is bound by the host's CPU: on a two-socket host a thread that runs on the
far socket reaches the card, and the pinned host memory it copies through, across the socket
interconnect. The kernel says which CPUs sit near a PCI device (sysfs `local_cpulist`); nvidia-smi
says it too (`topo -m`'s CPU Affinity). Pinning keeps to what the process may already use (a
cgroup, Ray, `taskset`): the GPU's CPUs are intersected with the process's affinity, never widened.

`os.sched_setaffinity(0, ...)` changes the calling thread only; threads inherit their creator's
mask when they start. A worker pins every thread it has (each tid under /proc/self/task) before its
roles build, so the threads torch and vLLM start later inherit the pin.

Imports neither torch nor anything that does, except `torch_bus_id`: bench/generate_spread.py
pins its process with these helpers before torch loads.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass

from dagrl.config.enums import CpuAffinity

PCI_DEVICES = "/sys/bus/pci/devices"  # <domain:bus:device.function>/local_cpulist
TASKS = "/proc/self/task"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ---- reading the host --------------------------------------------------------------------------
def parse_cpulist(text: str) -> set[int]:
    """Linux's cpulist ("0-15,32-47", "3", "0-3,8"; sysfs local_cpulist, nvidia-smi topo's CPU
    Affinity) -> the CPU ids; "" or "N/A" -> none."""
    text = text.strip()
    if not text or text.upper() == "N/A":
        return set()
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()) or (sep and int(hi) < int(lo)):
            raise ValueError(f"not a cpulist: {text!r}")
        cpus.update(range(int(lo), int(hi if sep else lo) + 1))
    return cpus


def compact(cpus) -> str:
    """CPU ids -> cpulist ("0-15,32-47")."""
    ids, parts = sorted(cpus), []
    for cpu in ids:
        if parts and parts[-1][1] == cpu - 1:
            parts[-1][1] = cpu
        else:
            parts.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in parts)


def topo_affinity(topo: str, gpu: int) -> str:
    """The "CPU Affinity" cell of row GPU<gpu> of `nvidia-smi topo -m` ("" where there is none)."""
    lines = [ANSI.sub("", line) for line in topo.splitlines()]
    header = next((line.split("\t") for line in lines if "CPU Affinity" in line), [])
    col = next((i for i, cell in enumerate(header) if cell.strip() == "CPU Affinity"), None)
    if col is None:
        return ""
    for line in lines:
        cells = line.split("\t")
        if cells[0].strip() == f"GPU{gpu}" and col < len(cells):
            return cells[col].strip()
    return ""


def sysfs_bus_id(bus: str) -> str:
    """nvidia-smi's "00000000:19:00.0" -> sysfs's "0000:19:00.0"."""
    domain, rest = bus.strip().split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def pci_address(domain: int, bus: int, device: int) -> str:
    """sysfs's name of a GPU from torch's pci ids (a GPU is function 0)."""
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def smi(*args: str) -> str:
    """nvidia-smi's output, "" where it is missing or fails."""
    try:
        run = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return run.stdout.strip() if run.returncode == 0 else ""


def smi_cards(text: str) -> list[tuple[int, str]]:
    """`nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader` -> [(index, sysfs address)]."""
    cards = []
    for line in text.splitlines():
        index, _, bus = line.partition(",")
        if index.strip().isdigit() and bus.strip():
            cards.append((int(index), sysfs_bus_id(bus)))
    return cards


def visible_gpu() -> str:
    """The process's first visible card as nvidia-smi's -i takes it (CUDA_VISIBLE_DEVICES' first
    entry: an index or a UUID; "0" when the variable is unset)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"


def torch_bus_id(device: int = 0) -> str | None:
    """The PCI address of the process's CUDA device `device` as torch sees it (the card the worker
    really uses, whatever the device order); None without CUDA or on a torch without pci ids."""
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(device)
    ids = [getattr(props, f"pci_{part}_id", None) for part in ("domain", "bus", "device")]
    return None if None in ids else pci_address(*ids)


@dataclass(frozen=True)
class GpuCpus:
    """The CPUs local to one card, the card (its PCI address or nvidia-smi index) and where they
    were read (or what was tried: `cpus` is empty then)."""

    cpus: frozenset[int]
    gpu: str
    source: str


def gpu_local_cpus(bus_id: str | None = None) -> GpuCpus:
    """The CPUs local to the card at `bus_id` (sysfs form), or to the first visible card as
    nvidia-smi names it when None (no CUDA initialised: the bench reads it before torch loads).
    sysfs's local_cpulist first, else the card's row of `nvidia-smi topo -m`."""
    index, tried = None, []
    if bus_id is None:
        cards = smi_cards(smi("-i", visible_gpu(), "--query-gpu=index,pci.bus_id", "--format=csv,noheader"))
        index, bus_id = cards[0] if cards else (None, None)
    if bus_id:
        path = os.path.join(PCI_DEVICES, bus_id, "local_cpulist")
        cpus = _cpus_in(open(path).read()) if os.path.isfile(path) else set()
        if cpus:
            return GpuCpus(frozenset(cpus), bus_id, path)
        tried.append(path)
        if index is None:
            listed = smi_cards(smi("--query-gpu=index,pci.bus_id", "--format=csv,noheader"))
            index = next((i for i, bus in listed if bus == bus_id), None)
    gpu = bus_id or f"GPU{visible_gpu()}"
    if index is not None:
        cpus = _cpus_in(topo_affinity(smi("topo", "-m"), index))
        if cpus:
            return GpuCpus(frozenset(cpus), gpu, "nvidia-smi topo -m")
        tried.append(f"nvidia-smi topo -m (GPU{index})")
    return GpuCpus(frozenset(), gpu, "nothing read: " + (", ".join(tried) or "no PCI address, no nvidia-smi"))


def _cpus_in(text: str) -> set[int]:
    """A cpulist read from the host; text that is not one counts as nothing read (a worker starts as
    it would have without the setting rather than fail on it)."""
    try:
        return parse_cpulist(text)
    except ValueError:
        return set()


# ---- pinning -----------------------------------------------------------------------------------
def pin_choice(local, allowed) -> tuple[set[int], str | None]:
    """The CPUs to pin to (the GPU's local ones this process may use), and why pinning would change
    nothing where it would not: a pin never widens `allowed` and never empties it."""
    pinned = set(local) & set(allowed)
    if not local:
        return pinned, "the GPU's local CPUs could not be read"
    if not pinned:
        return pinned, "no GPU-local CPU in the affinity"
    return pinned, "the affinity is the GPU's already" if pinned == set(allowed) else None


def thread_ids() -> list[int]:
    """Every thread of this process (Linux: /proc/self/task)."""
    return sorted(int(tid) for tid in os.listdir(TASKS) if tid.isdigit())


def pin_threads(cpus) -> tuple[int, int]:
    """Pin every thread of this process to `cpus` within its own mask (a thread narrowed by its
    library keeps its narrower set when the two do not meet). Passes again while new threads
    appear: one started by a thread not yet pinned inherits its old mask. Returns (threads
    pinned, threads that kept their own mask)."""
    cpus, done, kept = set(cpus), set(), 0
    for _ in range(5):
        new = [tid for tid in thread_ids() if tid not in done]
        if not new:
            break
        for tid in new:
            done.add(tid)
            try:
                own = os.sched_getaffinity(tid)
                if own & cpus:
                    os.sched_setaffinity(tid, own & cpus)
                else:
                    kept += 1
            except (ProcessLookupError, PermissionError):  # it ended meanwhile, or is not ours to move
                kept += 1
    return len(done) - kept, kept


@dataclass(frozen=True)
class Pin:
    """What pinning a process to its GPU's CPUs did."""

    local: GpuCpus
    allowed: frozenset[int]  # the calling thread's affinity before
    pinned: frozenset[int]  # local & allowed: the threads' CPUs now, unless `unchanged`
    unchanged: str | None = None  # why nothing changed (the process was left as it was)
    threads: int = 0
    kept: int = 0

    def line(self) -> str:
        """The worker's one log line: the GPU, the CPUs, where they came from."""
        head = f"cpu affinity (trainer.cpu_affinity=gpu_local): GPU {self.local.gpu}"
        where = f"local CPUs {compact(self.local.cpus) or '-'} from {self.local.source}"
        if self.unchanged:
            return f"{head}: unchanged, {self.unchanged} ({where}; allowed {compact(self.allowed)})"
        text = f"{head}: {self.threads} threads pinned to CPUs {compact(self.pinned)} ({where}"
        text += f"; allowed {compact(self.allowed)})"
        return text + (f"; {self.kept} kept their own CPUs" if self.kept else "")

    def facts(self) -> dict:
        """The bench's record of it."""
        return {"gpu": self.local.gpu, "gpu_local": compact(self.local.cpus), "from": self.local.source,
                "allowed": compact(self.allowed), "pinned": compact(self.pinned),
                **({"unchanged": self.unchanged} if self.unchanged else {"threads": self.threads})}  # fmt: skip


def pin_to_gpu(local: GpuCpus) -> Pin:
    """Pin every thread of this process to `local`'s CPUs that the process may use; where that
    would change nothing (none read, none allowed, all allowed already) the process is left as it is."""
    allowed = frozenset(os.sched_getaffinity(0))
    pinned, unchanged = pin_choice(local.cpus, allowed)
    if unchanged:
        return Pin(local, allowed, frozenset(pinned), unchanged)
    threads, kept = pin_threads(pinned)
    return Pin(local, allowed, frozenset(pinned), None, threads, kept)


# ---- a worker's setting -------------------------------------------------------------------------
def worker_affinity(mode: CpuAffinity, device_kind: str) -> CpuAffinity:
    """The setting a worker on `device_kind` applies: on a CPU device there is no GPU to be near,
    so gpu_local does nothing there, and the driver says so once."""
    if mode == CpuAffinity.gpu_local and device_kind != "cuda":
        from dagrl.console import log_once

        log_once("trainer.cpu_affinity=gpu_local: CPU workers keep their CPUs (no GPU to be local to)")
        return CpuAffinity.none
    return mode


def apply_cpu_affinity(mode: CpuAffinity, device_kind: str) -> Pin | None:
    """A GPU worker's start, before its roles build: with gpu_local, every thread on the CPUs
    local to the worker's card (CUDA device 0: Ray gives a worker its bundle's GPU as the only
    visible one), and one log line. None where the setting or the device asks for nothing."""
    if mode != CpuAffinity.gpu_local or device_kind != "cuda":
        return None
    from dagrl.console import log

    pin = pin_to_gpu(gpu_local_cpus(torch_bus_id(0)))
    log(pin.line())
    return pin
