"""The layers hold: import-linter's contracts in pyproject.toml (the packages stand in layers,
the functional core does no I/O, backends stay apart, and the applications use the public
API)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lint_imports(project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())",
        ],
        cwd=project,
        env={"PYTHONPATH": str(project), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


def test_contracts_hold() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 6 kept, 0 broken." in result.stdout


def lint_with(tmp_path: Path, module: str, line: str) -> subprocess.CompletedProcess[str]:
    """The contracts checked on a copy of the package whose ``module`` (a path under it) has
    ``line`` added at its end."""
    shutil.copytree(ROOT / "typevet_async", tmp_path / "typevet_async")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / "typevet_async" / module
    path.write_text(f"{path.read_text()}\n{line}  # injected\n")
    return lint_imports(tmp_path)


def test_an_injected_io_import_breaks_the_contract(tmp_path: Path) -> None:
    result = lint_with(tmp_path, "_core/reading/answers.py", "import aiohttp")
    assert result.returncode != 0
    assert "typevet_async._core.reading.answers -> aiohttp" in result.stdout


def test_an_application_reaching_under_the_session_breaks_the_contract(tmp_path: Path) -> None:
    line = "from typevet_async._session.judging import judge"
    result = lint_with(tmp_path, "_apps/cli/judge.py", line)
    assert result.returncode != 0
    assert "The applications use the public API" in result.stdout
    assert "typevet_async._apps.cli.judge -> typevet_async._session.judging" in result.stdout


def test_a_core_module_importing_the_session_breaks_the_layers(tmp_path: Path) -> None:
    line = "from typevet_async._session import settings"
    result = lint_with(tmp_path, "_core/prompts/questions.py", line)
    assert result.returncode != 0
    assert "The layers: the applications over the public API" in result.stdout
    assert "typevet_async._core.prompts.questions -> typevet_async._session.settings" in (
        result.stdout
    )
