"""The shape of the code, checked against the rules in docs/architecture.md: no import loops between
modules (nor between agent's packages), and no import from a lower layer to a higher one, with the
layers read from the table in docs/architecture.md "Layers" (so the page and the check cannot
disagree). Then the rules the issue named, spelled out: `providers/` never imports `agent/`,
`agent/mqtt/` never imports the daemon or the results, the daemon never reaches the operator's side,
and the fleet's two sides share only the protocol. Imports are read from the source (every `import`,
the ones inside functions too), so a loop hidden in a lazy import counts as well."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent", "providers")
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def layers() -> dict[str, int]:
    """Module or package name -> its layer, from the table under "## Layers" in docs/architecture.md:
    rows `| <n> <name> | `module`, `package`, ... |`."""
    text = ARCHITECTURE.read_text()
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    found: dict[str, int] = {}
    for line in section.splitlines():
        row = re.match(r"\|\s*(\d+)\b[^|]*\|(.*)\|\s*$", line)
        if row:
            for name in re.findall(r"`([a-z_.]+)`", row.group(2)):
                found[name] = int(row.group(1))
    return found


def layer_of(module: str, table: dict[str, int]) -> int | None:
    """The layer of the longest name in the table that is the module or a package holding it."""
    name = module
    while name:
        if name in table:
            return table[name]
        name = name.rpartition(".")[0]
    return None


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of agent/ and providers/ it imports (a package's name stands for its
    __init__; `from package import module` is an import of the module)."""
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                # `from x import y`: the module x.y when there is one, else x itself.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                found = known(target) if target.split(".")[0] in PACKAGES else None
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected parts of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    part = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        part.append(member)
                        if member == node:
                            break
                    if len(part) > 1:
                        found.append(sorted(part))
    return found


def _package_of(module: str) -> str:
    """agent's sub-packages as one node each (agent.fleet.*, agent.mqtt.*...); modules as they are."""
    parts = module.split(".")
    if parts[0] == "agent" and len(parts) > 2:
        return ".".join(parts[:2])
    return "providers" if parts[0] == "providers" else module


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return seen


def test_the_graph_is_read_from_every_module() -> None:
    graph = import_graph()
    assert {"agent.daemon", "agent.supervisor", "agent.mqtt.connection", "providers.select"} <= set(graph)
    assert "agent.supervisor" in graph["agent.daemon"]
    assert "providers.select" in graph["agent.backend_choice"]


def test_no_import_loops_between_modules() -> None:
    assert loops(import_graph()) == []


def test_no_import_loops_between_agents_packages() -> None:
    packages: dict[str, set[str]] = {}
    for module, imports in import_graph().items():
        node = packages.setdefault(_package_of(module), set())
        node.update(_package_of(i) for i in imports if _package_of(i) != _package_of(module))
    for imports in list(packages.values()):
        for target in imports:
            packages.setdefault(target, set())
    assert loops(packages) == []


def test_every_module_has_a_layer() -> None:
    table = layers()
    assert len(set(table.values())) >= 5, table
    assert [m for m in sorted(import_graph()) if layer_of(m, table) is None] == []


def test_no_import_points_up_a_layer() -> None:
    table = layers()
    up = [
        f"{module} (layer {layer_of(module, table)}) imports {target} (layer {layer_of(target, table)})"
        for module, imports in import_graph().items()
        for target in sorted(imports)
        if (layer_of(target, table) or 0) > (layer_of(module, table) or 0)
    ]
    assert up == []


def test_the_named_rules_hold() -> None:
    graph = import_graph()
    providers_up = {m: sorted(i for i in imports if i.startswith("agent")) for m, imports in graph.items()}
    assert {m: up for m, up in providers_up.items() if m.startswith("providers") and up} == {}
    mqtt_up = {
        m: sorted(i for i in imports if i.split(".")[:2] in (["agent", "daemon"], ["agent", "supervisor"],
                                                             ["agent", "pipeline"], ["agent", "results"]))
        for m, imports in graph.items()
        if m.startswith("agent.mqtt")
    }  # fmt: skip
    assert {m: up for m, up in mqtt_up.items() if up} == {}
    operator = [m for m in graph if layer_of(m, layers()) == max(layers().values())]
    assert {"agent.cli", "agent.fleetctl.client"} <= set(operator)
    assert sorted(_reach(graph, "agent.daemon") & set(operator)) == []
    # The fleet's sides share only the protocol (agent/fleet/protocol.py and document.py).
    shared = {"agent.fleet.protocol", "agent.fleet.document"}
    operator_reaches = {i for m, imports in graph.items() if m.startswith("agent.fleetctl") for i in imports}
    assert sorted(i for i in operator_reaches if i.startswith("agent.fleet.") and i not in shared) == []
    device_reaches = {i for m, imports in graph.items() if m.startswith("agent.fleet.") for i in imports}
    assert sorted(i for i in device_reaches if i.startswith("agent.fleetctl")) == []


def test_a_loop_is_found() -> None:
    """The check itself: a made-up loop is reported, a chain is not."""
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_a_layer_is_found_by_the_longest_name() -> None:
    """The check itself: a module takes its package's layer unless it has one of its own."""
    table = {"agent": 0, "agent.fleet": 4, "agent.fleet.protocol": 2}
    assert layer_of("agent.fleet.desired", table) == 4
    assert layer_of("agent.fleet.protocol", table) == 2
    assert layer_of("agent.errors", table) == 0
    assert layer_of("providers.select", table) is None
