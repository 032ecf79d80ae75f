"""Argument checks every backend applies at its public entry points (same rules, same messages).

A backend calls these before it spends any work on a request, so a bad request raises
from the call that received it and leaves the backend usable (the `Backend` contract).
"""

from __future__ import annotations

from typing import Any

from lmprog.core.errors import BackendError
from lmprog.core.protocol import GenerateRequest, ScoreRequest
from lmprog.core.sampling import SamplingParams


def check_score_request(request: Any) -> None:
    """TypeError/ValueError unless `request` is a ScoreRequest with at least one str choice."""
    if not isinstance(request, ScoreRequest):
        raise TypeError(f"score takes a ScoreRequest, got {type(request).__name__}")
    if not request.choices:
        raise ValueError("score needs at least one choice")
    for c in request.choices:
        if not isinstance(c, str):
            raise TypeError(f"choices must be strings, got {type(c).__name__} {c!r}")


def check_generate_request(request: Any, stream: Any) -> None:
    """TypeError unless `request` is a GenerateRequest and `stream` fits check_stream."""
    if not isinstance(request, GenerateRequest):
        raise TypeError(f"generate takes a GenerateRequest, got {type(request).__name__}")
    check_stream(stream)


def check_no_lora(request: Any, backend: str) -> None:
    """LoraError when a request names a LoRA adapter on a backend that serves none."""
    params = getattr(request, "params", None)
    name = getattr(params, "lora_path", None) or getattr(request, "lora_path", None)
    if name is not None:
        from lmprog.core.errors import LoraError

        raise LoraError(
            f"lora_path={name!r}: the {backend} backend serves no LoRA adapters yet; use "
            "lp.Runtime(lora_paths={...}) (or an lmprog serve --lora-paths endpoint)",
            adapter=name,
        )


def check_stream(stream: Any) -> None:
    """TypeError unless `stream` is None or a callable (it receives each text piece)."""
    if stream is not None and not callable(stream):
        raise TypeError("stream must be a callable taking each text piece")


def check_stop_token_ids(params: SamplingParams, vocab_size: int) -> None:
    """ValueError if a stop token id lies outside the model's vocabulary."""
    for t in params.stop_token_ids:
        if t >= vocab_size:
            raise ValueError(f"stop_token_ids: {t} is outside the vocabulary (size {vocab_size})")


def check_images(request: Any, image_token: str | None, backend: str) -> None:
    """BackendError when `request` carries images and the backend's model takes none;
    ValueError unless its prompt holds `image_token` once per image (the protocol's rule)."""
    images = getattr(request, "images", ())
    if not images:
        return
    if image_token is None:
        raise BackendError(
            f"{backend} takes no images (its model has no vision support), and this request "
            f"carries {len(images)}; use a vision-language model"
        )
    if not isinstance(request.prompt, str):
        raise ValueError("a request with images needs a text prompt (not token ids)")
    found = request.prompt.count(image_token)
    if found != len(images):
        raise ValueError(
            f"the prompt holds the image token {image_token!r} {found} times for "
            f"{len(images)} images; it must hold it once per image, in order"
        )
