"""JSON that fits its token budget: the pieces, without vLLM.

- ``Schema.shortest(s)``: the shortest valid instance of a (sub)schema, compact bytes
  (``{"a":""}``), the way xgrammar's JSON grammar writes it (properties in schema order,
  no extra properties unless the schema allows them).
- ``Schema.start()`` / ``feed`` / ``completion``: a partial-JSON parser that follows the
  schema byte by byte (unions as parallel alternatives), and the shortest text that
  closes what has been written into a valid instance (closes the current string, gives
  each missing required property its shortest value, fills minItems, closes arrays and
  objects).
- ``Spelling``: the fewest tokens of a vocabulary that spell some bytes (the count the
  budget is measured in) and the first of them.

Why our own and not a library: the partial-JSON parsers on PyPI (partial-json-parser,
ijson) repair text into *some* JSON without a schema, and the grammar engines
(xgrammar, llguidance, outlines) expose the next-token mask but not the shortest
completion of a state; xgrammar's ``find_jump_forward_string`` gives only the forced
part. The completion here is checked against xgrammar's matcher where it is used
(runtime/patches/json_budget.py), so a mistake here costs the guarantee for that
request, never a grammar violation.

Not covered (``completion`` returns None, the runtime hook then leaves vLLM's mask
alone and logs it): escapes inside object keys, ``format`` values other than those in
``FORMATS``, patterns whose completion the bounded search below does not find,
``minProperties``/``maxProperties``, ``not``/``if``/``then``, and ``multipleOf``.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache

try:  # the `regex` package (a transformers dependency) matches partial strings
    import regex as _regex
except ImportError:  # pragma: no cover
    _regex = None

WS = frozenset(b" \t\n\r")
_NUMBER_BYTES = frozenset(b"0123456789+-.eE")
_PARTIAL_NUMBER = re.compile(rb"-?(0|[1-9][0-9]*)?(\.[0-9]*)?([eE][+-]?[0-9]*)?")
_FULL_NUMBER = re.compile(rb"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")

# string formats: a regex as strict as xgrammar's and its shortest instance
_D = r"[0-9]"
_DATE = rf"{_D}{{4}}-(0[1-9]|1[0-2])-(0[1-9]|[12]{_D}|3[01])"
_TIME = rf"([01]{_D}|2[0-3]):[0-5]{_D}:([0-5]{_D}|60)(\.{_D}+)?(Z|[+-]([01]{_D}|2[0-3]):[0-5]{_D})"
FORMATS: dict[str, tuple[str, str]] = {
    "date": (_DATE, "2000-01-01"),
    "time": (_TIME, "00:00:00Z"),
    "date-time": (rf"{_DATE}T{_TIME}", "2000-01-01T00:00:00Z"),
    "uuid": (
        r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
        "00000000-0000-0000-0000-000000000000",
    ),
    "ipv4": (
        r"((25[0-5]|2[0-4][0-9]|[01]?[0-9]?[0-9])\.){3}"
        r"(25[0-5]|2[0-4][0-9]|[01]?[0-9]?[0-9])",
        "0.0.0.0",
    ),
}
# the schema "anything": one object, so that the caches keyed by id() stay right
ANY: dict = {}
_ALL_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")


class Unsupported(Exception):
    """A schema construct this module cannot bound."""


# ------------------------------------------------------------------------- spelling
class Spelling:
    """The fewest tokens of a vocabulary that spell a byte string."""

    def __init__(self, tokens: dict[bytes, int]):
        self.tokens = tokens  # token bytes -> one id that spells them
        self.longest = max((len(t) for t in tokens), default=1)

    def count(self, data: bytes) -> int | None:
        return self.split(data)[0]

    def split(self, data: bytes) -> tuple[int | None, int]:
        """(fewest tokens spelling ``data``, byte length of the first one); (None, 0)
        when no split exists."""
        n = len(data)
        if n == 0:
            return 0, 0
        best: list[int | None] = [None] * (n + 1)
        first = [0] * (n + 1)
        best[n] = 0
        tokens, longest = self.tokens, self.longest
        for i in range(n - 1, -1, -1):
            top = min(n, i + longest)
            b = None
            for j in range(top, i, -1):
                rest = best[j]
                if rest is not None and (b is None or rest + 1 < b) and data[i:j] in tokens:
                    b, first[i] = rest + 1, j - i
            best[i] = b
        return best[0], first[0]

    def first_token(self, data: bytes) -> int | None:
        count, length = self.split(data)
        return None if count is None or count == 0 else self.tokens[data[:length]]


# --------------------------------------------------------------------------- regex
def _pattern_alphabet(pattern: str) -> str:
    """One character for each literal, class range and category of the pattern:
    separators first (a completion that moves on to the next part is shorter), then
    digits, then letters."""
    try:
        import re._parser as sre
    except ImportError:  # pragma: no cover
        import sre_parse as sre
    chars: list[str] = []

    def walk(items) -> None:
        for op, av in items:
            name = str(op)
            if name == "LITERAL":
                chars.append(chr(av))
            elif name == "IN":
                for iop, iav in av:
                    iname = str(iop)
                    if iname == "LITERAL":
                        chars.append(chr(iav))
                    elif iname == "RANGE":
                        chars.extend((chr(iav[0]), chr(iav[1])))
                    elif iname == "CATEGORY":
                        chars.append(
                            {"CATEGORY_DIGIT": "0", "CATEGORY_SPACE": " "}.get(str(iav), "a")
                        )
            elif name == "ANY":
                chars.append("a")
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                walk(av[2])
            elif name == "SUBPATTERN":
                walk(av[-1])
            elif name == "BRANCH":
                for branch in av[1]:
                    walk(branch)
            elif name == "ATOMIC_GROUP":
                walk(av)

    try:
        walk(sre.parse(pattern))
    except Exception:
        chars = list("0aA-_.:@ /+Z")
    unique = list(dict.fromkeys(chars))
    return "".join(sorted(unique, key=lambda c: (c.isalnum(), not c.isdigit(), c.isupper(), c)))


@lru_cache(maxsize=4096)
def regex_completion(pattern: str, text: str, limit: int = 48) -> str | None:
    """The shortest suffix (found by iterative deepening over a small alphabet, at most
    ``limit`` characters and a bounded number of tries) that makes ``text`` a full
    match of ``pattern``; None when none is found."""
    if _regex is None:
        return None
    try:
        compiled = _regex.compile(pattern.removeprefix("^").removesuffix("$"))
    except Exception:
        return None
    if compiled.fullmatch(text):
        return ""
    if not compiled.fullmatch(text, partial=True):
        return None
    alphabet = _pattern_alphabet(pattern)
    tries = [0]

    def dfs(s: str, depth: int, budget: int) -> str | None:
        # depth-first, characters in alphabet order; at most `depth` more characters
        if compiled.fullmatch(s):
            return ""
        if depth == 0:
            return None
        for c in alphabet:
            tries[0] += 1
            if tries[0] > budget:
                return None
            t = s + c
            if compiled.fullmatch(t, partial=True):
                found = dfs(t, depth - 1, budget)
                if found is not None:
                    return c + found
        return None

    # the shortest, by iterative deepening, while that stays cheap; then the first
    # completion a depth-first search finds
    for depth in range(1, 5):
        found = dfs(text, depth, 4000)
        if found is not None:
            return found
    tries[0] = 0
    return dfs(text, limit, 20000)


def _json_string_bytes(text: str) -> bytes:
    return json.dumps(text, ensure_ascii=False).encode()[1:-1]


# -------------------------------------------------------------------------- schema
class Schema:
    """A JSON schema as xgrammar reads it (strict mode: no extra properties unless the
    schema asks for them), with the shortest instance and the partial parser."""

    def __init__(self, schema):
        if isinstance(schema, (str, bytes)):
            schema = json.loads(schema)
        self.root = schema
        # keyed by id(); each entry keeps its schema alive, so an id is never reused
        self._shortest: dict[int, tuple[object, bytes]] = {}
        self._branches: dict[int, tuple[object, list]] = {}

    # ----- normalising
    def resolve(self, s):
        seen = 0
        while isinstance(s, dict) and "$ref" in s:
            ref = s["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#"):
                raise Unsupported(f"$ref {ref!r}")
            target = self.root
            for part in ref[1:].split("/"):
                if part:
                    part = part.replace("~1", "/").replace("~0", "~")
                    target = target[int(part)] if isinstance(target, list) else target[part]
            rest = {k: v for k, v in s.items() if k != "$ref"}
            s = {**target, **rest} if rest and isinstance(target, dict) else target
            seen += 1
            if seen > 64:
                raise Unsupported("recursive $ref")
        if s is True or s == {}:
            return ANY
        if s is False:
            raise Unsupported("false schema")
        if "allOf" in s:
            merged = {k: v for k, v in s.items() if k != "allOf"}
            for part in s["allOf"]:
                part = self.resolve(part)
                for k, v in part.items():
                    if k == "properties":
                        merged["properties"] = {**merged.get("properties", {}), **v}
                    elif k == "required":
                        merged["required"] = list(dict.fromkeys(merged.get("required", []) + v))
                    else:
                        merged.setdefault(k, v)
            s = merged
        return s

    def branches(self, s) -> list:
        """The alternatives of a schema, each with one type (or a literal list)."""
        key = id(s)
        cached = self._branches.get(key)
        if cached is not None:
            return cached[1]
        original = s
        s = self.resolve(s)
        out: list = []
        if "enum" in s or "const" in s:
            values = s["enum"] if "enum" in s else [s["const"]]
            out.append(("lit", tuple(_compact(v) for v in values)))
        elif "anyOf" in s or "oneOf" in s:
            base = {k: v for k, v in s.items() if k not in ("anyOf", "oneOf")}
            for part in s.get("anyOf", s.get("oneOf")):
                part = self.resolve(part)
                out.extend(self.branches({**base, **part} if base else part))
        else:
            types = s.get("type")
            if types is None:
                if "properties" in s or "required" in s or "additionalProperties" in s:
                    types = ["object"]
                elif "items" in s or "prefixItems" in s:
                    types = ["array"]
                elif any(k in s for k in ("pattern", "format", "minLength", "maxLength")):
                    types = ["string"]
                else:
                    types = list(_ALL_TYPES)
            if isinstance(types, str):
                types = [types]
            for t in types:
                if t == "null":
                    out.append(("lit", (b"null",)))
                elif t == "boolean":
                    out.append(("lit", (b"true", b"false")))
                elif t in ("integer", "number", "string", "array", "object"):
                    out.append((t, s))
                else:
                    raise Unsupported(f"type {t!r}")
        self._branches[key] = (original, out)
        return out

    # ----- shortest instance
    def shortest(self, s) -> bytes:
        key = id(s)
        cached = self._shortest.get(key)
        if cached is not None:
            if cached[1] is None:
                raise Unsupported("a schema that contains itself on every path")
            return cached[1]
        self._shortest[key] = (s, None)  # a recursion guard
        found = []
        for branch in self.branches(s):
            try:
                found.append(self._shortest_branch(branch))
            except Unsupported:
                continue
        if not found:
            del self._shortest[key]
            raise Unsupported("no instance found")
        self._shortest[key] = (s, min(found, key=len))
        return self._shortest[key][1]

    def _shortest_branch(self, branch) -> bytes:
        kind, s = branch
        if kind == "lit":
            return min(s, key=len)
        if kind == "string":
            return b'"' + _json_string_bytes(self.string_completion(s, "")) + b'"'
        if kind in ("integer", "number"):
            return self.number_completion(s, b"")
        if kind == "array":
            n = int(s.get("minItems", 0))
            return b"[" + b",".join(self.shortest(self.item(s, i)) for i in range(n)) + b"]"
        props, required, _ = self.object_parts(s)
        return b"{" + b",".join(self._member(s, k) for k in required) + b"}"

    def _member(self, s, key: str) -> bytes:
        return _compact(key) + b":" + self.shortest(self.value_schema(s, key))

    def string_completion(self, s, text: str) -> str:
        """The shortest suffix that makes ``text`` (the unescaped content so far) a valid
        value of the string schema ``s``; raises Unsupported when not found."""
        fmt, pattern = s.get("format"), s.get("pattern")
        if fmt is not None and fmt in FORMATS:
            regex, example = FORMATS[fmt]
            if text == "":
                return example
            pattern = regex
        elif fmt is not None and pattern is None:
            raise Unsupported(f"format {fmt!r}")
        if pattern is not None:
            found = regex_completion(pattern, text)
            if found is None:
                raise Unsupported(f"pattern {pattern!r}")
            return found
        return "a" * max(0, int(s.get("minLength", 0)) - len(text))

    def number_completion(self, s, text: bytes) -> bytes:
        """``text`` (a number's bytes so far, maybe empty) plus the shortest suffix that
        makes it a valid number of ``s``, whole; raises Unsupported when none of the
        few suffixes tried fits the bounds."""
        integer = s.get("type") == "integer" or (
            isinstance(s.get("type"), list) and "number" not in s["type"]
        )
        lo, hi = s.get("minimum"), s.get("maximum")
        xlo, xhi = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        if isinstance(xlo, bool):  # draft 4
            xlo, lo = (lo if xlo else None), (None if xlo else lo)
        if isinstance(xhi, bool):
            xhi, hi = (hi if xhi else None), (None if xhi else hi)

        def ok(v: float) -> bool:
            return (
                (lo is None or v >= lo)
                and (hi is None or v <= hi)
                and (xlo is None or v > xlo)
                and (xhi is None or v < xhi)
            )

        if text == b"":
            floor = max((x for x in (lo, xlo) if x is not None), default=None)
            ceil_ = min((x for x in (hi, xhi) if x is not None), default=None)
            picks = [0]
            if floor is not None:
                picks += [math.ceil(floor), math.floor(floor) + 1]
            if ceil_ is not None:
                picks += [math.floor(ceil_), math.ceil(ceil_) - 1]
            for v in sorted(set(picks), key=lambda v: (len(str(v)), abs(v))):
                if ok(v):
                    return str(v).encode()
            if not integer:
                for v in (floor, ceil_):
                    if v is not None and ok(v):
                        return repr(float(v)).encode()
                if floor is not None and ceil_ is not None and ok((floor + ceil_) / 2):
                    return repr((floor + ceil_) / 2).encode()
            raise Unsupported("number bounds")
        tails = [b""]
        if text.endswith(b"-") and len(text) == 1:
            tails = [b"1", b"5", b"9"]  # xgrammar writes no "-0"
        elif text.endswith((b"-", b".", b"e", b"E", b"+")):
            tails = [b"0", b"1", b"5"]
        extra = [b"0", b"00", b"000", b"1", b"5", b"9"]
        if not integer and b"." not in text and b"e" not in text.lower():
            extra += [b".0", b".5", b".1", b".9", b".01", b".99"]
        for head in tails:
            for tail in [b""] + extra:
                whole = text + head + tail
                if _FULL_NUMBER.fullmatch(whole) is None:
                    continue
                if integer and not re.fullmatch(rb"-?[0-9]+", whole):
                    continue
                if ok(float(whole)):
                    return whole
        raise Unsupported("number bounds")

    def item(self, s, i: int):
        prefix = s.get("prefixItems") or []
        if i < len(prefix):
            return prefix[i]
        items = s.get("items", ANY if not prefix else False)
        if items is False:
            raise Unsupported("no item allowed")
        return items

    def object_parts(self, s):
        props = s.get("properties") or ANY
        required = [k for k in props if k in set(s.get("required", ()))]
        required += [k for k in s.get("required", ()) if k not in props]
        extra = s.get("additionalProperties")
        if extra is None:
            extra = ANY if not props and "patternProperties" not in s else False
        if extra is True or extra == {}:
            extra = ANY
        return props, required, extra

    def value_schema(self, s, key: str):
        props, _, extra = self.object_parts(s)
        if key in props:
            return props[key]
        if extra is False:
            raise Unsupported(f"property {key!r}")
        return extra

    def next_keys(self, s, keys: tuple) -> tuple[list[str], bool]:
        """Properties that may come after ``keys`` (schema order), and whether any
        other key may."""
        props, _, extra = self.object_parts(s)
        names = list(props)
        last = max((names.index(k) for k in keys if k in props), default=-1)
        return [k for k in names[last + 1 :] if k not in keys], extra is not False

    def allowed_keys(self, s, keys: tuple) -> tuple[list[str], bool]:
        """``next_keys`` up to the first required property still missing (which must
        come next at the latest); other keys only when none is missing."""
        nexts, extra = self.next_keys(s, keys)
        missing = self.missing_required(s, keys)
        if missing and missing[0] in nexts:
            return nexts[: nexts.index(missing[0]) + 1], False
        return nexts, extra and not missing

    def missing_required(self, s, keys: tuple) -> list[str]:
        return [k for k in self.object_parts(s)[1] if k not in keys]

    def close_object(self, s, keys: tuple, comma_first: bool) -> bytes:
        members = [self._member(s, k) for k in self.missing_required(s, keys)]
        if not members:
            return b"}"
        return (b"," if comma_first else b"") + b",".join(members) + b"}"

    def growth(self) -> int:
        """An upper bound, in bytes, of the shortest value of any subschema."""
        most = 0
        stack, seen = [self.root], set()
        while stack:
            s = stack.pop()
            if id(s) in seen or not isinstance(s, (dict, bool)):
                continue
            seen.add(id(s))
            try:
                most = max(most, len(self.shortest(s)))
                for kind, b in self.branches(s):
                    if kind == "object":
                        props, _, extra = self.object_parts(b)
                        stack += list(props.values()) + [extra]
                    elif kind == "array":
                        stack += list(b.get("prefixItems") or []) + [b.get("items", ANY)]
            except Unsupported:
                continue
        return most

    # ----- partial parser: a state is a tuple of stacks, a stack a tuple of frames
    # ("V", schema)                  a value of schema is expected
    # ("S", schema, raw, chars, esc) inside a string value (raw: bytes as written)
    # ("N", schema, text)            inside a number
    # ("L", literals, typed)         inside a literal (true/false/null/enum/const)
    # ("O", schema, keys, phase, kb) inside an object; phase: start key colon value after next
    # ("A", schema, count, phase)    inside an array; phase: start value after next
    def start(self) -> tuple:
        return ((("V", self.root),),)

    def feed(self, state: tuple, data: bytes) -> tuple:
        for b in data:
            nxt: list = []
            for stack in state:
                nxt.extend(self._step(stack, b))
            state = tuple(nxt)
            if not state:
                break
        return state

    def _done(self, stack: tuple) -> tuple:
        stack = stack[:-1]
        if not stack:
            return stack
        top = stack[-1]
        if top[0] == "O":
            return stack[:-1] + (("O", top[1], top[2], "after", b""),)
        return stack[:-1] + (("A", top[1], top[2] + 1, "after"),)

    def _step(self, stack: tuple, b: int) -> list:
        if not stack:
            return []
        f = stack[-1]
        kind = f[0]
        try:
            if kind == "V":
                if b in WS:
                    return [stack]
                out = []
                for branch in self.branches(f[1]):
                    new = self._begin(branch, b)
                    if new is not None:
                        out.append(stack[:-1] + (new,))
                return out
            if kind == "S":
                return self._string_step(stack, f, b)
            if kind == "N":
                text = f[2]
                if b in _NUMBER_BYTES:
                    t = text + bytes((b,))
                    return [stack[:-1] + (("N", f[1], t),)] if _PARTIAL_NUMBER.fullmatch(t) else []
                try:
                    whole = self.number_completion(f[1], text)
                except Unsupported:
                    return []
                return self._step(self._done(stack), b) if whole == text else []
            if kind == "L":
                t = f[2] + bytes((b,))
                if any(c.startswith(t) for c in f[1]):
                    return [stack[:-1] + (("L", f[1], t),)]
                return self._step(self._done(stack), b) if f[2] in f[1] else []
            if kind == "O":
                return self._object_step(stack, f, b)
            return self._array_step(stack, f, b)
        except Unsupported:
            return []

    def _begin(self, branch, b: int):
        kind, s = branch
        if kind == "lit":
            t = bytes((b,))
            return ("L", s, t) if any(c.startswith(t) for c in s) else None
        if kind == "string":
            return ("S", s, b"", 0, 0) if b == 0x22 else None
        if kind in ("integer", "number"):
            return ("N", s, bytes((b,))) if b in b"-0123456789" else None
        if kind == "object":
            return ("O", s, (), "start", b"") if b == 0x7B else None
        return ("A", s, 0, "start") if b == 0x5B else None

    def _string_step(self, stack, f, b: int) -> list:
        _, s, raw, chars, esc = f
        if esc == 1:
            if b not in b'"\\/bfnrtu':
                return []
            esc = 2 if b == 0x75 else 0
        elif esc >= 2:
            if b not in b"0123456789abcdefABCDEF":
                return []
            esc = 0 if esc == 5 else esc + 1
        elif b == 0x22:
            text = _unescape(raw)
            if text is None or not self._string_ok(s, text):
                return []
            return [self._done(stack)]
        elif b == 0x5C:
            esc, chars = 1, chars + 1
        elif b < 0x20:
            return []
        elif b & 0xC0 != 0x80:
            chars += 1
        max_len = s.get("maxLength")
        if max_len is not None and chars > max_len:
            return []
        return [stack[:-1] + (("S", s, raw + bytes((b,)), chars, esc),)]

    def _string_ok(self, s, text: str) -> bool:
        if len(text) < s.get("minLength", 0) or len(text) > s.get("maxLength", 1 << 60):
            return False
        try:
            return self.string_completion(s, text) == "" or (
                s.get("format") in FORMATS and text == FORMATS[s["format"]][1]
            )
        except Unsupported:
            return False

    def _object_step(self, stack, f, b: int) -> list:
        _, s, keys, phase, kb = f
        top = stack[:-1]
        if phase == "key":
            if b == 0x22 and _escape_state(kb) == 0:
                key = _unescape(kb)
                nexts, extra = self.allowed_keys(s, keys)
                # an extra key may repeat (xgrammar allows it; json.loads keeps the last)
                defined = self.object_parts(s)[0]
                if key is None or not (key in nexts or (extra and key not in defined)):
                    return []
                return [top + (("O", s, keys + (key,), "colon", b""),)]
            if b < 0x20:
                return []
            kb = kb + bytes((b,))
            nexts, extra = self.allowed_keys(s, keys)
            if not extra and not any(_compact(k)[1:].startswith(kb) for k in nexts):
                return []
            return [top + (("O", s, keys, "key", kb),)]
        if b in WS and phase in ("start", "colon", "after", "next"):
            return [stack]
        if phase in ("start", "next") and b == 0x22:
            return [top + (("O", s, keys, "key", b""),)]
        if phase in ("start", "after") and b == 0x7D:
            return [self._done(stack)] if not self.missing_required(s, keys) else []
        if phase == "after" and b == 0x2C:
            nexts, extra = self.allowed_keys(s, keys)
            return [top + (("O", s, keys, "next", b""),)] if nexts or extra else []
        if phase == "colon" and b == 0x3A:
            value = self.value_schema(s, keys[-1])
            return [top + (("O", s, keys, "value", b""), ("V", value))]
        return []

    def _array_step(self, stack, f, b: int) -> list:
        _, s, count, phase = f
        top = stack[:-1]
        if b in WS:
            return [stack]
        if phase == "start" and b == 0x5D or phase == "after" and b == 0x5D:
            return [self._done(stack)] if count >= s.get("minItems", 0) else []
        if phase == "after" and b == 0x2C:
            if count >= s.get("maxItems", 1 << 60):
                return []
            return [top + (("A", s, count, "next"),)]
        if phase in ("start", "next"):
            if count >= s.get("maxItems", 1 << 60):
                return []
            child = top + (("A", s, count, "value"), ("V", self.item(s, count)))
            return self._step(child, b)
        return []

    # ----- completion
    def completion(self, state: tuple, spelling: Spelling | None = None) -> bytes | None:
        """The shortest bytes (fewest tokens when ``spelling`` is given) that complete
        one of the alternatives of ``state`` into a valid instance; None when none can."""
        best, best_cost = None, None
        for stack in state:
            try:
                text = self._complete_stack(stack)
            except Unsupported:
                continue
            cost = len(text) if spelling is None else spelling.count(text)
            if cost is not None and (best_cost is None or cost < best_cost):
                best, best_cost = text, cost
        return best

    def _complete_stack(self, stack: tuple) -> bytes:
        out = []
        while stack:
            f = stack[-1]
            kind = f[0]
            if kind == "V":
                out.append(self.shortest(f[1]))
            elif kind == "S":
                out.append(self._close_string(f))
            elif kind == "N":
                out.append(self.number_completion(f[1], f[2])[len(f[2]) :])
            elif kind == "L":
                rest = [c for c in f[1] if c.startswith(f[2])]
                if not rest:
                    raise Unsupported("literal")
                out.append(min(rest, key=len)[len(f[2]) :])
            elif kind == "O":
                out.append(self._close_object(f))
            else:
                out.append(self._close_array(f))
            stack = stack[:-1]
            # the frame below (if any) now has its value: object/array "value" phases
            if stack:
                below = stack[-1]
                if below[0] == "O" and below[3] == "value":
                    stack = stack[:-1] + (("O", below[1], below[2], "after", b""),)
                elif below[0] == "A" and below[3] == "value":
                    stack = stack[:-1] + (("A", below[1], below[2] + 1, "after"),)
        return b"".join(out)

    def _close_string(self, f) -> bytes:
        raw = f[2]
        s = f[1]
        out = finish_raw(raw)
        raw = raw + out
        text = _unescape(raw)
        if text is None:
            raise Unsupported("string escape")
        rest = self.string_completion(s, text)
        max_len = s.get("maxLength")
        if max_len is not None and len(text) + len(rest) > max_len:
            raise Unsupported("maxLength")
        return out + _json_string_bytes(rest) + b'"'

    def _close_object(self, f) -> bytes:
        _, s, keys, phase, kb = f
        if phase == "start":
            return self.close_object(s, keys, False)
        if phase == "after":
            return self.close_object(s, keys, True)
        if phase == "colon":
            value = self.shortest(self.value_schema(s, keys[-1]))
            return b":" + value + self.close_object(s, keys, True)
        nexts, extra = self.allowed_keys(s, keys)
        missing = self.missing_required(s, keys)
        if phase == "next":
            if missing:
                return self.close_object(s, keys, False)
            options = [self._member(s, k) + b"}" for k in nexts]
            if extra:
                options.append(b'"_":' + self.shortest(self.value_schema(s, "_")) + b"}")
            if not options:
                raise Unsupported("no key left")
            return min(options, key=len)
        # phase "key": kb holds the key's bytes so far
        options = []
        for k in nexts:
            whole = _compact(k)[1:-1]
            if whole.startswith(kb):
                member = self._member(s, k)
                options.append(member[1 + len(kb) :] + self.close_object(s, keys + (k,), True))
        if extra and not missing:
            fill = finish_raw(kb)
            key = _unescape(kb + fill)
            if key is not None and key not in self.object_parts(s)[0]:
                value = self.shortest(self.value_schema(s, key))
                options.append(fill + b'":' + value + self.close_object(s, keys + (key,), True))
        if not options:
            raise Unsupported("key")
        return min(options, key=len)

    def _close_array(self, f) -> bytes:
        _, s, count, phase = f
        need = max(0, s.get("minItems", 0) - count)
        items = [self.shortest(self.item(s, count + i)) for i in range(need)]
        if phase == "start":
            return b",".join(items) + b"]"
        if phase == "after":
            return b"".join(b"," + i for i in items) + b"]"
        if phase == "next":
            if not items:
                items = [self.shortest(self.item(s, count))]
            return b",".join(items) + b"]"
        raise Unsupported("array phase")


def _compact(value) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _escape_state(raw: bytes) -> int:
    """0: not inside an escape; 1: after a backslash; 2-5: inside \\u and that many
    characters of it written (the "u" counts as the first)."""
    i, n, state = 0, len(raw), 0
    while i < n:
        if raw[i] == 0x5C:
            if i + 1 >= n:
                return 1
            if raw[i + 1] == 0x75:
                done = n - (i + 2)
                if done < 4:
                    return 2 + done
                i += 6
                continue
            i += 2
            continue
        i += 1
    return state


def finish_raw(raw: bytes) -> bytes:
    """Bytes that end an unfinished escape and an unfinished UTF-8 character at the end
    of a string's raw bytes."""
    esc = _escape_state(raw)
    if esc == 1:
        return b"n"
    if esc >= 2:
        return b"0" * (6 - esc)
    for i in range(1, min(4, len(raw)) + 1):
        c = raw[-i]
        if c & 0xC0 == 0x80:
            continue
        need = 1 if 0xC0 <= c < 0xE0 else 2 if 0xE0 <= c < 0xF0 else 3 if c >= 0xF0 else 0
        tail = need - (i - 1)
        if tail <= 0:
            return b""
        second = {0xE0: 0xA0, 0xF0: 0x90}.get(c, 0x80) if i == 1 else 0x80
        return bytes((second,)) + b"\x80" * (tail - 1)
    return b""


def _unescape(raw: bytes) -> str | None:
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:
        return None
