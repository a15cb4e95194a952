"""Releases: the version in one place (``typevet_async/_version.py``, which pyproject.toml reads)
and a CHANGELOG a user reads by version, in Keep a Changelog form, its newest release the
package's version, naming no internal issue or commit."""

from __future__ import annotations

import datetime
import re
import tomllib
from pathlib import Path

import typevet_async as tv
from typevet_async import _version

REPOSITORY = Path(__file__).parent.parent.parent
CHANGELOG = REPOSITORY / "CHANGELOG.md"

#: Keep a Changelog's kinds of change, the only sub-sections a version has.
KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
RELEASE = re.compile(r"## \[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})")
#: An issue named by number ("issue 44", "issues 33 and 34", "#12").
ISSUE = re.compile(r"\bissues?\s+#?\d+|(?<![\w/&])#\d+\b", re.IGNORECASE)
#: A commit hash: 7 to 40 hex digits holding both a digit and a letter (so neither a number
#: nor an English word).
COMMIT = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def _headings(level: int) -> list[str]:
    prefix = "#" * level + " "
    return [line for line in CHANGELOG.read_text().splitlines() if line.startswith(prefix)]


def _releases() -> list[tuple[tuple[int, int, int], datetime.date]]:
    releases = []
    for heading in _headings(2)[1:]:
        match = RELEASE.fullmatch(heading)
        assert match, f"not a release heading '## [X.Y.Z] - YYYY-MM-DD': {heading!r}"
        major, minor, patch, date = match.groups()
        releases.append(((int(major), int(minor), int(patch)), datetime.date.fromisoformat(date)))
    return releases


def test_the_version_has_one_place_which_the_distribution_reads() -> None:
    assert tv.__version__ is _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", tv.__version__)
    pyproject = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    dynamic = pyproject["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "typevet_async._version.__version__"}


def test_the_changelog_is_unreleased_then_releases_newest_first() -> None:
    assert _headings(1) == ["# Changelog"]
    assert _headings(2)[0] == "## [Unreleased]"
    releases = _releases()
    assert releases, "no release"
    assert releases == sorted(releases, reverse=True)
    assert len({version for version, _ in releases}) == len(releases)


def test_a_release_has_only_keep_a_changelog_kinds_of_change() -> None:
    kinds = [heading.removeprefix("### ") for heading in _headings(3)]
    assert set(kinds) <= KINDS, set(kinds) - KINDS


def test_the_newest_release_is_the_package_version() -> None:
    (major, minor, patch), _ = _releases()[0]
    assert f"{major}.{minor}.{patch}" == tv.__version__


def test_the_changelog_names_no_issue_and_no_commit() -> None:
    text = CHANGELOG.read_text()
    assert not ISSUE.findall(text)
    assert not COMMIT.findall(text)


def test_the_changelog_links_only_to_files_that_exist() -> None:
    text = CHANGELOG.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    targets += re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, re.MULTILINE)
    local = [target for target in targets if "://" not in target]
    assert local  # the guides and benchmark pages it cites
    assert not [target for target in local if not (REPOSITORY / target).exists()]
