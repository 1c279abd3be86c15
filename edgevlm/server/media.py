"""Images as the APIs send them (data: URLs, base64, file:// inside --media-dir) and PDFs as their
pages, decoded or refused."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from edgevlm.chat.resent import ChatImage, named
from edgevlm.errors import ImageError
from edgevlm.server.http import ApiError, bad_request, shown
from edgevlm.server.schemas import FileData, InputVideo, VideoUrl
from edgevlm.store.uploads import UploadKind, UploadStore
from edgevlm.vision.documents import count_pages
from edgevlm.vision.layout import TIMED_FRAMES, FrameScaffold
from edgevlm.vision.pdf import PDF
from edgevlm.vision.readers import PageFormat, format_for_type, format_of

PDF_MAGIC = b"%PDF-"
VIDEO_TYPES = {"video/mp4": ".mp4", "video/webm": ".webm", "video/quicktime": ".mov",
               "video/x-matroska": ".mkv", "video/x-msvideo": ".avi"}


def is_video_bytes(raw: bytes) -> bool:
    """Whether bytes open a video container: MP4/MOV (`ftyp` box), WebM/MKV (EBML), AVI (RIFF)."""
    avi = raw[:4] == b"RIFF" and raw[8:11] == b"AVI"
    return raw[4:8] == b"ftyp" or raw[:4] == b"\x1a\x45\xdf\xa3" or avi


def image_from_url(url: str | None, param: str, *, media_dir: Path | None,
                   useful_pixels: int | None, max_file_bytes: int | None = None) -> ChatImage:
    """An OpenAI `image_url.url`: a data: URL, or a file:// path inside the media folder."""
    if not url:
        raise bad_request("expected the image as a data: URL or a file:// URL", param)
    scheme = url.split(":", 1)[0].lower()
    if scheme == "data":
        return decode(_data_url_bytes(url, param), param, useful_pixels)
    if scheme == "file":
        return decode(_media_file_bytes(url, param, media_dir, max_file_bytes), param, useful_pixels)
    if scheme in ("http", "https"):
        raise bad_request("the server fetches nothing from the network; send the image inline "
                          "as a data:image/…;base64 URL", param, code="remote_url_refused")
    raise bad_request(f"unsupported image URL scheme '{shown(scheme, 20)}'; use a data: URL", param)


def image_from_base64(data: str, param: str, *, useful_pixels: int | None) -> ChatImage:
    """An Ollama `images` entry: base64 (a data: URL is accepted too). A PDF is refused: the
    Ollama API has no documents."""
    if not data:
        raise bad_request("expected a base64-encoded image", param)
    raw = _data_url_bytes(data, param) if data.startswith("data:") else _b64(data, param)
    if raw.startswith(PDF_MAGIC):
        raise bad_request("this is a PDF, and the Ollama API takes images only; send its pages as "
                          "images, or the PDF as a file part to /v1/chat/completions", param,
                          code="documents_unsupported")
    if is_video_bytes(raw):
        raise bad_request("this is a video, and the Ollama API takes images only; send it as a "
                          "video_url part to /v1/chat/completions", param, code="video_unsupported")
    return decode(raw, param, useful_pixels)


def video_frames(part: VideoUrl | InputVideo | None, param: str, *, media_dir: Path | None,
                 useful_pixels: int | None, max_file_bytes: int | None = None,
                 scaffold: FrameScaffold = TIMED_FRAMES) -> tuple[ChatImage, ...]:
    """A video as frames of the message: OpenAI-style `video_url` ({"url": a data:video/…;base64
    URL or file:// inside --media-dir}) or llama-server's `input_video` ({"data": base64,
    "format": "mp4"}); at most one window's frames, spread over the clip, each after its time
    (at the family's rate and frames to a block, `scaffold`)."""
    if part is None:
        raise bad_request("expected an object with the video's url (or data)", param)
    if isinstance(part, VideoUrl):
        url, where = part.url, f"{param}.url"
        if not url:
            raise bad_request("expected the video as a data:video/…;base64 URL or a file:// URL", where)
        scheme = url.split(":", 1)[0].lower()
        if scheme == "data":
            media_type = url[5:].split(";", 1)[0].lower()
            raw, suffix = _data_url_bytes(url, where, kind="video/"), VIDEO_TYPES.get(media_type, ".mp4")
        elif scheme == "file":
            raw, suffix = _media_file_bytes(url, where, media_dir, max_file_bytes), Path(url).suffix or ".mp4"
        else:
            raise bad_request("the server fetches nothing from the network; send the video inline as a "
                              "data:video/…;base64 URL", where, code="remote_url_refused")
    else:
        where = f"{param}.data"
        raw, suffix = _b64(part.data, where), f".{part.format or 'mp4'}"
    try:
        return ChatImage.frames_of(raw, suffix=suffix, useful_pixels=useful_pixels, scaffold=scaffold)
    except ImageError as exc:
        reason = str(exc).split(": ", 1)[-1]  # the made-up name means nothing to a client
        raise bad_request(reason, where, code="invalid_video") from None


@dataclass(frozen=True)
class PageRoom:
    """What one message's images may take before any is drawn: the context beside the answer
    (`tokens`), and one image at its smallest view (`floor_tokens`). A 1 KiB PDF of 500 blank
    pages was drawn whole before anything found it could not fit (issue 49.2)."""

    tokens: int
    floor_tokens: int

    def check(self, pages: int, before: int, param: str) -> None:
        """A 400 unless `pages` more images beside the `before` ones can fit at their smallest."""
        needed = (pages + before) * self.floor_tokens
        if self.floor_tokens and needed > self.tokens:
            most = max(self.tokens // self.floor_tokens - before, 0)
            raise ApiError(400, f"{param}: the PDF has {pages} pages; each takes at least "
                           f"{self.floor_tokens} tokens, and at most {most} fit the context beside the "
                           "answer; send fewer pages or raise the server's --n-ctx", param=param,
                           code="context_length_exceeded")

    def per_image_pixels(self, useful_pixels: int | None, images: int) -> int | None:
        """The pixels worth drawing a page at when `images` share the room."""
        return None if useful_pixels is None else max(useful_pixels // max(images, 1), 1)


def document_pages(part: FileData | None, param: str, *, useful_pixels: int | None,
                   room: PageRoom | None = None, before: int = 0) -> tuple[ChatImage, ...]:
    """An OpenAI `file` part's PDF (`file_data`, a data:application/pdf;base64 URL) as its pages,
    counted against the room (beside the `before` images of the message) before any is drawn,
    each drawn at its share of the pixels."""
    if part is None:
        raise bad_request("expected an object with file_data (and filename)", param)
    url = part.file_data
    where = f"{param}.file_data"
    if not url:
        raise bad_request("expected the PDF as a data:application/pdf;base64 URL", where)
    header, sep, payload = url.partition(",")
    form: PageFormat = PDF  # what a file part holds unless its media type says otherwise
    if sep and header.startswith("data:"):
        media_type = header[5:].split(";", 1)[0].lower()
        named = format_for_type(media_type) if media_type else PDF
        if named is None:
            raise bad_request(f"file_data holds {shown(media_type, 40)}; a file part takes a PDF or a "
                              "multi-page TIFF (send images as image_url parts)", where,
                              code="invalid_document")
        form = named
        raw = _data_url_bytes(url, where, kind=form.media_type)
    else:  # bare base64, as some clients send it
        raw = _b64(url, where)
        form = format_of(raw) or PDF
    if not form.holds(raw[:16]):
        raise bad_request(f"file_data is not a {form.name}", where, code="invalid_document")
    return _pages(raw, form, where, param, useful_pixels=useful_pixels, room=room, before=before)


def _pages(raw: bytes, form: PageFormat, where: str, param: str, *, useful_pixels: int | None,
           room: PageRoom | None, before: int) -> tuple[ChatImage, ...]:
    """A document's pages, counted against the room before any is drawn."""
    try:
        pages = count_pages(raw, f"document{form.suffix}")
        if room is not None:
            room.check(pages, before, param)
            useful_pixels = room.per_image_pixels(useful_pixels, pages + before)
        return ChatImage.pages_of(raw, useful_pixels=useful_pixels)
    except ImageError as exc:
        reason = str(exc).split(": ", 1)[-1]  # the made-up name means nothing to a client
        raise bad_request(reason, where, code="invalid_document") from None


def uploaded(file_id: str, param: str, *, uploads: UploadStore | None, useful_pixels: int | None,
             room: PageRoom | None = None, before: int = 0, scaffold: FrameScaffold = TIMED_FRAMES
             ) -> tuple[ChatImage, ...]:
    """What a `file_id` from `POST /v1/files` stands for: an image, a document's pages (counted
    against the room) or one window of a clip's frames; a 400 naming it when it is unknown,
    deleted or expired."""
    if not file_id:
        raise bad_request("expected a file_id from POST /v1/files", param)
    stored = uploads.get(file_id) if uploads is not None else None
    data = uploads.read(file_id) if uploads is not None and stored is not None else None
    if stored is None or data is None:
        raise bad_request(f"no file {shown(file_id, 60)}: unknown, deleted or expired (POST /v1/files "
                          "keeps one; GET /v1/files lists them)", param, code="file_not_found")
    if stored.kind is UploadKind.IMAGE:
        return named((decode(data, param, useful_pixels),), stored.filename)
    if stored.kind is UploadKind.VIDEO:
        try:
            # a clip's frames keep their digest's name: frames are told apart by clip that way
            return ChatImage.frames_of(data, suffix=Path(stored.filename).suffix or ".mp4",
                                       useful_pixels=useful_pixels, scaffold=scaffold)
        except ImageError as exc:
            raise bad_request(str(exc).split(": ", 1)[-1], param, code="invalid_video") from None
    form = format_of(data) or PDF
    pages = _pages(data, form, param, param, useful_pixels=useful_pixels, room=room, before=before)
    return named(pages, stored.filename)


def decode(data: bytes, param: str, useful_pixels: int | None) -> ChatImage:
    """Decode image bytes, or a 400 that names where they came from."""
    try:
        return ChatImage.from_bytes(data, useful_pixels=useful_pixels)
    except ImageError as exc:
        reason = str(exc).split(": ", 1)[-1]  # the upload's made-up name means nothing to a client
        raise bad_request(reason, param, code="invalid_image") from None


def _data_url_bytes(url: str, param: str, *, kind: str = "image/") -> bytes:
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        example = "image/png" if kind == "image/" else kind
        raise bad_request(f"a data: URL must be base64 (data:{example};base64,…)", param)
    media_type = header[5:-7].lower()
    if media_type and not media_type.startswith(kind):
        hint = "; send a PDF as a file part" if media_type == "application/pdf" else ""
        raise bad_request(f"the data: URL holds {shown(media_type, 40)}, not an image{hint}", param,
                          code="invalid_image")
    return _b64(payload, param)


def _b64(text: str, param: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("the image is not valid base64", param, code="invalid_base64") from None


def _media_file_bytes(url: str, param: str, media_dir: Path | None, max_bytes: int | None) -> bytes:
    if media_dir is None:
        raise bad_request("file:// images are off; start the server with --media-dir DIR to allow "
                          "files from that folder", param, code="file_url_refused")
    parsed = urlparse(url)
    if parsed.netloc not in ("", "localhost"):
        raise bad_request("file:// URLs must name a local path", param, code="file_url_refused")
    sent = unquote(parsed.path)  # errors name only this: never where a link inside points
    if "\x00" in sent:
        raise bad_request("a file:// path cannot hold a NUL character", param, code="file_url_refused")
    # a long path keeps its end, the file's name: the start is the folder the client already knows
    named = sent if len(sent) <= 80 else f"…{sent[-79:]}"
    try:
        path = Path(sent).resolve()
    except (OSError, RuntimeError):  # a path too long, a symlink loop
        raise bad_request(f"cannot resolve {named}", param, code="file_unreadable") from None
    if not path.is_relative_to(media_dir.resolve()):
        raise bad_request(f"{named} is outside the media folder {media_dir}", param,
                          code="file_url_refused")
    try:
        with path.open("rb") as handle:  # never more than a request body may hold
            data = handle.read(max_bytes + 1 if max_bytes is not None else -1)
    except OSError as exc:
        raise bad_request(f"cannot read {named} ({exc.strerror or 'unreadable'})", param,
                          code="file_unreadable") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise ApiError(413, f"{param}: {named} is larger than the {max_bytes >> 20} MiB a request may "
                       "send (--max-body-mb)", param=param, code="file_too_large")
    return data
