"""Decode the message columns of many records at once, with numpy and Arrow instead of a loop.

``decode_columns(data, starts, ends, columns)`` returns the asked-for message
columns (``exchange``, ``routing_key``, ``body``, ``body_size`` and the AMQP
properties) of the message records whose payloads are ``data[starts:ends]``.

How: every length-prefixed field is located for all records at once (numpy
gathers, one step per field, docs/queue-files.md sections 3.3-3.4), then each
string column is cut out of the segment's bytes by Arrow's ``take`` over a
zero-copy binary array whose offsets are the fields' boundaries. The headers
table is walked one entry per step for all messages together. No Python code
runs per message.

The fast path covers what brokers and clients write: well-formed records,
valid UTF-8, header values that are strings, byte arrays, integers, booleans or
void, and no repeated header name. Any other record (malformed, a continuation
flag word, a nested table or array, a float, decimal or timestamp header, an
invalid field, a header table longer than ``MAX_HEADER_ENTRIES``) is flagged
and decoded by ``decode_rows_python``, the reference decoder, so its row is
exactly what it always was: invalid fields as ``<invalid field: ...>``,
deep headers never failing the read. tests/test_spark_columnar.py checks
that both decoders agree on every kind of record.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from persistence.properties_format import FIXED_FIELD_WIDTHS, HEADERS_TABLE, PROPERTY_KINDS, SHORT_STRING
from persistence.record_format import MESSAGE_FIELD_WIDTHS, MESSAGE_FIELDS_AT, MalformedRecord, RecordType, decode_payload
from spark import basic_properties
from spark.schema import PROPERTY_COLUMNS, arrow_type
from spark.segment_index import be_uint

DECODED = frozenset({"exchange", "routing_key", "body", "body_size", *PROPERTY_COLUMNS})
MAX_HEADER_ENTRIES = 256
_MAP = arrow_type("map")
_TS = pa.timestamp("us", tz="UTC")
_PROPERTY_INDEX = {name: i for i, name in enumerate(basic_properties.PROPERTY_NAMES)}
# Header value types the fast path reads, letter code -> width (properties_format's): signed and unsigned
# integers here; long strings and byte arrays (-1: u32 length + bytes), bool and void below.
_SIGNED = {ord(letter): FIXED_FIELD_WIDTHS[letter] for letter in "bsIl"}
_UNSIGNED = {ord(letter): FIXED_FIELD_WIDTHS[letter] for letter in "BuiL"}
_LONG_STRINGS = (ord("S"), ord("x"))
_BOOL, _VOID = ord("t"), ord("V")
_WIDTH = np.full(256, -2, np.int64)  # -2: not on the fast path
for _code, _w in (*_SIGNED.items(), *_UNSIGNED.items()):
    _WIDTH[_code] = _w
_WIDTH[_BOOL], _WIDTH[_VOID] = FIXED_FIELD_WIDTHS["t"], FIXED_FIELD_WIDTHS["V"]
for _code in _LONG_STRINGS:
    _WIDTH[_code] = -1
# Value categories of header entries, in the order their arrays are concatenated.
_STR, _INT, _UINT, _TRUE, _FALSE, _NULL = range(6)


def decode_columns(data: bytes, starts: np.ndarray, ends: np.ndarray, columns: tuple[str, ...]) -> dict[str, pa.Array]:
    """The message columns among ``columns`` for the records with payloads ``data[starts[i]:ends[i]]``
    (in file order), each an Arrow array of the type the schema gives it."""
    wanted = [c for c in columns if c in DECODED]
    if not wanted or not len(starts):
        return decode_rows_python(data, starts, ends, wanted) if wanted else {}
    return _Batch(data, starts, ends).decode(wanted)


def record_batch(schema: pa.Schema, n: int, values: dict[str, Any]) -> pa.RecordBatch:
    """The batch of ``n`` rows of ``schema`` whose column ``name`` is ``values[name]``: an Arrow
    array (cast to the schema's type when it differs), or one value every row has (None: null)."""
    arrays = []
    for field in schema:
        value = values[field.name]
        if isinstance(value, (pa.Array, pa.ChunkedArray)):
            arrays.append(conform(value, field.type))
        elif value is None:
            arrays.append(pa.nulls(n, field.type))
        else:
            arrays.append(pa.repeat(pa.scalar(value, field.type), n))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def conform(array: pa.Array | pa.ChunkedArray, arrow_type: pa.DataType) -> pa.Array:
    """``array`` as one chunk of ``arrow_type``."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return array if array.type == arrow_type else array.cast(arrow_type)


class _Batch:
    """The fields of one batch of message records, located for all records at once."""

    def __init__(self, data: bytes, starts: np.ndarray, ends: np.ndarray) -> None:
        self.data = data
        self.d = np.frombuffer(data, np.uint8)
        self.buffer = pa.py_buffer(data)
        self.starts, self.ends = starts, ends
        self.n = len(starts)
        self.slow = np.zeros(self.n, bool)  # rows left to the reference decoder
        pos = starts + MESSAGE_FIELDS_AT
        spans = []
        for width in MESSAGE_FIELD_WIDTHS:  # exchange, routing key, properties, body
            self.slow |= pos + width > ends
            length = be_uint(self.d, pos, width)
            pos = pos + width
            spans.append((pos, length))
            pos = pos + length
            self.slow |= pos > ends
        if self.slow.any():  # malformed records: keep field boundaries in file order for _slices
            for field_start, length in spans:
                field_start[self.slow] = starts[self.slow]
                length[self.slow] = 0
        (self.ex_at, self.ex_len), (self.rk_at, self.rk_len), (self.pr_at, self.pr_len), (self.body_at, self.body_len) = spans

    def decode(self, wanted: list[str]) -> dict[str, pa.Array]:
        out: dict[str, pa.Array] = {}
        # Always: a record whose exchange or routing key is not UTF-8 is malformed (every field null).
        out["exchange"] = self._text(self.ex_at, self.ex_len)
        out["routing_key"] = self._text(self.rk_at, self.rk_len)
        if "body" in wanted:
            out["body"] = self._slices(self.body_at, self.body_len)
        if "body_size" in wanted:
            out["body_size"] = pa.array(self.body_len)
        props = [c for c in wanted if c in _PROPERTY_INDEX]
        if props:
            out.update(self._properties(props))
        out = {name: out[name] for name in wanted}
        slow = np.flatnonzero(self.slow)
        if len(slow):
            exact = decode_rows_python(self.data, self.starts[slow], self.ends[slow], wanted)
            out = {name: _replace_rows(out[name], slow, exact[name]) for name in wanted}
        return out

    # -- strings cut out of the segment --------------------------------------------------------

    def _slices(self, at: np.ndarray, length: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
        """A binary array of data[at[i]:at[i]+length[i]] (null where not ``valid``); the fields must be
        in file order and not overlap."""
        return slices(self.buffer, at, length, valid)

    def _text(self, at: np.ndarray, length: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
        """Like ``_slices``, as UTF-8 text; rows whose bytes are not valid UTF-8 go to the slow path
        (which replaces invalid bytes, or finds the record malformed)."""
        binary = self._slices(at, length, valid)
        try:
            return binary.cast(pa.string())
        except pa.ArrowInvalid:
            bad = [i for i, value in enumerate(binary.to_pylist()) if value is not None and not _is_utf8(value)]
            self.slow[bad] = True
            fine = np.ones(self.n, bool) if valid is None else valid.copy()
            fine[bad] = False
            return self._slices(at, length, fine).cast(pa.string())

    # -- the basic properties -------------------------------------------------------------------

    def _properties(self, wanted: list[str]) -> dict[str, pa.Array]:
        d, at, end = self.d, self.pr_at, self.pr_at + self.pr_len
        flags = np.where(self.pr_len >= 2, be_uint(d, at, 2), 0)
        flags = np.where(flags & 0xFFFC, flags, 0)  # no property bit: no properties at all
        self.slow |= (flags & 1).astype(bool)  # a continuation flag word (none in class basic)
        cur = np.where(flags != 0, at + 2, end)  # no properties: nothing to walk
        found: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for index, kind in enumerate(PROPERTY_KINDS):  # wire order
            present = (flags >> (15 - index)) & 1 == 1
            if not present.any():
                found[basic_properties.PROPERTY_NAMES[index]] = (present, cur, np.zeros(self.n, np.int64))
                continue
            if kind == SHORT_STRING:
                self.slow |= present & (cur >= end)
                length = np.where(present, be_uint(d, cur, 1), 0)
                field_at, cur = cur + 1, np.where(present, cur + 1 + length, cur)
            elif kind == HEADERS_TABLE:
                self.slow |= present & (cur + 4 > end)
                length = np.where(present, be_uint(d, cur, 4), 0)
                field_at, cur = cur + 4, np.where(present, cur + 4 + length, cur)
                self.slow |= present & (cur > end)
            else:
                self.slow |= present & (cur + kind > end)
                length = np.where(present, be_uint(d, cur, kind), 0)
                field_at, cur = cur, np.where(present, cur + kind, cur)
            found[basic_properties.PROPERTY_NAMES[index]] = (present, field_at, length)
        self.slow |= cur > end  # the property list runs past its end: malformed (all properties null)
        out = {}
        for name in wanted:
            present, field_at, length = found[name]
            present = present & ~self.slow
            kind = PROPERTY_KINDS[_PROPERTY_INDEX[name]]
            if name == "headers":
                out[name] = self._headers(present, field_at, field_at + length)
            elif kind == SHORT_STRING:
                out[name] = self._text(np.where(present, field_at, self.starts), np.where(present, length, 0), present)
            elif name == "timestamp":
                out[name] = pa.array(length * 1_000_000, _TS, mask=~present)
            else:
                out[name] = pa.array(length.astype(np.int32), pa.int32(), mask=~present)
        return out

    def _headers(self, present: np.ndarray, table_at: np.ndarray, table_end: np.ndarray) -> pa.Array:
        """The headers tables as a map<string,string> array (values as text, basic_properties)."""
        d = self.d
        rows_of, name_at, name_len, category, value_at, value_len, numbers = [], [], [], [], [], [], []
        pos = table_at.copy()
        active = np.flatnonzero(present & (pos < table_end))
        for _ in range(MAX_HEADER_ENTRIES):
            if not len(active):
                break
            p, e = pos[active], table_end[active]
            n_len = be_uint(d, p, 1)
            n_end = p + 1 + n_len
            ok = n_end < e  # room for the type octet after the name
            letter = be_uint(d, n_end, 1)
            width = _WIDTH[letter]
            ok &= width >= -1
            v_at = n_end + 1
            is_long = width == -1
            v_len = np.where(is_long, be_uint(d, v_at, 4), width)
            ok &= np.where(is_long, v_at + 4 <= e, True)
            v_at = np.where(is_long, v_at + 4, v_at)
            v_end = v_at + v_len
            ok &= v_end <= e
            bad = active[~ok]
            self.slow[bad] = True
            take = ok
            rows = active[take]
            letter, v_at, v_len = letter[take], v_at[take], v_len[take]
            cat = np.full(len(rows), _STR, np.int8)
            signed = np.isin(letter, list(_SIGNED))
            unsigned = np.isin(letter, list(_UNSIGNED))
            cat[signed], cat[unsigned] = _INT, _UINT
            is_bool = letter == _BOOL
            cat[is_bool] = np.where(be_uint(d, v_at[is_bool], 1) != 0, _TRUE, _FALSE)
            cat[letter == _VOID] = _NULL
            number = np.zeros(len(rows), np.int64)
            for widths, is_signed in ((_SIGNED, True), (_UNSIGNED, False)):
                for code, w in widths.items():
                    sel = letter == code
                    if sel.any():
                        value = be_uint(d, v_at[sel], w)
                        if is_signed and w < 8:
                            value = np.where(value >= 1 << (8 * w - 1), value - (1 << (8 * w)), value)
                        number[sel] = value  # an 8-byte value keeps its bits; _values reads them right
            rows_of.append(rows)
            name_at.append(p[take] + 1)
            name_len.append(n_len[take])
            category.append(cat)
            value_at.append(v_at)
            value_len.append(np.where(cat == _STR, v_len, 0))
            numbers.append(number)
            pos[rows] = v_end[take]
            active = rows[pos[rows] < table_end[rows]]
        else:
            self.slow[active] = True  # more entries than the fast path walks
        if rows_of:
            rows, names, names_len = np.concatenate(rows_of), np.concatenate(name_at), np.concatenate(name_len)
            cats, v_at, v_len, nums = (np.concatenate(x) for x in (category, value_at, value_len, numbers))
        else:
            rows = names = names_len = v_at = v_len = nums = np.zeros(0, np.int64)
            cats = np.zeros(0, np.int8)
        order = np.argsort(names, kind="stable")  # file order = (row, entry) order
        rows, names, names_len, cats, v_at, v_len, nums = (x[order] for x in (rows, names, names_len, cats, v_at, v_len, nums))
        keys = self._entry_text(rows, names, names_len)
        self._flag_repeated_names(rows, keys)
        keep = ~self.slow[rows]
        if not keep.all():
            rows, cats, v_at, v_len, nums = rows[keep], cats[keep], v_at[keep], v_len[keep], nums[keep]
            keys = keys.filter(pa.array(keep))
        values = self._values(rows, cats, v_at, v_len, nums)
        keep = ~self.slow[rows]  # _values may have sent more rows to the slow path
        if not keep.all():
            rows, keys, values = rows[keep], keys.filter(pa.array(keep)), values.filter(pa.array(keep))
        counts = np.bincount(rows, minlength=self.n)
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
        valid = present & ~self.slow
        return pa.MapArray.from_arrays(pa.array(offsets), keys, values, type=_MAP, mask=pa.array(~valid))

    def _entry_text(self, rows: np.ndarray, at: np.ndarray, length: np.ndarray) -> pa.Array:
        binary = slices(self.buffer, at, length)
        try:
            return binary.cast(pa.string())
        except pa.ArrowInvalid:  # invalid UTF-8: the reference decoder replaces it
            bad = [i for i, value in enumerate(binary.to_pylist()) if not _is_utf8(value)]
            self.slow[rows[bad]] = True
            fine = np.ones(len(rows), bool)
            fine[bad] = False
            return slices(self.buffer, at, np.where(fine, length, 0)).cast(pa.string())

    def _flag_repeated_names(self, rows: np.ndarray, keys: pa.Array) -> None:
        """A repeated header name keeps the last value in the reference decoder: leave it to it."""
        if len(rows) < 2:
            return
        codes = keys.dictionary_encode().indices.to_numpy(zero_copy_only=False).astype(np.int64)
        pairs = rows * (int(codes.max()) + 1) + codes
        unique, counts = np.unique(pairs, return_counts=True)
        if (counts > 1).any():
            repeated = unique[counts > 1] // (int(codes.max()) + 1)
            self.slow[repeated] = True

    def _values(self, rows, cats, v_at, v_len, nums) -> pa.Array:
        """Header values as text, in entry order (basic_properties._text for these types)."""
        strings = cats == _STR
        text = self._entry_text(rows[strings], v_at[strings], v_len[strings])
        parts = [text,
                 pa.array(nums[cats == _INT]).cast(pa.string()),
                 pa.array(nums[cats == _UINT].view(np.uint64)).cast(pa.string()),
                 pa.array(["true"] * int((cats == _TRUE).sum()), pa.string()),
                 pa.array(["false"] * int((cats == _FALSE).sum()), pa.string()),
                 pa.nulls(int((cats == _NULL).sum()), pa.string())]
        where = np.zeros(len(cats), np.int64)
        base = 0
        for category, part in enumerate(parts):
            chosen = cats == category
            where[chosen] = base + np.arange(int(chosen.sum()))
            base += len(part)
        return pa.concat_arrays(parts).take(pa.array(where))


def slices(buffer: pa.Buffer, at: np.ndarray, length: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A binary array of buffer[at[i]:at[i]+length[i]], null where ``valid`` is False. The slices
    must be in buffer order and not overlap: they are the even elements of one zero-copy binary
    array over the buffer, gathered by ``take``."""
    n = len(at)
    if not n:
        return pa.array([], pa.binary())
    bounds = np.empty(2 * n, np.int64)
    bounds[0::2] = at
    bounds[1::2] = at + length
    large = buffer.size > np.iinfo(np.int32).max
    whole = pa.Array.from_buffers(pa.large_binary() if large else pa.binary(), 2 * n - 1,
                                  [None, pa.py_buffer(bounds if large else bounds.astype(np.int32)), buffer])
    index = pa.array(np.arange(0, 2 * n, 2), mask=None if valid is None else ~valid)
    taken = whole.take(index)
    return taken.cast(pa.binary()) if large else taken


def _replace_rows(array: pa.Array, rows: np.ndarray, values: pa.Array) -> pa.Array:
    """``array`` with the elements at ``rows`` replaced by ``values``."""
    order = np.arange(len(array))
    order[rows] = len(array) + np.arange(len(rows))
    return pa.concat_arrays([array, values.cast(array.type)]).take(pa.array(order))


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def decode_rows_python(data: bytes, starts: np.ndarray, ends: np.ndarray, wanted: list[str]) -> dict[str, pa.Array]:
    """The reference decoder: one message at a time with record_format and basic_properties.
    A record that does not parse keeps its row with every decoded field null."""
    view = memoryview(data)
    props = [(c, _PROPERTY_INDEX[c]) for c in wanted if c in _PROPERTY_INDEX]
    values: dict[str, list[Any]] = {c: [] for c in wanted}
    for start, end in zip(starts.tolist(), ends.tolist()):
        try:
            record = decode_payload(RecordType.MESSAGE, view[start:end])
        except MalformedRecord:
            record = None
        if record is None:
            for column in values.values():
                column.append(None)
            continue
        row = {"exchange": record.exchange, "routing_key": record.routing_key, "body": record.body,
               "body_size": len(record.body)}
        if props:
            try:
                decoded = basic_properties.decode(record.raw_properties)
            except basic_properties.MalformedProperties:
                decoded = basic_properties.decode(b"")
            for name, i in props:
                row[name] = decoded[i]
        for name, column in values.items():
            column.append(row[name])
    return {name: _column(name, column) for name, column in values.items()}


def _column(name: str, values: list[Any]) -> pa.Array:
    if name == "timestamp":
        secs = np.array([-1 if v is None else v for v in values], np.int64)
        return pa.array(secs * 1_000_000, _TS, mask=secs < 0)
    if name == "headers":
        return pa.array(values, _MAP)
    if name in ("delivery_mode", "priority"):
        return pa.array(values, pa.int32())
    if name == "body":
        return pa.array(values, pa.binary())
    if name == "body_size":
        return pa.array(values, pa.int64())
    return pa.array(values, pa.string())
