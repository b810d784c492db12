"""The comparison helpers fail on the errors they exist to catch: a NaN or an infinity where the
reference is finite, a NaN on both sides of an equality, a value out of tolerance."""

from __future__ import annotations

import numpy as np
import pytest

from support.reference import assert_close, assert_same

REF = np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_assert_close_fails_on_a_non_finite_value_and_says_where(bad):
    out = REF.copy()
    out[2, 1] = bad
    with pytest.raises(AssertionError, match=r"non-finite values where the reference is finite, at \(2, 1\)"):
        assert_close(out, REF, atol=1.0, rtol=1.0)


def test_assert_close_fails_on_an_all_nan_output():
    with pytest.raises(AssertionError, match="12 non-finite"):
        assert_close(np.full_like(REF, np.nan), REF)


def test_assert_close_passes_within_and_fails_past_the_bound():
    assert_close(REF + 0.5e-4, REF, atol=1e-4, rtol=0)
    with pytest.raises(AssertionError, match="1 of 12 values out of tolerance"):
        out = REF.copy()
        out[0, 0] += 2e-4
        assert_close(out, REF, atol=1e-4, rtol=0)


def test_assert_close_takes_the_reference_non_finite_values_only_where_they_match():
    ref = REF.copy()
    ref[1, 1] = np.nan
    ref[1, 2] = np.inf
    assert_close(ref.copy(), ref)
    out = ref.copy()
    out[1, 2] = 0.0
    with pytest.raises(AssertionError, match=r"differ from the reference's non-finite ones, at \(1, 2\)"):
        assert_close(out, ref)


def test_assert_same_fails_when_both_sides_are_nan():
    both = np.full_like(REF, np.nan)
    np.testing.assert_array_equal(both, both)  # what the suite used: NaN == NaN passes it
    with pytest.raises(AssertionError, match="reference holds non-finite values"):
        assert_same(both, both)


def test_assert_same_fails_on_a_nan_or_one_flipped_value():
    out = REF.copy()
    out[0, 3] = np.nan
    with pytest.raises(AssertionError, match=r"at \(0, 3\)"):
        assert_same(out, REF)
    out = REF.copy()
    out[2, 2] = np.nextafter(out[2, 2], np.float32(2))
    with pytest.raises(AssertionError, match=r"1 of 12 values differ, first at \(2, 2\)"):
        assert_same(out, REF)
    assert_same(REF.copy(), REF)


def test_assert_same_compares_integer_codes_and_shapes():
    codes = np.arange(12).reshape(3, 4)
    assert_same(codes.copy(), codes)
    with pytest.raises(AssertionError, match="shape"):
        assert_same(codes[:2], codes)
