"""Digests of pandas, attrs and pydantic values (libraries in the test extra)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import attrs
import numpy as np
import pandas as pd
import pydantic
import pytest

import durably
from durably import digest

from .conftest import load_source


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


def test_what_pandas_values_carry_besides_their_values_counts() -> None:
    """What code reads besides the values: a Timestamp's or Timedelta's resolution
    (``as_unit``: arithmetic keeps it), a DatetimeIndex's frequency (``shift`` needs it), a
    frame's or series' ``attrs`` and ``flags``. The defaults keep the digests they had."""
    t = pd.Timestamp("2020-01-01 00:00:00")
    units = {digest(t.as_unit(u)) for u in ("s", "ms", "us", "ns")}
    assert len(units) == 4
    assert digest(pd.Timedelta(1, "s")) != digest(pd.Timedelta(1, "s").as_unit("s"))
    daily = pd.date_range("2020-01-01", periods=3, freq="D")
    assert digest(daily) != digest(pd.DatetimeIndex(list(daily)))
    assert digest(pd.timedelta_range("1D", periods=2, freq="D")) != digest(
        pd.TimedeltaIndex(list(pd.timedelta_range("1D", periods=2, freq="D"))))
    frame = pd.DataFrame({"w": [1.0, 2.0]})
    labelled = frame.copy()
    labelled.attrs["unit"] = "kg"
    assert digest(labelled) != digest(frame) == digest(frame.copy())
    assert digest(frame.set_flags(allows_duplicate_labels=False)) != digest(frame)
    series = frame["w"].copy()
    named = series.copy()
    named.attrs["unit"] = "kg"
    assert digest(named) != digest(series)
    mixed = pd.DataFrame({"w": [1.0], "n": ["a"]})
    mixed_labelled = mixed.copy()
    mixed_labelled.attrs["unit"] = "kg"
    assert digest(mixed_labelled) != digest(mixed)


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


LIBRARY_RECORDS = '''
import attrs, pydantic

@attrs.define
class Item:
    x: int
    def scaled(self):
        return self.x * FACTOR

@attrs.frozen
class Frozen:
    x: int
    def scaled(self):
        return self.x * FACTOR

class Model(pydantic.BaseModel):
    x: int
    def scaled(self):
        return self.x * FACTOR
'''


def load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, factor: str) -> ModuleType:
    """(Re)load the module of records from source, under the same name."""
    return load_source(tmp_path, monkeypatch, "durably_library_records",
                       LIBRARY_RECORDS.replace("FACTOR", factor))


def test_editing_a_method_of_attrs_and_pydantic_classes_changes_the_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def digests(m: ModuleType) -> list[str]:
        return [digest(m.Item(1)), digest(m.Frozen(1)), digest(m.Model(x=1))]

    first = digests(load(tmp_path, monkeypatch, "2"))
    edited = digests(load(tmp_path, monkeypatch, "3"))
    assert digests(load(tmp_path, monkeypatch, "2")) == first
    assert all(a != b for a, b in zip(first, edited, strict=True))


def test_pydantic_and_attrs_digests_are_stable_across_processes(tmp_path: Path) -> None:
    (tmp_path / "durably_library_records.py").write_text(LIBRARY_RECORDS.replace("FACTOR", "2"))
    script = (
        "import sys, durably, durably_library_records as m\n"
        "if sys.argv[1] == 'busy':\n"  # other work first: the digests must not depend on it
        "    m.Model(x=5).x = 6; durably.digest(m.Model); m.Model.model_json_schema()\n"
        "print(durably.digest([m.Item(1), m.Frozen(1), m.Model(x=1)]))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    outputs = {
        subprocess.run(
            [sys.executable, "-c", script, mode], env={**env, "PYTHONHASHSEED": seed},
            capture_output=True, text=True, check=True,
        ).stdout
        for seed, mode in (("0", "idle"), ("1", "busy"), ("2", "idle"))
    }
    assert len(outputs) == 1
