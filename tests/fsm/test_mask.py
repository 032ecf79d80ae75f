"""Masks: the one int32 bitmask encoding, built from guides and applied, against a reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fsm_toys import byte_level_tokenizer

from lmprog.fsm.index import TokenIndex
from lmprog.fsm.mask import allowed_bitmask, apply_bitmask_, num_words, unpack_bitmask

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def toy():
    return byte_level_tokenizer()


@pytest.fixture(scope="module")
def guides(toy):
    """Three guides in different states of two constraints, plus an unconstrained row."""
    digits = TokenIndex.get(r"[0-9]{1,3}", toy).new_guide()
    word = TokenIndex.get(r"(true|false) ok", toy).new_guide()
    word_mid = word.copy()
    word_mid.advance_all(toy.encode("tru", add_special_tokens=False))
    done = TokenIndex.get(r"[0-9]{1,3}", toy).new_guide()
    done.advance_all(toy.encode("12", add_special_tokens=False))
    return [digits, None, word_mid, done]


def reference_allowed(guide, width):
    row = torch.ones(width, dtype=torch.bool)
    if guide is not None:
        row[:] = False
        ids = [t for t in guide.allowed_token_ids().tolist() if t < width]
        row[ids] = True
    return row


def reference_bitmask(allowed):
    """bool [B, V] -> int32 words, bit t % 32 of word t // 32, written out by hand."""
    b, v = allowed.shape
    words = [[0] * num_words(v) for _ in range(b)]
    for r, t in allowed.nonzero().tolist():
        words[r][t // 32] |= 1 << (t % 32)
    return torch.tensor(
        [[w - (1 << 32) if w >= 1 << 31 else w for w in row] for row in words], dtype=torch.int32
    )


@pytest.mark.parametrize("width_extra", [0, 7, 40])  # logits padded beyond the vocabulary
def test_bitmask_matches_reference(toy, guides, width_extra):
    width = len(toy) + width_extra
    allowed = torch.stack([reference_allowed(g, width) for g in guides])
    mask = allowed_bitmask(guides, width)
    assert mask.dtype == torch.int32 and mask.shape == (len(guides), num_words(width))
    padding = torch.zeros(len(guides), num_words(width) * 32, dtype=torch.bool)
    padding[:, :width] = allowed
    padding[1, width:] = True  # an unconstrained row has every bit set
    assert torch.equal(mask, reference_bitmask(padding))
    assert torch.equal(unpack_bitmask(mask, width), allowed)


@pytest.mark.parametrize("width_extra", [0, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_matches_reference(toy, guides, width_extra, dtype):
    width = len(toy) + width_extra
    logits = torch.randn(len(guides), width).to(dtype)
    expected = logits.clone()
    for b, g in enumerate(guides):
        expected[b][~reference_allowed(g, width)] = float("-inf")
    assert apply_bitmask_(logits, allowed_bitmask(guides, width)) is logits
    assert torch.equal(logits, expected)


def test_apply_on_a_strided_row_view(toy, guides):
    width = len(toy)
    logits = torch.randn(6, width)
    expected = logits.clone()
    expected[2][~reference_allowed(guides[0], width)] = float("-inf")
    apply_bitmask_(logits[2:3], allowed_bitmask(guides[:1], width))
    assert torch.equal(logits, expected)


def test_eos_only_where_accepting(toy, guides):
    eos = toy.eos_token_id
    mask = unpack_bitmask(allowed_bitmask(guides, len(toy)), len(toy))
    assert not mask[0, eos] and not mask[2, eos] and mask[3, eos]
    assert mask[1].all()
    assert mask[2].sum() == 1 and mask[2, toy.convert_tokens_to_ids("e")]


def test_finished_guide_keeps_eos_only(toy):
    guide = TokenIndex.get(r"[0-9]", toy).new_guide()
    guide.advance_all([*toy.encode("7", add_special_tokens=False), toy.eos_token_id])
    logits = torch.zeros(1, len(toy))
    apply_bitmask_(logits, allowed_bitmask([guide], len(toy)))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [toy.eos_token_id]


def test_rows_are_shared_between_states_with_equal_sets(toy):
    """Padded rows (logits wider than the vocabulary's words; on a device, every row) are
    cached once per allowed set; a host row that the words span is the words themselves."""
    index = TokenIndex.get(r"[0-9]{3}x", toy)
    guide = index.new_guide()
    width = 32 * (index.num_words + 2)
    first = allowed_bitmask([guide], width)
    g2 = guide.copy()
    g2.advance_all(toy.encode("1", add_special_tokens=False))
    assert g2.state != guide.state
    assert torch.equal(first, allowed_bitmask([g2], width))
    assert len(index.state_cache(("bitmask", None, width, "set"))) == 1
    spanned = allowed_bitmask([g2], len(toy))
    assert np.array_equal(spanned[0].numpy(), g2.bitmask_words())
    assert not index.state_cache(("bitmask", None, len(toy)))  # no second copy


def test_validation_errors(toy, guides):
    mask = allowed_bitmask(guides, len(toy))
    with pytest.raises(ValueError, match="shape"):
        apply_bitmask_(torch.zeros(2, len(toy)), mask)
    with pytest.raises(ValueError, match="shape"):
        apply_bitmask_(torch.zeros(len(guides), len(toy) + 32), mask)
    with pytest.raises(ValueError, match="int32"):
        apply_bitmask_(torch.zeros(len(guides), len(toy)), mask.long())
    with pytest.raises(ValueError, match="2-D floating"):
        apply_bitmask_(torch.zeros(len(guides), len(toy), dtype=torch.long), mask)
    with pytest.raises(TypeError, match="torch tensors"):
        apply_bitmask_([[0.0]], mask)
    with pytest.raises(ValueError, match="at least one"):
        allowed_bitmask([], len(toy))


def test_the_device_path_never_reads_the_device(toy, guides):
    """Built and applied on the meta device, where a host read of tensor data raises."""
    width = len(toy) + 64
    logits = torch.empty(len(guides), width, device="meta")
    mask = allowed_bitmask(guides, width, "meta")
    assert mask.device.type == "meta" and apply_bitmask_(logits, mask) is logits


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("rows", ["all", "some"])  # every row constrained, or a None row among them
def test_cuda_masks_match_reference(toy, guides, rows):
    batch = guides if rows == "some" else [g for g in guides if g is not None]
    width = len(toy) + 64
    logits = torch.randn(len(batch), width, device="cuda", dtype=torch.bfloat16)
    expected = logits.clone()
    for b, g in enumerate(batch):
        expected[b][~reference_allowed(g, width).cuda()] = float("-inf")
    mask = allowed_bitmask(batch, width, "cuda")
    assert mask.device.type == "cuda"
    assert torch.equal(mask.cpu(), allowed_bitmask(batch, width))
    apply_bitmask_(logits, mask)
    assert torch.equal(logits, expected)


def test_batched_masks_equal_the_serial_ones(toy):
    """Positions not cached yet are computed together (prefetch_bitmask_words, in parallel);
    the rows equal those each guide computes alone."""
    pattern = r'\{"name":"[a-z]{0,6}","ok":(true|false)\}'
    texts = ['{"na', '{"name":"ab', '{"name":"abc","ok":', '{"name":"', '{"name":"abc","ok":t']

    def walked():
        index = TokenIndex.get(pattern, toy)
        out = []
        for text in texts:
            g = index.new_guide()
            g.advance_all(toy.encode(text, add_special_tokens=False))
            out.append(g)
        return out

    from lmprog.fsm.index import clear_memory_cache

    clear_memory_cache()
    batched = allowed_bitmask([*walked(), None], 300)
    clear_memory_cache()
    serial = torch.stack([allowed_bitmask([g], 300)[0] for g in walked()])
    assert torch.equal(batched[:-1], serial) and bool((batched[-1] == -1).all())


def reference_apply(logits: np.ndarray, words: np.ndarray) -> np.ndarray:
    """logits with -inf where the bit is 0, bit by bit from the words."""
    out = logits.copy()
    bits = np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")
    out[bits[:, : logits.shape[1]] == 0] = -np.inf
    return out


def random_words(rng: np.random.Generator, rows: int, n_words: int) -> np.ndarray:
    """Rows of each kind a walk meets: sparse (a few words set), all allowed, free text
    (most words -1, some partial), none allowed, random bits."""
    words = np.zeros((rows, n_words), dtype=np.int32)
    for r in range(rows):
        kind = r % 5
        if kind == 0:
            at = rng.choice(n_words, size=min(3, n_words), replace=False)
            words[r, at] = rng.integers(-(2**31), 2**31, size=len(at), dtype=np.int64)
        elif kind == 1:
            words[r] = -1
        elif kind == 2:
            words[r] = -1
            at = rng.choice(n_words, size=max(1, n_words // 10), replace=False)
            words[r, at] = rng.integers(-(2**31), 2**31, size=len(at), dtype=np.int64)
        elif kind == 4:
            words[r] = rng.integers(-(2**31), 2**31, size=n_words, dtype=np.int64)
    return words


@pytest.mark.parametrize("width", [49152, 49152 - 5, 32 * 3 + 1, 7])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_apply_of_every_row_kind_matches_reference(width, kind):
    """The host path (numpy arrays or CPU float32 tensors), one row at a time and in a
    batch, over rows sparse, full, free text, empty and random, widths on and off a word's
    end; all-allowed rows of a batch are left as they are."""
    rng = np.random.default_rng(width)
    words = random_words(rng, 10, num_words(width))
    logits = rng.standard_normal((10, width)).astype(np.float32)
    expected = reference_apply(logits, words)
    for rows in [slice(0, 10), *(slice(r, r + 1) for r in range(10))]:
        x, w = logits[rows].copy(), words[rows].copy()
        if kind == "torch":
            xt = torch.from_numpy(x)
            assert apply_bitmask_(xt, torch.from_numpy(w)) is xt
        else:
            assert apply_bitmask_(x, w) is x
        assert np.array_equal(x, expected[rows])


def test_apply_alternating_widths_and_threads():
    """The scratch row of biases is per thread and per row size: widths that share a word
    count and ones that do not, applied in turn and from threads at once, all match."""
    import threading

    rng = np.random.default_rng(1)
    cases = []
    for width in [4000, 4000 - 9, 3000, 4000, 31, 3000]:
        words = random_words(rng, 5, num_words(width))
        logits = rng.standard_normal((5, width)).astype(np.float32)
        cases.append((logits, words, reference_apply(logits, words)))
    failures = []

    def run() -> None:
        for _ in range(20):
            for logits, words, expected in cases:
                x = torch.from_numpy(logits.copy())
                apply_bitmask_(x, torch.from_numpy(words))
                if not np.array_equal(x.numpy(), expected):
                    failures.append(logits.shape)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    run()
    for t in threads:
        t.join()
    assert not failures


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_apply_of_other_torch_dtypes_matches_reference(dtype):
    """Logits that are not float32 take the table path (no numpy view), with the same result."""
    rng = np.random.default_rng(2)
    words = random_words(rng, 5, num_words(1000))
    logits = torch.from_numpy(rng.standard_normal((5, 1000)).astype(np.float32)).to(dtype)
    expected = reference_apply(logits.float().numpy(), words)
    apply_bitmask_(logits, torch.from_numpy(words))
    assert logits.dtype == dtype and np.array_equal(logits.float().numpy(), expected)


def test_numpy_rows_and_none_guides(toy, guides):
    """device=None: numpy rows, a None guide's row every bit set; applied to numpy logits."""
    width = len(toy) + 40
    mask = allowed_bitmask(guides, width, None)
    assert isinstance(mask, np.ndarray) and mask.dtype == np.int32
    assert np.array_equal(mask, allowed_bitmask(guides, width).numpy())
    assert (mask[1] == -1).all()
    one = allowed_bitmask(guides[:1], width, None)
    assert one.flags.writeable and np.array_equal(one[0], mask[0])
    logits = np.random.default_rng(3).standard_normal((len(guides), width)).astype(np.float32)
    expected = reference_apply(logits, mask)
    assert apply_bitmask_(logits, mask) is logits and np.array_equal(logits, expected)
    with pytest.raises(ValueError, match="float32"):
        apply_bitmask_(logits.astype(np.float64), mask)
    with pytest.raises(ValueError, match="float32"):  # a non-native byte order is not float32
        apply_bitmask_(logits.astype(">f4"), mask)
    with pytest.raises(ValueError, match="shape"):
        apply_bitmask_(logits[:2], mask)
    with pytest.raises(TypeError, match="both numpy"):
        apply_bitmask_(logits, torch.from_numpy(mask))


def test_first_visit_words_are_their_own(toy):
    """Words computed through the thread's scratch row are copies: a later position's
    mask leaves an earlier one's words (cached, read-only) as they were."""
    from lmprog.fsm.index import clear_memory_cache

    clear_memory_cache()
    index = TokenIndex.get(r"(ab|cd)[0-9]x", toy)
    guides = [index.new_guide()]
    for text in ["a", "ab", "ab1"]:
        g = index.new_guide()
        g.advance_all(toy.encode(text, add_special_tokens=False))
        guides.append(g)
    rows = [g.bitmask_words() for g in guides]
    assert all(not r.flags.writeable for r in rows)
    for g, r in zip(guides, rows, strict=True):  # each bit as the matcher validates its token
        bits = np.unpackbits(r.view(np.uint8), bitorder="little")
        assert [t for t in range(len(toy)) if bits[t]] == [
            t for t in range(len(toy)) if g.is_allowed(t)
        ]
    assert len({r.tobytes() for r in rows}) == len(rows)  # four different sets, kept apart


class _CountingMatcher:
    """An llguidance matcher that counts `validate_tokens` calls (everything else forwarded)."""

    def __init__(self, matcher) -> None:
        self._m, self.validated = matcher, 0

    def validate_tokens(self, tokens):
        self.validated += 1
        return self._m.validate_tokens(tokens)

    def __getattr__(self, name):
        return getattr(self._m, name)


def test_a_token_of_the_computed_mask_advances_without_validation(toy):
    """Once the position's mask is computed, a token whose bit is set is consumed without
    asking the matcher to validate it; a token whose bit is clear is still asked about and
    refused, the guide unchanged."""
    index = TokenIndex.get(r"[0-9]{2}x", toy)
    guide = index.new_guide()
    guide._matcher = counting = _CountingMatcher(guide._matcher)
    seven = toy.encode("7", add_special_tokens=False)[0]
    letter = toy.encode("x", add_special_tokens=False)[0]
    guide.advance(seven)  # the start's mask is computed by the index's build
    assert counting.validated == 0
    with pytest.raises(ValueError, match="not allowed"):  # no mask here yet: asked
        guide.advance(letter)
    assert counting.validated == 1 and guide.num_tokens == 1
    allowed_bitmask([guide], len(toy))  # the mask of the second digit's position
    with pytest.raises(ValueError, match="not allowed"):  # a clear bit: asked again
        guide.advance(letter)
    assert counting.validated == 2 and guide.num_tokens == 1
    guide.advance(seven)
    assert counting.validated == 2 and guide.num_tokens == 2
    assert guide.allowed_token_ids().tolist() == [letter]


# ---- rows written into the caller's array (out=) --------------------------------------------
_TEXTS = ['{"na', '{"name":"ab', '{"name":"abc","ok":', '{"name":"', '{"name":"abc","ok":t']


def _walked(toy, texts=_TEXTS):
    """Fresh guides of a new index (nothing cached but the start), one per text."""
    from lmprog.fsm.index import clear_memory_cache

    clear_memory_cache()
    index = TokenIndex.get(r'\{"name":"[a-z]{0,6}","ok":(true|false)\}', toy)
    out = []
    for text in texts:
        g = index.new_guide()
        g.advance_all(toy.encode(text, add_special_tokens=False))
        out.append(g)
    return out


def _out(kind, shape, fill=0x5A5A5A5A):
    """A host array of garbage, written over by the call."""
    rows = np.full(shape, fill, dtype=np.int32)
    return torch.from_numpy(rows) if kind == "torch" else rows


def expected_rows(guides, width):
    """The reference bitmask of the rows (None rows: every bit set, the padding's too)."""
    allowed = torch.stack([reference_allowed(g, width) for g in guides])
    padding = torch.zeros(len(guides), num_words(width) * 32, dtype=torch.bool)
    padding[:, :width] = allowed
    for b, g in enumerate(guides):
        padding[b, width:] = g is None
    return reference_bitmask(padding)


@pytest.mark.parametrize("kind", ["torch", "numpy", "new tensor", "new array"])
@pytest.mark.parametrize("width_extra", [0, 7, 40])
@pytest.mark.parametrize("rows", ["one", "batch", "batch, None first"])
def test_rows_written_into_out_match_the_reference(toy, kind, width_extra, rows):
    """First visits (computed into `out`, or into the new array returned), then the same
    positions cached, each row as the reference has it: None rows every bit set, padded
    widths too."""
    width = len(toy) + width_extra
    walked = _walked(toy)
    guides = {"one": walked[1:2], "batch": [*walked, None], "batch, None first": [None, *walked]}
    guides = guides[rows]

    def written(fill):
        if kind.startswith("new"):
            return allowed_bitmask(guides, width, "cpu" if kind == "new tensor" else None)
        out = _out(kind, (len(guides), num_words(width)), fill)
        assert allowed_bitmask(guides, width, out=out) is out
        return out

    firsts = written(0x5A5A5A5A)
    want = expected_rows(guides, width)  # (after: reference_allowed computes the masks)
    assert torch.equal(torch.as_tensor(firsts), want)
    assert torch.equal(torch.as_tensor(written(-1)), want)


@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_a_first_visit_into_out_caches_its_own_copy(toy, kind):
    """The mask llguidance computed into `out` is cached as a copy: the caller's later
    writes to `out` leave the position's words as they were, and the words are what a
    fresh guide computes there without `out`."""
    guides = _walked(toy)
    n = guides[0].index.num_words
    written = []
    for g in guides:
        out = _out(kind, (1, n))
        allowed_bitmask([g], len(toy), out=out)
        written.append(torch.as_tensor(out[0]).numpy().copy())
        out[0] = 0  # the caller's array is its own
    for g, row in zip(guides, written, strict=True):
        words = g.bitmask_words()
        assert not words.flags.writeable and np.array_equal(words, row)
    for g, row in zip(_walked(toy), written, strict=True):  # computed again, without out
        assert np.array_equal(g.bitmask_words(), row)
        bits = np.unpackbits(row.view(np.uint8), bitorder="little")
        assert [t for t in range(len(toy)) if bits[t]] == [
            t for t in range(len(toy)) if g.is_allowed(t)
        ]


def test_out_after_eos_and_for_a_checked_constraint(toy):
    """A finished guide writes EOS alone; a constraint with a check (distinct items)
    writes its filtered mask, as bitmask_words gives it, on first visits and after."""
    from lmprog.fsm import Constraint
    from lmprog.fsm.index import clear_memory_cache

    done = TokenIndex.get(r"[0-9]", toy).new_guide()
    done.advance_all([*toy.encode("7", add_special_tokens=False), toy.eos_token_id])
    out = _out("torch", (1, num_words(len(toy))))
    allowed_bitmask([done], len(toy), out=out)
    assert unpack_bitmask(out, len(toy))[0].nonzero().flatten().tolist() == [toy.eos_token_id]

    tags = {"type": "array", "items": {"type": "string", "maxLength": 3}, "uniqueItems": True}
    ids = toy.encode('["a", "b", "a', add_special_tokens=False)
    written = []
    clear_memory_cache()
    g = TokenIndex.get(Constraint.from_json_schema(tags), toy).new_guide()
    assert g.index.check is not None
    for t in [*ids, None]:  # the mask at each position, the first visits into out
        out = _out("numpy", (1, g.index.num_words))
        allowed_bitmask([g], len(toy), out=out)
        written.append(out[0].copy())
        if t is not None:
            g.advance(t)
    quote = toy.convert_tokens_to_ids('"')
    assert not (written[-1][quote >> 5] >> (quote & 31) & 1)  # "a" again: refused
    assert written[-2][quote >> 5] >> (quote & 31) & 1  # (an empty string is not a repeat)
    clear_memory_cache()
    h = TokenIndex.get(Constraint.from_json_schema(tags), toy).new_guide()
    for t, row in zip([*ids, None], written, strict=True):
        assert np.array_equal(h.bitmask_words(), row)
        if t is not None:
            h.advance(t)


def test_out_is_validated(toy, guides):
    width = len(toy)
    n = num_words(width)
    bad = [
        torch.zeros(len(guides), n, dtype=torch.int64),  # not int32
        torch.zeros(len(guides), n + 1, dtype=torch.int32),  # not the shape
        torch.zeros(n, len(guides), dtype=torch.int32).t(),  # not contiguous
        torch.zeros(len(guides), n, dtype=torch.int32, device="meta"),  # not in host memory
        np.zeros((len(guides), n), dtype=np.int64),
        np.zeros((len(guides), n), dtype=">i4"),  # not native int32
        np.zeros((len(guides), 2 * n), dtype=np.int32)[:, ::2],
        [[0] * n] * len(guides),
    ]
    readonly = np.zeros((len(guides), n), dtype=np.int32)
    readonly.flags.writeable = False
    for out in [*bad, readonly]:
        with pytest.raises(ValueError, match="out must be"):
            allowed_bitmask(guides, width, out=out)
    with pytest.raises(ValueError, match="at least one"):
        allowed_bitmask([], width, out=np.zeros((0, n), dtype=np.int32))


def test_a_tensor_out_is_viewed_only_while_it_holds_its_words(toy, guides):
    """The view kept of a tensor `out` serves that tensor alone, while its data stays where
    it was: a new tensor (perhaps at the freed one's address) and a tensor moved onto other
    storage (`set_`) are written where they are now."""
    width = len(toy)
    want = allowed_bitmask(guides, width)
    shape = (len(guides), num_words(width))
    for _ in range(3):  # new tensors, each freed before the next
        out = torch.full(shape, 3, dtype=torch.int32)
        assert torch.equal(allowed_bitmask(guides, width, out=out), want)
        del out
    out = torch.zeros(shape, dtype=torch.int32)
    allowed_bitmask(guides, width, out=out)
    old = out.data_ptr()
    out.set_(torch.full(shape, 3, dtype=torch.int32).untyped_storage(), 0, shape)
    assert out.data_ptr() != old
    assert torch.equal(allowed_bitmask(guides, width, out=out), want)


def test_threads_write_their_own_outs(toy):
    """Threads, each with its own out, walking copies of the same guides of one index: first
    visits and cached positions, every row as computed alone (on another index)."""
    import threading

    want = [allowed_bitmask([g], len(toy))[0].clone() for g in _walked(toy)]
    guides = _walked(toy)  # (a new index: the positions uncached)
    errors: list[str] = []

    def work(k: int) -> None:
        out = torch.zeros(1, num_words(len(toy)), dtype=torch.int32)
        for _ in range(30):
            for j in range(len(guides)):
                i = (j + k) % len(guides)
                allowed_bitmask([guides[i].copy()], len(toy), out=out)
                if not torch.equal(out[0], want[i]):
                    errors.append(f"thread {k}, guide {i}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
