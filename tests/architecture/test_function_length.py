"""No function of dynheads is over 80 lines (the house rule: a function does one thing, named for it).

A function's length is counted as ``ast`` sees it, from its ``def`` line (decorators left out) to its last line,
docstring and comments included; nested functions and methods count on their own and inside their parent. The
source is parsed, never imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dynheads

PACKAGE = Path(dynheads.__file__).parent
MAX_LINES = 80


def long_functions(source: str, where: str, limit: int = MAX_LINES) -> list[str]:
    """``where:line name (n lines)`` of every function in ``source`` longer than ``limit`` lines."""
    return [
        f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_function_is_over_80_lines():
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 40  # the whole package, not an empty glob
    problems = [
        problem
        for path in paths
        for problem in long_functions(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    ]
    assert not problems, "split these into functions that do one thing each:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [(MAX_LINES, []), (MAX_LINES + 1, ["f"])],
)
def test_the_check_counts_from_def_to_the_last_line(lines, expected):
    body = "".join(f"    x{i} = {i}\n" for i in range(lines - 2))
    source = f"@decorator\ndef f():\n    '''doc'''\n{body}"
    assert [problem.split()[1] for problem in long_functions(source, "m.py")] == expected


def test_the_check_sees_methods_and_nested_functions():
    inner = "".join(f"            y{i} = {i}\n" for i in range(4))
    source = f"class C:\n    def method(self):\n        def inner():\n{inner}"
    assert [problem.split()[1] for problem in long_functions(source, "m.py", limit=4)] == ["method", "inner"]
