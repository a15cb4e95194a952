"""krite-bench 0.1.0 (a public harness for any ``POST /v1/systemone`` server) against
``typevet-async serve`` over the real llama.cpp server, as a user of the harness would run it.

krite-bench is installed in its own virtual environment (``pip install krite-bench==0.1.0``: it
pins numpy, pyarrow, tokenizers, huggingface-hub, httpx and jsonschema of its own), named by
``--krite-python`` (default: ``$KRITE_PYTHON``, else this Python). It talks to a server only
over HTTP, as an "engine" of its ``benchmarks/baselines/engines.toml`` in a workspace
(``$KRITE_ROOT``); this script writes a fresh workspace for the run. What the harness needed
from the gateway, recorded in the results file:

- ``--no-auth``: it sends no ``Authorization`` header (the gateway listens on loopback only);
- ``dialect = "jev"`` in its engine entry: its own protocol keys a Score's probabilities by
  level name and wants ``latency_ms``; its Jev mapping reads System One's level indices and
  drops top-level ``x_`` fields (``x_typevet``), and its answer schema allows no other field;
- no ``model`` in its requests: the gateway answers them with the one model it serves.

Suites. krite-bench builds its suites from Hugging Face Hub downloads (``krite-bench data``),
which cannot be fetched here; its ``agnews-choice`` and ``sst5-score`` suites are built by its
own ``data.build_suite`` (its instructions, options, seeded order and case format) from the
``eval`` rows of the same public test sets kept in ``benchmarks/real_answers/public_data/`` (AG News
test, SST-5 test: 240 rows each, so at most 240 cases, not its 400; ``--cases`` draws fewer, with
its builder's own seeded draw). Its other System One suites have no data
here (BoolQ, XNLI, Banking77, MASSIVE, Amazon reviews), and ``latency`` builds its states with
the mmBERT-small tokenizer, a Hub download too: neither runs. Run, on those two suites:

- ``quality`` (every case; krite-bench then refits its per-bucket temperatures, ``calibrate``);
- ``invariance`` on ``agnews-choice``: every order of the 4 options for ``--invariance-n``
  cases (24 requests a case);
- ``interference`` on ``agnews-choice``: each of ``--interference-n`` cases alone, then with 3
  and with 15 filler questions in the same request.

The model is Gemma 3 270M (the base model: its accuracy is near chance; this measures the
plumbing and what the harness reports, not a model), served by the embedded llama.cpp server
as the live tests serve it (built-in ``gemma`` template, 4 slots, 8,192 tokens of context),
unless ``--url`` names a running server. krite-bench sends one request at a time.

    python -m benchmarks.real_answers.bench_krite [--krite-python PY] [--cases 240] \\
        [--invariance-n 10] [--interference-n 20] [--url URL]

On 2 shared cores one request took 3.5-7 s (load 8-11), so the recorded run is a subset:
``--cases 40 --invariance-n 3 --interference-n 5``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import typevet_async as tv
from benchmarks._shared import ROOT, markdown_table, write_results
from benchmarks.gateway.bench_gateway import Gateway

NAME = "bench_krite"
ENGINE = "typevet-serve"
SUITES = {"agnews-choice": "agnews.jsonl", "sst5-score": "sst5.jsonl"}
AGNEWS_LABELS = ["World", "Sports", "Business", "Sci/Tech"]  # krite-bench's label ids

#: Run in krite-bench's own Python: build one suite from our public rows with its builder.
BUILD = """
import json, sys
from pathlib import Path
from krite_bench import data
suite_id, source, out = sys.argv[1:4]
suite = {s.id: s for s in data.suites()}[suite_id]
labels, cases = json.loads(sys.argv[4]), int(sys.argv[5])
rows = []
for line in Path(source).read_text().splitlines():
    row = json.loads(line)
    if row["part"] == "eval":
        label = labels.index(row["label"]) if labels else int(row["label"])
        rows.append({"text": row["text"], "label": label})
cases = data.build_suite(suite, rows, n=cases)
print(json.dumps({"cases": len(cases), "sha256": data.write_jsonl(Path(out), cases)}))
"""

#: Run in krite-bench's own Python: one of its runners, as its command line calls it.
RUN = """
import sys
from pathlib import Path
from krite_bench import runners
step, out = sys.argv[1], Path(sys.argv[2])
if step == "quality":
    runners.run_quality(sys.argv[3], sys.argv[4].split(","), out)
elif step == "invariance":
    runners.run_invariance(sys.argv[3], sys.argv[4].split(","), int(sys.argv[5]), out)
else:
    runners.run_interference(sys.argv[3], sys.argv[4], int(sys.argv[5]), out)
"""


class Krite:
    """krite-bench in its own Python, over a fresh workspace naming the gateway as its engine."""

    def __init__(self, python: str, port: int) -> None:
        self.python = python
        self.root = Path(tempfile.mkdtemp(prefix="krite-workspace-"))
        self.out = self.root / "benchmarks" / "results" / "baselines"
        engines = self.root / "benchmarks" / "baselines" / "engines.toml"
        engines.parent.mkdir(parents=True)
        engines.write_text(
            f'[{ENGINE}]\nport = {port}\nmodel = "gemma-3-270m"\n'
            'backend = "typevet-async serve over llama.cpp (xllamacpp), CPU"\n'
            'precision = "Q4_K_M"\ndialect = "jev"\n'
        )
        self.env = {**os.environ, "KRITE_ROOT": str(self.root)}

    def version(self) -> str:
        code = "import importlib.metadata as m; print(m.version('krite-bench'))"
        return self._python(["-c", code]).strip()

    def build(self, suite: str, source: str, cases: int) -> dict[str, Any]:
        labels = AGNEWS_LABELS if suite.startswith("agnews") else []
        out = self.root / "benchmarks" / "data" / f"{suite}.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        path = str(ROOT / "benchmarks" / "real_answers" / "public_data" / source)
        built: dict[str, Any] = json.loads(
            self._python(["-c", BUILD, suite, path, str(out), json.dumps(labels), str(cases)])
        )
        return built

    def run(self, step: str, *args: str) -> tuple[float, str]:
        started = time.perf_counter()
        printed = self._python(["-c", RUN, step, str(self.out), *args])
        return time.perf_counter() - started, printed

    def rows(self, name: str) -> list[dict[str, Any]]:
        path = self.out / name
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def _python(self, args: list[str]) -> str:
        done = subprocess.run(
            [self.python, *args], capture_output=True, text=True, env=self.env, check=False
        )
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            raise SystemExit(f"krite-bench exited {done.returncode}")
        return done.stdout


def wait_ready(url: str) -> None:
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise SystemExit("the gateway never became ready")


def cell(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def first_errors(krite: Krite, suite: str) -> list[str]:
    errors = [row["error"] for row in krite.rows(f"pred-{ENGINE}-{suite}.jsonl") if row["error"]]
    return errors[:3]


def tables(krite: Krite) -> dict[str, str]:
    quality = krite.rows("quality.jsonl")
    rows = []
    for row in quality:
        raw = row.get("raw") or {}
        spread = row.get("macro_f1") if row["type"] == "choice" else row.get("mae")
        rows.append([
            f"`{row['suite']}`", str(row["n"]), cell(row.get("n_scored")),
            cell(row["error_rate"]), cell(row.get("accuracy")), cell(spread),
            cell(row.get("qwk")), cell(raw.get("ece")), cell(raw.get("nll")),
            cell(row.get("max_sum_dev"), 6),
        ])  # fmt: skip
    header = ["suite", "cases", "answered", "error rate", "accuracy"]
    header += ["macro F1 (choice) / MAE (score)", "QWK", "ECE", "NLL", "max sum deviation"]
    found = {"quality": markdown_table(header, rows)}
    rows = []
    for row in krite.rows("calibration.jsonl"):
        raw, scaled = row["raw_eval_half"], row["scaled_eval_half"]
        temperature = ", ".join(f"{k} {v:.2f}" for k, v in row["temperature"].items())
        rows.append([
            f"`{row['suite']}`", temperature, cell(raw["ece"]), cell(scaled["ece"]),
            cell(raw["nll"]), cell(scaled["nll"]),
        ])  # fmt: skip
    header = ["suite", "temperature by bucket", "ECE raw", "ECE scaled", "NLL raw", "NLL scaled"]
    found["calibration"] = markdown_table(header, rows)
    rows = [
        [
            f"`{row['suite']}`", str(row["cases"]), str(row["calls"]), cell(row["error_rate"]),
            cell(row["full_permutation_flip_rate"]), cell(row["reverse_flip_rate"]),
            cell(row["max_prob_dev"]), cell(row["mean_prob_dev"]),
        ]
        for row in krite.rows("invariance.jsonl")
    ]  # fmt: skip
    header = ["suite", "cases", "requests", "error rate", "flip rate, every order"]
    header += ["flip rate, reversed", "max probability change", "mean probability change"]
    found["invariance"] = markdown_table(header, rows)
    rows = [
        [
            f"`{row['suite']}`", str(row["fillers"]), str(row["cases"]),
            cell(row["error_rate"]), cell(row["argmax_change_rate"]), cell(row["max_prob_dev"]),
        ]
        for row in krite.rows("interference.jsonl")
    ]  # fmt: skip
    header = ["suite", "filler questions", "cases", "error rate", "answer changed"]
    header += ["max probability change"]
    found["interference"] = markdown_table(header, rows)
    return found


def measure(url: str, args: argparse.Namespace, server: str) -> dict[str, Any]:
    # Gateway: the serve command in a child process, as bench_gateway runs it; --no-auth
    # because krite-bench sends no key.
    gateway = Gateway(url, auth=("--no-auth",))
    seconds: dict[str, float] = {}
    try:
        port = int(gateway.url.rsplit(":", 1)[1])
        krite = Krite(args.krite_python, port)
        built = {suite: krite.build(suite, source, args.cases) for suite, source in SUITES.items()}
        wait_ready(gateway.url)
        steps = [
            ("quality", ENGINE, ",".join(SUITES)),
            ("invariance", ENGINE, "agnews-choice", str(args.invariance_n)),
            ("interference", ENGINE, "agnews-choice", str(args.interference_n)),
        ]
        printed = {}
        for step, *rest in steps:
            seconds[step], printed[step] = krite.run(step, *rest)
            print(printed[step].strip(), f"({seconds[step]:.0f} s)", flush=True)
        version = krite.version()
        found = tables(krite)
        errors = {suite: first_errors(krite, suite) for suite in SUITES}
    finally:
        code = gateway.stop()
    return {
        "server": server,
        "krite_bench": version,
        "note": (
            "krite-bench's agnews-choice and sst5-score suites, built by its own builder from "
            "the AG News and SST-5 test rows in benchmarks/real_answers/public_data "
            f"({args.cases} cases each, not its 400 Hub-drawn ones); its other suites and its "
            "latency runs need Hub downloads and did not run. Gemma 3 270M is a base model: "
            "accuracy near chance is expected."
        ),
        "settings": {
            "engine entry": f"[{ENGINE}] dialect = jev (no request_model: requests carry no model)",
            "gateway": "typevet-async serve --no-auth --request-deadline 600",
            "quality cases per suite": args.cases,
            "invariance cases": args.invariance_n,
            "interference cases": args.interference_n,
        },
        "suites": built,
        "seconds": {step: round(value, 1) for step, value in seconds.items()},
        "first_errors": errors,
        "gateway_exit_status_after_sigterm": code,
        "tables": found,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--krite-python",
        default=os.environ.get("KRITE_PYTHON", sys.executable),
        help="the Python of an environment with krite-bench installed ($KRITE_PYTHON)",
    )
    parser.add_argument(
        "--cases", type=int, default=240, help="cases per suite, drawn by krite-bench's builder"
    )
    parser.add_argument("--invariance-n", type=int, default=10, help="cases, 24 requests each")
    parser.add_argument("--interference-n", type=int, default=20, help="cases, 3 requests each")
    parser.add_argument("--url", help="a running llama.cpp server (default: the embedded one)")
    args = parser.parse_args()
    started = time.perf_counter()
    if args.url:
        figures = measure(args.url, args, args.url)
    else:
        options = tv.ServerOptions(chat_template="gemma", n_ctx=8192, n_parallel=4)
        with tv.EmbeddedServer(options) as embedded:
            server = "embedded: Gemma 3 270M Q4_K_M, xllamacpp, gemma template, 4 slots, n_ctx 8192"
            figures = measure(embedded.url, args, server)
    figures["elapsed_s"] = round(time.perf_counter() - started, 1)
    path = write_results(NAME, figures)
    for title, text in figures["tables"].items():
        print(f"\n{title}\n\n{text}")
    print(f"\n(figures in {path})")
    failed = [s for s, errors in figures["first_errors"].items() if errors]
    if failed or figures["gateway_exit_status_after_sigterm"] != 0:
        raise SystemExit(f"errors in {failed}: {figures['first_errors']}")


if __name__ == "__main__":
    main()
