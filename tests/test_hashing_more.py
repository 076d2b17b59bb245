"""Digest fixes: copyreg reducers, user reconstructors, padding bytes, cached properties,
library collisions, and errors raised from inside digests."""

from __future__ import annotations

import collections
import dataclasses
import functools
import pathlib
import re
import subprocess
import sys
import warnings
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import pydantic
import pytest

import durably
from durably import digest
from durably._keys.hashing import encode_arguments

from .conftest import load_source


# -- 1. copyreg.dispatch_table is consulted first ------------------------------------------------
def test_copyreg_reducers_are_used() -> None:
    assert digest(re.compile(r"\d")) == digest(re.compile(r"\d"))
    assert digest(re.compile(r"\d")) != digest(re.compile(r"\d+"))
    assert digest(re.compile("a")) != digest(re.compile("a", re.IGNORECASE))
    assert digest(int | str) == digest(int | str) != digest(int | float)
    assert digest(np.add) == digest(np.add) != digest(np.multiply)


# -- 2. a user reconstructor's code counts -------------------------------------------------------
SOURCE = '''
def make(k):
    return Thing(k)

class Thing:
    def __init__(self, k):
        self.k = k
    def __reduce__(self):
        return (make, (self.k,))

class Other:
    def __init__(self, k):
        self.k = k
    def __reduce__(self):
        return (Other, (self.k,))
    def scaled(self):
        return self.k * FACTOR
'''


def load(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, body: str) -> ModuleType:
    return load_source(tmp_path, monkeypatch, "durably_reduce_records", body)


def test_editing_a_user_reconstructor_changes_the_digest(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load(tmp_path, monkeypatch, SOURCE.replace("FACTOR", "2"))
    a, b = digest(first.Thing(1)), digest(first.Other(1))
    assert digest(first.Thing(2)) != a
    second = load(tmp_path, monkeypatch, SOURCE.replace("FACTOR", "3"))
    assert digest(second.Other(1)) != b
    third = load(tmp_path, monkeypatch, SOURCE.replace("Thing(k)", "Thing(k + 1)"))
    assert digest(third.Thing(1)) != a


# -- 3. collisions -------------------------------------------------------------------------------
def test_categorical_index_categories_and_order_count() -> None:
    a = pd.CategoricalIndex(["x", "y"], categories=["x", "y"])
    b = pd.CategoricalIndex(["x", "y"], categories=["y", "x"])
    c = pd.CategoricalIndex(["x", "y"], categories=["x", "y"], ordered=True)
    d = pd.CategoricalIndex(["x", "y"], categories=["x", "y", "z"])
    assert digest(a) == digest(a.copy())
    assert len({digest(a), digest(b), digest(c), digest(d)}) == 4
    m1 = pd.MultiIndex.from_arrays([a, [1, 2]])
    m2 = pd.MultiIndex.from_arrays([c, [1, 2]])
    assert digest(m1) == digest(m1.copy()) != digest(m2)


class Loose(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")
    a: int


class Private(pydantic.BaseModel):
    a: int
    _secret: int = 0


def test_pydantic_extra_fields_and_private_attributes_count() -> None:
    assert digest(Loose(a=1, b=2)) == digest(Loose(a=1, b=2))
    assert digest(Loose(a=1, b=2)) != digest(Loose(a=1, b=3)) != digest(Loose(a=1))
    p, q = Private(a=1), Private(a=1)
    assert digest(p) == digest(q)
    q._secret = 5
    assert digest(p) != digest(q)


class Quantity(np.ndarray):
    unit: str


def quantity(values: list[float], unit: str) -> Quantity:
    q = np.asarray(values).view(Quantity)
    q.unit = unit
    return q


def test_ndarray_subclass_attributes_count() -> None:
    assert digest(quantity([1.0], "m")) == digest(quantity([1.0], "m"))
    assert digest(quantity([1.0], "m")) != digest(quantity([1.0], "s"))


@dataclasses.dataclass
class Bag(dict[str, int]):
    name: str = ""


def test_a_dataclass_subclassing_dict_keeps_its_content() -> None:
    a, b = Bag(name="n"), Bag(name="n")
    a["x"] = 1
    b["x"] = 2
    assert digest(a) != digest(b)
    b["x"] = 1
    assert digest(a) == digest(b)


# -- 4. padding bytes ----------------------------------------------------------------------------
PADDING = """
import numpy as np, durably
dt = np.dtype([("flag", "i1"), ("value", "f8")], align=True)
a = np.empty(3, dtype=dt)
a["flag"] = [1, 2, 3]
a["value"] = [0.5, 1.5, 2.5]
g = np.empty(3, dtype=np.longdouble)
g[:] = [1, 2, 3]
c = np.empty(2, dtype=np.clongdouble)
c[:] = [1 + 2j, 3]
print(durably.digest(a), durably.digest(g), durably.digest(c), durably.digest(g[1]))
"""


def test_padding_bytes_never_enter_a_digest() -> None:
    dt = np.dtype([("flag", "i1"), ("value", "f8")], align=True)
    a = np.zeros(3, dtype=dt)
    b = np.empty(3, dtype=dt)
    b.view(np.uint8)[:] = 0xAB  # garbage in the padding
    b["flag"], b["value"] = 0, 0.0
    assert digest(a) == digest(b)
    b["value"][1] = 1.0
    assert digest(a) != digest(b)
    g = np.zeros(2, dtype=np.longdouble)
    h = np.empty(2, dtype=np.longdouble)
    h.view(np.uint8)[:] = 0xAB
    h[:] = 0
    assert digest(g) == digest(h) != digest(np.ones(2, dtype=np.longdouble))
    assert digest(g[0]) == digest(h[0])
    cz = np.zeros(2, dtype=np.clongdouble)
    ch = np.empty(2, dtype=np.clongdouble)
    ch.view(np.uint8)[:] = 0xAB
    ch[:] = 0
    assert digest(cz) == digest(ch) != digest(cz + 1j)
    outs = {
        subprocess.run([sys.executable, "-c", PADDING], capture_output=True, text=True,
                       check=True).stdout
        for _ in range(3)
    }
    assert len(outs) == 1


# -- 5. cached_property ------------------------------------------------------------------------
class Lazy:
    def __init__(self, n: int) -> None:
        self.n = n

    @functools.cached_property
    def double(self) -> int:
        return self.n * 2


class LazyDict(dict[str, int]):
    @functools.cached_property
    def total(self) -> int:
        return sum(self.values())


def test_a_filled_cached_property_leaves_the_digest_alone() -> None:
    a = Lazy(1)
    before = digest(a)
    assert a.double == 2
    assert digest(a) == before != digest(Lazy(2))
    d = LazyDict(x=1)
    before = digest(d)
    assert d.total == 1
    assert digest(d) == before


# -- 6. warnings -----------------------------------------------------------------------------------
def test_a_deque_does_not_warn_and_warnings_name_the_argument() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert digest(collections.deque([1, 2])) != digest(collections.deque([1, 3]))

    class Bare:
        pass

    with pytest.warns(UserWarning, match="Bare \\(in argument 'cfg'\\) expose no state"):
        encode_arguments({"cfg": [Bare()]})


# -- 7. errors -------------------------------------------------------------------------------------
def test_a_deleted_file_raises_a_serialization_error(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "data.txt"
    p.write_text("x")
    f = durably.file(p)
    p.unlink()
    with pytest.raises(durably.SerializationError, match=r"argument 'data'.*gone"):
        encode_arguments({"data": f})


def test_a_file_input_reads_as_a_pathlib_path_does(tmp_path: pathlib.Path) -> None:
    """durably.file() hands a task a File: its reading methods take pathlib.Path's
    arguments (read_text(errors=...) raised TypeError)."""
    p = tmp_path / "mixed.txt"
    p.write_bytes(b"caf\xe9\r\nline two\n")
    f = durably.file(p)
    assert f.read_bytes() == p.read_bytes()
    assert f.read_text(errors="replace") == "caf\ufffd\nline two\n"
    assert f.read_text("latin-1") == "café\nline two\n"
    assert f.read_text(encoding="latin-1", newline="") == "café\r\nline two\n"
    assert f.read_text("utf-8", "ignore", "") == "caf\r\nline two\n"
    with pytest.raises(UnicodeDecodeError):
        f.read_text()  # (UTF-8, strict: as Path.read_text(encoding="utf-8"))
    with f.open() as raw:
        assert raw.read(3) == b"caf"
    with f.open("r", encoding="utf-8", errors="backslashreplace", newline="") as text:
        assert text.read() == "caf\\xe9\r\nline two\n"
    with f.open(mode="rb", buffering=0) as unbuffered:
        assert unbuffered.read() == p.read_bytes()


class Broken:
    def __durably_digest__(self) -> Any:
        raise ValueError("boom")


class BrokenRegistered:
    pass


durably.register_encoder(BrokenRegistered, lambda o: 1 / 0)


def test_an_error_inside_a_digest_hook_is_wrapped() -> None:
    with pytest.raises(durably.SerializationError, match=r"argument 'x'.*Broken.*boom") as info:
        encode_arguments({"x": Broken()})
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(durably.SerializationError, match=r"BrokenRegistered.*ZeroDivision"):
        digest([BrokenRegistered()])


def test_deep_nesting_raises_a_serialization_error() -> None:
    deep: list[Any] = []
    for _ in range(sys.getrecursionlimit() * 2):
        deep = [deep]
    with pytest.raises(durably.SerializationError, match="nested too deeply"):
        digest(deep)
    with pytest.raises(durably.SerializationError, match=r"argument 'v'.*nested too deeply"):
        encode_arguments({"v": deep})


# -- 8. wide frames --------------------------------------------------------------------------------
def test_a_wide_uniform_frame_digests_by_its_block() -> None:
    df = pd.DataFrame(np.arange(12.0).reshape(3, 4), columns=list("abcd"))
    assert digest(df) == digest(df.copy()) == digest(pd.DataFrame({c: df[c].tolist() for c in df}))
    changed = df.copy()
    changed.iloc[2, 3] = -1.0
    assert digest(df) != digest(changed)
    assert digest(df) != digest(df.T.T.astype("float32"))
    assert digest(df) != digest(df[["b", "a", "c", "d"]])
    mixed = df.assign(a=df["a"].astype("int64"))
    assert digest(mixed) != digest(df)
