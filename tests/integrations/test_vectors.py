"""The vector helpers that retrieval's near-duplicate check relies on."""

import pytest

from icrlhf.integrations import vectors


def test_a_unit_array_has_length_one_and_keeps_its_direction() -> None:
    unit = vectors.unit_array([3.0, 4.0])

    assert unit.tolist() == pytest.approx([0.6, 0.8])


def test_the_dot_product_of_unit_arrays_is_their_cosine() -> None:
    a, b = [1.0, 2.0, 3.0], [-2.0, 0.5, 4.0]

    assert float(vectors.unit_array(a) @ vectors.unit_array(b)) == pytest.approx(
        vectors.cosine(a, b)
    )


def test_a_zero_vector_stays_zero_rather_than_dividing_by_zero() -> None:
    assert vectors.unit_array([0.0, 0.0]).tolist() == [0.0, 0.0]
