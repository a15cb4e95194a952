"""Images for requests that take them: checked by their bytes, capped in size, sent as data URIs.

Every `Image` is checked when it is built, however it is built (``Image(data, mime)``,
`Image.from_bytes`, `Image.from_path`): bytes, not empty, a supported type that its bytes'
signature confirms. The size cap is a caller's choice: `from_bytes` and `from_path` take one,
and every call checks the session's ``max_image_bytes`` (`check_images`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from typevet_async._errors import InvalidInputError

__all__ = [
    "DEFAULT_MAX_IMAGES",
    "DEFAULT_MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "NO_IMAGES",
    "Image",
    "JudgmentImages",
    "check_images",
    "check_judgment_images",
    "image_size",
]

#: Default cap on one image's size, checked before anything is encoded.
DEFAULT_MAX_IMAGE_BYTES = 10 * 1024 * 1024
#: Default cap on the images one judgment or generation takes.
DEFAULT_MAX_IMAGES = 8

#: The most pixels an image may declare in its header: a few hundred bytes can declare a
#: 20,000 x 20,000 image that a vision server would decode to 1.6 GB.
MAX_IMAGE_PIXELS = 50_000_000

_SUPPORTED = ("image/jpeg", "image/png", "image/webp")
#: JPEG's start-of-frame markers (the frame header holds the size); C4, C8 and CC are not.
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def image_size(data: bytes) -> tuple[int, int] | None:
    """The width and height an image's header declares (PNG, JPEG, WebP), read without
    decoding it; None where the header is cut short or not one of these."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return width, height
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        chunk = data[12:16]
        if chunk == b"VP8X" and len(data) >= 30:
            return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(
                data[27:30], "little"
            )
        if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
            bits = int.from_bytes(data[21:25], "little")
            return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
        if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
            width, height = struct.unpack("<HH", data[26:30])
            return width & 0x3FFF, height & 0x3FFF
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """A JPEG's size from its frame header: segment by segment (each step skips a segment by
    its length, so a hostile file costs one pass)."""
    index = 2
    while index + 4 <= len(data):
        if data[index] != 0xFF:
            return None
        marker = data[index + 1]
        if marker == 0xFF:  # fill byte
            index += 1
            continue
        if marker in _JPEG_FRAMES:
            if index + 9 > len(data):
                return None
            height, width = struct.unpack(">HH", data[index + 5 : index + 9])
            return width, height
        (length,) = struct.unpack(">H", data[index + 2 : index + 4])
        if length < 2:
            return None
        index += 2 + length
    return None


def _sniff(data: bytes) -> str | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


def _image_bytes(value: Any) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidInputError(f"image data must be bytes, got {type(value).__name__}")
    return bytes(value)


def _check_mime_type(image: Image, _: attrs.Attribute[Any], mime_type: Any) -> None:
    if not image.data:
        raise InvalidInputError("image data is empty")
    if not isinstance(mime_type, str) or mime_type not in _SUPPORTED:
        raise InvalidInputError(
            f"image type {mime_type!r} is not supported; use one of {list(_SUPPORTED)}"
        )
    sniffed = _sniff(image.data[:16])
    if sniffed != mime_type:
        raise InvalidInputError(
            f"image bytes are {sniffed or 'not a supported image'}, not {mime_type}"
        )
    size = image_size(image.data)
    if size is not None and size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise InvalidInputError(
            f"the image declares {size[0]} x {size[1]} pixels, past the cap of "
            f"{MAX_IMAGE_PIXELS:,} pixels"
        )


def _check_cap(max_bytes: Any) -> None:
    if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 1:
        raise InvalidInputError(f"max_bytes must be a positive integer, got {max_bytes!r}")


@attrs.frozen(repr=False)
class Image:
    """A PNG, JPEG or WebP image; its MIME type must match its bytes, and the size its header
    declares must be at most `MAX_IMAGE_PIXELS` (checked when built).

    :raises InvalidInputError: data that is not bytes or is empty, an unsupported type, bytes
        whose signature is not the declared type, or a header that declares too many pixels.
    """

    data: bytes = attrs.field(converter=_image_bytes)
    # Checked after ``data`` (attrs runs validators in field order, after every converter).
    mime_type: str = attrs.field(validator=_check_mime_type)

    def __repr__(self) -> str:
        return f"Image({self.mime_type}, {len(self.data)} bytes)"

    @classmethod
    def from_bytes(
        cls, data: bytes, mime_type: str, *, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    ) -> Image:
        """The image of ``data``, once it is at most ``max_bytes`` (checked before any copy)."""
        _check_cap(max_bytes)
        if isinstance(data, bytes | bytearray | memoryview) and len(data) > max_bytes:
            raise InvalidInputError(f"image of {len(data)} bytes exceeds the {max_bytes}-byte cap")
        return cls(data, mime_type)

    @classmethod
    def from_path(cls, path: str | Path, *, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> Image:
        """Read an image file; its type comes from its bytes, its size is checked first."""
        _check_cap(max_bytes)
        file = Path(path)
        size = file.stat().st_size
        if size > max_bytes:
            raise InvalidInputError(
                f"image {file} of {size} bytes exceeds the {max_bytes}-byte cap"
            )
        data = file.read_bytes()
        mime_type = _sniff(data[:16])
        if mime_type is None:
            raise InvalidInputError(f"{file} is not a PNG, JPEG or WebP image")
        return cls.from_bytes(data, mime_type, max_bytes=max_bytes)

    def data_uri(self) -> str:
        return f"data:{self.mime_type};base64,{base64.b64encode(self.data).decode('ascii')}"

    @functools.cached_property
    def sha256(self) -> str:
        """The hex SHA-256 of ``data``: what a read cache's key holds (computed once per
        image, not once per question that shows it)."""
        return hashlib.sha256(self.data).hexdigest()


def check_images(
    images: Image | Sequence[Image], *, max_images: int, max_bytes: int
) -> tuple[Image, ...]:
    """The images of one call, once their count, type and sizes pass the session's caps.

    The one check of a call's images: judgments and generations both use it.

    :raises InvalidInputError: too many images, one that is not an `Image`, or one too large.
    """
    if isinstance(images, Image):
        checked: tuple[Image, ...] = (images,)
    elif isinstance(images, tuple):  # the default (), without the slower ABC check
        checked = images
    elif isinstance(images, Sequence) and not isinstance(images, str | bytes | bytearray):
        checked = tuple(images)
    else:
        raise InvalidInputError(
            f"images must be a tv.Image or a sequence of them (raw bytes: tv.Image.from_bytes), "
            f"got {type(images).__name__}"
        )
    if len(checked) > max_images:
        raise InvalidInputError(
            f"{len(checked)} images, but this session takes at most {max_images}"
        )
    for image in checked:
        if not isinstance(image, Image):
            raise InvalidInputError(f"images must be tv.Image, got {type(image).__name__}")
        if len(image.data) > max_bytes:
            raise InvalidInputError(
                f"an image of {len(image.data)} bytes exceeds this session's {max_bytes}-byte cap"
            )
    return checked


@attrs.frozen(eq=False)
class JudgmentImages:
    """A judgment's images, checked: the state's, shown before it in every question's reads,
    and each question's own, shown with its instructions in its own reads only."""

    state: tuple[Image, ...] = ()
    #: Question id -> its own images (only questions that have some).
    questions: Mapping[str, tuple[Image, ...]] = attrs.field(factory=dict)

    def __bool__(self) -> bool:
        return bool(self.state or self.questions)

    def of(self, question_id: str) -> tuple[Image, ...]:
        """The images ``question_id``'s reads show after the state."""
        return self.questions.get(question_id, ())


#: A judgment without images.
NO_IMAGES = JudgmentImages()


def check_judgment_images(
    images: Image | Sequence[Image],
    question_images: Mapping[str, Image | Sequence[Image]] | None,
    questions: Sequence[tuple[str, object]],
    *,
    max_images: int,
    max_bytes: int,
) -> JudgmentImages:
    """A judgment's images once each passes `check_images` and, all together, the session's
    ``max_images``; each question's own keyed by the id of one of ``questions``.

    :raises InvalidInputError: as `check_images`; ``question_images`` not a mapping, or naming
        a question the judgment does not ask; more images in all than ``max_images``.
    """
    state = check_images(images, max_images=max_images, max_bytes=max_bytes)
    if not question_images:
        if question_images is not None and not isinstance(question_images, Mapping):
            raise InvalidInputError(
                f"question_images must map question ids to images, got {question_images!r}"
            )
        return JudgmentImages(state) if state else NO_IMAGES
    if not isinstance(question_images, Mapping):
        raise InvalidInputError(
            "question_images must map question ids to a tv.Image or a sequence of them, got "
            f"{type(question_images).__name__}"
        )
    question_ids = {question_id for question_id, _ in questions}
    own: dict[str, tuple[Image, ...]] = {}
    for question_id, given in question_images.items():
        if question_id not in question_ids:
            raise InvalidInputError(
                f"question_images names {question_id!r}, which this judgment does not ask"
            )
        try:
            checked = check_images(given, max_images=max_images, max_bytes=max_bytes)
        except InvalidInputError as error:
            raise InvalidInputError(f"question_images[{question_id!r}]: {error}") from None
        if checked:
            own[question_id] = checked
    total = len(state) + sum(len(each) for each in own.values())
    if total > max_images:
        raise InvalidInputError(
            f"{total} images in this judgment (its own and its questions'), but this session "
            f"takes at most {max_images}"
        )
    return JudgmentImages(state, own)
