"""The shared types at the bottom (ram_live/types.py), and the import graph they keep acyclic."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from ram_live.types import Activity, MergeInfo, Plan, RamStatistics, TensorSpec

PACKAGE = Path(__file__).resolve().parent.parent / "ram_live"
#: installed as ram_live.integrations (setup.py maps the folder): part of the graph
INTEGRATIONS = PACKAGE.parent / "integrations"


def _module_name(path: Path) -> str:
    if path.is_relative_to(INTEGRATIONS):
        parts = ("ram_live", "integrations", *path.relative_to(INTEGRATIONS).with_suffix("").parts)
    else:
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in [*PACKAGE.rglob("*.py"), *INTEGRATIONS.rglob("*.py")]}


def import_graph() -> dict[str, set[str]]:
    """Every ``ram_live`` module -> the ``ram_live`` modules it imports anywhere in its text (module level,
    inside functions, under ``TYPE_CHECKING``): a type-only import is an edge too."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # ram_live.x.y where y is a name in ram_live.x
                    target = target.rpartition(".")[0]
                if target.startswith("ram_live") and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_sources_sinks_and_distributed_never_reach_the_engine_or_the_methods() -> None:
    graph = import_graph()
    assert graph["ram_live.types"] == set()  # the bottom: torch only
    assert graph["ram_live.io.dtensor"] == set()
    for low in (
        "ram_live.types",
        "ram_live.io.dtensor",
        "ram_live.io.sources",
        "ram_live.io.sinks",
        "ram_live.io.distributed",
        "ram_live.auxiliary",
        "ram_live.kernels.pool",
        "ram_live.kernels.cc",
    ):
        above = {m for m in reachable(graph, low) if m.startswith(("ram_live.engine", "ram_live.methods"))}
        assert not above, (low, sorted(above))


def test_no_module_of_the_package_is_in_an_import_circle() -> None:
    """Not even inside a package (a lazy import inside a function, or a type-only one, counts)."""
    graph = import_graph()
    for module in graph:
        circle = sorted(m for m in reachable(graph, module) if module in reachable(graph, m))
        assert not circle, (module, circle)


def test_the_graph_sees_relative_type_only_and_package_imports() -> None:
    graph = import_graph()
    # a module-level `from .types import ...` and a package-relative `from . import functional as F`
    assert "ram_live.types" in graph["ram_live.io.sources"]
    assert "ram_live.types" in graph["ram_live.io.sinks"]
    assert "ram_live.io.dtensor" in graph["ram_live.io.distributed"]
    assert any(m.startswith("ram_live.functional") for m in graph["ram_live.probing"])


def test_tensor_spec_plan_and_merge_info_by_hand() -> None:
    spec = TensorSpec((3, 4, 5), torch.bfloat16, torch.device("cpu"))
    assert spec.numel == 60 and spec.counted and not spec.is_buffer
    assert TensorSpec((), torch.float32, torch.device("cpu")).numel == 1
    plan = Plan(merge=("a", "b"), copy=("n",), alias={"tied": "a"}, check_equal=("n",))
    assert plan.keys == ("a", "b", "n", "tied")
    info = MergeInfo(method="ram", config=None, agents=("x", "y"))
    for kind in ("native", "eager", "native"):
        info.count_kernel(kind)
    assert info.extra["kernels"] == {"native": 2, "eager": 1}


def test_activity_threshold_is_the_largest_value_at_or_below_eps() -> None:
    t = Activity(eps=1e-3).threshold_for(torch.float32)
    f32 = torch.tensor(t, dtype=torch.float32)
    assert float(f32) == t and t <= 1e-3  # a float32 value, not above eps
    assert float(torch.nextafter(f32, torch.tensor(1.0))) > 1e-3  # and the next one up is
    assert Activity(eps=0.5).threshold_for(torch.float32) == 0.5  # exact in float32: kept
    assert Activity(rule="changed").threshold == 0.0 and Activity(eps=0.0).threshold == 0.0
    bf = Activity(eps=1e-3).threshold_for(torch.bfloat16)
    assert (
        bf <= 1e-3
        and float(torch.nextafter(torch.tensor(bf, dtype=torch.bfloat16), torch.tensor(1.0, dtype=torch.bfloat16)))
        > 1e-3
    )


def test_ram_statistics_shared_is_active_minus_unique() -> None:
    stats = RamStatistics(torch.tensor([5, 3]), torch.tensor([2, 3]), torch.zeros(3, dtype=torch.int64))
    assert stats.shared.tolist() == [3, 0]


def test_importing_ram_live_types_first_keeps_the_package_working() -> None:
    """``ram_live.types`` is bound as an attribute of the package: it must not replace anything the package's own
    code uses (it once shadowed the stdlib ``types`` there, and importing ``ram_live.probe`` then failed to bind)."""
    import subprocess
    import sys

    code = (
        "import ram_live.types, ram_live\nimport ram_live.probing, ram_live.selection.run\n"
        "assert callable(ram_live.probe) and callable(ram_live.search)\n"
        "import ram_live.engine.plan\nassert ram_live.types.Plan is ram_live.engine.plan.Plan\n"
    )
    subprocess.run([sys.executable, "-W", "error::ImportWarning", "-c", code], check=True)
