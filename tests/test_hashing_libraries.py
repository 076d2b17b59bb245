"""Digests of pandas, attrs and pydantic values (libraries in the test extra)."""

from __future__ import annotations

import attrs
import numpy as np
import pandas as pd
import pydantic

import durably
from durably import digest


def test_dataframe_by_values_index_columns_and_dtypes() -> None:
    df = pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})
    assert digest(df) == digest(df.copy())
    assert digest(df) == digest(pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]}))
    assert digest(df) != digest(df.astype({"a": "int32"}))
    assert digest(df) != digest(df.rename(columns={"b": "c"}))
    assert digest(df) != digest(df.set_axis([10, 11, 12]))
    assert digest(df) != digest(df.assign(a=[1, 2, 4]))
    assert digest(df) != digest(df[["b", "a"]])  # column order is part of a frame
    dup = pd.DataFrame([[1, 2]], columns=["a", "a"])
    assert digest(dup) != digest(pd.DataFrame([[1, 3]], columns=["a", "a"]))


def test_series_and_index() -> None:
    s = pd.Series([1.0, 2.0], index=["r", "s"], name="v")
    assert digest(s) == digest(s.copy())
    assert digest(s) != digest(s.rename("w"))
    assert digest(s) != digest(s.astype("float32"))
    assert digest(s) != digest(s.to_frame())
    assert digest(pd.Index([1, 2])) != digest(pd.Index([1, 2], name="n"))
    assert digest(pd.RangeIndex(3)) == digest(pd.RangeIndex(3))


def test_categoricals_timestamps_and_missing_values() -> None:
    c1 = pd.Series(pd.Categorical(["a", "b"], categories=["a", "b"]))
    c2 = pd.Series(pd.Categorical(["a", "b"], categories=["b", "a"]))
    c3 = pd.Series(pd.Categorical(["a", "b"], categories=["a", "b"], ordered=True))
    assert len({digest(c1), digest(c2), digest(c3)}) == 3
    t = pd.Timestamp("2026-01-01 00:00:00.000000001")
    assert digest(t) != digest(pd.Timestamp("2026-01-01 00:00:00.000000002"))
    assert digest(t) != digest(t.tz_localize("UTC"))
    assert digest(t.to_pydatetime(warn=False)) != digest(t)
    assert digest(pd.Timedelta(1, "ns")) != digest(pd.Timedelta(2, "ns"))
    assert digest(pd.NaT) == digest(pd.NaT) != digest(pd.NA)
    nullable = pd.Series([1, None], dtype="Int64")
    assert digest(nullable) == digest(pd.Series([1, None], dtype="Int64"))
    assert digest(nullable) != digest(pd.Series([1, 2], dtype="Int64"))
    aware = pd.DatetimeIndex(["2026-01-01"], tz="Europe/Paris")
    assert digest(aware) != digest(pd.DatetimeIndex(["2026-01-01"], tz="UTC"))


@attrs.define
class Point:
    x: int
    y: list[int] = attrs.field(factory=list)


class Model(pydantic.BaseModel):
    name: str
    weights: dict[str, float]


def test_attrs_and_pydantic_by_field_values() -> None:
    assert digest(Point(1, [2])) == digest(Point(1, [2]))
    assert digest(Point(1, [2])) != digest(Point(1, [3]))
    assert digest(Point(1)) != digest((1, []))
    m = Model(name="a", weights={"x": 1.0, "y": 2.0})
    assert digest(m) == digest(Model(name="a", weights={"y": 2.0, "x": 1.0}))
    assert digest(m) != digest(Model(name="a", weights={"x": 1.0, "y": 3.0}))


def test_dataframe_argument_caches_a_task(tmp_path: object) -> None:
    calls = []

    @durably.task
    def total(df: pd.DataFrame) -> float:
        calls.append(1)
        return float(df.to_numpy().sum())

    df = pd.DataFrame({"a": np.arange(5.0)})
    assert total(df) == total(df.copy()) == 10.0
    assert total(df.assign(a=df.a + 1)) == 15.0
    assert len(calls) == 2
