"""The command line's flag types and shared flag groups: every rule of what a flag accepts is
written here once (the embedded server's ``serve-local`` flags use them too)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn, TypeVar

import typevet_async as tv
from typevet_async._apps.cli.exits import PROG, CommandLineError
from typevet_async._session.configuration import BACKENDS, SETTINGS, Setting

__all__ = [
    "AddCommand",
    "CommandParser",
    "fraction",
    "non_negative_int",
    "number_argument",
    "port",
    "positive_float",
    "positive_int",
    "question_flags",
    "session_flags",
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


#: The groups ``--help`` shows the session's settings in, by the setting's home.
_GROUPS: Final = {
    "connection": "server (each flag wins over its TYPEVET_* variable)",
    "backend": "the backend's reads",
    "http": "HTTP",
    "session": "the session",
}


def _checked(setting: Setting) -> Callable[[str], str]:
    """An argparse type: the text, once the setting's own rule takes it (`Session.from_env`
    reads it again, by the same rule)."""
    assert setting.read is not None
    read = setting.read

    def argument(text: str) -> str:
        try:
            read(text, "")
        except tv.ConfigurationError as error:
            raise argparse.ArgumentTypeError(str(error).strip()) from None
        return text

    return argument


def session_flags(parser: argparse.ArgumentParser, *, skip: Collection[str] = ()) -> None:
    """A flag for every setting of `SETTINGS` a text gives (``skip``: those whose flag the
    command uses for its own setting), by the setting's name: ``top_k`` is ``--top-k``. The
    values stay text: `Session.from_env` reads them as it reads the variables."""
    groups = {home: parser.add_argument_group(title) for home, title in _GROUPS.items()}
    names = []
    for setting in SETTINGS:
        if setting.read is None or setting.name in skip:
            continue
        names.append(setting.name)
        applies = (
            "" if setting.backends >= set(BACKENDS) else "; " + ", ".join(sorted(setting.backends))
        )
        options: dict[str, Any] = {"help": f"{setting.help} ({setting.variable}{applies})"}
        if setting.choices:
            options["choices"] = setting.choices
        elif setting.switch:  # a yes or no: --name, --no-name
            options["action"] = argparse.BooleanOptionalAction
        else:
            options.update(metavar=setting.metavar, type=_checked(setting))
        groups[setting.home].add_argument(setting.flag, **options)
    parser.set_defaults(session_flags=tuple(names))


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
