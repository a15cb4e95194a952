"""``multipart/form-data`` System One requests (how the official client sends image assets):
the parts counted before the standard library's MIME parser sees them, each part claimed by
exactly one asset, then read as a JSON request is."""

from __future__ import annotations

import base64
import email.message
import email.parser
import email.policy
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs
import orjson

from typevet_async._core.wires.decoding import CpuClock, DecodeBudget, check_json_budget
from typevet_async._core.wires.system_one import (
    SystemOneCall,
    request_from_system_one,
    validation_detail,
)
from typevet_async._errors import BudgetExceededError, SystemOneValidationError

__all__ = [
    "MultipartPart",
    "count_multipart_parts",
    "media_type",
    "parse_multipart",
    "request_from_system_one_multipart",
]


def count_multipart_parts(body: bytes, boundary: str) -> int:
    """How many delimiter lines (``--boundary``) ``body`` holds: an upper bound on its parts plus
    one, counted in one pass of C before any parser looks at it."""
    delimiter = b"--" + boundary.encode("ascii", "replace")
    return body.count(b"\n" + delimiter) + (1 if body.startswith(delimiter) else 0)


# -- multipart requests ---------------------------------------------------------------------
#
# The official client (typesafe-sdk 0.7.5, ``_core/endpoints.py``: ``prepare_system_one`` and
# ``with_assets``) sends a request with image assets as ``multipart/form-data``: first a part
# named ``request`` (``application/json``, the JSON body, whose ``assets`` entries are
# ``{"type": "image", "part": "asset-N"}``), then one part per asset, named ``asset-N``, holding
# the image's raw bytes (``image/png``, ``image/jpeg`` or ``application/octet-stream``). The
# whole body is then zstd-compressed like any other of 1 KiB or more. Each part is claimed by
# exactly one asset; an image's format is read from its bytes, not from its part's label.


@attrs.frozen
class MultipartPart:
    """One part of a ``multipart/form-data`` body."""

    name: str
    #: The part's ``Content-Type``, if it has one.
    content_type: str | None
    data: bytes = attrs.field(repr=lambda data: f"<{len(data)} bytes>")


#: What an image part's bytes are recognised as: System One's formats, by signature.
_PART_FORMATS: Final = ((b"\x89PNG\r\n\x1a\n", "png"), (b"\xff\xd8\xff", "jpg"))


def media_type(content_type: str) -> str:
    """A ``Content-Type`` header's media type, in lower case (``"multipart/form-data"``)."""
    message = email.message.Message()
    message["Content-Type"] = content_type
    return message.get_content_type()


def _multipart_error(msg: str, loc: list[str | int] | None = None) -> SystemOneValidationError:
    return SystemOneValidationError([validation_detail(loc or ["body"], msg, "multipart_invalid")])


def parse_multipart(
    body: bytes, content_type: str, *, max_parts: int | None = None
) -> list[MultipartPart]:
    """The parts of a ``multipart/form-data`` body (RFC 7578), in order, read by the standard
    library's MIME parser (`email`); a preamble and an epilogue are ignored. With
    ``max_parts``, the parts are counted (one pass of C over the bytes) before the parser,
    whose time grows with them, sees the body.

    :raises SystemOneValidationError: ``content_type`` is not ``multipart/form-data`` with a
        boundary, the parser found a defect (no closing boundary, a malformed header), or a
        part is not ``form-data`` with a name.
    :raises BudgetExceededError: more than ``max_parts`` parts.
    """
    try:
        head = f"Content-Type: {content_type}\r\n\r\n".encode("ascii")
    except UnicodeEncodeError:
        head = b""
    if max_parts is not None and head:
        header = email.message.Message()
        header["Content-Type"] = content_type
        boundary = header.get_param("boundary")
        # n parts have n + 1 delimiter lines (the last one closing)
        if (
            isinstance(boundary, str)
            and boundary
            and count_multipart_parts(body, boundary) > max_parts + 1
        ):
            raise BudgetExceededError(
                f"the multipart body has more than {max_parts} parts", "parts"
            )
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    boundary = message.get_boundary()
    if (
        not head
        or message.get_content_type() != "multipart/form-data"
        or not boundary
        or not 1 <= len(boundary) <= 70
    ):
        raise _multipart_error(
            "the Content-Type must be multipart/form-data with a boundary of 1 to 70 ASCII "
            "characters",
            ["header", "content-type"],
        )
    if message.defects or not message.is_multipart():
        problems = "; ".join(type(defect).__name__ for defect in message.defects) or "no parts"
        raise _multipart_error(f"the body is not made of its parts ({problems})")
    parts: list[MultipartPart] = []
    for index, part in enumerate(message.iter_parts()):
        name = part.get_param("name", header="content-disposition")
        if part.defects:
            problems = "; ".join(type(defect).__name__ for defect in part.defects)
            raise _multipart_error(f"part {index} is malformed ({problems})")
        if part.get_content_disposition() != "form-data" or not isinstance(name, str) or not name:
            raise _multipart_error(
                f"part {index} needs a 'Content-Disposition: form-data; name=\"...\"' header"
            )
        data = part.get_payload(decode=True)
        content = part.get("Content-Type")
        parts.append(
            MultipartPart(
                name,
                None if content is None else str(content),
                data if isinstance(data, bytes) else b"",
            )
        )
    return parts


def _part_format(data: bytes) -> str | None:
    return next((fmt for signature, fmt in _PART_FORMATS if data.startswith(signature)), None)


def request_from_system_one_multipart(
    body: bytes,
    content_type: str,
    *,
    budget: DecodeBudget | None = None,
    clock: CpuClock | None = None,
    max_assets: int | None = None,
    max_questions: int | None = None,
    served_models: Sequence[str] = (),
) -> SystemOneCall:
    """A ``multipart/form-data`` System One request (as the official client sends one with
    image assets) as the SDK judges it: the ``request`` part's JSON, each asset's ``part``
    replaced by that part's bytes, then read as `request_from_system_one` reads a JSON body.

    With a ``budget``, its parts are counted before they are parsed and the ``request``
    part's JSON is checked against it (``clock``: the CPU time the decode has left).

    :raises SystemOneValidationError: a body that is not multipart, no ``request`` part or one
        that is not JSON, two parts of one name, an asset naming a part that is missing or
        already claimed, a part no asset claims, a part that is not a PNG or JPEG image, and
        anything `request_from_system_one` refuses; ``detail`` lists every problem found.
    :raises BudgetExceededError: past ``budget``.
    """
    max_parts = budget.max_parts if budget is not None else None
    by_name = _parts_by_name(parse_multipart(body, content_type, max_parts=max_parts))
    data = _request_part_json(by_name.pop("request", None), budget, clock)
    detail: list[dict[str, Any]] = []
    claimed: dict[str, str] = {}  # part name -> the asset that claims it
    assets = data.get("assets") if isinstance(data, dict) else None
    if isinstance(assets, dict):
        data = {**data, "assets": _inline_assets(assets, by_name, claimed, detail)}
    detail.extend(_unclaimed_parts(by_name, claimed))
    try:
        call = request_from_system_one(
            data, max_assets=max_assets, max_questions=max_questions, served_models=served_models
        )
    except SystemOneValidationError as error:
        raise SystemOneValidationError(detail + error.detail) from None
    if detail:
        raise SystemOneValidationError(detail)
    return call


def _parts_by_name(parts: list[MultipartPart]) -> dict[str, MultipartPart]:
    """The parts keyed by name, in order.

    :raises SystemOneValidationError: two parts of one name.
    """
    by_name: dict[str, MultipartPart] = {}
    for part in parts:
        if part.name in by_name:
            raise _multipart_error(f"two parts are named {part.name!r}", ["body", part.name])
        by_name[part.name] = part
    return by_name


def _request_part_json(
    request: MultipartPart | None, budget: DecodeBudget | None, clock: CpuClock | None
) -> Any:
    """The ``request`` part's JSON, checked against ``budget`` if there is one.

    :raises SystemOneValidationError: no ``request`` part, or one that is not JSON.
    :raises BudgetExceededError: past ``budget``.
    """
    if request is None:
        raise SystemOneValidationError(
            [
                validation_detail(
                    ["body", "request"],
                    "a multipart body needs a part named 'request' holding the JSON request",
                    "missing",
                )
            ]
        )
    try:
        data = orjson.loads(request.data)
    except orjson.JSONDecodeError as error:
        raise SystemOneValidationError(
            [validation_detail(["body", "request"], f"not valid JSON: {error}", "json_invalid")]
        ) from None
    if budget is not None:
        check_json_budget(data, budget, clock or CpuClock(budget.cpu_seconds), "the request part")
    return data


def _inline_assets(
    assets: dict[Any, Any],
    parts: Mapping[str, MultipartPart],
    claimed: dict[str, str],
    detail: list[dict[str, Any]],
) -> dict[str, Any]:
    """``assets`` with each one that names a ``part`` replaced by that part's bytes (each
    claim recorded in ``claimed``); an asset whose part is refused is left out and its detail
    entry added to ``detail`` (its placeholder then stays text)."""
    inlined: dict[str, Any] = {}
    for name, asset in assets.items():
        if not isinstance(asset, dict) or asset.get("part") is None:
            inlined[name] = asset
            continue
        image = _claim_part(str(name), asset, parts, claimed)
        if isinstance(image, dict) and "loc" in image:
            detail.append(image)
        else:
            inlined[name] = image
    return inlined


def _unclaimed_parts(
    parts: Mapping[str, MultipartPart], claimed: Mapping[str, str]
) -> list[dict[str, Any]]:
    """A detail entry for each part no asset claims."""
    return [
        validation_detail(
            ["body", part_name],
            "no asset claims this part: each part is claimed by exactly one asset",
            "value_error",
        )
        for part_name in parts
        if part_name not in claimed
    ]


def _claim_part(
    name: str, asset: dict[str, Any], parts: Mapping[str, MultipartPart], claimed: dict[str, str]
) -> dict[str, Any]:
    """The JSON asset that ``asset``'s part stands for (its bytes as ``data_base64``, its
    format read from them), or the detail entry refusing it."""
    loc: list[str | int] = ["body", "assets", name, "part"]
    part_name = asset["part"]
    part = parts.get(part_name) if isinstance(part_name, str) else None
    if part is None:
        return validation_detail(
            loc, f"no part of the body is named {part_name!r}", "value_error", part_name
        )
    if part_name in claimed:
        return validation_detail(
            loc,
            f"part {part_name!r} is already claimed by asset {claimed[part_name]!r}: each part "
            "is claimed by exactly one asset",
            "value_error",
            part_name,
        )
    claimed[part_name] = name
    fmt = _part_format(part.data)
    if fmt is None:
        return validation_detail(
            loc,
            f"part {part_name!r} is not a PNG or JPEG image",
            "enum",
            part.content_type,
            {"expected": "'png', 'jpg' or 'jpeg'"},
        )
    return {
        "type": asset.get("type", "image"),
        "format": fmt,
        "data_base64": base64.b64encode(part.data).decode("ascii"),
    }
