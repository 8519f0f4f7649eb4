"""JSON responses rendered by orjson (FastAPI's ORJSONResponse is deprecated upstream).

Subclassing Starlette's JSONResponse keeps FastAPI documenting the response models."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse as _StarletteJSONResponse


class JSONResponse(_StarletteJSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
