"""What the benchmarks share: tickets, the results folder, statistics, Markdown tables and an
argparse count.

Not a benchmark itself. The benchmarks live in one package per thing they measure (`GROUPS`:
``client_cost``, ``real_answers``, ``gateway``, ``scale``); each writes its figures to
``benchmarks/results/<group>/<benchmark>.json``, a named run of it (another arm, another
setting kept as evidence) to ``<benchmark>.<run>.json`` beside it (`results_path`), with the
machine, the Python and the SDK's source revision, and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = Path(__file__).resolve().parent
RESULTS = BENCHMARKS / "results"

OPENINGS = (
    "Hi,",
    "Hello team,",
    "Urgent:",
    "Quick question:",
    "Dear support,",
    "Hey,",
    "Good morning,",
    "Sorry to bother you,",
)
ISSUES = (
    "I was charged twice for order {n} and want my money back.",
    "my parcel {n} has been stuck in transit for three weeks.",
    "the app crashes when I open settings (build {n}).",
    "the replacement for order {n} arrived and works perfectly, thanks!",
    "please send a VAT invoice for order {n} by Friday.",
    "I cannot log in since the password reset; ticket {n}.",
    "the jacket from order {n} is the wrong size, can I return it?",
    "my subscription renewed although I cancelled it; account {n}.",
    "the discount code {n} was not applied at checkout.",
    "order {n} arrived with a cracked screen.",
    "how do I change the delivery address of order {n}?",
    "the tracking page for parcel {n} shows an error.",
)


def ticket(n: int) -> str:
    """Ticket number ``n``: an opening and an issue, both chosen by ``n``, naming ``n``."""
    return matched_ticket(n, n)


def matched_ticket(position: int, number: int) -> str:
    """A ticket whose wording is chosen by ``position`` and that names ``number``: two passes
    given the same positions and numbers of the same width send prompts of the same token
    count (Gemma's tokenizer reads each digit as one token), only the digits differ."""
    opening = OPENINGS[position % len(OPENINGS)]
    issue = ISSUES[(position // len(OPENINGS)) % len(ISSUES)]
    return f"{opening} {issue.format(n=number)}"


def tickets(count: int, start: int = 0) -> list[str]:
    """``count`` distinct tickets, numbers ``start`` .. ``start + count - 1``."""
    return [ticket(n) for n in range(start, start + count)]


def ticket_stream(count: int, start: int = 0) -> Iterator[str]:
    """The same tickets made one at a time (for batches that must not sit in a list)."""
    return (ticket(n) for n in range(start, start + count))


def current_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def peak_rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min and max (what every table shows: the machine is noisy)."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def fmt(cell: dict[str, float], digits: int = 0, unit: str = "") -> str:
    """``median (min-max)``."""
    median, low, high = cell["median"], cell["min"], cell["max"]
    return f"{median:,.{digits}f}{unit} ({low:,.{digits}f}-{high:,.{digits}f})"


def percentile(sorted_values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, round(share * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (exit 2 naming it otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} is below {minimum}")
        return value

    return parse


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _revision() -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=False, timeout=10,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "typevet_async"],
            capture_output=True, text=True, check=False, timeout=10,
        ).stdout.strip()  # fmt: skip
    except OSError:
        return "unknown"
    return f"{head}{' + uncommitted changes in typevet_async/' if dirty else ''}"


def machine() -> dict[str, Any]:
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "revision": _revision(),
    }


def groups() -> list[str]:
    """The benchmark groups: the packages under ``benchmarks/`` (a new folder with an
    ``__init__.py`` is a new group; its docstring says what the group measures)."""
    return sorted(
        path.parent.name
        for path in BENCHMARKS.glob("*/__init__.py")
        if not path.parent.name.startswith("_")
    )


def group_of(benchmark: str) -> str:
    """The group whose folder holds ``<benchmark>.py``."""
    found = [group for group in groups() if (BENCHMARKS / group / f"{benchmark}.py").is_file()]
    if len(found) != 1:
        raise ValueError(
            f"{benchmark!r} is a script of {len(found)} benchmark groups, not one "
            f"(groups: {', '.join(groups())})"
        )
    return found[0]


def results_path(name: str) -> Path:
    """Where the results named ``name`` live: ``<benchmark>`` (its latest run) or
    ``<benchmark>.<run>`` (a named run kept beside it), under the benchmark's group."""
    return RESULTS / group_of(name.partition(".")[0]) / f"{name}.json"


def write_results(name: str, figures: dict[str, Any], folder: Path | None = None) -> Path:
    """``figures`` with the machine's block as `results_path` ``(name)`` (the results the docs
    pages are generated from), or as ``<folder>/<name>.json`` (a development run may write
    elsewhere)."""
    path = results_path(name) if folder is None else folder / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "machine": machine(), **figures}
    path.write_text(json.dumps(payload, indent=1, sort_keys=False) + "\n")
    return path


def run_json_subprocess(
    args: Sequence[str],
    timeout: float = 3600,
    *,
    code: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``python -m <args>`` (given ``code``, ``python -c <code> <args>``) in a fresh
    process from the repository root, in ``env`` if given (else this process's environment);
    its last stdout line is JSON."""
    command = [sys.executable, *(["-c", code] if code is not None else ["-m"]), *args]
    done = subprocess.run(
        command,
        capture_output=True, text=True, timeout=timeout, check=False, cwd=ROOT,
        env=None if env is None else dict(env),
    )  # fmt: skip
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"{' '.join(args[:3])} ... exited {done.returncode}")
    lines = done.stdout.strip().splitlines()
    if not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"{' '.join(args[:3])} ... printed nothing")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def run_on_gemma(
    name: str,
    run: Callable[[str, int], Coroutine[Any, Any, dict[str, Any]]],
    count: int,
    url: str | None,
) -> None:
    """Run a load benchmark's ``run(url, count)`` against ``url``, or against the live tests'
    Gemma 3 server started here (tests/live/conftest.py: 4 slots); write and print its
    figures, and exit 1 unless they passed."""
    import asyncio

    import typevet_async as tv

    if url:
        figures = asyncio.run(run(url, count))
    else:
        options = tv.ServerOptions(chat_template="gemma", n_ctx=8192, n_parallel=4)
        with tv.EmbeddedServer(options) as server:
            figures = asyncio.run(run(server.url, count))
    path = write_results(name, figures)
    print(json.dumps(figures))
    print(f"written to {path}")
    if not figures["passed"]:
        raise SystemExit(1)
