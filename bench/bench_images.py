"""What an image costs the server before the model sees it (issue 32): reading a data URL,
the byte and pixel checks and the one full decode `lmprog.serve.images.load_images` does,
per image size and format; and the refusal of a 100-megapixel image (header only).

    .venv/bin/python bench/bench_images.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import base64
import io
import statistics
import time

from PIL import Image

from lmprog.serve.errors import APIError
from lmprog.serve.images import ImageRef, load_images
from lmprog.serve.limits import ServerLimits

SIZES = ((640, 480), (1920, 1080), (4000, 3000))


def encoded(size: tuple[int, int], fmt: str) -> bytes:
    img = Image.effect_noise(size, 40).convert("RGB")  # photo-like entropy, not a flat colour
    buf = io.BytesIO()
    img.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def timed(limits: ServerLimits, url: str, repeat: int) -> float:
    ref = ImageRef(url, "messages[0].content[0]")
    runs = []
    for _ in range(repeat):
        t = time.perf_counter()
        try:
            load_images(limits, [ref])
        except APIError:
            pass
        runs.append(time.perf_counter() - t)
    return statistics.median(runs) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    limits = ServerLimits(max_image_bytes=64 << 20, max_image_pixels=40_000_000)
    print(f"{'image':>22} {'bytes':>10} {'ms (median)':>12}")
    for size in SIZES:
        for fmt in ("JPEG", "PNG"):
            data = encoded(size, fmt)
            url = f"data:image/{fmt.lower()};base64," + base64.b64encode(data).decode()
            ms = timed(limits, url, args.repeat)
            print(f"{fmt:>5} {size[0]:>5}x{size[1]:<5}     {len(data):>10,} {ms:>12.1f}")
    huge = io.BytesIO()
    Image.new("1", (10_000, 10_000)).save(huge, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(huge.getvalue()).decode()
    ms = timed(limits, url, args.repeat)
    print(f"{'PNG 10000x10000 (400)':>22} {len(huge.getvalue()):>10,} {ms:>12.1f}")


if __name__ == "__main__":
    main()
