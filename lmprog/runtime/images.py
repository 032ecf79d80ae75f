"""Images of a request inside the engine: where their embeddings go, how the radix cache keys
them, and the encoder run of one step.

    run = ImageRun(prepared, positions)       # one image of a request (models/image_processing)
    ids = keyed_ids(prompt_ids, runs)         # image positions -> the image's cache key
    rows, embeds = step_images(batch, model)  # this step's image rows (None: no image fed)

A request's token ids hold, at each position of an image, a key derived from the image's
digest instead of the image token (as SGLang pads image positions with a hash of the image):
the radix cache matches them like tokens, so the same image after the same text reuses its
KV and a different image never does. Keys lie beyond every vocabulary (2**39 up) and below
the LoRA key space (2**40), so they are never tokens and never an adapter's offset. Each
position has its own 39 bits (SHAKE-256 of the digest, 5 bytes a position), not one value
for the whole run: a run of n positions carries 39 n bits of the image, so two images share
the KV of a run only if their digests collide, and even its first position only with
probability 2**-39 (SGLang's one 30-bit pad value per image: 2**-30 for the whole run).
The model embeds a keyed position with the image's embedding row instead.

The vision encoder runs when a step first feeds one of an image's positions (a prefix hit
over the whole image never runs it); the embeddings stay on the request until prefill has
fed its last position (chunked prefill over a long image run reads them chunk by chunk),
then they are dropped. Images of one step are encoded in one batch, an image shared by
several requests once. Design: docs/design/vision.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch

    from .scheduler.batch import ScheduledBatch

IMAGE_KEY_BASE = 1 << 39
_KEY_BYTES = 5  # per position: 40 bits of SHAKE-256 output, 39 of them kept


def image_keys(digest: str, n: int) -> np.ndarray:
    """The cache keys of an image's n positions (int64): 2**39 + 39 bits each, from the
    SHAKE-256 stream of its sha256 digest (the same image, the same keys, in any process)."""
    stream = hashlib.shake_256(digest.encode()).digest(_KEY_BYTES * n)
    raw = np.frombuffer(stream, dtype=np.uint8).reshape(n, _KEY_BYTES).astype(np.int64)
    bits = np.zeros(n, dtype=np.int64)
    for b in range(_KEY_BYTES):
        bits = (bits << 8) | raw[:, b]
    return IMAGE_KEY_BASE + (bits & (IMAGE_KEY_BASE - 1))


class ImageRun:
    """One image of a request: its prepared pixels (`image`, a PreparedImage), the token
    indices its embedding rows go to (ascending), and those rows once encoded (engine thread
    only)."""

    __slots__ = ("image", "positions", "start", "end", "keys", "embeds")

    def __init__(self, image: Any, positions: np.ndarray) -> None:
        positions = np.asarray(positions, dtype=np.int64)
        if positions.ndim != 1 or not len(positions) or len(positions) != image.rows:
            raise ValueError(f"an image of {image.rows} rows needs as many positions")
        if np.any(np.diff(positions) <= 0) or positions[0] < 0:
            raise ValueError("image positions must be ascending and non-negative")
        self.image = image
        self.positions = positions
        self.start, self.end = int(positions[0]), int(positions[-1]) + 1
        self.keys = image_keys(image.digest, len(positions))
        self.embeds: torch.Tensor | None = None

    @property
    def digest(self) -> str:
        return str(self.image.digest)

    def __repr__(self) -> str:
        return (
            f"ImageRun({self.digest[:12]}, [{self.start}, {self.end}), rows={len(self.positions)})"
        )


def keyed_ids(prompt_ids: Sequence[int], runs: Sequence[ImageRun]) -> list[int]:
    """prompt_ids with every image position holding its key."""
    ids = list(prompt_ids)
    for run in runs:
        if run.end > len(ids):
            raise ValueError(f"{run} lies beyond the prompt's {len(ids)} tokens")
        for p, key in zip(run.positions.tolist(), run.keys.tolist()):
            ids[p] = key
    return ids


def step_images(batch: ScheduledBatch, model: Any) -> tuple[np.ndarray, torch.Tensor] | None:
    """(rows, embeds): the batch's token rows that are image positions and their embedding
    rows, encoding the images first fed now (one `model.encode_images` call); None when the
    step feeds no image position. Drops an image's embeddings once its last position is fed."""
    import torch

    wanted: list[tuple[Any, ImageRun]] = []
    for e in batch.entries:
        fed_end = e.end - e.num_draft
        for run in getattr(e.req, "images", ()):
            if run.start < fed_end and run.end > e.start:
                wanted.append((e, run))
    if not wanted:
        return None
    todo: dict[str, list[ImageRun]] = {}
    for _, run in wanted:
        if run.embeds is None:
            todo.setdefault(run.digest, []).append(run)
    if todo:
        encoded = model.encode_images([runs[0].image for runs in todo.values()])
        for runs, embeds in zip(todo.values(), encoded):
            for run in runs:
                run.embeds = embeds
    rows: list[np.ndarray] = []
    parts: list[torch.Tensor] = []
    for e, run in wanted:
        lo = int(np.searchsorted(run.positions, e.start))
        hi = int(np.searchsorted(run.positions, e.end - e.num_draft))
        if hi > lo:
            assert run.embeds is not None
            rows.append(run.positions[lo:hi] - e.start + e.offset)
            parts.append(run.embeds[lo:hi])
        if e.end - e.num_draft >= run.end:  # prefill is past this image
            run.embeds = None
    if not rows:
        return None
    return np.concatenate(rows), torch.cat(parts)
