"""A cached tokenizer without transformers: the `tokenizers` file plus what transformers said.

    tok = FastTokenizer.load(folder)   # None where describe() has not written the folder yet

`describe(tok, folder)` writes what transformers computed (special tokens, the chat template,
the decode clean-up) once `FastTokenizer` is checked to encode and decode as transformers
does; `hf_tokenizer()` gives the transformers one. Design: docs/design/foundations.md.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from lmprog.core.cache_files import write_json
from lmprog.core.chat import template_from_tokenizer

META_FILE = "lmprog_tokenizer.json"
_META_VERSION = 1

# Attributes copied from the transformers tokenizer as they are.
_PLAIN = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "bos_token_id",
    "eos_token_id",
    "unk_token_id",
    "pad_token_id",
    "all_special_tokens",
    "all_special_ids",
    "add_bos_token",
    "add_eos_token",
    "model_max_length",
)

# Texts the adapter must encode and decode exactly as transformers does before it is trusted.
CHECK_TEXTS = (
    "",
    "Hello, world!",
    " The capital of France is Paris.\n",
    "  two  spaces,\ttabs\t\tand\r\nwindows newlines\n\n\n",
    "def f(x):\n    return {'a': [1, 2.5e-3, None]}  # code\n",
    "naïve café — “quotes” ‘single’ … ½ ²³ ÿ",
    "日本語のテキスト、中文文本，한국어 텍스트",
    "emoji 🙂👍🏽 👨‍👩‍👧 flags 🇫🇷 and ZWJ\u200d joiners",
    "combining e\u0301 and precomposed é; Ω Å ﬁ ligature",
    "12345678901234567890 3.14159 -42 0x1F 1e10",
    "mixedCASE snake_case kebab-case CONSTANT_CASE",
    "\u00a0non-breaking\u2003em space\u3000ideographic",
    '{"json": true, "n": [1,2,3], "s": "a\\"b"}',
    "<|im_start|>user\n2+2=?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><s></s><unk>[INST] text [/INST]<|eot_id|>",
    "text with <|im_end|> inside and <|im_start|>again",
    "\x00\x01\x1f control\x7f chars",
    "😀" * 5 + "a" * 40 + " " * 17 + "!" * 9,
)


class FastTokenizer:
    """A `tokenizers.Tokenizer` with the transformers tokenizer attributes lmprog reads."""

    # _PLAIN's attributes, as transformers had them (None where it had none)
    bos_token: str | None
    eos_token: str | None
    unk_token: str | None
    pad_token: str | None
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    all_special_tokens: list[str] | None
    all_special_ids: list[int] | None
    add_bos_token: bool | None
    add_eos_token: bool | None
    model_max_length: int | None

    def __init__(
        self, backend: Tokenizer, meta: Mapping[str, Any], folder: Path | None = None
    ) -> None:
        self._tokenizer = backend  # the name transformers uses (lmprog's detokenizer reads it)
        self._meta = dict(meta)
        self._folder = folder
        for name in _PLAIN:
            setattr(self, name, self._meta.get(name))
        self.special_tokens_map: dict[str, Any] = dict(self._meta.get("special_tokens_map") or {})
        self.chat_template: str | dict[str, str] | None = self._meta.get("chat_template")
        self.clean_up_tokenization_spaces = bool(self._meta.get("clean_up_tokenization_spaces"))
        self._cleanup_applies = bool(self._meta.get("cleanup_applies"))
        self.split_special_tokens = bool(self._meta.get("split_special_tokens"))
        self.name_or_path = str(folder) if folder is not None else ""
        self._split_backend: Tokenizer | None = None
        self._lock = threading.Lock()
        self._hf: Any = None

    # ---- loading -------------------------------------------------------------------------------
    @classmethod
    def load(cls, folder: Path) -> FastTokenizer | None:
        """The tokenizer saved in `folder`, or None where it has no checked description."""
        meta_path = folder / META_FILE
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(meta, dict) or meta.get("version") != _META_VERSION:
            return None
        if not meta.get("verified"):
            return None
        try:
            backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception:  # noqa: BLE001 - a damaged cache entry: the caller rebuilds it
            return None
        return cls(backend, meta, folder)

    # ---- what lmprog uses ----------------------------------------------------------------------
    @property
    def backend_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def encode(
        self,
        text: str,
        add_special_tokens: bool = True,
        *,
        split_special_tokens: bool | None = None,
    ) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        split = self.split_special_tokens if split_special_tokens is None else split_special_tokens
        backend = self._split() if split else self._tokenizer
        return backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(
        self,
        token_ids: int | Sequence[int],
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> str:
        ids = [int(token_ids)] if isinstance(token_ids, int) else [int(i) for i in token_ids]
        text = self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        cleanup = (
            self.clean_up_tokenization_spaces
            if clean_up_tokenization_spaces is None
            else clean_up_tokenization_spaces
        )
        if cleanup and self._cleanup_applies:
            text = clean_up_tokenization(text)
        return text

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=False)

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def added_tokens_decoder(self) -> dict[int, Any]:
        return self._tokenizer.get_added_tokens_decoder()

    def convert_ids_to_tokens(
        self, ids: int | Sequence[int], skip_special_tokens: bool = False
    ) -> str | list[str | None] | None:
        if isinstance(ids, int):
            return self._tokenizer.id_to_token(ids)
        skip = set(self.all_special_ids or ()) if skip_special_tokens else set()
        return [self._tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skip]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | None | list[int | None]:
        if isinstance(tokens, str):
            return self._tokenizer.token_to_id(tokens)
        return [self._tokenizer.token_to_id(t) for t in tokens]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        decoder = self._tokenizer.decoder
        return decoder.decode(tokens) if decoder is not None else " ".join(tokens)

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, Any]],
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        **variables: Any,
    ) -> str | list[int]:
        """The conversation rendered by lmprog's chat renderer (as transformers renders it with
        tokenize=False); with tokenize=True, its token ids (no special tokens added)."""
        text = template_from_tokenizer(self).render(
            conversation, add_generation_prompt=add_generation_prompt, **variables
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def hf_tokenizer(self) -> Any:
        """The transformers tokenizer saved in the same folder (imports transformers)."""
        with self._lock:
            if self._hf is None:
                if self._folder is None:
                    raise ValueError("this tokenizer was not loaded from a folder")
                from transformers import AutoTokenizer

                self._hf = AutoTokenizer.from_pretrained(self._folder)
            return self._hf

    def __repr__(self) -> str:
        return f"FastTokenizer({self.name_or_path!r}, vocab={len(self)})"

    def _split(self) -> Tokenizer:
        # A second backend that reads special-token strings as text: transformers flips a flag
        # on its one backend per call instead, which races between threads.
        with self._lock:
            if self._split_backend is None:
                split = Tokenizer.from_str(self._tokenizer.to_str())
                split.encode_special_tokens = True
                self._split_backend = split
            return self._split_backend


def clean_up_tokenization(text: str) -> str:
    """transformers' `PreTrainedTokenizerBase.clean_up_tokenization`."""
    return (
        text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
    )


def describe(tok: Any, folder: Path) -> bool:
    """Write `folder/lmprog_tokenizer.json` for the transformers tokenizer `tok` saved in
    `folder`, marked verified only if a `FastTokenizer` over `folder/tokenizer.json` agrees with
    `tok` on `CHECK_TEXTS` and every token id. Returns whether it agreed."""
    backend_file = folder / "tokenizer.json"
    if not backend_file.is_file():
        return False
    meta: dict[str, Any] = {"version": _META_VERSION, "verified": False}
    meta["tokenizer_class"] = type(tok).__name__
    for name in _PLAIN:
        meta[name] = _jsonable(getattr(tok, name, None))
    meta["special_tokens_map"] = _jsonable(getattr(tok, "special_tokens_map", None) or {})
    meta["chat_template"] = _jsonable(getattr(tok, "chat_template", None))
    meta["clean_up_tokenization_spaces"] = bool(getattr(tok, "clean_up_tokenization_spaces", False))
    meta["split_special_tokens"] = bool(getattr(tok, "split_special_tokens", False))
    # transformers skips the clean-up for BPE models unless told otherwise (see its _decode).
    model = getattr(getattr(tok, "backend_tokenizer", None), "model", None)
    meta["cleanup_applies"] = type(model).__name__ != "BPE" or bool(
        getattr(
            tok, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", False
        )
    )
    fast = FastTokenizer(Tokenizer.from_file(str(backend_file)), meta, folder)
    verified = agrees(fast, tok)
    meta["verified"] = verified
    write_json(folder / META_FILE, meta)
    return verified


def agrees(fast: FastTokenizer, tok: Any) -> bool:
    """Whether `fast` encodes and decodes as the transformers tokenizer `tok` does."""
    try:
        if fast.get_vocab() != tok.get_vocab() or len(fast) != len(tok):
            return False
        theirs = {i: (t.content, t.special) for i, t in tok.added_tokens_decoder.items()}
        ours = {i: (t.content, t.special) for i, t in fast.added_tokens_decoder.items()}
        if theirs != ours:
            return False
        for text in CHECK_TEXTS:
            for add in (False, True):
                ids = fast.encode(text, add_special_tokens=add)
                if ids != list(tok.encode(text, add_special_tokens=add)):
                    return False
            if fast.encode(text, add_special_tokens=False, split_special_tokens=True) != list(
                tok.encode(text, add_special_tokens=False, split_special_tokens=True)
            ):
                return False
            for skip in (False, True):
                for clean in (None, False, True) if fast._cleanup_applies else (None, False):
                    ours_text = fast.decode(
                        ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean
                    )
                    if ours_text != tok.decode(
                        ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean
                    ):
                        return False
        # Single ids: every added token and a stride through the rest (all of them would take
        # a second in transformers' decode at every cache build).
        sample = sorted(set(range(0, len(tok), 7)) | set(theirs))
        for i in sample:
            for skip in (False, True):
                if fast.decode([i], skip_special_tokens=skip) != tok.decode(
                    [i], skip_special_tokens=skip
                ):
                    return False
        every = list(range(len(tok)))
        return bool(fast.convert_ids_to_tokens(every) == tok.convert_ids_to_tokens(every))
    except Exception:  # noqa: BLE001 - anything the adapter cannot mirror: keep transformers
        return False


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)  # an AddedToken: its content
