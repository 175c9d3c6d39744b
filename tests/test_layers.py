"""Cheap guards over the package's source (AST only, nothing imported): imports point down the
layers, config/ imports no part, modules stay under 500 lines, the types a newcomer reads first
have docstrings."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dagrl"

# Bottom to top (DESIGN.md's layout read as layers): a module imports, at module level, only from
# its own layer or those below. Parts (objectives, backends, node kinds) sit above config and core,
# which find them through dagrl.registry and never import them. Node kinds sit above the trainer
# too: it runs them through core's scheduler, which looks them up by the DAG file's kind names.
# The sampling pipeline and the entry point assemble runs from all of it.
LAYERS = (
    {"errors", "registry", "console"},
    {"algos", "data", "rewards", "tools", "rollout"},
    {"config"},
    {"core"},
    {"objectives"},
    {"backends"},
    {"trainer"},
    {"nodes"},
    {"sample"},
    {"plugins"},  # shipped plugins: what a user's own plugin file could be
    {"main"},
)
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}
PARTS = {"backends", "objectives", "nodes"}  # config/ asks the registry for these, never imports them


def _area(module: str) -> str:
    """dagrl.config.roles -> config; dagrl.main -> main."""
    return module.split(".")[1] if module.count(".") else module


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, module_level: bool) -> list[tuple[int, str]]:
    """(line, imported dagrl module) of the module's imports: top-level statements only (not under
    `if TYPE_CHECKING:`), or every import in the file."""
    if module_level:
        nodes = [n for n in tree.body if not isinstance(n, ast.If)]
        nodes += [s for n in tree.body if isinstance(n, ast.Try) for s in n.body]
    else:
        nodes = list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "dagrl":  # from dagrl import nodes
                found += [(node.lineno, f"dagrl.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name.startswith("dagrl.")]


def upward_imports(root: Path) -> list[str]:
    """'file:line area -> area' for every module-level import that points up the layers."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        src = _area(_module_name(path, root))
        for line, name in _imports(ast.parse(path.read_text()), module_level=True):
            dst = _area(name)
            if dst in LEVEL and src in LEVEL and LEVEL[dst] > LEVEL[src]:
                bad.append(f"{path.relative_to(root.parent)}:{line} {src} -> {dst} ({name})")
    return bad


def test_every_area_of_the_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.rglob("*.py"))}
    areas = packages | {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert areas <= set(LEVEL), f"give {sorted(areas - set(LEVEL))} a layer in LAYERS"


def test_module_level_imports_point_down_the_layers():
    assert upward_imports(PACKAGE) == []


def test_an_upward_import_is_caught(tmp_path):
    """The check itself: a core module importing a node kind at module level is reported."""
    fake = tmp_path / "dagrl"
    (fake / "core").mkdir(parents=True)
    (fake / "core" / "scheduler.py").write_text(
        "from dagrl.config.roles import Role\nfrom dagrl.nodes.reward import decode_responses\n"
    )
    (fake / "trainer").mkdir()
    (fake / "trainer" / "loop.py").write_text("import dagrl.nodes\n\ndef f():\n    import dagrl.main\n")
    assert upward_imports(fake) == [
        "dagrl/core/scheduler.py:2 core -> nodes (dagrl.nodes.reward)",
        "dagrl/trainer/loop.py:1 trainer -> nodes (dagrl.nodes)",
    ]


def test_config_imports_no_part_anywhere():
    """Not even inside a function: config/ runs a part's rules by asking dagrl.registry."""
    bad = []
    for path in sorted((PACKAGE / "config").rglob("*.py")):
        for line, name in _imports(ast.parse(path.read_text()), module_level=False):
            if _area(name) in PARTS | {"trainer", "sample", "main"}:
                bad.append(f"{path.name}:{line} {name}")
    assert bad == []


BUILTIN_BACKENDS = {"torch", "megatron", "hf", "vllm"}  # dagrl/backends/<name>/
NOT_A_BACKEND = {"backends/logprob_kernel.py": {"torch"}}  # DAGRL_LOGPROB_KERNEL=torch|triton


def _backend_comparisons(path: Path) -> list[str]:
    """`x == "megatron"`, `x != "hf"`, `x in ("vllm", ...)`: a branch on a built-in backend's name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            names = {v.value for v in values if isinstance(v, ast.Constant)} & BUILTIN_BACKENDS
            names -= NOT_A_BACKEND.get(str(path.relative_to(PACKAGE)), set())
            found += [f"{path.relative_to(PACKAGE)}:{node.lineno} compares with {n!r}" for n in sorted(names)]
    return found


def test_only_a_backend_branches_on_its_own_name():
    """What a backend is (its own config section, devices, hooks) is asked of the registry
    (dagrl.registry.Backend), so no module outside dagrl/backends/<name>/ branches on a name."""
    own = {PACKAGE / "backends" / name for name in BUILTIN_BACKENDS}
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if not any(d in path.parents for d in own)
        for hit in _backend_comparisons(path)
    ]
    assert not found, "\n".join(found)


def test_no_module_over_500_lines():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}, "split these by what they hold (STYLE rule 6)"


@pytest.mark.parametrize(
    "module, name",
    [
        ("dagrl.core.batch", "Batch"),
        ("dagrl.core.scheduler", "Scheduler"),
        ("dagrl.core.dag", "Dag"),
        ("dagrl.core.runtime", "Runtime"),
        ("dagrl.config.roles", "RoleSpec"),
        ("dagrl.config.placement", "Plan"),
        ("dagrl.config.placement", "RoleLayout"),
        ("dagrl.config.roles", "ModelSpec"),
        ("dagrl.config.roles", "ParallelLayout"),
        ("dagrl.trainer.memory_plan", "MemoryPlan"),
        ("dagrl.backends.memory", "RoleMemory"),
        ("dagrl.registry", "BackendEntry"),
        ("dagrl.backends.protocols", "TrainBackend"),
        ("dagrl.backends.protocols", "RolloutBackend"),
        ("dagrl.backends.protocols", "TeacherBackend"),
    ],
)
def test_the_types_a_newcomer_reads_first_have_docstrings(module, name):
    cls = getattr(importlib.import_module(module), name)
    doc = cls.__dict__.get("__doc__") or ""
    doc = "" if doc.startswith(f"{name}(") else doc  # a dataclass's generated signature is no docstring
    assert len(doc.split()) >= 8, f"{module}.{name} needs a docstring saying what it is and holds"
