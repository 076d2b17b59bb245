"""The canonical digest: equal values agree in every process, different values differ."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import decimal
import enum
import fractions
import importlib
import importlib.util
import json
import os
import pathlib
import random
import struct
import subprocess
import sys
import threading
import uuid
import zoneinfo
from collections.abc import Iterator
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import durably
from durably._keys.hashing import encode_arguments

from .conftest import load_source

# -- shared strategies ---------------------------------------------------------------------
# Set elements and dict keys never mix values that are == across types (1, 1.0, True, -0.0,
# 0.0): Python keeps whichever came first, so such sets are "equal" yet hold different values.
atoms = (
    st.none() | st.booleans() | st.integers() | st.floats() | st.complex_numbers()
    | st.text(max_size=8) | st.binary(max_size=8)
)
hashables = st.recursive(
    st.integers() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3).map(tuple) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
values = st.recursive(
    atoms | hashables,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(hashables, inner, max_size=4)
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
    ),
    max_leaves=20,
)


def rebuild(v: Any, rnd: random.Random) -> Any:
    """An equal value built from new containers, with dict and set insertion order shuffled."""
    if isinstance(v, (dict, set, frozenset)):
        items = list(v.items()) if isinstance(v, dict) else list(v)
        rnd.shuffle(items)
        if isinstance(v, dict):
            return {rebuild(k, rnd): rebuild(x, rnd) for k, x in items}
        return type(v)(rebuild(x, rnd) for x in items)
    if isinstance(v, (list, tuple)):
        return type(v)(rebuild(x, rnd) for x in v)
    return v


def strict(v: Any) -> str:
    """Test oracle: a text that is equal exactly when two values must share a digest."""
    t = type(v)
    if t is float:
        return "float:" + ("nan" if v != v else struct.pack("<d", v).hex())
    if t is complex:
        return f"complex({strict(v.real)},{strict(v.imag)})"
    if t in (list, tuple):
        return f"{t.__name__}[{','.join(strict(x) for x in v)}]"
    if t is dict:
        return "dict{" + ",".join(sorted(f"{strict(k)}:{strict(x)}" for k, x in v.items())) + "}"
    if t in (set, frozenset):
        return t.__name__ + "{" + ",".join(sorted(strict(x) for x in v)) + "}"
    return f"{t.__name__}:{v!r}"


digest = durably.digest
NAN = float("nan")
TOKYO = zoneinfo.ZoneInfo("Asia/Tokyo")


# -- 1. properties ------------------------------------------------------------------------
@settings(deadline=None)
@given(values, st.randoms(use_true_random=False))
def test_equal_values_built_in_any_order_share_a_digest(v: Any, rnd: random.Random) -> None:
    assert digest(rebuild(v, rnd)) == digest(v)


@settings(deadline=None)
@given(values, values)
def test_digests_differ_exactly_when_values_differ(a: Any, b: Any) -> None:
    assert (digest(a) == digest(b)) == (strict(a) == strict(b))


@settings(deadline=None)
@given(values)
def test_wrapping_a_value_changes_its_digest(v: Any) -> None:
    forms = [v, [v], (v,), [v, v], {"k": v}, {"k": [v]}]
    assert len({digest(w) for w in forms}) == len(forms)


DISTINCT = [
    1, 1.0, True, "1", b"1", bytearray(b"1"), 1 + 0j, decimal.Decimal(1), fractions.Fraction(1),
    0.0, -0.0, 0, False, None, "", b"", [], (), {}, set(), frozenset(), [1], (1,), {1},
    frozenset({1}), {1: 1}, {"1": 1}, [[1]], [(1,)], {"a": {1}}, {"a": frozenset({1})},
    [1, [2]], [1, [2.0]], {"a": (1,)}, {"a": [1]}, range(1), slice(1), ..., 2**64, -(2**64),
    float("inf"), -float("inf"), NAN, np.int64(1), np.float64(1.0), np.array(1),
]


def test_values_of_different_type_or_content_all_differ() -> None:
    digests = [digest(v) for v in DISTINCT]
    assert len(set(digests)) == len(DISTINCT)


def test_nan_digests_equal_nan_deliberately() -> None:
    other_nan = struct.unpack("<d", bytes.fromhex("010000000000f87f"))[0]  # another payload
    assert digest(NAN) == digest(float("nan")) == digest(-NAN) == digest(other_nan)
    assert digest([NAN, {"x": NAN}]) == digest([float("nan"), {"x": float("nan")}])
    assert digest(complex(NAN, 1)) == digest(complex(float("nan"), 1))


def test_order_never_matters_for_dicts_sets_and_arguments() -> None:
    words = [f"word{i}" for i in range(1000)]
    assert digest(set(words)) == digest(set(reversed(words))) != digest(frozenset(words))
    assert digest(dict.fromkeys(words, 0)) == digest(dict.fromkeys(reversed(words), 0))
    d = digest({"a": [1, 2.5, None]})
    assert len(d) == 32 and int(d, 16) >= 0 and d == d.lower()
    assert encode_arguments({"a": 1, "b": 2}) == encode_arguments({"b": 2, "a": 1})
    assert encode_arguments({"a": 1, "b": 2}) != encode_arguments({"a": 2, "b": 1})
    assert encode_arguments({"a": 1}) != encode_arguments({"b": 1})
    assert encode_arguments({"a": 1}) != digest({"a": 1})


def test_builtin_subclasses_keep_their_type_and_state() -> None:
    od = collections.OrderedDict
    assert digest(od(a=1, b=2)) != digest(od(b=2, a=1))  # order is part of the value
    assert digest(od(a=1)) == digest(od(a=1)) != digest({"a": 1})
    dd = collections.defaultdict
    assert digest(dd(int, a=1)) != digest(dd(list, a=1))
    tagged = type("Tagged", (list,), {})
    x, y = tagged([1]), tagged([1])
    assert digest(x) == digest(y) != digest([1])
    y.meta = "other"
    assert digest(x) != digest(y)


# -- 2. stable across processes --------------------------------------------------------------
VALUES_MODULE = '''
import dataclasses, datetime as dt, decimal, enum, fractions, json, pathlib, uuid, zoneinfo
from typing import NamedTuple
import numpy as np
import durably

@dataclasses.dataclass
class Point:
    x: int
    tags: set

Color = enum.Enum("Color", "RED BLUE")
Pair = NamedTuple("Pair", [("a", int), ("b", frozenset)])
WORDS = [f"w{i}" for i in range(40)]

class Plain:
    def __init__(self):
        self.names = set(WORDS)

class FixedTZ(dt.tzinfo):
    def __init__(self, hours):
        self.hours = hours
    def utcoffset(self, d):
        return dt.timedelta(hours=self.hours)

def scale(x):
    return x * len(WORDS)

@dataclasses.dataclass
class Settings:
    lr: float
    WARMUP = 10
    def effective_lr(self):
        return self.lr / self.WARMUP

class Shade(enum.Enum):
    DARK = (1, "d")
    LIGHT = (2, "l")
    def other(self):
        return Shade.LIGHT if self is Shade.DARK else Shade.DARK

class Perm(enum.Flag):
    R = 1
    W = 2
    def readable(self):
        return bool(self.value & 1)

class Tags(dict):
    __slots__ = ("kind",)
    def first(self):
        return min(self)

DEFAULT = Settings(0.1)

def uses_records(x):
    return DEFAULT.effective_lr() * x if Shade.DARK.other() else [Shade.DARK, DEFAULT]

def tags():
    t = Tags(a=1)
    t.kind = "k"
    return t

def values():
    w = WORDS
    return {
        "dict": {k: i for i, k in enumerate(w)}, "set": set(w), "frozenset": frozenset(w),
        "nested": {"a": [set(w[:5]), (frozenset(w[5:9]), {"k": {frozenset(w[9:12])}})]},
        "dataclass": Point(1, set(w[:10])), "plain_object": Plain(),
        "aware": dt.datetime(2024, 3, 1, 12, tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
        "utc": dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC), "naive": dt.datetime(2024, 3, 1),
        "custom_tz": dt.datetime(2024, 3, 1, tzinfo=FixedTZ(3)),
        "decimal": decimal.Decimal("3.14"), "fraction": fractions.Fraction(2, 7),
        "uuid": uuid.UUID(int=12345), "path": pathlib.Path("data") / "x.csv",
        "enum": Color.BLUE, "namedtuple": Pair(1, frozenset(w)),
        "array": np.arange(12).reshape(3, 4), "array_T": np.arange(12.0).reshape(3, 4).T,
        "array_obj": np.array([set(w[:4]), "s"], dtype=object),
        "big": bytes(range(256)) * 1024, "big_in_set": {bytes(70000), b"small"},
        "function": scale,
        "record_methods": Settings(0.2), "enum_methods": Shade.DARK, "flag": Perm.R,
        "slotted_dict": tags(), "function_records": uses_records,
    }

def main():
    Perm.R | Perm.W  # a combined value joins Perm's member map: the digests must not move
    print(json.dumps({k: durably.digest(v) for k, v in values().items()}))
'''


def test_digests_are_identical_across_processes_and_hash_seeds(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "durably_stability_values"
    (tmp_path / f"{name}.py").write_text(VALUES_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    runs = []
    for seed in ("0", "1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", f"import {name}; {name}.main()"],
            env={**env, "PYTHONHASHSEED": seed}, capture_output=True, text=True, check=True,
        )
        runs.append(json.loads(out.stdout))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module(name)
    try:
        here = {k: digest(v) for k, v in module.values().items()}
    finally:
        del sys.modules[name]
    assert runs[0] == runs[1] == runs[2] == here
    assert len(set(here.values())) == len(here)


# -- 3. golden digests ------------------------------------------------------------------------
@dataclasses.dataclass
class GoldenPoint:
    x: int
    y: str


class GoldenPlain:
    def __init__(self) -> None:
        self.n, self.tags = 1, {"b", "a"}


GoldenColor = enum.Enum("GoldenColor", "RED")
GoldenPair = collections.namedtuple("GoldenPair", "a b")
for _golden_type in (GoldenPoint, GoldenPlain, GoldenColor, GoldenPair):  # whatever our module
    _golden_type.__module__ = "golden_values"

# Pinned digests: a change here changes every user's cache keys. Change ENCODING_VERSION and
# these together, never silently.
GOLDEN: list[tuple[Any, str]] = [
    (None, "3ee6403d4745a5fd8dabb1c6b54e5ee8"),
    (True, "c47800e13c0dee5e97724788c0926087"),
    (2**100, "d70c42b502f6902d7c3d431f9639f02c"),
    (-0.0, "e91eed936bce5de045be0bd87d3c1dc8"),
    (NAN, "a62f15d7b2695f40376a39dac199b69f"),
    (1 - 2j, "a2bd406c365e65809529e1be6bdeb017"),
    ("héllo", "58b48bbe7df37febf070f6085a3d2773"),
    # str keys past the kept blocks' 64, ASCII (written at C speed) and not
    ({f"key{i}": i for i in range(100)}, "168a4e597c1cb326a9a0c23b2f96b79f"),
    ({("ké" if i % 7 == 0 else "k") + str(i): i for i in range(100)},
     "8f5703cd11e0bc5952e53fade5d68260"),
    ({"été": 1, "a": 2, "z\U0001f600": 3}, "8c2ee845d2b7aba41e1b955f482820c3"),
    (b"\x00\xff", "d72b14433b6e9d615bb55bed265d42f0"),
    ([1, "a", None], "d893f0f5f1c0d10974b1cd82676fc6d4"),
    ({"b": 2, "a": [1]}, "46dc1251db04ee94824c7c4e81cb4560"),
    ({3, 1, 2}, "8a490d6f3043b45d1b49fb8ac0048c46"),
    (frozenset({"x", "y"}), "9c5b072d2d189a47557bec4143fc8636"),
    (decimal.Decimal("1.10"), "b322e2af8967c045897d99c4db8e0dad"),
    (uuid.UUID(int=1), "fa5c1e8521270c648eb5f1546a4b9144"),
    (dt.datetime(2024, 1, 2, 3, 4, 5, 6), "ab09669f7e43c62cb85b824df683dd46"),
    (dt.datetime(2024, 1, 2, tzinfo=dt.UTC), "44bc67dc3834f40647bd0414f902b40f"),
    (dt.datetime(2024, 1, 2, tzinfo=TOKYO), "99965286495927407d4b30635f75ff35"),
    (pathlib.PurePosixPath("a/b.txt"), "036aeaf6dff983e6d4eab876730ad89b"),
    (np.arange(6, dtype="<i8").reshape(2, 3), "72895f124d187eb3fba1712379ff8db0"),
    (np.float64(1.5), "f19b10eb341e24c3f6f138341a12bc14"),
    (GoldenPoint(1, "y"), "078cda58de9a3ff753a97eb8135189c4"),
    (GoldenPlain(), "bed3c42e1c3b0df3651180d05a2dafcf"),
    (GoldenColor.RED, "06135dcd0b9ae737d3095c42541ae736"),
    (GoldenPair(1, {"k": b"v"}), "64f9c0ef476d2e4a86ecf00d89a4a936"),
    (bytes(range(256)) * 300, "227c3f9a866773e6210af181f3133312"),
    # runs of strings (encoded as one block at C speed: the same bytes as one by one)
    ([f"line {i}" for i in range(10)], "da5ab64c2e4bf4942ddc920c93069066"),
    (tuple("abcdefghé\ud800"), "750dc9dae0daea4e0d576b6368682d21"),
    (["x" * 70000] + ["y"] * 9, "b08d3b15a9813ae961843812aa5e4dac"),
    ([["a"] * 8, ("b",) * 8], "c64facc043dcd7b0b932d08a8aedc9a7"),
    ({"m": [f"{i:04d}" * 250 for i in range(100)], "n": 1}, "8f5de78c1c1396ef146bc7fc19d53166"),
]


_texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=30) | st.sampled_from(
    ["", "é" * 40000, "z" * 65535, "z" * 65536])


@settings(deadline=None, max_examples=200)
@given(st.lists(_texts, max_size=40), st.booleans())
def test_a_run_of_strings_digests_as_its_strings_one_by_one(
        strings: list[str], as_tuple: bool) -> None:
    from durably._keys.canonical import Encoder

    value: Any = tuple(strings) if as_tuple else strings
    fast = digest(value)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Encoder, "strings",  # each str on its own
                   lambda self, items, digests=False: None if digests else False)
        assert digest(value) == fast


def _str_block_written_anew(self: Any, tag: bytes, keys: list[str]) -> None:
    """Encoder.str_block as it was before its blocks were kept (the oracle below)."""
    import array

    encoded = [k.encode("utf-8", "surrogatepass") for k in keys]
    lengths = array.array("Q", map(len, encoded))
    if sys.byteorder == "big":
        lengths.byteswap()
    self.buf += tag + len(keys).to_bytes(8, "little")
    self.buf += lengths.tobytes()
    self.raw(b"k", b"".join(encoded))


@settings(deadline=None, max_examples=300)
@given(st.dictionaries(_texts, values, max_size=70), st.booleans())
def test_kept_blocks_of_dict_keys_digest_as_keys_written_anew(
        d: dict[str, Any], as_set: bool) -> None:
    """The block of a dict's str keys (or a set's strs) is kept after its first use: a dict
    digests the same the first time, from the kept block, once the blocks kept are full,
    and as the keys written anew each time."""
    from durably._keys import canonical as _canonical
    from durably._keys.canonical import Encoder

    value: Any = set(d) if as_set else d
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_canonical, "_KEY_BLOCKS", {})
        first, kept = digest(value), digest(value)
        mp.setattr(_canonical, "_KEY_BLOCKS", {(i,): b"" for i in range(4096)})  # full
        full = digest(value)
        mp.setattr(Encoder, "str_block", _str_block_written_anew)
        assert first == kept == full == digest(value)


@pytest.mark.parametrize(("value", "expected"), GOLDEN, ids=[repr(v)[:40] for v, _ in GOLDEN])
def test_golden_digests(value: Any, expected: str) -> None:
    assert durably.ENCODING_VERSION == 1
    assert digest(value) == expected


# -- 4. numpy ---------------------------------------------------------------------------------
def test_numpy_views_and_their_contiguous_copies_agree() -> None:
    a = np.arange(24, dtype=np.float64).reshape(4, 6)
    for view in (a[::2], a[:, 1::3], a[::-1]):  # (in C order: they share with their copy)
        assert not view.flags.c_contiguous
        assert digest(view) == digest(np.ascontiguousarray(view))
    for view in (a.T, np.asfortranarray(a)):  # Fortran order is observable: never shared
        assert digest(view) == digest(np.asfortranarray(view))
        assert digest(view) != digest(np.ascontiguousarray(view))
    assert digest(a[::2]) != digest(a[1::2])
    assert digest(a.T) != digest(a)
    assert digest(np.arange(3, dtype=np.int32)) != digest(np.arange(3, dtype=np.int64))
    assert digest(np.ones(3, dtype=np.float32)) != digest(np.ones(3, dtype=np.float64))
    b = np.arange(6)
    assert digest(b.reshape(2, 3)) != digest(b.reshape(3, 2)) != digest(b)
    assert digest(np.int64(1)) != digest(1) and digest(np.float64(1.0)) != digest(1.0)
    assert digest(np.array(1)) != digest(np.int64(1))
    # small arrays too, down to one byte (their bytes once went missing)
    assert digest(np.array([1], np.uint8)) != digest(np.array([2], np.uint8))
    assert digest(np.array([0.0])) != digest(np.array([-0.0]))
    assert digest(np.zeros((0, 3))) != digest(np.zeros((3, 0)))


def test_numpy_structured_object_datetime_and_masked_arrays() -> None:
    rec = np.array([(1, 2.0), (3, 4.0)], dtype=[("x", "<i4"), ("y", "<f8")])
    renamed = rec.astype([("u", "<i4"), ("y", "<f8")])
    assert digest(rec) == digest(rec.copy()) != digest(renamed)
    assert digest(rec[0]) == digest(rec.copy()[0]) != digest(renamed[0])
    obj = np.array([{"a": 1}, [1, 2], "s"], dtype=object)
    other = np.array([{"a": 2}, [1, 2], "s"], dtype=object)
    assert digest(obj) == digest(obj.copy()) != digest(other)
    days = np.array(["2024-01-01", "NaT"], dtype="datetime64[D]")
    assert digest(days) == digest(days.copy()) != digest(days.astype("datetime64[s]"))
    assert digest(days) != digest(np.array(["2024-01-02", "NaT"], dtype="datetime64[D]"))
    masked = np.ma.array([1, 2, 3], mask=[False, True, False])
    assert digest(masked) == digest(masked.copy()) != digest(np.ma.array([1, 2, 3]))
    assert digest(masked) != digest(masked.data)


# -- 5. datetime ------------------------------------------------------------------------------
class FixedTZ(dt.tzinfo):
    def dst(self, d: dt.datetime | None) -> None:
        return None

    def tzname(self, d: dt.datetime | None) -> None:
        return None


class ZoneLike(FixedTZ):  # like pytz: one object per offset, all printing the zone's name
    def __init__(self, offset: float) -> None:
        self.offset = dt.timedelta(hours=offset)

    def __str__(self) -> str:
        return "Zone/Like"

    def utcoffset(self, d: dt.datetime | None) -> dt.timedelta:
        return self.offset


class BareTZ(FixedTZ):  # the default repr holds a memory address
    def utcoffset(self, d: dt.datetime | None) -> dt.timedelta:
        return dt.timedelta(hours=2)


def test_datetimes_tz_is_part_of_the_value() -> None:
    naive = dt.datetime(2024, 6, 1, 12)
    utc = naive.replace(tzinfo=dt.UTC)
    assert digest(naive) != digest(utc)
    paris = utc.astimezone(zoneinfo.ZoneInfo("Europe/Paris"))
    plus2 = utc.astimezone(dt.timezone(dt.timedelta(hours=2)))
    assert paris == utc == plus2
    assert len({digest(utc), digest(paris), digest(plus2)}) == 3
    berlin = paris.replace(tzinfo=zoneinfo.ZoneInfo("Europe/Berlin"))
    assert digest(paris) != digest(berlin)
    again = dt.datetime(2024, 6, 1, 14, tzinfo=zoneinfo.ZoneInfo("Europe/Paris"))
    assert digest(paris) == digest(again)
    assert digest(dt.time(1, tzinfo=dt.UTC)) != digest(dt.time(1))
    assert digest(dt.date(2024, 6, 1)) != digest(naive)
    # other tzinfo classes: equal ones agree, one per offset (like pytz) differ by offset
    a, b = BareTZ(), BareTZ()  # both alive: different addresses
    assert digest(naive.replace(tzinfo=a)) == digest(naive.replace(tzinfo=b))
    assert digest(naive.replace(tzinfo=ZoneLike(1))) == digest(naive.replace(tzinfo=ZoneLike(1)))
    assert digest(naive.replace(tzinfo=ZoneLike(-5))) != digest(
        naive.replace(tzinfo=ZoneLike(-4.9))
    )


# -- 6. records -------------------------------------------------------------------------------
@dataclasses.dataclass
class Box:
    x: int
    items: dict[str, int]


Crate = dataclasses.make_dataclass("Crate", [("x", int), ("items", dict[str, int])])


class Row(NamedTuple):
    a: int
    b: str


Col = collections.namedtuple("Col", "a b")
Level = enum.IntEnum("Level", "LOW HIGH")
Perm = enum.Flag("Perm", "R W")


def test_dataclasses_namedtuples_and_enums() -> None:
    assert digest(Box(1, {"a": 1, "b": 2})) == digest(Box(1, {"b": 2, "a": 1}))
    assert digest(Box(1, {"a": 1})) != digest(Box(2, {"a": 1}))
    assert digest(Box(1, {"a": 1})) != digest(Crate(1, {"a": 1}))
    assert len({digest(Row(1, "x")), digest(Col(1, "x")), digest((1, "x"))}) == 3
    assert digest(Row(1, "x")) != digest(Row(1, "y"))
    assert len({digest(Level.LOW), digest(Level.HIGH), digest(1), digest(Perm.R)}) == 4
    flags = [Perm(0), Perm.R, Perm.W, Perm.R | Perm.W]
    assert len({digest(f) for f in flags}) == 4


def test_attrs_classes() -> None:
    attrs: Any = pytest.importorskip("attrs")

    @attrs.define
    class Item:
        x: int
        tags: set[str]
    assert digest(Item(1, {"a", "b"})) == digest(Item(1, {"b", "a"})) != digest(Item(2, set()))


def test_pydantic_models() -> None:
    pydantic: Any = pytest.importorskip("pydantic", minversion="2")

    class Model(pydantic.BaseModel):
        x: int
        tags: dict[str, int]
    assert digest(Model(x=1, tags={"a": 1, "b": 2})) == digest(Model(x=1, tags={"b": 2, "a": 1}))
    assert digest(Model(x=1, tags={})) != digest(Model(x=2, tags={}))


# -- 7. cycles --------------------------------------------------------------------------------
def cyclic(value: int) -> tuple[list[Any], dict[str, Any]]:
    a: list[Any] = [value]
    a.append(a)
    d: dict[str, Any] = {"v": value}
    d["self"] = d
    d["nested"] = [{"up": d}]
    return a, d


def test_cyclic_structures_digest_and_compare_by_content() -> None:
    (a1, d1), (a2, d2), (a3, d3) = cyclic(1), cyclic(1), cyclic(2)
    assert digest(a1) == digest(a2) != digest(a3)
    assert digest(d1) == digest(d2) != digest(d3)
    shared = [1]
    assert digest([shared, shared]) == digest([[1], [1]])  # sharing without a cycle is fine


# -- 8. hooks, registered encoders, stateless objects -------------------------------------------
class Hooked:
    def __init__(self, key: str, noise: object) -> None:
        self.key, self.noise = key, noise

    def __durably_digest__(self) -> str:
        return self.key


class Registered:
    def __init__(self, key: int) -> None:
        self.key = key
        self.lock = threading.Lock()  # would not digest without the encoder


RegisteredChild = type("RegisteredChild", (Registered,), {})
durably.register_encoder(Registered, lambda r: r.key)


class TreeNode:
    def __init__(self, parent: TreeNode | None = None) -> None:
        self.parent, self.children = parent, list[TreeNode]()
        if parent is not None:
            parent.children.append(self)

    def __durably_digest__(self) -> Any:
        return [self.parent, list(self.children)]  # fresh lists: only the node marks the cycle


def test_durably_digest_hook_and_registered_encoders_are_used() -> None:
    assert digest(Hooked("a", threading.Lock())) == digest(Hooked("a", object()))
    assert digest(Hooked("a", 1)) != digest(Hooked("b", 1)) != digest("b")
    assert digest(Registered(1)) == digest(Registered(1)) != digest(Registered(2))
    assert digest(RegisteredChild(1)) not in (digest(Registered(1)), digest(1))
    root = TreeNode()
    TreeNode(TreeNode(root))
    assert digest(root) == digest(root)
    with pytest.raises(durably.DefinitionError):
        durably.register_encoder("Registered", repr)  # type: ignore[arg-type]
    itself = type("Itself", (), {"__durably_digest__": lambda self: self})
    with pytest.raises(durably.SerializationError, match="Itself returned the object itself"):
        digest(itself())


def test_objects_without_state_warn_exactly_once() -> None:
    class Opaque:
        pass

    with pytest.warns(UserWarning, match="Opaque expose no state") as record:
        assert digest(Opaque()) == digest(Opaque())
    assert len(record) == 1
    assert digest(GoldenPlain()) != digest(Opaque())  # an object with state: no warning


# -- 9. values that cannot be digested ----------------------------------------------------------
def generator() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(
    ("value", "type_name"), [(threading.Lock(), "_thread.lock"), (generator(), "generator")]
)
def test_undigestable_values_raise_a_serialization_error(value: Any, type_name: str) -> None:
    with pytest.raises(durably.SerializationError, match=type_name):
        digest({"deep": [value]})
    with pytest.raises(durably.SerializationError, match=type_name) as info:
        encode_arguments({"n": 1, "lock": value})  # names the argument and the fix
    assert "argument 'lock'" in str(info.value) and "ignore=('lock',)" in str(info.value)


# -- 10. functions as values ----------------------------------------------------------------------
def make_adder(n: int) -> Any:
    return lambda x: x + n


class Runner:
    def __init__(self, n: int) -> None:
        self.n, self.callback = n, self.run  # holds its own bound method: a cycle

    def run(self) -> int:
        return self.n


def test_functions_digest_by_code_and_captured_values() -> None:
    assert digest(lambda x: x + 1) != digest(lambda x: x + 2)
    assert digest(make_adder) == digest(make_adder)
    assert digest(make_adder(1)) == digest(make_adder(1)) != digest(make_adder(2))
    assert digest(make_adder) != digest(generator)
    assert digest(Box) != digest(Crate) and digest(int) != digest(str)
    assert digest(Runner(1)) == digest(Runner(1)) != digest(Runner(2))
    assert digest(Runner(1).run) == digest(Runner(1).run) != digest(Runner(2).run)
    assert digest(Runner(1).run) != digest(Runner.run)


# -- 11. big buffers ----------------------------------------------------------------------------
def test_big_buffers_digest_in_place() -> None:
    size = 50 * 1024 * 1024
    data = bytes(size)
    changed = bytearray(data)
    changed[-1] = 1
    assert digest(data) == digest(bytes(size)) != digest(bytes(changed))
    assert digest(data) != digest(bytearray(data)) and digest(data) != digest(memoryview(data))
    array = np.zeros(size // 8)
    other = array.copy()
    other[-1] = 1.0
    assert digest(array) == digest(array.copy()) != digest(other)
    assert digest(array[::2]) == digest(np.ascontiguousarray(array[::2]))
    assert digest({data, b"x"}) == digest({b"x", bytes(size)}) != digest({bytes(changed), b"x"})


# -- 12. the code of the user's record classes ----------------------------------------------------
RECORDS = '''
import dataclasses, enum
from typing import NamedTuple
import numpy as np

@dataclasses.dataclass
class Params:
    lr: float
    def effective_lr(self):
        return self.lr * FACTOR

class Pair(NamedTuple):
    a: int
    def total(self):
        return self.a * FACTOR

class Color(enum.Enum):
    RED = 1
    BLUE = 2
    def shade(self):
        return Color.BLUE if self is Color.RED else FACTOR  # names its own class: a cycle

class Tags(dict):
    def first(self):
        return min(self) * FACTOR

class Scaled(np.ndarray):
    def scaled(self):
        return self * FACTOR

class Hooked:
    def __init__(self, key):
        self.key = key
    def __durably_digest__(self):
        return self.key
    def scaled(self):
        return self.key * FACTOR

def values():
    return {"dataclass": Params(0.5), "namedtuple": Pair(1), "enum": Color.RED,
            "dict_subclass": Tags(a=1), "hook": Hooked(2),
            "ndarray_subclass": np.arange(3).view(Scaled)}
'''


def load_records(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, factor: str,
                 name: str = "durably_records") -> ModuleType:
    """(Re)load the records module from source, as a notebook or an edited file would."""
    return load_source(tmp_path, monkeypatch, name, RECORDS.replace("FACTOR", factor))


def test_editing_a_method_of_a_record_class_changes_the_digest(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = {k: digest(v) for k, v in load_records(tmp_path, monkeypatch, "2").values().items()}
    edited = {k: digest(v) for k, v in load_records(tmp_path, monkeypatch, "3").values().items()}
    again = {k: digest(v) for k, v in load_records(tmp_path, monkeypatch, "2").values().items()}
    assert again == first  # the same source, imported again: the same digests
    for kind in first:
        assert edited[kind] != first[kind], kind


def test_a_method_edit_is_seen_in_the_same_class_object(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = load_records(tmp_path, monkeypatch, "2")
    p = records.Params(0.5)
    before = digest(p)
    assert digest(records.Params(0.5)) == before
    other = load_records(tmp_path, monkeypatch, "3", name="durably_records_other")
    records.Params.effective_lr = other.Params.effective_lr  # patched, as in a notebook
    assert digest(p) != before


def test_class_constants_count_but_mutable_class_state_does_not() -> None:
    @dataclasses.dataclass
    class Scaled:
        x: int
        SCALE = 2
        seen: Any = dataclasses.field(default_factory=list, init=False, compare=False)
        registry: Any = None

    Scaled.registry = []  # a mutable class attribute: its content is state, not code
    before = digest(Scaled(1))
    Scaled.registry.append(object())
    assert digest(Scaled(1)) == before
    Scaled.SCALE = 3
    assert digest(Scaled(1)) != before


def test_a_task_is_not_served_a_stale_result_after_a_method_edit(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    durably.configure(store=durably.DiskStore(tmp_path / "s"))
    calls: list[float] = []

    @durably.task
    def train(p: Any, color: Any, pair: Any) -> Any:
        calls.append(p.lr)
        return p.effective_lr(), color.shade(), pair.total()

    try:
        records = load_records(tmp_path, monkeypatch, "2")
        assert train(records.Params(0.5), records.Color.BLUE, records.Pair(1)) == (1.0, 2, 2)
        same = load_records(tmp_path, monkeypatch, "2")
        assert train(same.Params(0.5), same.Color.BLUE, same.Pair(1)) == (1.0, 2, 2)
        assert len(calls) == 1  # same code, same inputs: served from the cache
        edited = load_records(tmp_path, monkeypatch, "3")
        assert train(edited.Params(0.5), edited.Color.BLUE, edited.Pair(1)) == (1.5, 3, 3)
        assert len(calls) == 2
    finally:
        durably.configure()


def test_records_in_a_fingerprint_walk_terminate() -> None:
    class Mode(enum.Enum):
        FAST = 1
        SLOW = 2

        def flip(self) -> Mode:
            return Mode.SLOW if self is Mode.FAST else Mode.FAST

    default = Box(1, {"a": 1})

    def pick() -> Any:
        return Mode.FAST.flip(), default, [Mode.SLOW, Row(1, "x")]

    assert digest(pick) == digest(pick)
    assert digest(Mode.FAST) == digest(Mode.FAST) != digest(Mode.SLOW)


# -- 13. what register_encoder refuses ------------------------------------------------------------
@pytest.mark.parametrize("cls", [pathlib.Path, pathlib.PurePosixPath, dict, str, int, dt.datetime])
def test_register_encoder_refuses_types_digested_by_value(cls: type) -> None:
    with pytest.raises(durably.DefinitionError, match=r"already digests .* durably\.file\(path\)"):
        durably.register_encoder(cls, repr)


def test_register_encoder_works_for_subclasses_of_such_types() -> None:
    class Versioned(dict[str, Any]):
        pass

    class DataPath(type(pathlib.Path())):  # type: ignore[misc]
        pass

    durably.register_encoder(Versioned, lambda v: v.get("version"))
    durably.register_encoder(DataPath, lambda p: p.name)
    assert digest(Versioned(version=1, noise=1)) == digest(Versioned(version=1, noise=2))
    assert digest(Versioned(version=1)) != digest(Versioned(version=2))
    assert digest(DataPath("a/x.csv")) == digest(DataPath("b/x.csv")) != digest(DataPath("x.txt"))


# -- 14. builtin subclasses with __slots__ -------------------------------------------------------
class SlottedDict(dict[str, int]):
    __slots__ = ("tag",)


class SlottedList(list[int]):
    __slots__ = ("__secret", "count_")  # a private (mangled) name too

    def set_secret(self, value: str) -> None:
        self.__secret = value


class SlottedWithDict(SlottedDict):
    pass  # no __slots__: instances have a __dict__ as well


def test_values_in_slots_of_builtin_subclasses_count() -> None:
    a, b, unset, none = SlottedDict(x=1), SlottedDict(x=1), SlottedDict(x=1), SlottedDict(x=1)
    a.tag, b.tag, none.tag = "a", "b", None
    assert len({digest(a), digest(b), digest(unset), digest(none)}) == 4
    assert digest(unset) == digest(SlottedDict(x=1)) != digest({"x": 1})
    c = SlottedDict(x=1)
    c.tag = "a"
    assert digest(c) == digest(a)
    s1, s2 = SlottedList([1]), SlottedList([1])
    s1.set_secret("p")
    s2.set_secret("q")
    assert digest(s1) != digest(s2) != digest(SlottedList([1]))
    w1, w2 = SlottedWithDict(x=1), SlottedWithDict(x=1)
    w1.tag = w2.tag = "a"
    w2.extra = 1
    assert digest(w1) != digest(w2) != digest(a)
    a.tag = a  # a slot holding its own object: a back-reference, not endless recursion
    assert digest(a) == digest(a)


# -- 15. errors of broken values are durably errors -----------------------------------------------
def test_a_released_memoryview_raises_a_serialization_error() -> None:
    view = memoryview(b"abc")
    view.release()
    with pytest.raises(durably.SerializationError, match="memoryview was released") as info:
        encode_arguments({"data": view})
    assert "argument 'data'" in str(info.value) and "ignore=('data',)" in str(info.value)


@dataclasses.dataclass
class Lazy:
    x: int
    later: int = dataclasses.field(init=False)


def test_a_dataclass_field_never_set_raises_a_serialization_error() -> None:
    with pytest.raises(durably.SerializationError, match=r"field 'later' of .*Lazy was never set"):
        digest([Lazy(1)])
    done = Lazy(1)
    done.later = 2
    assert digest(done) == digest(done) != digest(Lazy(1).__dict__)


@pytest.mark.parametrize(
    "value", [dt.datetime(2024, 1, 1, tzinfo=dt.tzinfo()), dt.time(1, tzinfo=dt.tzinfo())]
)
def test_a_bare_tzinfo_raises_a_serialization_error(value: Any) -> None:
    with pytest.raises(durably.SerializationError, match=r"tzinfo.*utcoffset\(\)"):
        digest(value)


@given(st.dictionaries(st.text(max_size=12), values, max_size=5))
@settings(max_examples=300, deadline=None)
def test_argument_digests_equal_the_general_encoding(arguments: dict[str, Any]) -> None:
    """encode_arguments writes names from a table and dispatches inline: the bytes hashed are
    what the general path (Encoder.raw + Encoder.encode) writes, so keys never change."""
    from durably._keys.canonical import _HEADER, Encoder
    from durably._keys.hashing import encode_arguments

    e = Encoder()
    e.buf += _HEADER
    for name in sorted(arguments):
        e.path = name
        e.raw(b"=", name.encode())
        e.encode(arguments[name])
    expected = e.hexdigest()
    assert encode_arguments(arguments) == expected
    assert encode_arguments(arguments) == expected  # again, with the names' encodings kept


_plain_scalars = (st.integers() | st.sampled_from([2**63 - 1, -(2**63), 2**63, -(2**63) - 1])
                  | st.floats(allow_nan=True) | st.sampled_from([0.0, -0.0, float("inf")])
                  | st.text() | st.booleans() | st.none())
# short tuples and lists of scalars take the short path too (longer ones, nested ones and
# ones holding anything else leave it)
_scalars = (_plain_scalars
            | st.lists(_plain_scalars, max_size=40) | st.tuples(_plain_scalars, _plain_scalars)
            | st.lists(st.lists(_plain_scalars, max_size=2), max_size=2))


@given(st.dictionaries(st.text(max_size=12), _scalars, max_size=6))
@settings(max_examples=500, deadline=None)
def test_scalar_arguments_take_the_short_path_and_get_the_same_digest(
        arguments: dict[str, Any]) -> None:
    """Arguments that are all small scalars are encoded without an Encoder (the common call
    of a task): the digest is the general path's, ints past 64 bits and long strings
    included (they leave the short path)."""
    from durably._keys.hashing import _general_arguments, encode_arguments

    expected = _general_arguments(arguments)  # (also puts the names in the table)
    assert encode_arguments(arguments) == expected
    assert encode_arguments(dict(reversed(arguments.items()))) == expected


# values whose encoding is hashed in place: a list of strings past 64 KiB in all, one long
# string, bytes, and a dict holding them (an argument with a large buffer is digested again
# when asked; a large block of strings is taken in the same pass)
_large = st.sampled_from([
    ["m" * 5000] * 14, [f"{i:05d}" * 1000 for i in range(14)], "s" * 70_000,
    b"b" * 70_000, {"messages": ["x" * 9000] * 8, "n": 3}, {"blob": b"z" * 70_000},
    (["y" * 70_000], 1), [b"q" * 70_000, "t" * 5],
    b"B" * (2 << 20), [b"B" * (2 << 20), "v" * 3], {"m": ["w"] * 9, "out": "o" * (2 << 20)},
])


@given(st.dictionaries(st.text(max_size=12), _scalars | values | _large, max_size=6))
@settings(max_examples=400, deadline=None)
def test_argument_digests_taken_in_the_key_s_pass_equal_digest_each(
        arguments: dict[str, Any]) -> None:
    """encode_arguments(arguments, each) puts in ``each`` the digests digest_each gives of the
    arguments it encoded itself (not small scalars, and none holding a large buffer), from
    the same pass: the key is unchanged, and digest_each(arguments, each) equals
    digest_each(arguments)."""
    from durably._keys.hashing import digest_each, encode_arguments

    each: dict[str, str] = {}
    key = encode_arguments(arguments, each)
    assert key == encode_arguments(arguments)
    full = digest_each(arguments)
    assert set(each) <= set(arguments)
    assert {n: full[n] for n in each} == each
    assert digest_each(arguments, each) == full
    for name, value in arguments.items():
        if isinstance(value, bytes) and len(value) > 1 << 20:
            assert name not in each  # hashed in place: digested again when asked
        elif isinstance(value, (bytes, str)) and len(value) >= 1 << 16:
            assert name in each  # (up to 1 MiB: hashed by the argument's tap too)


class _Ping(enum.Enum):  # classes whose codes refer to each other (through their values)
    X: Any = []  # noqa: RUF012 - an Enum member whose value is a list


class _Pong(enum.Enum):
    Y: Any = [_Ping.X]  # noqa: RUF012


_Ping.X.value.append(_Pong.Y)


class _Pung(enum.Enum):
    Z: Any = [_Pong.Y]  # noqa: RUF012


def _cyclic() -> list[Any]:
    inner: list[Any] = ["a", 1]
    inner.append(inner)  # an element with a cycle of its own
    outer: list[Any] = [inner, "b" * 3]
    outer.append(outer)  # and one back to the argument
    # keys that encode alike (two NaNs): their values are encoded apart (Encoder.sub)
    outer.append({float("nan"): outer, float("nan"): 1})
    return outer


def _looped_dict() -> dict[str, Any]:
    d: dict[str, Any] = {"x": [1, 2, 3], "y": "yy"}
    d["self"] = d
    d["inner"] = {"up": d, "k": 5}
    return d


_elements = (
    st.lists(values, max_size=10) | st.lists(values, max_size=10).map(tuple)
    | st.dictionaries(st.text(max_size=4), values, max_size=10)
    | st.lists(st.text(max_size=6), min_size=8, max_size=12)  # the strings block
    | st.lists(st.text(max_size=6), min_size=8, max_size=12).map(tuple)
    | st.dictionaries(st.text(max_size=4), st.integers(-3, 40) | st.integers(), max_size=10)
    | st.sampled_from([
        ["m" * 5000] * 14, [b"q" * 70_000, "t" * 5, 7], {"blob": b"z" * 70_000, "n": 17},
        {1: "int keys", 2: [3]}, {"a": True, "b": None, "c": 2**70}, list(range(10_001)),
        (1, ["x" * 70_000], "y"), [["i" * 9000] * 8, 99],
    ])
    | st.builds(_cyclic) | st.builds(_looped_dict)
    | st.lists(st.sampled_from([_Ping.X, _Pong.Y, _Pung.Z, "p", 20]), max_size=5)
    | st.sampled_from([_Ping.X, _Pong.Y, _Pung.Z, {"a": _Pong.Y, "b": _Ping.X}])
)


@given(st.dictionaries(st.text(max_size=12), _scalars | values | _large | _elements,
                       max_size=5))
@settings(max_examples=400, deadline=None)
def test_flow_digests_taken_in_the_key_s_pass_equal_the_tracer_s(
        arguments: dict[str, Any]) -> None:
    """The tracer's flow digests of a step's arguments (each argument, each element of a
    list, tuple or dict argument) taken in the pass that makes the key are those
    trace_digest gives: elements with cycles, large buffers, packed ints, the strings
    block, values too common to mean a flow and non-str keys included."""
    from durably._keys.hashing import digest_each, encode_arguments
    from durably._trace.tracer import flow_digests

    each: dict[str, str] = {}
    taken: dict[str, list[str | None]] = {}
    assert encode_arguments(arguments, each, taken) == encode_arguments(arguments)
    full = digest_each(arguments)
    assert digest_each(arguments, each) == full
    assert flow_digests(arguments, full, taken) == flow_digests(arguments, full)
    assert flow_digests(arguments, None, taken) == flow_digests(arguments)


@given(_scalars | values | _large | _elements)
@settings(max_examples=400, deadline=None)
def test_a_result_s_element_digests_taken_in_one_pass_equal_trace_digest_s(value: Any) -> None:
    """trace_digests (a result's digest and its elements', for fan-out edges) equals
    trace_digest of the whole and of each element (a dict's values in its order), with
    cycles, large buffers, the strings block, common values and non-str keys."""
    from durably._keys.hashing import MAX_RESULT_ELEMENTS, trace_digest, trace_digests

    whole, elements = trace_digests(value)
    assert whole == trace_digest(value)
    t = type(value)
    if whole and t in (list, tuple, dict):
        items = list(value.values()) if t is dict else list(value)
        assert elements == tuple(trace_digest(item)[:16]
                                 for item in items[:MAX_RESULT_ELEMENTS])
    else:
        assert elements == ()


def test_arguments_nested_as_deep_as_the_key_allows_get_their_digests_too() -> None:
    """The taps add frames: an argument nested as deeply as the key alone allows is encoded
    again without them, never refused."""
    from durably._keys.hashing import digest_each, encode_arguments

    def nested(depth: int) -> list[Any]:
        value: list[Any] = []
        for _ in range(depth):
            value = [value]
        return value

    low, high = 1, 5000  # the deepest argument the key alone takes, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        try:
            encode_arguments({"x": [nested(mid), "other"]})
        except durably.SerializationError:
            high = mid - 1
        else:
            low = mid
    arguments = {"x": [nested(low), "other"]}
    each: dict[str, str] = {}
    taken: dict[str, list[str | None]] = {}
    assert encode_arguments(arguments, each, taken) == encode_arguments(arguments)
    assert digest_each(arguments, each) == digest_each(arguments)


def test_a_large_list_of_strings_is_encoded_once_for_its_key_and_its_digest() -> None:
    """The digest of a list-of-strings argument, for explain and the tracer, is taken in the
    pass that makes the key: its strings are encoded once, not twice."""
    from durably._keys.canonical import Encoder
    from durably._keys.hashing import digest_each, encode_arguments

    calls = []
    strings = Encoder.strings

    def counted(self: Encoder, items: Any, *more: Any) -> Any:
        calls.append(len(items))
        return strings(self, items, *more)

    arguments = {"messages": [f"message {i} " * 400 for i in range(40)], "n": 3}
    Encoder.strings = counted  # type: ignore[method-assign]
    try:
        each: dict[str, str] = {}
        encode_arguments(arguments, each)
        got = digest_each(arguments, each)
        assert calls == [40]
    finally:
        Encoder.strings = strings  # type: ignore[method-assign]
    assert got == digest_each(arguments)


@given(st.dictionaries(st.text(max_size=12), _scalars | values, min_size=0, max_size=6),
       st.data())
@settings(max_examples=500, deadline=None)
def test_positional_arguments_get_the_digest_of_the_bound_ones(
        arguments: dict[str, Any], data: st.DataObject) -> None:
    """A call with all its arguments given by position is digested without binding them
    (encode_positional): the same digest as the bound arguments, ignored ones left out, or
    None (a value that is not a small scalar: the caller binds them and digests them)."""
    from durably._keys.hashing import encode_arguments, encode_positional, positional_plan

    names = list(arguments)
    ignore = data.draw(st.sets(st.sampled_from(names)) if names else st.just(set()))
    plan = positional_plan(names, ignore)
    assert plan is not None
    got = encode_positional(plan, tuple(arguments.values()))
    bound = {n: v for n, v in arguments.items() if n not in ignore}
    if got is None:  # left to the general path: something in it is not a small scalar
        assert not all(_small_scalar(v) or (type(v) in (tuple, list) and len(v) <= 32
                                            and all(map(_small_scalar, v)))
                       for v in bound.values())
    else:
        assert got == encode_arguments(bound)


def _small_scalar(v: Any) -> bool:
    """What encode_positional writes itself (an int of 64 bits, a str under 64 KiB...)."""
    t = type(v)
    return ((t is int and -(2**63) <= v < 2**63) or t in (float, bool, type(None))
            or (t is str and len(v.encode("utf-8", "surrogatepass")) < 1 << 16))


def test_a_task_called_by_position_keeps_its_cache_key(tmp_path: pathlib.Path) -> None:
    """The digest of a call by position (no binding) is the one of the same call by keyword,
    with defaults and ignored arguments as the bound path has them: one cache entry."""
    durably.configure(store=durably.DiskStore(tmp_path))
    calls: list[tuple[Any, ...]] = []

    @durably.task(ignore=("verbose",))
    def combine(b: str, a: int, verbose: bool, c: float = 0.5) -> str:
        calls.append((a, b, c))
        return f"{a}{b}{c}"

    assert combine("x", 1, True, 0.5) == "1x0.5"
    assert combine(b="x", a=1, verbose=False) == "1x0.5"  # bound: default and ignore
    assert combine("x", 1, False, c=0.5) == "1x0.5"
    assert calls == [(1, "x", 0.5)]
    key = combine.cache_key(a=1, b="x", verbose=True)
    assert combine.cache_key("x", 1, False, 0.5) == key
    assert combine.cache_key("x", 2, False, 0.5) != key
