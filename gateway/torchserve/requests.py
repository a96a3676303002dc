"""A TorchServe request from an HTTP request, as TorchServe's frontend builds it.

Every query parameter is an input parameter (its value as text, no content type); a
multipart or URL-encoded form gives one parameter per field (a file keeps its content
type); any other body is the parameter ``body`` with the request's media type. Every request
header goes to the handler (``context.get_request_header``), and ``explain`` is ``"True"``
on ``/explanations`` and ``"False"`` on ``/predictions``, as TorchServe sets it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from starlette.datastructures import Headers, QueryParams, UploadFile
from starlette.formparsers import FormParser, MultiPartException, MultiPartParser

from weir.errors import InvalidInput
from weir.torchserve.envelope import Parameter, TsRequest

MULTIPART = "multipart/form-data"
URLENCODED = "application/x-www-form-urlencoded"
MAX_FORM_PARTS = 1000


def media_type(headers: Headers) -> str:
    """The request's media type without its parameters (``charset``, ``boundary``)."""
    return headers.get("content-type", "").split(";", 1)[0].strip().lower()


async def ts_request(headers: Headers, query: bytes, body: bytes, explain: bool) -> TsRequest:
    """The TorchServe request an HTTP request of these headers, query string and body makes."""
    parameters = [Parameter(k, "", v.encode()) for k, v in QueryParams(query).multi_items()]
    kind = media_type(headers)
    if kind in (MULTIPART, URLENCODED):
        parameters.extend(await _form(headers, body, kind))
    else:
        parameters.append(Parameter("body", kind, body))
    handed = dict(headers.items())
    handed["explain"] = "True" if explain else "False"
    return TsRequest(parameters, handed)


async def _form(headers: Headers, body: bytes, kind: str) -> list[Parameter]:
    try:
        if kind == MULTIPART:
            parser = MultiPartParser(
                headers,
                _once(body),
                max_files=MAX_FORM_PARTS,
                max_fields=MAX_FORM_PARTS,
                max_part_size=len(body) + 1,
            )
            form = await parser.parse()
        else:
            form = await FormParser(headers, _once(body)).parse()
    except MultiPartException as exc:
        raise InvalidInput(f"malformed form data: {exc.message}") from None
    parameters = []
    for name, value in form.multi_items():
        if isinstance(value, UploadFile):
            data = await value.read()
            parameters.append(Parameter(name, value.content_type or "", data))
        else:
            parameters.append(Parameter(name, "", value.encode()))
    await form.close()
    return parameters


async def _once(body: bytes) -> AsyncGenerator[bytes, None]:
    yield body
    yield b""
