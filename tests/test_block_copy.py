"""Whole-page block copies (``vllm_admission.plugin.repairs.block_copy``): a page that an
attention layer and a Mamba layer share is copied whole, whatever view comes first."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from vllm_admission.plugin.repairs.block_copy import copy_pages  # noqa: E402

NUM_BLOCKS, PAGE, STATE = 6, 64, 40  # bytes per page; the state view covers 40 of them


def shared_views():
    """Two layer pairs in one allocation, as vLLM lays out a hybrid model: per pair a
    Mamba view (int8, the first STATE bytes of each page) and an attention view (bf16,
    the whole page) of the same bytes. Returns the first pair's pages and views."""
    whole = torch.arange(2 * NUM_BLOCKS * PAGE, dtype=torch.int64).remainder(251)
    whole = whole.to(torch.uint8)
    raw = whole[:NUM_BLOCKS * PAGE]
    state = torch.as_strided(whole.view(torch.int8), (NUM_BLOCKS, 1, STATE), (PAGE, STATE, 1))
    attention = raw.view(torch.bfloat16).view(NUM_BLOCKS, 2, PAGE // 4)
    return raw, state, attention


def pair(src, dst):
    return SimpleNamespace(src_block_id=src, dst_block_id=dst)


def test_the_whole_shared_page_is_copied_even_through_the_state_view_first():
    """vLLM 0.32's ``copy_kv_cache_blocks_inplace`` copies these pages through the state
    view only (docs/engine-facts.md section 10); here every byte of each page moves."""
    raw, state, attention = shared_views()
    before = raw.view(NUM_BLOCKS, PAGE).clone()
    copy_pages([state, attention], NUM_BLOCKS, [pair(1, 4), pair(2, 5)])
    pages = raw.view(NUM_BLOCKS, PAGE)
    assert torch.equal(pages[4], before[1]) and torch.equal(pages[5], before[2])
    assert torch.equal(pages[:4], before[:4])  # nothing else moved
    assert torch.equal(attention[4], attention[1])


def test_views_at_other_offsets_or_strides_are_copied_each():
    # Two layer pairs in one allocation (views at different offsets): both copied.
    raw = torch.zeros(2 * NUM_BLOCKS * PAGE, dtype=torch.uint8)
    raw[:] = torch.arange(raw.numel()).remainder(249).to(torch.uint8)
    first = raw[:NUM_BLOCKS * PAGE].view(NUM_BLOCKS, PAGE)
    second = raw[NUM_BLOCKS * PAGE:].view(NUM_BLOCKS, PAGE)
    want = (first[0].clone(), second[0].clone())
    copy_pages([first, second, first], NUM_BLOCKS, [pair(0, 3)])
    assert torch.equal(first[3], want[0]) and torch.equal(second[3], want[1])


def test_nothing_to_copy_and_a_view_off_the_pool_size():
    raw, state, attention = shared_views()
    copy_pages([state], NUM_BLOCKS, [])
    with pytest.raises(ValueError, match="not a multiple"):
        copy_pages([attention], NUM_BLOCKS + 1, [pair(0, 1)])
