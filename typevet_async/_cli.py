"""The ``typevet-async`` command line: judge, batch, generate, serve-local.

Backend, URL, model, API key and concurrency come from flags or the ``TYPEVET_*`` variables
(flags win); with no URL the embedded llama.cpp server is started.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import anyio
import orjson
from tqdm import tqdm

import typevet_async as tv
from typevet_async._backends import embedded
from typevet_async._convert import converter, questions_from_json

EXAMPLES = {
    "judge": """example:
  typevet-async judge "I was charged twice and want a refund" \\
      --noul refund="Is a refund requested?" \\
      --choice route="Which team?:billing,shipping,technical" \\
      --score urgency="How urgent?:can wait,this week,today" --table
  echo '{"ticket": "..."}' | typevet-async judge - --questions questions.json""",
    "batch": """example:
  typevet-async batch tickets.jsonl --questions questions.json --out answers.jsonl
  typevet-async batch tickets.jsonl --questions questions.json --out answers.jsonl --resume
input lines: {"id": "t1", "state": "..."} or a bare JSON string (its id is its line number).
output lines, in input order: {"id": ..., "answers": {...}, "usage": {...}}
                           or {"id": ..., "error": {"type": ..., "message": ...}}""",
    "generate": """example:
  typevet-async generate 'Reply in JSON like {"colour": "red"}. The car is red.' \\
      --schema colour.schema.json""",
    "serve-local": """example:
  typevet-async serve-local --port 8080
  TYPEVET_BASE_URL=http://127.0.0.1:8080 typevet-async judge "..." --noul q="Refund?" """,
}


# -- arguments -----------------------------------------------------------------------------


def _connection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server (flags win over TYPEVET_* variables)")
    group.add_argument("--backend", choices=["llama_cpp", "vllm"], help="TYPEVET_BACKEND")
    group.add_argument("--base-url", help="TYPEVET_BASE_URL (unset: the embedded server)")
    group.add_argument("--model", help="TYPEVET_MODEL (required for vllm)")
    group.add_argument("--api-key", help="TYPEVET_API_KEY")
    group.add_argument("--max-concurrency", type=int, help="TYPEVET_MAX_CONCURRENCY")


def _question_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--questions", type=Path, help="a JSON file of questions")
    parser.add_argument("--noul", action="append", default=[], metavar="ID=INSTRUCTIONS")
    parser.add_argument(
        "--choice", action="append", default=[], metavar="ID=INSTRUCTIONS:LABEL,LABEL,..."
    )
    parser.add_argument(
        "--score", action="append", default=[], metavar="ID=INSTRUCTIONS:LEVEL,LEVEL,..."
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="typevet-async",
        description="Typed questions to language-model servers, typed answers with probabilities.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    judge = command("judge", "Judge one state and print the typed answers.")
    judge.add_argument("state", help="the state text, @FILE to read a file, or - for stdin")
    _question_flags(judge)
    judge.add_argument("--table", action="store_true", help="a readable table, not JSON")
    _connection_flags(judge)

    batch = command("batch", "Judge every line of a JSONL file into another, in input order.")
    batch.add_argument("input", type=Path)
    _question_flags(batch)
    batch.add_argument("--out", type=Path, required=True)
    batch.add_argument("--resume", action="store_true", help="skip ids already in --out")
    batch.add_argument("--no-progress", action="store_true")
    _connection_flags(batch)

    generate = command("generate", "Generate one JSON value that passes a JSON Schema.")
    generate.add_argument("prompt")
    generate.add_argument("--schema", type=Path, required=True)
    generate.add_argument(
        "--max-tokens", type=int, default=None, help="the token limit (default: the session's)"
    )
    _connection_flags(generate)

    serve = command("serve-local", "Run the embedded llama.cpp server in the foreground.")
    serve.add_argument(
        "options", nargs=argparse.REMAINDER, help="serving flags: see serve-local --help"
    )
    return parser


def _split_spec(spec: str, flag: str) -> tuple[str, str, list[str]]:
    if "=" not in spec:
        raise tv.QuestionError(f"{flag} wants ID=INSTRUCTIONS[:OPTIONS], got {spec!r}")
    question_id, rest = spec.split("=", 1)
    instructions, _, options = rest.rpartition(":") if ":" in rest else (rest, "", "")
    return question_id, instructions, [o.strip() for o in options.split(",") if o.strip()]


def questions_from_args(args: argparse.Namespace) -> dict[str, tv.Question]:
    questions: dict[str, tv.Question] = {}
    if args.questions is not None:
        questions.update(questions_from_json(json.loads(args.questions.read_text())))
    for spec in args.noul:
        if "=" not in spec:
            raise tv.QuestionError(f"--noul wants ID=INSTRUCTIONS, got {spec!r}")
        question_id, instructions = spec.split("=", 1)
        questions[question_id] = tv.Noul(instructions=instructions)
    for spec in args.choice:
        question_id, instructions, labels = _split_spec(spec, "--choice")
        questions[question_id] = tv.Choice(labels, instructions=instructions)
    for spec in args.score:
        question_id, instructions, levels = _split_spec(spec, "--score")
        questions[question_id] = tv.Score(levels, instructions=instructions)
    if not questions:
        raise tv.QuestionError("no questions: give --questions FILE or --noul/--choice/--score")
    return questions


def session_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> tv.Session:
    env = dict(environ)
    for flag, variable in (
        ("backend", "TYPEVET_BACKEND"),
        ("base_url", "TYPEVET_BASE_URL"),
        ("model", "TYPEVET_MODEL"),
        ("api_key", "TYPEVET_API_KEY"),
        ("max_concurrency", "TYPEVET_MAX_CONCURRENCY"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            env[variable] = str(value)
    return tv.Session.from_env(env)


def read_state(argument: str, stdin: TextIO) -> Any:
    """The state: the argument itself, or from stdin (-) or a file (@FILE), JSON if it parses."""
    if argument != "-" and not argument.startswith("@"):
        return argument
    text = stdin.read() if argument == "-" else Path(argument[1:]).read_text()
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


# -- commands ------------------------------------------------------------------------------


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


async def run_judge(args: argparse.Namespace, out: TextIO) -> int:
    questions = questions_from_args(args)
    state = read_state(args.state, sys.stdin)
    async with session_from_args(args, os.environ) as session:
        judgment = await session.judge(state, questions)
    if args.table:
        print(_table(judgment), file=out)
    else:
        data = converter.unstructure(judgment)
        data.pop("diagnostics")
        print(json.dumps(data, indent=2, ensure_ascii=False), file=out)
    return 0


def _done_ids(out: Path) -> set[Any]:
    """Ids already in OUT; a last line cut off by a kill is removed so it is judged again."""
    if not out.exists():
        return set()
    raw = out.read_bytes()
    complete = raw[: raw.rfind(b"\n") + 1]
    if len(complete) != len(raw):
        out.write_bytes(complete)
    done: set[Any] = set()
    for line in complete.splitlines():
        if line.strip():
            done.add(_id_key(orjson.loads(line)["id"]))
    return done


def _id_key(value: Any) -> Any:
    return json.dumps(value, sort_keys=True)


def _records(path: Path, skip: set[Any]) -> Iterator[tuple[Any, Any]]:
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            data = orjson.loads(line)
            record_id, state = (
                (data["id"], data["state"])
                if isinstance(data, dict) and "id" in data and "state" in data
                else (number, data)
            )
            if _id_key(record_id) not in skip:
                yield record_id, state


def _line(item: tv.BatchItem) -> bytes:
    if item.judgment is not None:
        data = converter.unstructure(item.judgment)
        body = {"id": item.record_id, "answers": data["answers"], "usage": data["usage"]}
    else:
        error = item.error
        body = {
            "id": item.record_id,
            "error": {"type": type(error).__name__, "message": str(error)},
        }
    return orjson.dumps(body) + b"\n"


async def run_batch(args: argparse.Namespace, out: TextIO) -> int:
    questions = questions_from_args(args)
    skip = _done_ids(args.out) if args.resume else set()
    if not args.resume and args.out.exists() and args.out.stat().st_size:
        raise tv.ConfigurationError(f"{args.out} exists; pass --resume to continue it")
    with args.input.open("rb") as lines:
        total = sum(1 for line in lines if line.strip()) - len(skip)
    started = time.monotonic()
    done = failed = 0
    bar = tqdm(total=total, unit="rec", disable=args.no_progress, file=sys.stderr)
    async with session_from_args(args, os.environ) as session:
        with args.out.open("ab") as sink:
            stream = session.judge_many(_records(args.input, skip), questions, ordered=True)
            async for item in stream:
                sink.write(_line(item))
                sink.flush()  # a killed run keeps every line it wrote
                done += 1
                failed += not item.ok
                bar.update(1)
    bar.close()
    elapsed = time.monotonic() - started
    print(
        f"{done} records ({len(skip)} skipped as done), {failed} failed, "
        f"{done / elapsed if elapsed else 0:.2f} records/s",
        file=out,
    )
    return 1 if failed else 0


async def run_generate(args: argparse.Namespace, out: TextIO) -> int:
    schema = json.loads(args.schema.read_text())
    max_tokens = tv.UNSET if args.max_tokens is None else args.max_tokens
    async with session_from_args(args, os.environ) as session:
        result = await session.generate(args.prompt, schema=schema, max_tokens=max_tokens)
    print(json.dumps(result.value, indent=2, ensure_ascii=False), file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve-local"]:  # its flags are the embedded server's own
        embedded.main(argv[1:], prog="typevet-async serve-local")
        return 0
    args = build_parser().parse_args(argv)
    runner = {"judge": run_judge, "batch": run_batch, "generate": run_generate}[args.command]
    try:
        return anyio.run(runner, args, sys.stdout)
    except tv.TypevetError as error:
        print(f"typevet-async: {type(error).__name__}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
