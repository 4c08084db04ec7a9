"""Hypothesis strategies built from the msgspec structs themselves.

`strategy_for(cls)` walks `msgspec.inspect.type_info(cls)` and honours what the types declare
(string lengths and patterns, integer and float bounds, tz-aware datetimes, enums, nested
structs, optional fields), so a new field or constraint is covered without editing this file.
`Any` and free-form dict values get JSON values inside the I-JSON limits (RFC 7493).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

from synapse.types import MESSAGE_CLASSES, Envelope, MessageType

MAX_SAFE_INTEGER = 2**53 - 1

#: Offsets as RFC 3339 can write them (whole minutes).
_TIMEZONES = st.sampled_from(
    [
        UTC,
        timezone(timedelta(hours=8)),
        timezone(timedelta(hours=-5)),
        timezone(timedelta(hours=5, minutes=30)),
    ]
)

#: Text as any peer may send it: no surrogates (I-JSON), otherwise anything, Chinese included.
_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=20)

json_scalars: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
)

#: Any I-JSON value, shallow enough to stay readable in failure reports.
json_values: st.SearchStrategy[Any] = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(_text, inner, max_size=4),
    ),
    max_leaves=12,
)


def _version() -> st.SearchStrategy[str]:
    # The pattern allows any MAJOR.MINOR, but only a 1.x decodes: another major is refused.
    return st.integers(0, 999).map(lambda minor: f"1.{minor}")


def _str(t: mi.StrType) -> st.SearchStrategy[str]:
    if t.pattern is not None:
        return st.from_regex(t.pattern, fullmatch=True)
    min_size = t.min_length or 0
    max_size = t.max_length if t.max_length is not None else max(min_size, 24)
    return st.text(
        alphabet=st.characters(exclude_categories=["Cs"]), min_size=min_size, max_size=max_size
    )


def _int(t: mi.IntType) -> st.SearchStrategy[int]:
    lo = -MAX_SAFE_INTEGER
    hi = MAX_SAFE_INTEGER
    if t.ge is not None:
        lo = max(lo, t.ge)
    if t.gt is not None:
        lo = max(lo, t.gt + 1)
    if t.le is not None:
        hi = min(hi, t.le)
    if t.lt is not None:
        hi = min(hi, t.lt - 1)
    return st.integers(lo, hi)


def _float(t: mi.FloatType) -> st.SearchStrategy[float]:
    return st.floats(
        min_value=t.ge if t.ge is not None else t.gt,
        max_value=t.le if t.le is not None else t.lt,
        exclude_min=t.gt is not None,
        exclude_max=t.lt is not None,
        allow_nan=False,
        allow_infinity=False,
    )


def _datetime(t: mi.DateTimeType) -> st.SearchStrategy[datetime]:
    if t.tz is False:
        return st.datetimes()
    if t.tz is True:
        return st.datetimes(timezones=_TIMEZONES)
    return st.datetimes(timezones=st.one_of(st.none(), _TIMEZONES))


def _struct(t: mi.StructType) -> st.SearchStrategy[Any]:
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for f in t.fields:
        if f.name == "version" and issubclass(t.cls, Envelope):
            strategy = _version()
        else:
            strategy = from_type_info(f.type)
        (required if f.required else optional)[f.name] = strategy
    kwargs = st.fixed_dictionaries(required, optional=optional)
    return kwargs.map(lambda kw: t.cls(**kw))


def from_type_info(t: mi.Type) -> st.SearchStrategy[Any]:
    """A strategy for values of the msgspec type `t` that its decoder accepts."""
    if isinstance(t, mi.StructType):
        return _struct(t)
    if isinstance(t, mi.StrType):
        return _str(t)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.IntType):
        return _int(t)
    if isinstance(t, mi.FloatType):
        return _float(t)
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.AnyType):
        return json_values
    if isinstance(t, mi.DateTimeType):
        return _datetime(t)
    if isinstance(t, mi.EnumType):
        return st.sampled_from(list(t.cls))
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(list(t.values))
    if isinstance(t, mi.UnionType):
        return st.one_of([from_type_info(member) for member in t.types])
    if isinstance(t, mi.ListType):
        return st.lists(
            from_type_info(t.item_type),
            min_size=t.min_length or 0,
            max_size=t.max_length if t.max_length is not None else max(t.min_length or 0, 3),
        )
    if isinstance(t, mi.DictType):
        return st.dictionaries(
            from_type_info(t.key_type),
            from_type_info(t.value_type),
            min_size=t.min_length or 0,
            max_size=t.max_length if t.max_length is not None else max(t.min_length or 0, 3),
        )
    if isinstance(t, mi.Metadata):
        return from_type_info(t.type)
    raise NotImplementedError(f"no strategy for {t!r}")


def strategy_for(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    return from_type_info(mi.type_info(cls))


def message_strategy(message_type: MessageType) -> st.SearchStrategy[Envelope[Any]]:
    return strategy_for(MESSAGE_CLASSES[message_type])


#: Any of the 17 messages.
any_message: st.SearchStrategy[Envelope[Any]] = st.one_of(
    [message_strategy(t) for t in MessageType]
)
