"""OpenAI's Files API: `POST /v1/files` keeps an image, a PDF or a clip for a time to live, and
its `file_id` then stands for it in any image, file or video part. An upload is read ahead in
idle time (its views encoded, and its opening block prefilled into the image-prefix cache), so
the question that names it later pays only for itself (issue 53)."""

from __future__ import annotations

import email.policy
from email.message import EmailMessage
from email.parser import BytesParser
from typing import Any, cast

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from edgevlm.errors import ImageError
from edgevlm.server import schemas as sc
from edgevlm.server.http import ApiError, bad_request, read_bytes, shown
from edgevlm.server.media import PageRoom, is_video_bytes, uploaded
from edgevlm.server.turns import ServerState, state_of
from edgevlm.store.uploads import StoredFile, UploadKind, UploadRefused, UploadStore
from edgevlm.vision.images import load_image_bytes
from edgevlm.vision.readers import format_of

PURPOSES = ("vision", "user_data")
MAX_FILENAME_CHARS = 255

router = APIRouter(prefix="/v1", responses=sc.errors(sc.OpenAIError, 400, 401, 404, 408, 413))

_UPLOAD_BODY = {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary"},
                   "purpose": {"type": "string", "enum": list(PURPOSES)}}}}}}}


@router.post("/files", response_model=None, openapi_extra=_UPLOAD_BODY)
async def create_file(request: Request) -> dict[str, object]:
    """Keep an upload (multipart: `file`, `purpose` vision or user_data) and read it ahead."""
    state = state_of(request)
    uploads = _uploads(state)
    content_type = request.headers.get("content-type", "")
    if not content_type.lower().startswith("multipart/form-data"):
        raise bad_request("expected multipart/form-data with a file and its purpose (as the OpenAI "
                          "clients send it)", code="invalid_content_type")
    body = await read_bytes(request, state.max_body_bytes)
    fields = await run_in_threadpool(_form, content_type, body)
    purpose = _text(fields.get("purpose"))
    if purpose not in PURPOSES:
        raise bad_request(f"purpose must be {' or '.join(PURPOSES)} (got {shown(purpose, 40)!r})", "purpose",
                          code="invalid_purpose")
    upload = fields.get("file")
    if upload is None or upload.get_filename() is None:
        raise bad_request("expected the file as a part named file, with a filename", "file")
    raw = upload.get_payload(decode=True)
    data = raw if isinstance(raw, bytes) else b""
    filename = shown(upload.get_filename() or "upload", MAX_FILENAME_CHARS)
    kind = await run_in_threadpool(_kind_of, data)
    try:
        stored = uploads.add(data, filename=filename, purpose=purpose, kind=kind)
    except UploadRefused as exc:
        status, code = (413, "file_too_large") if exc.too_large else (400, "too_many_files")
        raise ApiError(status, str(exc), param="file", code=code) from None
    try:  # what a message naming it would show, read ahead in idle time
        room = PageRoom(state.model.n_ctx - state.max_tokens, state.image_floor)
        media = await run_in_threadpool(uploaded, stored.id, "file", uploads=uploads, room=room,
                                        useful_pixels=state.useful_pixels, scaffold=state.video_frames)
        state.read_ahead(media, stored.id)
    except ApiError:  # too many pages to show at once, say: a message naming it gets the 400
        pass
    return _entry(stored, uploads)


@router.get("/files")
async def list_files(request: Request) -> dict[str, object]:
    """The files kept now, newest first, in OpenAI's list shape."""
    uploads = _uploads(state_of(request))
    files = [_entry(stored, uploads) for stored in uploads.listed()]
    return {"object": "list", "data": files, "has_more": False,
            "first_id": files[0]["id"] if files else None, "last_id": files[-1]["id"] if files else None}


@router.get("/files/{file_id}")
async def get_file(request: Request, file_id: str) -> dict[str, object]:
    """One file's record; a 404 once it is deleted or expired."""
    uploads = _uploads(state_of(request))
    return _entry(_found(uploads, file_id), uploads)


@router.get("/files/{file_id}/content", response_model=None,
            responses={200: {"description": "the file's bytes", "content": {"application/octet-stream": {}}}})
async def file_content(request: Request, file_id: str) -> Response:
    """A kept file's bytes, as they were uploaded."""
    uploads = _uploads(state_of(request))
    stored = _found(uploads, file_id)
    data = uploads.read(stored.id)
    if data is None:
        raise _missing(file_id)
    return Response(data, media_type="application/octet-stream")


@router.delete("/files/{file_id}")
async def delete_file(request: Request, file_id: str) -> dict[str, object]:
    """Forget a file (its reads ahead stay in the caches, as any image's do)."""
    if not _uploads(state_of(request)).delete(file_id):
        raise _missing(file_id)
    return {"id": file_id, "object": "file", "deleted": True}


def _uploads(state: ServerState) -> UploadStore:
    if state.uploads is None:
        raise ApiError(404, "this server keeps no uploads; send images and files inline", code="files_off")
    return state.uploads


def _found(uploads: UploadStore, file_id: str) -> StoredFile:
    stored = uploads.get(file_id)
    if stored is None:
        raise _missing(file_id)
    return stored


def _missing(file_id: str) -> ApiError:
    return ApiError(404, f"No such File object: {shown(file_id, 60)} (unknown, deleted or expired)",
                    param="file_id", code="file_not_found")


def _entry(stored: StoredFile, uploads: UploadStore) -> dict[str, object]:
    """A file as OpenAI's `file` object: "uploaded" while it is read ahead, "processed" once
    a question naming it pays only for itself (or the read was left to that question)."""
    status = "uploaded" if uploads.is_reading(stored.id) else "processed"
    return {"id": stored.id, "object": "file", "bytes": stored.n_bytes, "created_at": int(stored.created_at),
            "expires_at": int(stored.expires_at), "filename": stored.filename, "purpose": stored.purpose,
            "status": status, "status_details": None}


def _form(content_type: str, body: bytes) -> dict[str, EmailMessage]:
    """A multipart/form-data body's parts by name (the standard library's MIME parser: binary
    parts come back byte for byte)."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1", "replace")
    message = BytesParser(policy=email.policy.HTTP).parsebytes(head + body)
    if not message.is_multipart():
        raise bad_request("the multipart body has no parts (is its boundary right?)",
                          code="invalid_multipart")
    parts: dict[str, EmailMessage] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str):
            parts[name] = cast(EmailMessage, part)
    return parts


def _text(part: EmailMessage | None) -> str:
    if part is None:
        return ""
    payload: Any = part.get_payload(decode=True)
    return payload.decode("utf-8", "replace").strip() if isinstance(payload, bytes) else ""


def _kind_of(data: bytes) -> UploadKind:
    """What an upload holds, checked before it is kept: a document, a clip or an image (decoded:
    bytes that are none of these are refused, and nothing is kept)."""
    if not data:
        raise bad_request("the file is empty", "file", code="invalid_file")
    if format_of(data) is not None:
        return UploadKind.DOCUMENT
    if is_video_bytes(data):
        return UploadKind.VIDEO
    try:
        load_image_bytes(data, "upload", useful_pixels=1 << 16)
    except ImageError as exc:
        reason = str(exc).split(": ", 1)[-1]
        raise bad_request(f"not an image, a PDF or a video ({reason})", "file", code="invalid_file") from None
    return UploadKind.IMAGE
