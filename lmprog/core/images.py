"""Images for vision-language models: what a request carries, and where each one sits.

    ImageInput.from_source(path | bytes | PIL.Image | "data:image/png;base64,...")
    GenerateRequest(prompt, images=(img, ...))   one `Backend.image_token` per image in prompt

An image travels as its encoded bytes and their digest: the digest keys the radix cache
(the same image asked about twice reuses its KV) and is what logs and errors name. Pixels
are decoded only where a model's processor needs them (`load`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
from dataclasses import dataclass, field
from typing import Any

# Bounds that hold for every backend; a server may set lower ones per request.
MAX_IMAGE_BYTES = 32 * 1024 * 1024
MAX_IMAGE_PIXELS = 40_000_000


@dataclass(frozen=True)
class ImageInput:
    """One image: its encoded file bytes (PNG, JPEG, WebP, ...) and their sha256 digest."""

    data: bytes = field(repr=False)
    digest: str

    @classmethod
    def from_bytes(cls, data: bytes) -> ImageInput:
        if not data:
            raise ValueError("an image of 0 bytes")
        if len(data) > MAX_IMAGE_BYTES:
            raise ValueError(f"an image of {len(data):,} bytes; at most {MAX_IMAGE_BYTES:,}")
        return cls(bytes(data), hashlib.sha256(data).hexdigest())

    @classmethod
    def from_source(cls, source: Any) -> ImageInput:
        """A path, encoded bytes, a PIL image or a base64 data URL."""
        if isinstance(source, ImageInput):
            return source
        if isinstance(source, (bytes, bytearray, memoryview)):
            return cls.from_bytes(bytes(source))
        if isinstance(source, str) and source.startswith("data:"):
            return cls.from_bytes(_data_url_bytes(source))
        if isinstance(source, (str, os.PathLike)):
            path = os.fspath(source)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"image file not found: {path!r}")
            with open(path, "rb") as f:
                return cls.from_bytes(f.read())
        if _is_pil_image(source):
            buf = io.BytesIO()
            source.save(buf, format="PNG")
            return cls.from_bytes(buf.getvalue())
        raise TypeError(
            "an image is a file path, encoded bytes, a PIL image or a data URL, "
            f"got {type(source).__name__}"
        )

    def load(self, max_pixels: int = MAX_IMAGE_PIXELS) -> Any:
        """The decoded image as an RGB PIL image; ValueError for data that is no image (or
        a truncated one) and for more than `max_pixels` pixels (checked before decoding)."""
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(self.data)) as img:
                width, height = img.size
                if width * height > max_pixels:
                    raise ValueError(
                        f"an image of {width}x{height} pixels; at most {max_pixels:,} pixels"
                    )
                return img.convert("RGB")
        except (UnidentifiedImageError, OSError, Image.DecompressionBombError) as exc:
            raise ValueError(f"image {self.digest[:12]} cannot be decoded: {exc}") from None


def _data_url_bytes(url: str) -> bytes:
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ValueError("an image data URL is data:image/<type>;base64,<data>")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("an image data URL's base64 data does not decode") from None


def _is_pil_image(obj: Any) -> bool:
    return any(c.__module__.startswith("PIL.") and c.__name__ == "Image" for c in type(obj).__mro__)
