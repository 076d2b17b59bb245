"""A numpy array's memory order is part of its digest when code can observe it (issue #33,
point 5): a task whose result depends on the layout (``ravel(order="K")``) is never served
the result computed for another layout, while equal arrays of equal layout share, and every
C-ordered array keeps the digest it always had (pinned)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import durably
from durably import digest

#: the digest of np.arange(6, dtype="<i8").reshape(2, 3), pinned in test_hashing's GOLDEN
GOLDEN_C = "72895f124d187eb3fba1712379ff8db0"


def _c() -> Any:
    return np.arange(6, dtype="<i8").reshape(2, 3)


def test_a_task_reading_memory_order_is_never_served_another_layouts_result(
        store: Any) -> None:
    calls: list[str] = []

    @durably.task
    def flat(a: Any) -> list[int]:
        calls.append("F" if a.flags.f_contiguous else "C")
        return [int(x) for x in a.ravel(order="K")]

    c = _c()
    f = np.asfortranarray(c)
    assert np.array_equal(c, f)
    assert flat(c) == [0, 1, 2, 3, 4, 5]
    assert flat(f) == [0, 3, 1, 4, 2, 5]  # (was served [0, 1, 2, 3, 4, 5], C's result)
    assert calls == ["C", "F"]
    # equal arrays of equal layout share the entry
    assert flat(_c()) == [0, 1, 2, 3, 4, 5]
    assert flat(np.asfortranarray(_c())) == [0, 3, 1, 4, 2, 5]
    assert calls == ["C", "F"]


def test_c_ordered_arrays_keep_their_pinned_digest() -> None:
    c = _c()
    assert digest(c) == GOLDEN_C
    assert digest(np.ascontiguousarray(np.asfortranarray(c))) == GOLDEN_C
    # 1-D and 0-d arrays are C- and Fortran-contiguous at once: no layout, as before
    one = np.arange(5.0)
    assert digest(np.asfortranarray(one)) == digest(one)
    assert digest(np.array(3.0, order="F")) == digest(np.array(3.0))
    # a column (n, 1) or a row (1, n) is contiguous in both orders too
    col = np.arange(4.0).reshape(4, 1)
    assert digest(np.asfortranarray(col)) == digest(col)


def test_views_in_c_order_share_with_their_copy_and_others_do_not() -> None:
    a = np.arange(24.0).reshape(4, 6)
    for view in (a[::2], a[:, 1::3], a[::-1], a[::-1, ::-2]):
        assert view.ravel(order="K").tolist() == view.ravel().tolist()
        assert digest(view) == digest(np.ascontiguousarray(view))
    f = np.asfortranarray(a)
    # a strided view of a Fortran array visits its elements in Fortran order: not shared
    # with its C copy, nor with its Fortran copy (order="A" reads that copy in F order)
    view = f[::2]
    assert not view.flags.f_contiguous
    assert digest(view) != digest(np.ascontiguousarray(view))
    assert digest(view) != digest(np.asfortranarray(view))
    assert digest(view) == digest(np.asfortranarray(a)[::2])
    # a transposed 3-D view: neither C nor Fortran order
    t = np.arange(24.0).reshape(2, 3, 4).transpose(1, 0, 2)
    assert digest(t) != digest(np.ascontiguousarray(t))
    assert digest(t) == digest(np.arange(24.0).reshape(2, 3, 4).transpose(1, 0, 2))
    # broadcast (stride 0) arrays visited in C order keep their C digest
    b = np.broadcast_to(np.arange(4.0), (3, 4))
    assert b.ravel(order="K").tolist() == b.ravel().tolist()
    assert digest(b) == digest(np.ascontiguousarray(b))


def _random_view(rng: Any) -> Any:
    nd = int(rng.integers(1, 5))
    shape = tuple(int(x) for x in rng.integers(1, 4, nd))
    a = np.arange(int(np.prod(shape))).reshape(shape).transpose(rng.permutation(nd))
    a = a[tuple(slice(None, None, int(rng.choice([1, 2, -1, -2]))) for _ in a.shape)]
    if rng.random() < 0.3:
        axis = int(rng.integers(0, a.ndim))
        shape = list(a.shape)
        shape[axis] = 3
        a = np.broadcast_to(np.take(a, [0], axis=axis), shape)
    if rng.random() < 0.2:
        a = np.asfortranarray(a)
    return a


def test_equal_digests_mean_equal_order_k_ravels() -> None:
    """Two arrays with one digest read the same with ravel(order="K"), whatever their
    strides (the layout is sorted as numpy's iterator sorts it)."""
    rng = np.random.default_rng(7)
    seen: dict[str, list[int]] = {}
    for _ in range(3000):
        a = _random_view(rng)
        k = a.ravel(order="K").tolist()
        assert seen.setdefault(digest(a), k) == k, (a.shape, a.strides)
        # an array whose ravel(order="K") is C order shares with its C copy
        if (k == a.ravel().tolist() and not a.flags.f_contiguous) or a.flags.c_contiguous:
            assert digest(a) == digest(np.ascontiguousarray(a))


def test_masked_and_object_arrays_carry_their_layout_too() -> None:
    c = np.ma.masked_array(_c(), mask=[[0, 1, 0], [0, 0, 0]])
    f = np.ma.masked_array(np.asfortranarray(_c()), mask=np.asfortranarray(c.mask))
    assert digest(c) != digest(f)
    # a C-ordered array's digest does not depend on its mask's layout
    assert digest(np.ma.masked_array(_c(), mask=np.asfortranarray(c.mask))) == digest(c)
    o = np.array([[1, "a"], [2, "b"]], dtype=object)
    assert digest(o) != digest(np.asfortranarray(o))


def test_pandas_frames_do_not_depend_on_their_block_layout() -> None:
    """A DataFrame's values are encoded in C order whatever pandas' block layout: a frame
    built from a C or a Fortran array is the same value (its layout is pandas' own)."""
    pd = pytest.importorskip("pandas")
    c = np.arange(6.0).reshape(2, 3)
    assert digest(pd.DataFrame(c)) == digest(pd.DataFrame(np.asfortranarray(c)))
    assert digest(pd.DataFrame(c)) == digest(pd.DataFrame(c.copy()))
