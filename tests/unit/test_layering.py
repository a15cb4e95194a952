"""The layers hold: import-linter's contracts in pyproject.toml (the functional core does no
I/O, backends stay apart, and the applications use the public API)."""

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
    assert "Contracts: 5 kept, 0 broken." in result.stdout


def test_an_injected_io_import_breaks_the_contract(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "typevet_async", tmp_path / "typevet_async")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    answers = tmp_path / "typevet_async" / "_core" / "answers.py"
    answers.write_text("import aiohttp  # injected\n" + answers.read_text())
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "typevet_async._core.answers -> aiohttp" in result.stdout


def test_an_application_reaching_under_the_session_breaks_the_contract(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "typevet_async", tmp_path / "typevet_async")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    judge = tmp_path / "typevet_async" / "_cli" / "judge.py"
    judge.write_text(judge.read_text() + "\nfrom typevet_async._judging import judge  # injected\n")
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert "The applications use the public API" in result.stdout
    assert "typevet_async._cli.judge -> typevet_async._judging" in result.stdout
