"""Images for requests that take them: checked by their bytes, capped in size, sent as data URIs."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path

import attrs

from typevet_async._errors import InvalidInputError

__all__ = ["DEFAULT_MAX_IMAGES", "DEFAULT_MAX_IMAGE_BYTES", "Image", "check_images"]

#: Default cap on one image's size, checked before anything is encoded.
DEFAULT_MAX_IMAGE_BYTES = 10 * 1024 * 1024
#: Default cap on the images one judgment or generation takes.
DEFAULT_MAX_IMAGES = 8

_SUPPORTED = ("image/jpeg", "image/png", "image/webp")


def _sniff(data: bytes) -> str | None:
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


@attrs.frozen(repr=False)
class Image:
    """A PNG, JPEG or WebP image; its MIME type must match its bytes."""

    data: bytes
    mime_type: str

    def __repr__(self) -> str:
        return f"Image({self.mime_type}, {len(self.data)} bytes)"

    @classmethod
    def from_bytes(
        cls, data: bytes, mime_type: str, *, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    ) -> Image:
        if not isinstance(data, bytes | bytearray):
            raise InvalidInputError(f"image data must be bytes, got {type(data).__name__}")
        if len(data) > max_bytes:
            raise InvalidInputError(f"image of {len(data)} bytes exceeds the {max_bytes}-byte cap")
        if mime_type not in _SUPPORTED:
            raise InvalidInputError(
                f"image type {mime_type!r} is not supported; use one of {list(_SUPPORTED)}"
            )
        sniffed = _sniff(bytes(data[:16]))
        if sniffed != mime_type:
            raise InvalidInputError(
                f"image bytes are {sniffed or 'not a supported image'}, not {mime_type}"
            )
        return cls(bytes(data), mime_type)

    @classmethod
    def from_path(cls, path: str | Path, *, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> Image:
        """Read an image file; its type comes from its bytes, its size is checked first."""
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


def check_images(
    images: Image | Sequence[Image], *, max_images: int, max_bytes: int
) -> tuple[Image, ...]:
    """The images of one call, once their count, type and sizes pass the session's caps.

    The one check of a call's images: judgments and generations both use it.

    :raises InvalidInputError: too many images, one that is not an `Image`, or one too large.
    """
    checked = (images,) if isinstance(images, Image) else tuple(images)
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
