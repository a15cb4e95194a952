"""The versioned JSON file a pinned artefact (a calibration map, a fitted prior) is kept in:
its envelope (``format``, ``version``, ``created``, ``pins``, ``questions``), a SHA-256 of its
own canonical JSON (keys sorted, the digest left out), the indented file, and reading one back
as far as the envelope goes (JSON, its format, its version) and the digest check. What the
questions' entries hold is each artefact's own.
"""

from __future__ import annotations

import hashlib
from typing import Any

import attrs
import orjson

from typevet_async._errors import CalibrationError

__all__ = ["ArtefactFile", "canonical_sha256"]


def canonical_sha256(value: Any) -> str:
    """``sha256:`` of ``value``'s canonical JSON (keys sorted): an artefact's digest (its body,
    the digest left out), a question set's hash."""
    return "sha256:" + hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


@attrs.frozen
class ArtefactFile:
    """One kind of artefact file: its ``format`` and ``version``, and how its refusals name it
    (``kind``: "not a {kind}", "{kind} version ..."; ``subject``: "{subject} is not JSON",
    "{subject}'s sha256 ...")."""

    format: str
    version: int
    kind: str
    subject: str

    def body(
        self, created: str, pins: attrs.AttrsInstance, questions: dict[str, Any]
    ) -> dict[str, Any]:
        """The artefact's JSON without its digest (``pins``: its `Pins`)."""
        return {
            "format": self.format,
            "version": self.version,
            "created": created,
            "pins": attrs.asdict(pins),
            "questions": questions,
        }

    @staticmethod
    def to_json(body: dict[str, Any], sha256: str) -> bytes:
        """The file: ``body`` with its ``sha256``, indented for reading."""
        kept = {**body, "sha256": sha256}
        return orjson.dumps(kept, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"

    def read(self, data: bytes | str) -> dict[str, Any]:
        """A file's JSON object, of this format and version (its fields are the caller's).

        :raises CalibrationError: not JSON, not an object of this format, another version.
        """
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError as error:
            raise CalibrationError(f"{self.subject} is not JSON: {error}") from None
        if not isinstance(body, dict) or body.get("format") != self.format:
            raise CalibrationError(f"not a {self.kind}: 'format' is not {self.format!r}")
        if body.get("version") != self.version:
            raise CalibrationError(
                f"{self.kind} version {body.get('version')!r}; this SDK reads version "
                f"{self.version}"
            )
        return body

    def check_digest(self, written: Any, content: str) -> None:
        """Refuse a file whose ``sha256`` (``written``) is not its content's.

        :raises CalibrationError: it was changed after it was fitted (edited or cut short).
        """
        if written != content:
            raise CalibrationError(
                f"{self.subject}'s sha256 {written!r} is not its content's ({content}): "
                "it was changed after it was fitted"
            )
