"""Budgeted decoding (`typevet_async._core.wires.decoding`, the gateway's encoding and multipart)
and the System One request reader's limits: each hostile shape the servers met, refused by the
budget's mechanism in bounded time."""

from __future__ import annotations

import base64
import gzip
import time
from typing import Any

import pytest
from backports import zstd

from typevet_async._apps.gateway.encoding import decompress
from typevet_async._apps.gateway.multipart import (
    count_multipart_parts,
    parse_multipart,
    request_from_system_one_multipart,
)
from typevet_async._core.wires.decoding import CpuClock, DecodeBudget, check_json_budget
from typevet_async._core.wires.system_one import request_from_system_one
from typevet_async._errors import (
    BadEncodingError,
    BodyTooLargeError,
    BudgetExceededError,
    InvalidInputError,
    SystemOneValidationError,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 32


def clock() -> CpuClock:
    return CpuClock(30.0)


def test_many_empty_zstd_frames_stop_at_the_frame_cap_at_once() -> None:
    # 2 MiB of empty frames stalled the gateway's loop 12-13 s: each frame a new decompressor
    # and a copy of the rest of the body.
    body = zstd.compress(b"") * 233_000
    began = time.perf_counter()
    with pytest.raises(BudgetExceededError, match="more than 16 frames") as caught:
        decompress(body, "zstd", DecodeBudget(), clock())
    assert caught.value.limit == "frames"
    assert time.perf_counter() - began < 0.5


def test_zstd_frames_are_walked_in_place_in_linear_time() -> None:
    # Under the frame cap the walk copies nothing: 16 frames of a large body cost one pass.
    payload = b"x" * (256 * 1024)
    body = zstd.compress(payload) * 16
    out = decompress(body, "zstd", DecodeBudget(max_bytes=len(payload) * 16), clock())
    assert out == payload * 16
    with pytest.raises(BodyTooLargeError):
        decompress(body, "zstd", DecodeBudget(max_bytes=len(payload) * 16 - 1), clock())


@pytest.mark.parametrize(
    ("body", "encoding", "message"),
    [
        (zstd.compress(b"abc")[:-2], "zstd", "not a zstd body"),
        (b"garbage", "zstd", "not a zstd body"),
        (gzip.compress(b"abc")[:-4], "gzip", "cut short"),
        (gzip.compress(b"abc") + b"tail", "gzip", "bytes after its end"),
        (b"abc", "br", "'br' is not accepted"),
    ],
)
def test_a_body_that_does_not_decode_is_a_bad_encoding(
    body: bytes, encoding: str, message: str
) -> None:
    with pytest.raises(BadEncodingError, match=message):
        decompress(body, encoding, DecodeBudget(), clock())


def test_an_identity_body_past_the_cap_is_too_large() -> None:
    with pytest.raises(BodyTooLargeError):
        decompress(b"x" * 11, "identity", DecodeBudget(max_bytes=10), clock())


def test_a_decode_past_its_cpu_time_stops() -> None:
    spent = CpuClock(0.001)
    deadline = time.thread_time() + 0.01
    while time.thread_time() < deadline:  # use the clock's time up
        pass
    with pytest.raises(BudgetExceededError, match="CPU time") as caught:
        check_json_budget([[0] * 10] * 10_000, DecodeBudget(), spent)
    assert caught.value.limit == "cpu"


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = [value]
    return value


def test_json_depth_is_counted_without_recursion() -> None:
    check_json_budget(nested(128), DecodeBudget(max_depth=128), clock())
    for depth in (129, 1_000, 100_000):  # deeper than Python's recursion limit too
        with pytest.raises(BudgetExceededError, match="deeper than 128 levels") as caught:
            check_json_budget(nested(depth), DecodeBudget(max_depth=128), clock())
        assert caught.value.limit == "depth"


def test_json_items_are_counted_before_a_huge_array_is_walked() -> None:
    check_json_budget([0] * 99, DecodeBudget(max_items=100), clock())
    with pytest.raises(BudgetExceededError, match="more than 100 JSON values") as caught:
        check_json_budget([0] * 100, DecodeBudget(max_items=100), clock())
    assert caught.value.limit == "items"
    began = time.perf_counter()
    with pytest.raises(BudgetExceededError):
        check_json_budget({"state": [0] * 5_000_000}, DecodeBudget(), clock())
    assert time.perf_counter() - began < 0.5


@pytest.mark.parametrize("field", ["max_bytes", "max_items", "max_depth", "max_parts"])
def test_a_budget_needs_positive_limits(field: str) -> None:
    with pytest.raises(InvalidInputError, match=field):
        DecodeBudget(**{field: 0})


def multipart(parts: int, boundary: str = "b0und") -> bytes:
    chunks = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="p{i}"\r\n\r\nx\r\n'.encode()
        for i in range(parts)
    ]
    return b"".join(chunks) + f"--{boundary}--\r\n".encode()


def test_multipart_parts_are_counted_before_the_parser_sees_them() -> None:
    assert count_multipart_parts(multipart(3), "b0und") == 4
    body = multipart(30_000)
    began = time.perf_counter()
    with pytest.raises(BudgetExceededError, match="more than 33 parts") as caught:
        parse_multipart(body, "multipart/form-data; boundary=b0und", max_parts=33)
    assert caught.value.limit == "parts"
    assert time.perf_counter() - began < 0.5
    assert (
        len(parse_multipart(multipart(33), "multipart/form-data; boundary=b0und", max_parts=33))
        == 33
    )


def test_a_multipart_request_part_is_held_to_the_json_budget() -> None:
    request = b'{"model": "m", "state": ' + b"[" * 200 + b"]" * 200 + b', "questions": {}}'
    body = (
        b'--b\r\nContent-Disposition: form-data; name="request"\r\n'
        b"Content-Type: application/json\r\n\r\n" + request + b"\r\n--b--\r\n"
    )
    with pytest.raises(BudgetExceededError, match="the request part nests deeper"):
        request_from_system_one_multipart(
            body, "multipart/form-data; boundary=b", budget=DecodeBudget(), clock=clock()
        )


def noul() -> dict[str, Any]:
    return {"type": "noul", "instructions": "Refund?"}


def test_too_many_questions_are_refused_before_any_is_read() -> None:
    questions = {f"q{i}": noul() for i in range(401)}
    with pytest.raises(SystemOneValidationError) as caught:
        request_from_system_one(
            {"model": "m", "state": "s", "questions": questions}, max_questions=400
        )
    (entry,) = caught.value.detail
    assert entry["loc"] == ["body", "questions"]
    assert entry["type"] == "too_long"
    assert entry["ctx"] == {"max_length": 400}


def test_too_many_assets_are_refused_before_a_placeholder_is_looked_for() -> None:
    assets = {
        f"<img{i}>": {"type": "image", "format": "png", "data_base64": "AA=="} for i in range(2_000)
    }
    state = {"lines": [f"line {i}" for i in range(20_000)]}
    began = time.perf_counter()
    with pytest.raises(SystemOneValidationError) as caught:
        request_from_system_one(
            {"model": "m", "state": state, "questions": {"q": noul()}, "assets": assets},
            max_assets=32,
        )
    assert [entry["loc"] for entry in caught.value.detail] == [["body", "assets"]]
    assert time.perf_counter() - began < 0.5


def test_placeholders_are_found_by_one_pattern_per_request() -> None:
    # 2,000 assets over 20,000 strings blocked the loop 17-18 s: a pattern compiled per string.
    data = base64.b64encode(PNG).decode()
    assets = {
        f"<img{i}>": {"type": "image", "format": "png", "data_base64": data} for i in range(200)
    }
    lines = [f"line {i}" for i in range(20_000)]
    lines[7] = "see <img3> and <img1>"
    lines[9_000] = "again <img3>"
    state = {"first": "<img0>", "lines": lines}
    questions = {"q": {"type": "noul", "instructions": f"Do {' '.join(assets)} match?"}}
    began = time.perf_counter()
    call = request_from_system_one(
        {"model": "m", "state": state, "questions": questions, "assets": assets}
    )
    assert time.perf_counter() - began < 5.0
    # numbered in reading order: the state's keys in order, depth first, then the questions
    assert call.state["first"] == "[image 1]"
    assert call.state["lines"][7] == "see [image 2] and [image 3]"
    assert call.state["lines"][9_000] == "again [image 2]"
    assert len(call.images) == 200
