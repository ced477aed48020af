"""What the docs tell a user is true: every install hint works as written from a clone (ram-live is not on PyPI)
and names only extras pyproject.toml has, every dotted ``ram_live.x.y`` name resolves as written, and no page or
docstring cites an internal issue number a user cannot see."""

from __future__ import annotations

import ast
import importlib
import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = sorted([*(ROOT / "ram_live").rglob("*.py"), *(ROOT / "integrations").rglob("*.py")])
EXAMPLES = sorted(p for p in (ROOT / "examples").rglob("*") if p.suffix in {".py", ".md", ".sh"})
BENCHMARK_PAGES = sorted((ROOT / "benchmarks").glob("*.md"))
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"])

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]+`")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def source_strings(path: Path) -> list[tuple[int, str]]:
    """Every string constant of a Python file (docstrings, messages; implicit concatenations joined), by line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def texts(paths: list[Path], *, strings_of_sources: bool) -> list[tuple[str, str]]:
    """(where, text) pairs: whole files, or a package source's strings one by one."""
    found = []
    for path in paths:
        if path.suffix == ".py" and strings_of_sources:
            found += [(f"{rel(path)}:{line}", text) for line, text in source_strings(path)]
        else:
            found.append((rel(path), path.read_text(encoding="utf-8")))
    return found


# --- install hints ---------------------------------------------------------------------------------------------

HINT = re.compile(r"pip install\b([^\n`#();]*)")
OURS = re.compile(r"^(?:\.|ram[-_]live)(?:\[|$)")  # the project itself: the clone or its name
EXTRAS_OF_OURS = re.compile(r"""(?<![\w-])(?:\.|ram[-_]live)\[([^\]]*)\]""")


def hint_problems(where: str, text: str) -> list[str]:
    problems = []
    for match in re.finditer(r"ram[-_]live\[", text):
        problems.append(
            f"{where}: {text[match.start() : match.start() + 30]!r}: ram-live is not on PyPI; "
            'install from the clone: pip install -e ".[extra]"'
        )
    for match in HINT.finditer(text):
        hint = match.group(0).strip()
        line = text[match.start() :].split("\n", 1)[0]
        for extras in EXTRAS_OF_OURS.findall(line):
            unknown = sorted({e.strip() for e in extras.split(",")} - EXTRAS)
            if unknown:
                problems.append(f"{where}: {hint!r} names extras pyproject.toml does not have: {unknown}")
        try:
            args = shlex.split(match.group(1))
        except ValueError:
            problems.append(f"{where}: {hint!r} does not parse as a shell command")
            continue
        for i, arg in enumerate(args):
            if arg.startswith("-") or not OURS.match(arg):
                continue
            if arg.startswith("ram"):
                problems.append(f"{where}: {hint!r} installs ram-live by name; it is not on PyPI")
            elif arg.startswith(".") and (i == 0 or args[i - 1] not in {"-e", "--editable"}):
                problems.append(f'{where}: {hint!r}: install the clone editable, as pip install -e ".[extra]"')
    return problems


def test_hint_checker_catches_what_it_should():
    assert not hint_problems("x", 'pip install -e ".[hf,peft]"   # core')
    assert not hint_problems("x", 'needs lm-eval: pip install -e ".[lm-eval]" (in the ram-live clone)')
    assert not hint_problems("x", "pip install torch==2.13.0")
    assert hint_problems("x", "pip install 'ram-live[trl]'")
    assert hint_problems("x", "pip install 'ram_live[trl]'")
    assert hint_problems("x", "pip install ram-live")
    assert hint_problems("x", 'pip install -e ".[nope]"')
    assert hint_problems("x", 'pip install ".[hf]"')


def test_every_install_hint_works_from_a_clone():
    sources = texts(PAGES + EXAMPLES, strings_of_sources=False) + texts(SOURCES, strings_of_sources=True)
    assert len(sources) > 100
    problems = [p for where, text in sources for p in hint_problems(where, text)]
    assert not problems, "install hints that do not work as written:\n" + "\n".join(problems)


# --- dotted names ----------------------------------------------------------------------------------------------

DOTTED = re.compile(r"(?<![\w./])ram_live(?:\.[A-Za-z_]\w*)+")
FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+(ram_live[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]+)", re.M)


def code_of(text: str) -> str:
    """The code blocks and code spans of a markdown page, one per line."""
    return "\n".join(
        [m.group(0) for m in FENCE.finditer(text)]
        + [m.group(0)[1:-1] for m in INLINE_CODE.finditer(FENCE.sub("", text))]
    )


def resolves(name: str) -> str | None:
    """None if ``name`` resolves as a user would write it (``import`` its longest module prefix, then the dotted
    expression from ``ram_live`` down), else why not."""
    parts = name.split(".")
    imported = None
    for end in range(len(parts), 0, -1):
        module = ".".join(parts[:end])
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and not (module == exc.name or module.startswith(exc.name + ".")):
                return f"importing {module} needs {exc.name}"
            continue
        except Exception as exc:  # noqa: BLE001 - a module that fails to import is the finding
            return f"importing {module} raised {type(exc).__name__}: {exc}"
        imported = module
        break
    if imported is None:
        return "no importable prefix"
    obj = importlib.import_module("ram_live")
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            return f"{'.'.join(parts[:i])} ({type(obj).__name__}) has no attribute {part!r}"
    return None


def test_resolver_resolves_modules_and_refuses_attributes_a_function_lacks():
    assert resolves("ram_live.training.search.SearchSetting") is None
    assert resolves("ram_live.merge") is None
    assert resolves("ram_live.selection.DEFAULT_SPACE") is None  # the package of ram_live.search (the function)
    assert resolves("ram_live.selection.space.DEFAULT_SPACE") is None
    assert resolves("ram_live.search.DEFAULT_SPACE") is not None  # ram_live.search is the function
    assert resolves("ram_live.no_such_name") is not None


def test_every_dotted_name_in_the_docs_resolves():
    names: dict[str, set[str]] = {}
    imports: dict[tuple[str, str], set[str]] = {}
    for page in PAGES:
        code = code_of(page.read_text(encoding="utf-8"))
        for name in DOTTED.findall(code):
            names.setdefault(name, set()).add(rel(page))
        for module, imported in FROM_IMPORT.findall(code):
            for item in imported.strip("()").split(","):
                item = item.split(" as ")[0].strip()
                if item and item != "*":
                    imports.setdefault((module, item), set()).add(rel(page))
    assert len(names) > 30
    failing = []
    for name, pages in sorted(names.items()):
        why = resolves(name)
        if why:
            failing.append(f"{name} ({', '.join(sorted(pages))}): {why}")
    for (module, item), pages in sorted(imports.items()):
        try:
            exec(f"from {module} import {item}", {})
        except Exception as exc:  # noqa: BLE001 - any failure is the finding
            failing.append(f"from {module} import {item} ({', '.join(sorted(pages))}): {type(exc).__name__}: {exc}")
    assert not failing, "names in the docs that do not resolve:\n" + "\n".join(failing)


# --- internal issue numbers ------------------------------------------------------------------------------------

ISSUE = re.compile(r"(?i)\bissues?[ -]#?\d+|(?<![\w/&#-])#\d+\b|\b(?:the|this|that) issue(?:'s)?\b")
EXTERNAL = re.compile(r"\b(?:PEFT|peft|transformers|verl|PyTorch|torch|TRL|trl|lm-eval)(?: issue)?\s+#\d+")


def issue_references(text: str) -> list[str]:
    text = EXTERNAL.sub("", re.sub(r"\]\(https?://[^)]*\)", "]", text))  # public trackers and links are fine
    return [m.group(0) for m in ISSUE.finditer(text)]


def test_issue_checker_catches_what_it_should():
    assert issue_references("measured (issue 24), as issue-20 said; see #17; the issue's run")
    assert len(issue_references("(issue 24) issue-20 #17 the issue's")) == 4
    assert not issue_references("PEFT #3737, PEFT issue #3004, a link [x](https://github.com/a/b/issues/3)")
    assert not issue_references("[docs](search.md#the-budget-rule), `&#39;`, ## 2 sections")
    assert issue_references("(#17)")


@pytest.mark.parametrize("kind", ["pages", "docstrings"])
def test_no_internal_issue_numbers(kind):
    if kind == "pages":
        sources = texts(PAGES + BENCHMARK_PAGES, strings_of_sources=False)
    else:
        sources = texts(SOURCES, strings_of_sources=True)
    found = [f"{where}: {ref!r}" for where, text in sources for ref in issue_references(text)]
    assert not found, "internal issue numbers a user cannot look up (say the measurement or the reason):\n" + "\n".join(
        found
    )
