"""Images in requests: OpenAI `image_url` parts, Anthropic image blocks (as `image_url`
parts by then) and SGLang's `image_data`, read into `ImageInput`s within the server's limits.

    refs = [ImageRef(url, "messages[0].content[1]"), ...]
    check_vision(ctx, refs)                         # 400: a text-only model, too many images
    images = await ctx.blocking(load_images, ctx.limits, refs)

Where an image may come from: a data URL always; an http(s) URL only with
`--allow-image-urls` (downloaded within the byte budget and `--image-fetch-timeout`,
redirects to http(s) only); a local file only inside `--allowed-image-folders` (symlinks
resolved first). Every image is decoded once here, within `--max-image-pixels`, so a
corrupt, truncated or oversized one is a 400 naming its field before the model sees it.
Design: docs/design/server.md#images.
"""

from __future__ import annotations

import base64
import binascii
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmprog.core.images import ImageInput

from .context import ServeContext
from .errors import APIError
from .limits import ServerLimits

# SGLang's /generate reads an image_data string ending so as a file path (its load_image)
_FILE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp")


@dataclass(frozen=True)
class ImageRef:
    """One image a request names: `source` (a data URL, an http(s) or file:// URL; in
    SGLang's image_data also a path or bare base64) and the request field it sits in."""

    source: str
    param: str
    native: bool = False  # SGLang's image_data: paths and bare base64 too


def chat_image_refs(messages: Sequence[Any]) -> list[ImageRef]:
    """The `image_url` parts of a chat request's user messages, in order (a 400 for a part
    of another shape). Parts in other roles are refused when the prompt is rendered."""
    refs = []
    for i, message in enumerate(messages):
        if message.role != "user" or not isinstance(message.content, list):
            continue
        for j, part in enumerate(message.content):
            if part.get("type") != "image_url":
                continue
            param = f"messages[{i}].content[{j}]"
            value = part.get("image_url")
            url = value.get("url") if isinstance(value, dict) else value
            if not isinstance(url, str) or not url:
                raise APIError(
                    400,
                    f"{param}.image_url: an image_url part is "
                    '{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}',
                    param=f"{param}.image_url",
                )
            refs.append(ImageRef(url, param))
    return refs


def check_vision(ctx: ServeContext, refs: Sequence[ImageRef]) -> None:
    """400 when a request has images and the model takes none, or more than max_images."""
    if not refs:
        return
    if ctx.backend.image_token is None:
        raise APIError(
            400,
            f"{refs[0].param}: the model {ctx.model_name!r} takes no images (it is not a "
            "vision-language model); send text only",
            param=refs[0].param,
            code="unsupported_content",
        )
    limit = ctx.limits.max_images
    if len(refs) > limit:
        raise APIError(
            400,
            f"{len(refs)} images is more than this server's limit of {limit} per request "
            "(max_images, lmprog serve --max-images)",
            param=refs[limit].param,
            code="too_many_images",
        )


def load_images(limits: ServerLimits, refs: Sequence[ImageRef]) -> tuple[ImageInput, ...]:
    """Each image read and decoded (blocking: run it on a worker thread); a 400 naming the
    field of the first that cannot be read or decoded or goes over a limit."""
    budget = _Budget(limits)
    images = []
    for ref in refs:
        data = _read(ref, limits, budget.bytes_left(ref))
        budget.take_bytes(ref, len(data))
        try:
            image = ImageInput.from_bytes(data)
            width, height = image.load(max_pixels=budget.pixels_left).size
        except ValueError as exc:
            raise _bad(ref, f"{exc}{budget.pixels_note(exc)}", "invalid_image") from None
        budget.pixels_left -= width * height
        images.append(image)
    return tuple(images)


class _Budget:
    """What is left of a request's image bytes and pixels."""

    def __init__(self, limits: ServerLimits) -> None:
        self.limit_bytes = limits.max_image_bytes
        self.used_bytes = 0
        self.pixels_left = limits.max_image_pixels
        self.limit_pixels = limits.max_image_pixels

    def bytes_left(self, ref: ImageRef) -> int:
        left = self.limit_bytes - self.used_bytes
        if left <= 0:
            raise self._over(ref)
        return left

    def take_bytes(self, ref: ImageRef, n: int) -> None:
        self.used_bytes += n
        if self.used_bytes > self.limit_bytes:
            raise self._over(ref)

    def _over(self, ref: ImageRef) -> APIError:
        return APIError(
            400,
            f"{ref.param}: the request's images hold more than this server's limit of "
            f"{self.limit_bytes:,} bytes (max_image_bytes, lmprog serve --max-image-bytes)",
            param=ref.param,
            code="image_too_large",
        )

    def pixels_note(self, exc: ValueError) -> str:
        if "pixels" not in str(exc):
            return ""
        return (
            f" (max_image_pixels, lmprog serve --max-image-pixels: {self.limit_pixels:,} "
            "pixels for all images of a request)"
        )


def _read(ref: ImageRef, limits: ServerLimits, max_bytes: int) -> bytes:
    if ref.native:
        return _native(ref, limits, max_bytes)
    return _url(ref, limits, max_bytes)


def _url(ref: ImageRef, limits: ServerLimits, max_bytes: int) -> bytes:
    source = ref.source
    if source.startswith("data:"):
        return _data_url(ref)
    scheme = urllib.parse.urlsplit(source).scheme.lower()
    if scheme in ("http", "https"):
        return _fetch(ref, limits, max_bytes)
    if scheme == "file":
        return _local(ref, urllib.request.url2pathname(urllib.parse.urlsplit(source).path), limits)
    if scheme and len(scheme) > 1:
        raise _bad(ref, f"an image URL's scheme is data:, http(s): or file:, got {scheme!r}")
    raise _bad(
        ref,
        "an image is a data URL (data:image/png;base64,...), an http(s) URL or a file:// URL",
    )


def _native(ref: ImageRef, limits: ServerLimits, max_bytes: int) -> bytes:
    """An SGLang image_data string: also a file path (by its suffix, as SGLang reads it) or
    bare base64 data."""
    source = ref.source
    scheme = urllib.parse.urlsplit(source).scheme.lower()
    if source.startswith("data:") or scheme in ("http", "https", "file"):
        return _url(ref, limits, max_bytes)
    if source.lower().endswith(_FILE_SUFFIXES):
        return _local(ref, source, limits)
    try:
        return base64.b64decode(source, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(
            ref,
            "image_data entries are data URLs, http(s) URLs, file paths or base64 image data; "
            "this one is none of them",
        ) from None


def _data_url(ref: ImageRef) -> bytes:
    head, sep, payload = ref.source.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise _bad(ref, "an image data URL is data:image/<type>;base64,<data>")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _bad(ref, "the image data URL's base64 data does not decode") from None


def _local(ref: ImageRef, path: str, limits: ServerLimits) -> bytes:
    """A file inside one of the allowed folders (after resolving symlinks and '..')."""
    folders = limits.allowed_image_folders
    if not folders:
        raise _bad(
            ref,
            "this server reads no local files as images (lmprog serve --allowed-image-folders "
            "DIR names folders it may read); send the image as a data URL",
            "local_file_refused",
        )
    real = os.path.realpath(path)
    if not any(os.path.commonpath([real, f]) == f for f in folders):
        raise _bad(
            ref,
            "the image file is outside the folders this server may read (--allowed-image-folders)",
            "local_file_refused",
        )
    try:
        size = os.stat(real).st_size
        if not os.path.isfile(real):
            raise _bad(ref, "the image path is not a file")
        if size > limits.max_image_bytes:
            raise _bad(
                ref,
                f"the image file has {size:,} bytes, more than this server's limit of "
                f"{limits.max_image_bytes:,} (max_image_bytes)",
                "image_too_large",
            )
        with open(real, "rb") as f:
            return f.read(limits.max_image_bytes + 1)
    except OSError as exc:
        raise _bad(ref, f"the image file cannot be read ({exc.strerror})") from None


def _fetch(ref: ImageRef, limits: ServerLimits, max_bytes: int) -> bytes:
    if not limits.allow_image_urls:
        raise _bad(
            ref,
            "this server does not fetch image URLs (lmprog serve --allow-image-urls turns it "
            "on); send the image as a data URL (data:image/png;base64,...)",
            "image_url_refused",
        )
    opener = urllib.request.build_opener(_HttpOnlyRedirects())
    request = urllib.request.Request(ref.source, headers={"User-Agent": "lmprog-serve"})
    timeout = limits.image_fetch_timeout_s
    deadline = time.monotonic() + timeout
    data = bytearray()
    try:
        with opener.open(request, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                raise _too_big(ref, max_bytes)
            while len(data) <= max_bytes:  # the whole download within the deadline
                piece = response.read1(min(1 << 16, max_bytes + 1 - len(data)))
                if not piece:
                    break
                data += piece
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the download took over {timeout:g} s")
    except APIError:
        raise
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise _bad(
            ref, f"the image URL cannot be fetched: {reason}", "image_fetch_failed"
        ) from None
    if len(data) > max_bytes:
        raise _too_big(ref, max_bytes)
    return bytes(data)


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects to http(s) URLs only (urllib also follows ftp:, which would reach files)."""

    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).scheme.lower() not in ("http", "https"):
            raise urllib.error.URLError(f"a redirect to {newurl[:80]!r}, which is not http(s)")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _too_big(ref: ImageRef, max_bytes: int) -> APIError:
    return _bad(
        ref,
        f"the image at the URL holds more than the {max_bytes:,} bytes left of this request's "
        "image budget (max_image_bytes)",
        "image_too_large",
    )


def _bad(ref: ImageRef, why: str, code: str = "invalid_image") -> APIError:
    return APIError(400, f"{ref.param}: {why}", param=ref.param, code=code)
