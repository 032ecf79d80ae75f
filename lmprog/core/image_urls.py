"""Images as URLs for the HTTP APIs: a data URL with the type read from the bytes.

data_url(image) -> "data:image/png;base64,..."    (lp.OpenAI's image_url parts, SGLang's
                                                   image_data from RuntimeEndpoint)
"""

from __future__ import annotations

import base64

from lmprog.core.images import ImageInput


def data_url(image: ImageInput) -> str:
    """`image` as a base64 data URL with its type read from its first bytes."""
    return f"data:{image_type(image.data)};base64,{base64.b64encode(image.data).decode()}"


def image_type(data: bytes) -> str:
    """The MIME type of encoded image bytes (PNG, JPEG, GIF, WebP, BMP; else PNG's, which
    servers that sniff the bytes read anyway)."""
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"BM"):
        return "image/bmp"
    return "image/png"
