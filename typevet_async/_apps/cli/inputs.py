"""What the commands read from their arguments: the questions, the state, JSON files, a JSONL
input's records and the session the flags and ``TYPEVET_*`` variables describe."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, TextIO

import typevet_async as tv
from typevet_async._apps.cli.exits import CommandLineError, reason
from typevet_async._apps.jsonl import BOM, json_error
from typevet_async._core.wires.jsonvalues import parse_json

__all__ = [
    "json_lines",
    "questions_from_args",
    "read_json_file",
    "read_state",
    "session_from_args",
]


#: What each flag's options are called in its form, and an example of the whole flag.
_SPEC_FORMS: Final = {
    "--choice": ("LABEL", 'team="Which team?:billing,shipping"'),
    "--score": ("LEVEL", 'mood="How does the customer feel?:unhappy,neutral,happy"'),
}


def _form(flag: str) -> str:
    option, example = _SPEC_FORMS[flag]
    return f'{flag} wants ID="INSTRUCTIONS:{option},{option},..." (e.g. {flag} {example})'


def _split_spec(spec: str, flag: str) -> tuple[str, str, list[str]]:
    option, _ = _SPEC_FORMS[flag]
    form = _form(flag)
    if "=" not in spec:
        raise tv.QuestionError(f"{form}, got {spec!r}: no '=' after the id")
    question_id, rest = spec.split("=", 1)
    if ":" not in rest:  # the instructions forgotten: what is there reads as instructions
        raise tv.QuestionError(
            f"{form}, got {spec!r}: no ':' between the instructions and the "
            f"{option.lower()}s (are the instructions missing?)"
        )
    instructions, _, options = rest.rpartition(":")
    return question_id, instructions, [o.strip() for o in options.split(",") if o.strip()]


def _question_from_spec(flag: str, spec: str) -> tuple[str, tv.Question]:
    if flag == "--noul":
        if "=" not in spec:
            raise tv.QuestionError(f"--noul wants ID=INSTRUCTIONS, got {spec!r}")
        question_id, instructions = spec.split("=", 1)
        return question_id, tv.Noul(instructions=instructions)
    question_id, instructions, options = _split_spec(spec, flag)
    try:
        if flag == "--choice":
            return question_id, tv.Choice(options, instructions=instructions)
        return question_id, tv.Score(options, instructions=instructions)
    except tv.QuestionError as error:  # the question's own rule, with the flag's form
        raise tv.QuestionError(f"{_form(flag)}, got {spec!r}: {error}") from None


def questions_from_args(args: argparse.Namespace) -> dict[str, tv.Question]:
    """The questions of --questions, then of --noul/--choice/--score in the order given.

    :raises QuestionError: none at all, a bad one, or an id given twice.
    :raises CommandLineError: the --questions file cannot be read or is not JSON.
    """
    questions: dict[str, tv.Question] = {}
    given_by: dict[str, str] = {}
    if args.questions is not None:
        data = read_json_file(args.questions, "--questions")
        questions.update(tv.questions_from_json(data))
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


def session_from_args(
    args: argparse.Namespace, environ: Mapping[str, str], **settings: Any
) -> tv.Session:
    """The session the flags and variables describe (flags win), with other settings by name
    (``cache``); nothing is opened or started.

    :raises ConfigurationError: naming the flag (and its variable) that is missing or wrong.
    """
    flags = {name: getattr(args, name) for name in args.session_flags}
    return tv.Session.from_env(environ, flags=flags, **settings)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} appears twice in one object")
        seen[key] = value
    return seen


def read_json_file(path: Path, flag: str) -> Any:
    """A whole JSON file (--questions, --schema); a key given twice is refused, not dropped."""
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise CommandLineError(f"{flag} {path}: cannot read it: {reason(error)}") from None
    try:
        return json.loads(raw, object_pairs_hook=_unique_keys, parse_constant=_refuse_constant)
    except RecursionError:
        raise CommandLineError(f"{flag} {path}: not valid JSON: nested too deeply") from None
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError among them
        raise CommandLineError(f"{flag} {path}: not valid JSON: {error}") from None


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """Each JSON value of a JSONL input (--input of eval and fit-prior) with its line number,
    read as it goes; a BOM before the first line and blank lines skipped.

    :raises CommandLineError: the file cannot be read, or a line is not JSON (naming it).
    """
    try:
        source = path.open("rb")
    except OSError as error:
        raise CommandLineError(f"cannot read the input {path}: {reason(error)}") from None
    with source:
        for number, line in enumerate(source, start=1):
            if number == 1:
                line = line.removeprefix(BOM)
            if not line.strip():
                continue
            try:
                yield number, parse_json(line)
            except ValueError as error:
                raise CommandLineError(
                    f"{path} line {number}: not valid JSON ({json_error(error)})"
                ) from None


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
            f"cannot read the state from {source}: {reason(error)}{hint}"
        ) from None
    except UnicodeDecodeError as error:
        raise CommandLineError(
            f"cannot read the state from {source}: not UTF-8 text ({error.reason})"
        ) from None
    try:
        return parse_json(text)
    except ValueError:
        return text
