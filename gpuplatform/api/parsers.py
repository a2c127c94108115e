"""The API's JSON parser: bounded in size and in nesting, so no body can crash a view."""

import io
from collections.abc import Mapping
from typing import IO, Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_BODY_BYTES = 1024 * 1024


class BoundedJSONParser(JSONParser):
    """JSON bodies up to 1 MB. Over that, or nested deeper than Python can follow, is a
    400 `parse_error` instead of a hang or a 500."""

    max_bytes = MAX_BODY_BYTES

    def parse(
        self,
        stream: IO[Any] | None,
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        data = stream.read(self.max_bytes + 1) if stream is not None else b""
        if len(data) > self.max_bytes:
            raise ParseError(f"the request body is over {self.max_bytes // 1024} KiB")
        try:
            return super().parse(io.BytesIO(data), media_type, parser_context)
        except RecursionError as exc:
            raise ParseError("JSON nested too deeply") from exc
