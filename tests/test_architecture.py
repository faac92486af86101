"""The layout is the architecture: each package imports only from the layers
below it (docs/architecture.md), and no two modules import each other in a
circle. Imports inside functions count; ``if TYPE_CHECKING:`` blocks are left
out of the layering, since they never run, but not out of the floors: nothing
below the facade names the facade or the HTTP edge, even for typing."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent / "xtml"

# Lower numbers are lower layers. Packages on one layer do not import each
# other: vocab knows markup but not chat, chat knows plugins but not vocab.
LAYERS: dict[str, int] = {
    "errors": 0,
    "lru": 0,  # the one bound of the caches kept by name
    "markup": 1,
    "plugins": 2,
    "dialects": 0,  # data files only
    "chat": 3,
    "vocab": 3,
    "codec": 4,
    "template": 5,
    "serving": 6,
    "training": 6,
    "exports": 6,
    "vllm": 6,
    "testing": 6,
    "playground": 7,  # the page over the gateway's OpenAI shapes and HTTP limits
    "cli": 8,
    "__init__": 9,
    "__main__": 9,
}


def _modules() -> dict[str, Path]:
    out = {}
    for f in ROOT.rglob("*.py"):
        parts = ["xtml", *f.relative_to(ROOT).with_suffix("").parts]
        if parts[-1] == "__init__" and len(parts) > 2:
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


# The floors: the core (the language, plugins, dialects, vocabularies and
# the codec) does no I/O and knows nothing above it; the facade stands on it;
# the edges (exports, the gateway, dataset jobs, testing tools, the CLI)
# stand on the facade.
CORE = ("errors", "lru", "dialects", "markup", "plugins", "chat", "vocab", "codec")
FACADE = "template"
# Libraries that speak HTTP or open sockets: the edge's business only.
NETWORK = ("starlette", "uvicorn", "aiohttp", "httpx", "httptools", "uvloop", "requests", "urllib3", "socket",
           "http", "urllib.request", "asyncio", "ssl", "selectors")


def _imports(name: str, is_package: bool, source: str, mods: dict[str, Path], *, typing: bool = False) -> set[str]:
    pkg = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()

    def resolve(target: str) -> None:
        while target and target not in mods:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)

    def walk(node: ast.AST) -> None:
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, ast.If) and _is_type_checking(ch) and not typing:
                for x in ch.orelse:
                    walk(x)
                continue
            if isinstance(ch, ast.Import):
                for a in ch.names:
                    if a.name.startswith("xtml"):
                        resolve(a.name)
            elif isinstance(ch, ast.ImportFrom):
                if ch.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (ch.level - 1)]
                    mod = ".".join(base + ([ch.module] if ch.module else []))
                else:
                    mod = ch.module or ""
                if mod.startswith("xtml"):
                    for a in ch.names:
                        full = f"{mod}.{a.name}"
                        resolve(full if full in mods else mod)
            walk(ch)

    walk(ast.parse(source))
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p.name == "__init__.py", p.read_text(encoding="utf-8"), mods) for m, p in mods.items()}


def _layer(module: str) -> tuple[str, int]:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    assert top in LAYERS, f"{module} is in no layer of docs/architecture.md"
    return top, LAYERS[top]


def test_every_module_has_a_layer() -> None:
    mods = _modules()
    assert len(mods) > 30
    for m in mods:
        _layer(m)


def test_imports_point_down() -> None:
    wrong = []
    for m, deps in _graph().items():
        top, level = _layer(m)
        for d in deps:
            dtop, dlevel = _layer(d)
            if dtop != top and dlevel >= level:
                wrong.append(f"{m} imports {d}")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_circles() -> None:
    graph = _graph()
    # A package's __init__ re-exporting its own modules is a door, not a layer.
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(v: str, path: list[str]) -> None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                circles.append([*path[path.index(w):], w])
            elif w not in state:
                visit(w, path)
        path.pop()
        state[v] = 2

    for v in sorted(graph):
        if v not in state:
            visit(v, [])
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


def test_the_check_can_fail() -> None:
    """An import inside a function counts; one under TYPE_CHECKING does not;
    a chat module importing the tokenizer layer breaks the layering."""
    mods = _modules()
    src = ("from typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from ..template import Template\n"
           "def f():\n    from ..vocab.binding import Binding\n")
    found = _imports("xtml.chat.render", False, src, mods)
    assert found == {"xtml.vocab.binding"}
    assert _layer("xtml.vocab.binding")[1] >= _layer("xtml.chat.render")[1]


def _all_imports(path: Path, name: str) -> list[tuple[str, list[str]]]:
    """Every import of a module, TYPE_CHECKING blocks included: (module,
    names imported from it), relative imports resolved."""
    is_package = path.name == "__init__.py"
    pkg = name if is_package else name.rpartition(".")[0]
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append((mod, [a.name for a in node.names]))
    return out


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_private_name_crosses_a_package() -> None:
    """A name with a leading underscore is its package's own business: no
    module imports one from another package."""
    wrong = []
    for m, path in _modules().items():
        for mod, names in _all_imports(path, m):
            if not mod.startswith("xtml"):
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__") and _package(mod) != _package(m):
                    wrong.append(f"{m} imports {n} from {mod}")
    assert not wrong, "\n".join(sorted(wrong))


def test_nothing_below_the_facade_names_what_is_above_it() -> None:
    """The core takes a dialect and a binding, never the facade, and never
    imports the edges, not even for type hints."""
    wrong = []
    for m, path in _modules().items():
        top = _layer(m)[0]
        if top not in CORE:
            continue
        for mod, _ in _all_imports(path, m):
            if mod.startswith("xtml.") and _layer(mod)[0] not in CORE:
                wrong.append(f"{m} imports {mod}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_core_does_no_network_io() -> None:
    wrong = []
    for m, path in _modules().items():
        if _layer(m)[0] not in (*CORE, FACADE):
            continue
        for mod, _ in _all_imports(path, m):
            if any(mod == n or mod.startswith(n + ".") for n in NETWORK):
                wrong.append(f"{m} imports {mod}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_floor_checks_can_fail() -> None:
    """A typing-only import of the facade from the codec, and a private name
    from another package, are both found."""
    src = ("from typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from ..template import Template\n"
           "from ..vocab.binding import _private\n")
    tmp = ROOT.parent / "tests" / "data" / "_floor_probe.py"
    tmp.write_text(src, encoding="utf-8")
    try:
        found = _all_imports(tmp, "xtml.codec.probe")
    finally:
        tmp.unlink()
    assert ("xtml.template", ["Template"]) in found
    assert ("xtml.vocab.binding", ["_private"]) in found
    assert _layer("xtml.template")[0] not in CORE
    assert _package("xtml.vocab.binding") != _package("xtml.codec.probe")


def test_no_test_module_imports_another() -> None:
    """What tests share lives in tests/helpers or conftest.py: a test module
    imported by another would run its tests' module-level work twice and tie
    two subjects together."""
    tests = ROOT.parent / "tests"
    wrong = []
    for f in tests.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            wrong += [f"{f.relative_to(tests)} imports {n}" for n in names
                      if n.startswith("tests.test_") or n.startswith("tests.conftest")]
    assert not wrong, "\n".join(sorted(wrong))


MAX_LINES = 800
"""A module longer than this holds more than one job: split it along its seams."""


def test_no_module_is_over_the_line_limit() -> None:
    long = [f"{name}: {n} lines" for name, path in sorted(_modules().items())
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES]
    assert not long, "\n".join(long)


def test_the_edges_ask_the_facade_not_the_request_reader() -> None:
    """The gateway and the playground learn what a request resolved to from
    ``Template.encode_request`` (the named tool choice included), never by
    reading the request again with the chat layer's own field table."""
    inner = ("xtml.chat.fields", "xtml.chat.request")
    wrong = []
    for name, path in sorted(_modules().items()):
        if _package(name) not in ("xtml.serving", "xtml.playground"):
            continue
        for mod, names in _all_imports(path, name):
            targets = [mod, *(f"{mod}.{n}" for n in names)]
            wrong += [f"{name} imports {t}" for t in targets if t in inner]
    assert not wrong, "\n".join(wrong)
