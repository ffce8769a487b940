"""The shapes of the server's replies: errors in OpenAI's shape,
`{"error": {"message", "type", "param", "code"}}` (raised as `ApiError`, or turned into it
from validation, cancellation and routing errors), token usage, and SSE events."""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.requests import Request

from workbench.models.base import Cancelled


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.code = code  # OpenAI's `code` when it says more than the status


# The code of a reply whose output constraint could not be kept: llguidance gave up on it
# mid-generation (a limit of its parser or lexer that the request's bounds did not foresee),
# or a reply made where its matcher cannot be seen breaks it. The constraint is the caller's,
# so it is a 400 (`invalid_request_error`, naming the field that asked for it), never a 200
# with a reply that breaks it (a user of structured outputs relies on a matching reply or an
# error), nor a 500; streamed, the error event comes in the stream, in the same shape.
CONSTRAINT_NOT_KEPT = "constraint_not_kept"


def constraint_error(field: str, message: str) -> dict[str, Any]:
    """The error body of a constraint that could not be kept (`CONSTRAINT_NOT_KEPT`)."""
    return error_body(f"{field}: {message}", "invalid_request_error", field,
                      CONSTRAINT_NOT_KEPT)


class WithinField(ValueError):
    """A request validator's error at a place within its field (`[2].function.parameters`
    of `tools`): the error handler names that place, not just the field."""

    def __init__(self, place: str, message: str):
        super().__init__(message)
        self.place = place


def error_body(message: str, kind: str, param: str | None, code: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def sse(body: dict[str, Any]) -> str:
    return f"data: {json.dumps(body)}\n\n"


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "dict", "list"}


def _field_path(loc) -> str:
    """A validation error's location as a request field, as OpenAI's errors name it and the
    guard's do (`messages[0].content`): pydantic also names the branch of a union it tried
    (`str`, `list[TextPart]`, `NamedToolChoice`), which is no field."""
    out = ""
    for x in loc:
        if isinstance(x, int):
            out += f"[{x}]"
        elif (isinstance(x, str) and re.fullmatch(r"[a-z_][a-z0-9_]*", x)
              and x not in _TYPE_TAGS and x != "body"):
            out += f".{x}" if out else x
    return out


def add_error_handlers(app) -> None:
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        return JSONResponse(error_body(exc.message, exc.kind, exc.param,
                                       exc.code or exc.status), status_code=exc.status)

    @app.exception_handler(Cancelled)
    async def _cancelled(_: Request, exc: Cancelled):  # the client has gone: nobody reads it
        return JSONResponse(error_body(str(exc), "client_closed_request", None, 499),
                            status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException):  # unknown route, method
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error", None,
                                       exc.status_code), status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        problems, params = [], []
        for err in exc.errors():
            field = _field_path(err.get("loc", ()))
            if err.get("type") == "extra_forbidden":
                problems.append(f"{field}: unsupported field (this server does not implement "
                                "it; leave it out)")
            elif err.get("type") == "json_invalid":
                problems.append(f"the body is not valid JSON ({err.get('msg')})")
                field = ""
            else:
                msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
                if isinstance(cause := (err.get("ctx") or {}).get("error"), WithinField):
                    field, msg = field + cause.place, str(cause)
                problems.append(f"{field}: {msg}" if field else msg)
            params.append(field or None)
        unique = list(dict.fromkeys(problems))
        return JSONResponse(error_body("; ".join(unique), "invalid_request_error",
                                       params[0] if params else None, "invalid_request"),
                            status_code=400)
