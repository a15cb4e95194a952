"""The package's shape cannot regrow unnoticed, measured by what formatting cannot squeeze:
each module states its one job in its docstring, no function's code is over 65 lines as the
formatter lays it out (its signature and docstring, which document it, not counted), no module
holds over 300 statements (a sign of two jobs in one file: split it by concept), and nothing
opts out of the formatter to fit."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "typevet_async"
MAX_MODULE_STATEMENTS = 300
MAX_FUNCTION_CODE_LINES = 65


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> str:
    return str(path.relative_to(PACKAGE))


def statements(source: str) -> int:
    """Statements, nested ones included: a line count that joining or splitting lines does not
    change."""
    return sum(isinstance(node, ast.stmt) for node in ast.walk(ast.parse(source)))


def test_the_package_has_modules_to_measure() -> None:
    assert len(_modules()) > 50


def test_statements_count_code_not_layout() -> None:
    squeezed = "def f(x):\n    return [x, x]\n\n\ny = f(1); z = f(2)\n"
    laid_out = "def f(x):\n    return [\n        x,\n        x,\n    ]\n\n\ny = f(1)\nz = f(2)\n"
    assert statements(squeezed) == statements(laid_out) == 4


def test_every_module_states_its_job() -> None:
    silent = [
        _name(path) for path in _modules() if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not silent, f"say in a docstring what each of these is for: {silent}"


def test_no_module_holds_over_300_statements() -> None:
    sizes = {_name(path): statements(path.read_text()) for path in _modules()}
    too_big = {name: size for name, size in sizes.items() if size > MAX_MODULE_STATEMENTS}
    assert not too_big, f"these hold more than one job, split them by concept: {too_big}"


def code_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's code as laid out: from its first statement after the docstring to its end."""
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:] or body
    assert function.end_lineno is not None
    return function.end_lineno - body[0].lineno + 1


def test_a_functions_docstring_is_not_its_code() -> None:
    source = 'def f():\n    """Say\n    what.\n    """\n    x = 1\n    return x\n'
    function = ast.parse(source).body[0]
    assert isinstance(function, ast.FunctionDef)
    assert code_lines(function) == 2


def test_no_functions_code_is_over_65_lines() -> None:
    too_long = {
        f"{_name(path)}:{node.name}": code_lines(node)
        for path in _modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and code_lines(node) > MAX_FUNCTION_CODE_LINES
    }
    assert not too_long, f"break these into named steps: {too_long}"


def test_nothing_opts_out_of_the_formatter() -> None:
    opted_out = [
        f"{_name(path)}:{token.start[0]}"
        for path in _modules()
        for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if token.type == tokenize.COMMENT
        and any(mark in token.string for mark in ("fmt: skip", "fmt: off", "noqa: E501"))
    ]
    assert not opted_out, f"let the formatter lay these out (group the code instead): {opted_out}"
