"""The engine tests' output comparison (tests/model_output.py) on made-up outputs: what it
accepts as rounding and what it rejects as a different model output."""

from __future__ import annotations

import pytest
from model_output import Output, output_difference, unit_roundoff

U = 2.0**-8  # bfloat16


def out(tokens, logits, passes=1):
    return Output(cached=0, tokens=list(tokens), logits=[dict(d) for d in logits], passes=passes)


# Two positions; at position 1 the top two logits are one bfloat16 ulp apart (0.5 vs 0.5 - 2**-9).
WANT = out([7, 3], [{7: 0.75, 1: 0.25}, {3: 0.5, 9: 0.5 - 2**-9, 1: 0.1}])


def test_unit_roundoff_is_half_the_dtypes_epsilon():
    pytest.importorskip("torch")
    assert unit_roundoff("bfloat16") == U
    assert unit_roundoff("float32") == 2.0**-24


def test_the_same_output_passes_exactly_and_within_rounding():
    same = out(WANT.tokens, WANT.logits)
    assert output_difference(WANT, same, U, exact=True) is None
    assert output_difference(WANT, same, U) is None


def test_a_logit_moved_by_one_rounding_passes_only_without_exact():
    moved = out([7, 3], [{7: 0.75 + 2**-8, 1: 0.25}, WANT.logits[1]])
    assert output_difference(WANT, moved, U) is None
    assert "bit-identical" in output_difference(WANT, moved, U, exact=True)


def test_a_flip_at_a_near_tie_passes_and_ends_the_comparison():
    # Position 1 flips 3 -> 9 at a one-ulp tie; what follows is not compared.
    flipped = out([7, 9], [WANT.logits[0], {9: 0.5, 3: 0.5 - 2**-9, 1: 0.1}])
    assert output_difference(WANT, flipped, U) is None


def test_a_flip_with_a_clear_margin_is_a_different_output():
    want = out([7, 3], [{7: 0.75, 1: 0.25}, {3: 0.5, 9: 0.25}])
    flipped = out([7, 9], [want.logits[0], {9: 0.5, 3: 0.25}])
    assert "not a near-tie" in output_difference(want, flipped, U)


def test_a_flip_to_a_token_outside_the_top_k_is_a_different_output():
    flipped = out([7, 4], [WANT.logits[0], {4: 0.5, 1: 0.1}])
    assert "top" in output_difference(WANT, flipped, U)


def test_a_drifting_logit_fails_even_when_the_tokens_agree():
    # The same greedy tokens, but the chosen token's logit moved by 0.05: far beyond
    # passes * u * max |logit| = 2 * 2**-8 * 0.75 = 0.0059.
    drifted = out([7, 3], [{7: 0.70, 1: 0.25}, WANT.logits[1]])
    assert "moved by" in output_difference(WANT, drifted, U)


def test_the_bound_grows_with_the_prefill_passes():
    drifted = out([7, 3], [{7: 0.75 + 3 * 2**-8, 1: 0.25}, WANT.logits[1]], passes=1)
    assert output_difference(WANT, drifted, U) is not None  # 2 passes: 0.0059 < 0.0117
    drifted.passes = 4
    assert output_difference(WANT, drifted, U) is None  # 5 passes: 0.0146


def test_outputs_of_other_lengths_differ():
    assert "tokens against" in output_difference(WANT, out([7], WANT.logits[:1]), U)
