from __future__ import annotations

from typing import Any

import pytest

import typevet_async as tv


def test_noul_options_are_false_then_true() -> None:
    noul = tv.Noul(instructions="Refund?", criteria={"true": "asks for money back"})
    assert [(o.label, o.description) for o in noul.options()] == [
        ("false", None),
        ("true", "asks for money back"),
    ]


def test_choice_keeps_insertion_order_and_descriptions() -> None:
    choice = tv.Choice({"b": "bee", "a": None, "c": "  "}, instructions=" Pick one ")
    assert choice.labels == ("b", "a", "c")
    assert [o.description for o in choice.options()] == ["bee", None, None]
    assert choice.instructions == "Pick one"


def test_score_levels_become_options_by_index() -> None:
    score = tv.Score(["low", "mid", "high"], instructions="How much?")
    assert [(o.label, o.description) for o in score.options()] == [
        ("0", "low"),
        ("1", "mid"),
        ("2", "high"),
    ]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: tv.Choice({"only": None}, instructions="x"), "at least two labels"),
        (lambda: tv.Choice({"a": None, " a ": None}, instructions="x"), "distinct"),
        (lambda: tv.Choice({"": None, "b": None}, instructions="x"), "non-empty"),
        (lambda: tv.Choice({"a": 3, "b": None}, instructions="x"), "description of 'a'"),
        (lambda: tv.Choice("ab", instructions="x"), "mapping"),
        (lambda: tv.Score(["one"], instructions="x"), "at least two levels"),
        (lambda: tv.Score(["one", ""], instructions="x"), "non-empty"),
        (lambda: tv.Noul(instructions="x", criteria={"yes": "y"}), "only 'true' and 'false'"),
        (lambda: tv.Noul(instructions="   "), "instructions"),
        (lambda: tv.Noul(instructions=None), "instructions"),
    ],
)
def test_bad_questions_are_refused_at_construction(build: Any, message: str) -> None:
    with pytest.raises(tv.QuestionError, match=message) as caught:
        build()
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, tv.TypevetError)


def test_questions_are_frozen() -> None:
    import attrs

    noul = tv.Noul(instructions="x")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        noul.instructions = "y"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: tv.Choice(["a\nb", "a b"], instructions="x"),
            r"Choice labels 'a\\nb' and 'a b' render identically in the prompt \('a b'\)",
        ),
        (
            lambda: tv.Choice(["<x>", "‹x›"], instructions="x"),
            "Choice labels '<x>' and '‹x›' render identically in the prompt",
        ),
        (
            lambda: tv.Choice(["a\u2028b", "a\r\n b", "c"], instructions="x"),
            r"Choice labels 'a\\u2028b' and 'a\\r\\n b' render identically",
        ),
        (
            lambda: tv.Choice({"a: b": None, "a": "b"}, instructions="x"),
            "Choice options 'a: b' and 'a' render identically in the prompt",
        ),
        (
            lambda: tv.Score(["<low>", "‹low›", "high"], instructions="x"),
            "Score levels '<low>' and '‹low›' render identically",
        ),
        (
            lambda: tv.Score(["low\n", "low", "high"], instructions="x"),
            "Score levels must be distinct, 'low' appears twice",
        ),
        (
            lambda: tv.Score(["low\nish", "low ish"], instructions="x"),
            "Score levels 'low\\\\nish' and 'low ish' render identically",
        ),
    ],
)
def test_options_that_render_identically_are_refused_naming_both(build: Any, message: str) -> None:
    with pytest.raises(tv.QuestionError, match=message):
        build()


def test_options_that_only_look_alike_before_rendering_are_kept() -> None:
    assert tv.Choice(["<x>", "x", "‹y›"], instructions="x").labels == ("<x>", "x", "‹y›")
    assert tv.Choice({"a": "b", "a b": None}, instructions="x").labels == ("a", "a b")
    assert tv.Score(["Low", "low"], instructions="x").levels == ("Low", "low")
