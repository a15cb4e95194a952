"""The docs' own rules: a short README, benchmark pages generated from the result files and
current, and an API reference that names every public name. (The site's strict build and the
browser visit are in scripts/test.sh and tests/live/test_docs_browser_live.py.)"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import typevet_async as tv

REPOSITORY = Path(__file__).parent.parent.parent
README_MAX_LINES = 300


def _benchmark_pages() -> ModuleType:
    path = REPOSITORY / "scripts" / "benchmark_pages.py"
    spec = importlib.util.spec_from_file_location("benchmark_pages", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_fits_in_300_lines() -> None:
    lines = (REPOSITORY / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_readme_links_only_to_files_that_exist() -> None:
    readme = (REPOSITORY / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [target for target in targets if "://" not in target]
    assert len(local) >= 20  # the map of the docs
    missing = [target for target in local if not (REPOSITORY / target).exists()]
    assert not missing


def test_the_benchmark_pages_are_current() -> None:
    assert _benchmark_pages().main(["--check"]) == 0


def test_each_result_file_has_a_page_naming_its_commit_and_machine() -> None:
    pages = _benchmark_pages().expected()
    for result in sorted((REPOSITORY / "benchmarks" / "results").glob("*.json")):
        text = pages[REPOSITORY / "docs" / "benchmarks" / f"{result.stem}.md"]
        machine = json.loads(result.read_text()).get("machine")
        if isinstance(machine, dict):
            assert f"| commit | `{machine['revision']}` |" in text
            assert f"| machine | {machine['machine']}, {machine['cpus']} CPUs |" in text
        else:
            assert "| commit | not recorded in this file |" in text
            assert "| machine | not recorded in this file |" in text
        assert "\n| --- |" in text  # at least one table


def test_a_result_file_without_its_run_says_so(tmp_path: Path) -> None:
    script = _benchmark_pages()
    result = tmp_path / "bench_x.json"
    result.write_text(json.dumps({"benchmark": "bench_x", "table": "| a | b |\n| --- | --- |"}))
    text = script.page(result)
    assert "| commit | not recorded in this file |" in text
    assert "<!-- --8<-- [start:results] -->\n| a | b |\n| --- | --- |\n" in text


def test_every_public_name_is_in_the_api_reference() -> None:
    reference = "\n".join(path.read_text() for path in (REPOSITORY / "docs" / "api").glob("*.md"))
    documented = set(re.findall(r"^::: typevet_async\.(\w+)$", reference, re.MULTILINE))
    assert set(tv.__all__) - documented == set()
    assert {"RayJudge", "evaluate", "Evaluation"} <= {
        name.rpartition(".")[2]
        for name in re.findall(r"^::: (typevet_async\.[\w.]+)$", reference, re.MULTILINE)
    }
