"""One configuration, three doors: every setting declared once (`_session/configuration.SETTINGS`)
reaches a session by the same name from Python (``top_k=``), the environment
(``TYPEVET_TOP_K``) and the command line (``--top-k``), on every backend it applies to.

These tests enumerate the declaration, so a setting missing from one door, or a keyword no
declaration names, fails here."""

from __future__ import annotations

import argparse
import inspect
import typing
import warnings
from pathlib import Path
from typing import Any

import attrs
import pytest

import typevet_async as tv
from typevet_async._apps.cli import inputs
from typevet_async._apps.cli.exits import CommandLineError
from typevet_async._apps.cli.parser import build_parser
from typevet_async._backends.system_one import SESSION_SETTINGS_REFUSED
from typevet_async._core.statistics.calibration import (
    CalibrationMap,
    Pins,
    QuestionMap,
    Reading,
    Temperature,
    question_hash,
    question_set_hash,
)
from typevet_async._core.statistics.fitted_prior import QuestionPrior
from typevet_async._session.configuration import (
    BACKENDS,
    BY_NAME,
    FRAMING,
    SETTINGS,
    read_settings,
    settings_table,
)

REPOSITORY = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:1"
#: The settings whose value is an object: a Python door only, each on purpose.
PYTHON_ONLY = {"server", "http", "retry", "trace_configs", "cache"}
#: A text each setting takes, to knock on its variable's and flag's doors.
SAMPLES = {
    "backend": "llama_cpp",
    "base_url": URL,
    "local_model": "gemma3-270m",
    "model": "m",
    "on_missing": "clamp",
    "logprobs_mode": "raw_logits",
    "api_key": "k",
    "time_slice": "none",
    "off_menu_threshold": "0.5",
    "layout": "split",
    "controls": "digits",
    "noul_controls": "letters",
    "score_controls": "scale",
    "content_free": "scores",
    "prefix_reuse": "off",
    "batch_calibration": "on",
    "batch_calibration_window": "16",
}
#: The commands that open a session, and the settings each one's own flags take over.
SESSION_COMMANDS = {
    "judge": ["judge", "x", "--noul", "q=Is it?"],
    "batch": ["batch", "in.jsonl", "--noul", "q=Is it?", "--out", "o.jsonl"],
    "eval": ["eval", "in.jsonl", "--noul", "q=Is it?", "--out", "o"],
    "fit-prior": ["fit-prior", "in.jsonl", "--noul", "q=Is it?", "--out", "p.json"],
    "generate": ["generate", "p", "--schema", "s.json"],
    "serve": ["serve"],
    "mcp": ["mcp"],
}
TAKEN_OVER = {
    "serve": {"max_connections", "max_batch_states"},
    # It reads the states as they are answered: no map or prior applies.
    "fit-prior": {"calibration", "prior"},
}

pytestmark = pytest.mark.usefixtures("no_typevet_variables")


def sample(name: str, calibration: Path) -> str:
    setting = BY_NAME[name]
    if setting.switch:
        return "true"
    if name == "prior":
        return str(calibration.with_name("prior.json"))
    return str(calibration) if name == "calibration" else SAMPLES.get(name, "3")


@pytest.fixture
def calibration(tmp_path: Path) -> Path:
    """A calibration map's file (a map of one question: what a setting's text names), and
    beside it a fitted prior's (``prior.json``) pinned alike."""
    question = tv.Noul(instructions="Is it?")
    pins = Pins(
        questions=question_set_hash([("q", question)]),
        model="m",
        template_family="gemma3",
        backend="llama_cpp",
        framing="typevet/letters/2/noul-words",
    )
    entry = QuestionMap(question_hash(question), Reading(), Temperature(2.0), "question")
    path = tmp_path / "map.json"
    path.write_bytes(CalibrationMap(pins, {"q": entry}, "2026-12-01T00:00:00+00:00").to_json())
    prior = QuestionPrior(question_hash(question), Reading(), tv.BatchPrior((0.7, 0.3), 16))
    path.with_name("prior.json").write_bytes(tv.FittedPrior(pins, {"q": prior}).to_json())
    return path


def constructor_keywords(kind: str) -> set[str]:
    """The keywords of ``Session.<kind>``: its own parameters and its `TypedDict`'s."""
    method = getattr(tv.Session, kind)
    names = set(inspect.signature(method).parameters) - {"options", "base_url"}
    hints = typing.get_type_hints(method, include_extras=True)
    [options] = typing.get_args(hints["options"])
    return names | options.__required_keys__ | options.__optional_keys__


def test_every_setting_has_its_python_door() -> None:
    session_fields = {field.name for field in attrs.fields(tv.SessionSettings)}
    http_fields = {field.name for field in attrs.fields(tv.HttpSettings)}
    for setting in SETTINGS:
        kinds = sorted(setting.backends)
        if setting.home == "session" or setting.name in ("http", "endpoint_slots"):
            assert setting.name in session_fields | {"http", "endpoint_slots"}, setting.name
            assert all(setting.name in constructor_keywords(kind) for kind in kinds), setting.name
        elif setting.home == "http":
            assert setting.name in http_fields | {"max_retries"}, setting.name
        elif setting.home == "backend" or setting.name == "model":
            assert all(setting.name in constructor_keywords(kind) for kind in kinds), setting.name
    assert "model" in constructor_keywords("local")  # local_model: Session.local(model)
    assert set(BY_NAME["backend"].choices) == set(BACKENDS)
    assert all(callable(getattr(tv.Session, kind)) for kind in BACKENDS)


def test_every_session_keyword_is_declared() -> None:
    for kind in BACKENDS:
        declared = {
            setting.name
            for setting in SETTINGS
            if kind in setting.backends
            and setting.home != "http"
            and setting.name not in ("backend", "base_url", "local_model")
        }
        # Typed on every constructor, refused at once where the server frames (a test below).
        refused = set() if kind in FRAMING else SESSION_SETTINGS_REFUSED
        assert constructor_keywords(kind) == declared | refused | {"http"}, kind
    local = constructor_keywords("local") - {"model"}  # model: the local model's name
    assert local <= constructor_keywords("llama_cpp")
    for field in attrs.fields(tv.SessionSettings):
        assert BY_NAME[field.name].home == "session", field.name
    for field in attrs.fields(tv.HttpSettings):
        assert BY_NAME[field.name].home == "http", field.name


def test_every_text_setting_has_its_variable_and_its_flag_on_every_session_command(
    calibration: Path,
) -> None:
    textual = [setting for setting in SETTINGS if setting.read is not None]
    assert {setting.name for setting in SETTINGS} - {s.name for s in textual} == PYTHON_ONLY
    for setting in textual:
        assert setting.variable == "TYPEVET_" + setting.name.upper()
        assert setting.flag == "--" + setting.name.replace("_", "-")
        # the variable's door, read by the setting's own rule
        assert setting.name in read_settings(
            {setting.variable: sample(setting.name, calibration)}, None
        )
    for command, argv in SESSION_COMMANDS.items():
        for setting in textual:
            if setting.name in TAKEN_OVER.get(command, ()):
                continue
            flag = (
                [setting.flag]
                if setting.switch
                else [setting.flag, sample(setting.name, calibration)]
            )
            args = build_parser().parse_args([*argv, *flag])
            assert setting.name in args.session_flags, (command, setting.name)
            assert getattr(args, setting.name) is not None, (command, setting.name)


def test_the_declared_defaults_are_the_records_defaults() -> None:
    records = {
        "session": tv.SessionSettings(),
        "http": tv.HttpSettings(),
    }
    backends = {
        "top_k": tv.LlamaCppConfig(base_url=URL),
        "reproducible": tv.LlamaCppConfig(base_url=URL),
        "logprobs_mode": tv.VllmConfig(base_url=URL, model="m"),
        "top_logprobs": tv.OpenAICompatibleConfig(base_url=URL),
        "max_batch_states": tv.SystemOneConfig(base_url=URL),
    }
    for setting in SETTINGS:
        if setting.name in ("retry", "trace_configs", "cache", "calibration", "http", "layout"):
            continue
        if setting.home in records:
            record = records[setting.home]
            actual = (
                record.retry.max_retries  # type: ignore[union-attr]
                if setting.name == "max_retries"
                else getattr(record, setting.name)
            )
            assert actual == setting.default, setting.name
        elif setting.name in backends:
            assert getattr(backends[setting.name], setting.name) == setting.default, setting.name
    assert tv.SessionSettings().layout.value == BY_NAME["layout"].default
    assert tv.ServerOptions().model == BY_NAME["local_model"].default


def test_a_system_one_session_refuses_exactly_the_settings_declared_for_the_framing_backends() -> (
    None
):
    framing_only = {s.name for s in SETTINGS if s.home == "session" and s.backends == FRAMING}
    assert framing_only == SESSION_SETTINGS_REFUSED


def test_the_guide_lists_every_setting_as_declared() -> None:
    guide = (REPOSITORY / "docs" / "guide" / "configuration.md").read_text()
    start = guide.index("-->\n", guide.index("<!-- settings-table")) + len("-->\n")
    end = guide.index("<!-- /settings-table -->")
    assert guide[start:end] == settings_table(), (
        "regenerate the table: python -c 'from typevet_async._session.configuration import "
        "settings_table; print(settings_table())'"
    )
    assert all(f"`{setting.keyword}`" in guide for setting in SETTINGS)


# -- the environment ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"TYPEVET_TOP_K": "x"}, "TYPEVET_TOP_K must be a positive integer, got 'x'"),
        ({"TYPEVET_TOP_K": "0"}, "TYPEVET_TOP_K must be a positive integer, got 0"),
        ({"TYPEVET_TOP_K": "1.5"}, "TYPEVET_TOP_K must be a positive integer, got '1.5'"),
        ({"TYPEVET_LAYOUT": "wide"}, "TYPEVET_LAYOUT must be one of 'typevet', 'fused', 'split'"),
        ({"TYPEVET_REQUEST_TIMEOUT": "nan"}, "TYPEVET_REQUEST_TIMEOUT must be a positive"),
        ({"TYPEVET_REQUEST_TIMEOUT": "0"}, "TYPEVET_REQUEST_TIMEOUT must be a positive"),
        ({"TYPEVET_MAX_RETRIES": "-1"}, "TYPEVET_MAX_RETRIES must be an integer >= 0, got -1"),
        ({"TYPEVET_VERIFY_TLS": "maybe"}, "TYPEVET_VERIFY_TLS must be true or false"),
        ({"TYPEVET_OFF_MENU_THRESHOLD": "2"}, "TYPEVET_OFF_MENU_THRESHOLD must be in"),
        ({"TYPEVET_CALIBRATION": "/no/such/map.json"}, "TYPEVET_CALIBRATION /no/such/map.json"),
        ({"TYPEVET_API_KEY": "sk-secret\n"}, "TYPEVET_API_KEY starts or ends with whitespace"),
        ({"TYPEVET_BASE_URL": "http://a:1,"}, "TYPEVET_BASE_URL must be a non-empty string"),
        (
            {
                "TYPEVET_BACKEND": "vllm",
                "TYPEVET_BASE_URL": URL,
                "TYPEVET_MODEL": "m",
                "TYPEVET_TOP_K": "5",
            },
            "TYPEVET_TOP_K applies to llama_cpp, not vllm",
        ),
        (
            {"TYPEVET_BACKEND": "system_one", "TYPEVET_BASE_URL": URL, "TYPEVET_LAYOUT": "split"},
            "TYPEVET_LAYOUT applies to llama_cpp, openai_compatible, vllm, not system_one",
        ),
        ({"TYPEVET_BACKEND": "openai_decisions"}, "openai_decisions needs TYPEVET_BASE_URL"),
    ],
)
def test_a_bad_variable_is_a_configuration_error_naming_it(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(tv.ConfigurationError, match=message) as caught:
        tv.Session.from_env(environ)
    assert "secret" not in str(caught.value)


def test_the_environment_reaches_every_setting_of_llama_cpp() -> None:
    environ = {
        "TYPEVET_BASE_URL": URL,
        "TYPEVET_TOP_K": "7",
        "TYPEVET_ON_MISSING": "clamp",
        "TYPEVET_REPRODUCIBLE": "yes",
        "TYPEVET_REQUEST_TIMEOUT": "9.5",
        "TYPEVET_MAX_RETRIES": "0",
        "TYPEVET_MAX_CONNECTIONS": "3",
        "TYPEVET_KEEPALIVE": "1",
        "TYPEVET_MAX_RESPONSE_BYTES": "1000",
        "TYPEVET_VERIFY_TLS": "off",
        "TYPEVET_TIME_SLICE": "none",
        "TYPEVET_LAYOUT": "split",
        "TYPEVET_CONTROLS": "digits",
        "TYPEVET_NOUL_CONTROLS": "letters",
        "TYPEVET_SCORE_CONTROLS": "scale",
        "TYPEVET_CONTENT_FREE": "all",
        "TYPEVET_OFF_MENU_THRESHOLD": "0.25",
        "TYPEVET_RAISE_OFF_MENU": "1",
        "TYPEVET_MAX_IMAGES": "2",
        "TYPEVET_MAX_IMAGE_BYTES": "99",
        "TYPEVET_PREFIX_REUSE": "off",
        "TYPEVET_MAX_TOKENS": "64",
        "TYPEVET_PERMUTATIONS": "2",
        "TYPEVET_LABEL_PRIOR": "true",
        "TYPEVET_MAX_CONCURRENCY": "5",
    }
    session = tv.Session.from_env(environ)
    backend = session.backend
    assert isinstance(backend, tv.AsyncLlamaCpp)
    config = backend.config
    assert (config.top_k, config.on_missing, config.reproducible) == (7, "clamp", True)
    http = config.http
    assert (http.request_timeout, http.retry.max_retries, http.max_connections) == (9.5, 0, 3)
    assert (http.keepalive, http.max_response_bytes, http.verify_tls) == (1.0, 1000, False)
    assert http.time_slice is None
    expected = tv.SessionSettings(
        layout="split",
        controls="digits",
        noul_controls="letters",
        score_controls="scale",
        content_free="all",
        off_menu_threshold=0.25,
        raise_off_menu=True,
        max_images=2,
        max_image_bytes=99,
        prefix_reuse="off",
        max_tokens=64,
        permutations=2,
        label_prior=True,
        max_concurrency=5,
    )
    assert session.settings == expected


@pytest.mark.parametrize(
    ("environ", "kind", "check"),
    [
        (
            {
                "TYPEVET_BACKEND": "vllm",
                "TYPEVET_MODEL": "m",
                "TYPEVET_LOGPROBS_MODE": "raw_logits",
            },
            tv.AsyncVllm,
            lambda b: b.config.logprobs_mode == "raw_logits",
        ),
        (
            {
                "TYPEVET_BACKEND": "openai_compatible",
                "TYPEVET_TOP_LOGPROBS": "5",
                "TYPEVET_ON_MISSING": "error",
            },
            tv.AsyncOpenAICompatible,
            lambda b: (b.config.top_logprobs, b.config.on_missing) == (5, "error"),
        ),
        (
            {
                "TYPEVET_BACKEND": "system_one",
                "TYPEVET_MAX_BATCH_STATES": "8",
                "TYPEVET_API_KEY": "k",
            },
            tv.AsyncSystemOne,
            lambda b: (b.config.max_batch_states, b.config.http.api_key) == (8, "k"),
        ),
        (
            {"TYPEVET_BACKEND": "openai_decisions", "TYPEVET_MODEL": "d"},
            tv.AsyncOpenAIDecisions,
            lambda b: b.config.model == "d",
        ),
    ],
)
def test_the_environment_reaches_every_backend(
    environ: dict[str, str], kind: type[Any], check: Any
) -> None:
    backend = tv.Session.from_env({"TYPEVET_BASE_URL": URL, **environ}).backend
    assert isinstance(backend, kind)
    assert check(backend)


def test_a_list_of_urls_is_a_fleet_and_no_url_the_embedded_server() -> None:
    environ = {"TYPEVET_BASE_URL": f"{URL}, http://127.0.0.1:2", "TYPEVET_ENDPOINT_SLOTS": "2"}
    assert isinstance(tv.Session.from_env(environ).backend, tv.AsyncFleet)
    embedded = tv.Session.from_env({"TYPEVET_LOCAL_MODEL": "qwen2.5-coder-1.5b"}).backend
    assert isinstance(embedded, tv.AsyncLlamaCpp)
    assert embedded.config.server == tv.ServerOptions(model="qwen2.5-coder-1.5b")


def test_a_python_keyword_and_a_variable_of_one_setting_are_refused_together() -> None:
    with pytest.raises(tv.ConfigurationError, match="top_k comes from TYPEVET_TOP_K here"):
        tv.Session.from_env({"TYPEVET_TOP_K": "5"}, top_k=6)
    session = tv.Session.from_env(
        {"TYPEVET_BASE_URL": URL, "TYPEVET_KEEPALIVE": "1"},
        http=tv.HttpSettings(request_timeout=4),
        top_k=6,
    )
    assert isinstance(session.backend, tv.AsyncLlamaCpp)
    http = session.backend.config.http
    assert (http.request_timeout, http.keepalive, session.backend.config.top_k) == (4, 1, 6)


# -- the command line ----------------------------------------------------------------------


def session_of(*flags: str, environ: dict[str, str] | None = None) -> tv.Session:
    args = build_parser().parse_args([*SESSION_COMMANDS["judge"], *flags])
    return inputs.session_from_args(args, environ or {})


def test_the_flags_reach_the_session_and_win_over_the_variables() -> None:
    session = session_of(
        "--base-url",
        URL,
        "--top-k",
        "5",
        "--layout",
        "split",
        "--request-timeout",
        "7",
        "--max-retries",
        "1",
        "--no-verify-tls",
        "--label-prior",
        "--permutations",
        "2",
        environ={"TYPEVET_TOP_K": "9", "TYPEVET_LAYOUT": "fused", "TYPEVET_VERIFY_TLS": "1"},
    )
    backend = session.backend
    assert isinstance(backend, tv.AsyncLlamaCpp)
    assert backend.config.top_k == 5
    assert (backend.config.http.request_timeout, backend.config.http.retry.max_retries) == (7, 1)
    assert backend.config.http.verify_tls is False
    assert session.settings.layout is tv.Layout.SPLIT
    assert (session.settings.permutations, session.settings.label_prior) == (2, True)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--top-k", "0"], "argument --top-k: must be a positive integer, got 0"),
        (["--request-timeout", "soon"], "argument --request-timeout: must be a positive number"),
        (["--layout", "wide"], "argument --layout: invalid choice: 'wide'"),
        (["--calibration", "/no/such/map.json"], "/no/such/map.json: cannot read it"),
        (["--prior", "/no/such/prior.json"], "/no/such/prior.json: cannot read it"),
    ],
)
def test_a_bad_flag_is_a_command_line_error_naming_it(flags: list[str], message: str) -> None:
    with pytest.raises(CommandLineError, match=message):
        build_parser().parse_args([*SESSION_COMMANDS["judge"], *flags])


def test_a_flag_of_another_backend_is_refused_naming_the_flag() -> None:
    flags = ["--backend", "vllm", "--base-url", URL, "--model", "m", "--reproducible"]
    with pytest.raises(tv.ConfigurationError, match="--reproducible applies to llama_cpp"):
        session_of(*flags)


def test_serve_keeps_its_own_caps_and_the_session_takes_them_from_the_variables() -> None:
    args = build_parser().parse_args(["serve", "--max-connections", "7"])
    assert "max_connections" not in args.session_flags
    session = inputs.session_from_args(
        args, {"TYPEVET_BASE_URL": URL, "TYPEVET_MAX_CONNECTIONS": "3"}
    )
    assert isinstance(session.backend, tv.AsyncLlamaCpp)
    assert session.backend.config.http.max_connections == 3


def test_every_flag_is_listed_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["judge", "--help"])
    shown = capsys.readouterr().out
    for setting in SETTINGS:
        if setting.read is not None:
            assert setting.flag in shown, setting.name
            assert setting.variable in shown, setting.name
    assert isinstance(parser, argparse.ArgumentParser)


# -- the keywords of before http= ----------------------------------------------------------


def test_the_http_keywords_of_before_still_work_for_one_release_with_a_warning() -> None:
    trace = tv.HttpSettings().trace_configs
    with pytest.warns(DeprecationWarning, match=r"give them as http=tv\.HttpSettings"):
        session = tv.Session.llama_cpp(
            URL,
            api_key="k",
            request_timeout=5,
            max_retries=0,
            trace_configs=trace,
            time_slice=None,
        )  # type: ignore[call-arg]
    assert isinstance(session.backend, tv.AsyncLlamaCpp)
    http = session.backend.config.http
    assert (http.api_key, http.request_timeout, http.retry.max_retries) == ("k", 5, 0)
    assert http.time_slice is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tv.Session.llama_cpp(URL, http=tv.HttpSettings(api_key="k"))  # no warning
