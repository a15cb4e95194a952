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
README_MAX_LINES = 120


def _benchmark_pages() -> ModuleType:
    path = REPOSITORY / "scripts" / "benchmark_pages.py"
    spec = importlib.util.spec_from_file_location("benchmark_pages", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_fits_in_120_lines() -> None:
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
    results = sorted((REPOSITORY / "benchmarks" / "results").rglob("*.json"))
    assert results
    for result in results:
        group = result.parent.name
        text = pages[REPOSITORY / "docs" / "benchmarks" / group / f"{result.stem}.md"]
        benchmark = result.stem.partition(".")[0]
        assert f"| benchmark | `python -m benchmarks.{group}.{benchmark}` |" in text
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


def test_the_benchmarks_are_grouped_by_folder_and_a_new_one_drops_in(tmp_path: Path) -> None:
    script = _benchmark_pages()
    benchmarks, results = tmp_path / "benchmarks", tmp_path / "benchmarks" / "results"
    (benchmarks / "scale").mkdir(parents=True)
    (benchmarks / "scale" / "__init__.py").write_text('"""Scale: throughput at size."""\n')
    (benchmarks / "scale" / "bench_new.py").write_text('"""What a new benchmark measures."""\n')
    (benchmarks / "_private").mkdir()
    (benchmarks / "_private" / "__init__.py").write_text("")
    (results / "scale").mkdir(parents=True)
    for name in ("bench_new", "bench_new.other_setting"):
        (results / "scale" / f"{name}.json").write_text(json.dumps({"table": "| a |\n| --- |"}))
    by_group, problems = script.results(benchmarks, results)
    assert problems == []
    assert list(by_group) == ["scale"]
    assert [path.stem for path in by_group["scale"]] == ["bench_new", "bench_new.other_setting"]
    index = script.index(by_group, benchmarks)
    assert "## Scale\n\nThroughput at size." in index
    assert "- `bench_new`: What a new benchmark measures." in index
    assert "[bench_new.other_setting](scale/bench_new.other_setting.md)" in index


def test_a_result_outside_a_group_or_without_its_script_is_named(tmp_path: Path) -> None:
    script = _benchmark_pages()
    benchmarks, results = tmp_path / "benchmarks", tmp_path / "benchmarks" / "results"
    (benchmarks / "scale").mkdir(parents=True)
    (benchmarks / "scale" / "__init__.py").write_text('"""Scale: throughput."""\n')
    (results / "scale").mkdir(parents=True)
    (results / "bench_loose.json").write_text("{}")
    (results / "scale" / "bench_gone.json").write_text("{}")
    by_group, problems = script.results(benchmarks, results)
    assert by_group == {"scale": []}
    assert len(problems) == 2
    assert "bench_loose.json: not in a group's folder" in problems[0]
    assert "bench_gone.json: no benchmarks/scale/bench_gone.py wrote it" in problems[1]


def test_a_benchmark_writes_its_results_into_its_group() -> None:
    from benchmarks import _shared

    results = REPOSITORY / "benchmarks" / "results"
    assert _shared.groups() == ["client_cost", "gateway", "real_answers", "scale"]
    assert _shared.results_path("bench_real_model") == (
        results / "real_answers" / "bench_real_model.json"
    )
    assert _shared.results_path("bench_real_model.urgency_methods") == (
        results / "real_answers" / "bench_real_model.urgency_methods.json"
    )
    assert _shared.results_path("bench_fleet").parent == results / "scale"


def test_every_public_name_is_in_the_api_reference() -> None:
    reference = "\n".join(path.read_text() for path in (REPOSITORY / "docs" / "api").glob("*.md"))
    documented = set(re.findall(r"^::: typevet_async\.(\w+)$", reference, re.MULTILINE))
    assert set(tv.__all__) - documented == set()
    assert {"RayJudge", "evaluate", "Evaluation"} <= {
        name.rpartition(".")[2]
        for name in re.findall(r"^::: (typevet_async\.[\w.]+)$", reference, re.MULTILINE)
    }


# What a reader of the guides and README needs is what the SDK does today; which commit a
# figure came from, which internal issue changed it and when it was run belong to the
# benchmark pages (each names its commit and machine) and the CHANGELOG.
USER_DOCS = (
    "README.md",
    "docs/index.md",
    "docs/architecture.md",
    "docs/guide/*.md",
    "docs/api/*.md",
)
JOURNAL_PATTERNS = {
    # a run of 7-40 hex digits with a digit and a letter, standing alone (not inside a number
    # such as 1.2345678901234568e+22 or a 64-digit SHA-256)
    "a commit": r"(?<![\w.+-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w+-])",
    "an issue number": r"(?i:\b(?:issues?|PR|pull\s+request)\s+#?\d+|(?<![\w/&])#\d+\b)",
    "session words": (
        r"(?i:\b(?:this|an\s+earlier|a\s+previous|the\s+previous|the\s+last)\s+session\b"
        r"|\bthe\s+lead(?:'s\b|\s+(?:asked|asks|said|says|merges|merged|wants)\b))"
    ),
    "a run date": r"\b20\d\d-\d\d-\d\d\b",
}


def _journal_entries(text: str) -> list[str]:
    """What the text names of the work's journal, each as `line: what ('words')`; the patterns
    span line breaks, as a paragraph wraps anywhere."""
    return [
        f"{text.count(chr(10), 0, match.start()) + 1}: {what} ({' '.join(match[0].split())!r})"
        for what, pattern in JOURNAL_PATTERNS.items()
        for match in re.finditer(pattern, text)
    ]


def test_the_journal_patterns_find_what_they_name_and_nothing_else() -> None:
    assert len(_journal_entries("measured at a8a2f9c on 2026-12-06 (issue 43, see #12)")) == 4
    assert _journal_entries("measured in this\nsession, before Issue\n33") != []
    assert _journal_entries("decoded: 1.2345678901234568e+22; sha256 " + "ab12" * 16) == []
    assert _journal_entries("the lead token ends the prefix; the session's slots") == []


def test_the_readme_and_guides_name_no_commit_issue_session_or_run_date() -> None:
    paths = sorted({path for pattern in USER_DOCS for path in REPOSITORY.glob(pattern)})
    assert len(paths) >= 20
    found = {
        str(path.relative_to(REPOSITORY)): entries
        for path in paths
        if (entries := _journal_entries(path.read_text()))
    }
    assert found == {}
