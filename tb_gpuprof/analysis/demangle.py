"""Itanium C++ ABI demangler for CUDA kernel names (``_ZN…`` → readable), pure Python.

Traces from Nsight Systems, CUPTI and some XPlane producers carry mangled kernel names such as
``_ZN5cudnn6detail25bn_fw_tr_1C11_kernel_NCHWIffLi512ELb1ELi1EEEv17cudnnTensorStruct…``.
This covers what kernel symbols use: nested/local/template names, substitutions, template
parameters and packs, literals, lambdas, function and pointer types. Output follows
``c++filt`` (``void f<int>(int)``, ``> >``, ``(anonymous namespace)``, ``{lambda(int)#1}``).
Anything outside that subset (template expressions, decltype) makes :func:`demangle` return
the input unchanged: it is best effort and never raises.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["demangle"]

_MAX_LEN = 20_000  # longer symbols are returned as-is: no kernel name is that long
_MAX_DEPTH = 200  # recursion guard against hostile input

_BUILTIN = {
    "v": "void", "w": "wchar_t", "b": "bool", "c": "char", "a": "signed char",
    "h": "unsigned char", "s": "short", "t": "unsigned short", "i": "int", "j": "unsigned int",
    "l": "long", "m": "unsigned long", "x": "long long", "y": "unsigned long long",
    "n": "__int128", "o": "unsigned __int128", "f": "float", "d": "double", "e": "long double",
    "g": "__float128", "z": "...",
}
_BUILTIN_D = {
    "h": "half", "n": "decltype(nullptr)", "a": "auto", "c": "decltype(auto)", "s": "char16_t",
    "i": "char32_t", "u": "char8_t", "f": "decimal32", "d": "decimal64", "e": "decimal128",
}
# Literal suffixes as c++filt prints them; other types print as "(type)value".
_LITERAL_SUFFIX = {"i": "", "j": "u", "l": "l", "m": "ul", "x": "ll", "y": "ull"}
_STD_SUBST = {
    "t": "std", "a": "std::allocator", "b": "std::basic_string", "s": "std::string",
    "i": "std::istream", "o": "std::ostream", "d": "std::iostream",
}
_OPERATORS = {
    "nw": "new", "na": "new[]", "dl": "delete", "da": "delete[]", "ps": "+", "ng": "-",
    "ad": "&", "de": "*", "co": "~", "pl": "+", "mi": "-", "ml": "*", "dv": "/", "rm": "%",
    "an": "&", "or": "|", "eo": "^", "aS": "=", "pL": "+=", "mI": "-=", "mL": "*=",
    "dV": "/=", "rM": "%=", "aN": "&=", "oR": "|=", "eO": "^=", "ls": "<<", "rs": ">>",
    "lS": "<<=", "rS": ">>=", "eq": "==", "ne": "!=", "lt": "<", "gt": ">", "le": "<=",
    "ge": ">=", "ss": "<=>", "nt": "!", "aa": "&&", "oo": "||", "pp": "++", "mm": "--",
    "cm": ",", "pm": "->*", "pt": "->", "cl": "()", "ix": "[]", "qu": "?",
}


class _Unsupported(Exception):
    """The symbol uses a part of the grammar this demangler does not cover."""


class _Pack:
    __slots__ = ("items",)

    def __init__(self, items: list) -> None:
        self.items = items


class _Fn:
    """A function type; ``mods`` are pointer/reference declarators applied to it."""

    __slots__ = ("mods", "params", "ret")

    def __init__(self, ret: object, params: list, mods: str = "") -> None:
        self.ret, self.params, self.mods = ret, params, mods


class _Arr:
    __slots__ = ("dim", "elem", "mods")

    def __init__(self, elem: object, dim: str, mods: str = "") -> None:
        self.elem, self.dim, self.mods = elem, dim, mods


def _with_mods(t: _Fn | _Arr, cls: type, mods: str) -> object:
    if cls is _Fn:
        return _Fn(t.ret, t.params, mods)  # type: ignore[union-attr]
    return _Arr(t.elem, t.dim, mods)  # type: ignore[union-attr]


def _render(t: object) -> str:
    if isinstance(t, str):
        return t
    if isinstance(t, _Pack):
        return ", ".join(_render(x) for x in t.items)
    if isinstance(t, _Fn):
        mods = f"({t.mods})" if t.mods else ""
        return f"{_render(t.ret)} {mods}({_params(t.params)})"
    if isinstance(t, _Arr):
        mods = f"({t.mods}) " if t.mods else ""
        return f"{_render(t.elem)} {mods}[{t.dim}]"
    raise _Unsupported(type(t).__name__)


def _params(params: list) -> str:
    if len(params) == 1 and params[0] == "void":
        return ""
    out: list[str] = []
    for p in params:
        if isinstance(p, _Pack):
            out.extend(_render(x) for x in p.items)
        else:
            out.append(_render(p))
    return ", ".join(out)


def _collapse(outer: str, inner: str) -> str:
    """Reference collapsing: ``T& &&`` is ``T&``; only ``&& &&`` stays ``&&``."""
    return "&&" if outer == inner == "&&" else "&"


def _add_mod(t: object, mod: str) -> object:
    """Apply a declarator (``*``, ``&``, ``&&``) or cv-qualifier (`` const``) to a type."""
    if mod in ("&", "&&"):
        if isinstance(t, (_Fn, _Arr)) and t.mods.startswith("&"):
            inner = "&&" if t.mods.startswith("&&") else "&"
            rest = t.mods[len(inner):]
            cls = _Fn if isinstance(t, _Fn) else _Arr
            return _with_mods(t, cls, _collapse(mod, inner) + rest)
        if isinstance(t, str) and t.endswith("&"):
            inner = "&&" if t.endswith("&&") else "&"
            return t[: -len(inner)] + _collapse(mod, inner)
    if isinstance(t, _Fn):
        if mod.startswith(" "):  # cv on a function type: rare, keep it readable
            return _Fn(t.ret, t.params, t.mods + mod)
        return _Fn(t.ret, t.params, mod + t.mods)
    if isinstance(t, _Arr):
        return _Arr(t.elem, t.dim, mod + t.mods)
    if isinstance(t, _Pack):
        return _Pack([_add_mod(x, mod) for x in t.items])
    return _render(t) + mod


class _Parser:
    def __init__(self, s: str) -> None:
        self.s = s
        self.i = 0
        self.subs: list[object] = []
        self.tmpl: list[object] | None = None  # template args params T_ refer to
        self.depth = 0

    # -- low level ---------------------------------------------------------------------
    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def eat(self, c: str) -> bool:
        if self.s.startswith(c, self.i):
            self.i += len(c)
            return True
        return False

    def need(self, c: str) -> None:
        if not self.eat(c):
            raise _Unsupported(f"expected {c!r} at {self.i}")

    def number(self) -> int:
        neg = self.eat("n")
        j = self.i
        while self.peek().isdigit():
            self.i += 1
        if j == self.i:
            raise _Unsupported("number expected")
        v = int(self.s[j:self.i])
        return -v if neg else v

    def seq_id(self) -> int:
        """Base-36 id of S<id>_ / T<id>_: empty means 0, otherwise value + 1."""
        if self.eat("_"):
            return 0
        j = self.i
        while self.peek() and (self.peek().isdigit() or self.peek().isupper()):
            self.i += 1
        if j == self.i:
            raise _Unsupported("seq-id")
        self.need("_")
        return int(self.s[j:self.i - 1], 36) + 1

    def enter(self) -> None:
        self.depth += 1
        if self.depth > _MAX_DEPTH:
            raise _Unsupported("too deep")

    # -- encodings and names -------------------------------------------------------------
    def encoding(self, top: bool) -> str:
        self.enter()
        name, is_template, cv, ctor = self.name()
        if not self.peek() or self.peek() in "E.":
            self.depth -= 1
            return name
        saved = self.tmpl
        if is_template is not None:
            self.tmpl = is_template
        ret = None
        if is_template is not None and not ctor:
            ret = self.type()
        params = [self.type()]
        while self.peek() and self.peek() not in "E.":
            params.append(self.type())
        self.tmpl = saved
        self.depth -= 1
        out = f"{name}({_params(params)}){cv}"
        if ret is not None and top:
            r = _render(ret)
            out = f"{r} {out}"
        return out

    def name(self) -> tuple[str, list | None, str, bool]:
        """Returns (text, template args of the last component or None, cv suffix, ctor/dtor)."""
        c = self.peek()
        if c == "N":
            return self.nested()
        if c == "Z":
            return self.local_name()
        if c == "S" and self.peek(1) == "t":
            self.i += 2
            text, ctor = self.unqualified("std")
            text = "std::" + text
        elif c == "S":
            text = _render(self.substitution())
            ctor = False
            if self.peek() != "I":
                raise _Unsupported("substitution as a name")
        else:
            text, ctor = self.unqualified(None)
        args = None
        if self.peek() == "I":
            self.subs.append(text)
            args = self.template_args()
            text = _with_args(text, args)
        return text, args, "", ctor

    def nested(self) -> tuple[str, list | None, str, bool]:
        self.need("N")
        cv = ""
        while self.peek() in ("r", "V", "K"):
            cv += {"r": " restrict", "V": " volatile", "K": " const"}[self.s[self.i]]
            self.i += 1
        if self.peek() in ("R", "O"):
            cv += " &" if self.s[self.i] == "R" else " &&"
            self.i += 1
        cur: str | None = None
        args: list | None = None
        ctor = False
        while True:
            c = self.peek()
            if c == "":
                raise _Unsupported("unterminated nested name")
            if c == "E":
                self.i += 1
                break
            from_subst = False
            if c == "I":
                if cur is None:
                    raise _Unsupported("template args without a name")
                args = self.template_args()
                cur = _with_args(cur, args)
            else:
                args = None
                if c == "S" and self.peek(1) != "t":
                    piece = _render(self.substitution())
                    from_subst = True
                elif c == "S":
                    self.i += 2
                    piece = "std"
                    from_subst = True
                elif c == "T":
                    piece = _render(self.template_param())
                elif c == "D" and self.peek(1) in "tT":
                    raise _Unsupported("decltype prefix")
                elif c == "M":  # lambda initializer scope: already a candidate
                    self.i += 1
                    continue
                else:
                    piece, ctor = self.unqualified(cur)
                cur = piece if cur is None else f"{cur}::{piece}"
            if not from_subst and self.peek() != "E":
                self.subs.append(cur)
        if cur is None:
            raise _Unsupported("empty nested name")
        return cur, args, cv, ctor

    def local_name(self) -> tuple[str, list | None, str, bool]:
        self.need("Z")
        enc = self.encoding(top=False)
        self.need("E")
        if self.eat("s"):
            self.discriminator()
            return enc + "::string literal", None, "", False
        if self.eat("d"):  # default argument scope
            if self.peek() != "_":
                self.number()
            self.need("_")
        text, args, cv, ctor = self.name()
        self.discriminator()
        return f"{enc}::{text}", args, cv, ctor

    def discriminator(self) -> None:
        if self.peek() == "_":
            if self.peek(1) == "_":
                self.i += 2
                self.number()
                self.need("_")
            elif self.peek(1).isdigit():
                self.i += 2

    def unqualified(self, scope: str | None) -> tuple[str, bool]:
        c = self.peek()
        if c.isdigit():
            return self.source_name(), False
        if c == "U":
            return self.unnamed(), False
        if c == "L":  # internal-linkage marker before a source name
            self.i += 1
            text = self.source_name()
            self.discriminator()
            return text, False
        if c in ("C", "D") and (self.peek(1).isdigit() or self.peek(1) == "I"):
            self.i += 1
            if self.eat("I"):  # inheriting constructor
                self.i += 1
                self.type()
            else:
                self.i += 1
            base = _base_name(scope or "")
            return (base if c == "C" else "~" + base), True
        if c.islower() and self.peek(1):
            code = self.s[self.i:self.i + 2]
            self.i += 2
            if code == "cv":
                return "operator " + _render(self.type()), True
            if code == "li":
                return 'operator"" ' + self.source_name(), False
            if code in _OPERATORS:
                op = _OPERATORS[code]
                sep = " " if op[0].isalpha() else ""
                return f"operator{sep}{op}", False
        raise _Unsupported(f"unqualified name at {self.i}")

    def source_name(self) -> str:
        n = self.number()
        if n <= 0 or self.i + n > len(self.s):
            raise _Unsupported("bad source-name length")
        text = self.s[self.i:self.i + n]
        self.i += n
        if text.startswith("_GLOBAL__N"):
            return "(anonymous namespace)"
        return text

    def unnamed(self) -> str:
        self.need("U")
        if self.eat("t"):
            n = 1 if self.peek() == "_" else self.number() + 2
            self.need("_")
            return f"{{unnamed type#{n}}}"
        if self.eat("l"):
            params = [self.type()]
            while self.peek() != "E":
                if not self.peek():
                    raise _Unsupported("lambda")
                params.append(self.type())
            self.need("E")
            n = 1 if self.peek() == "_" else self.number() + 2
            self.need("_")
            return f"{{lambda({_params(params)})#{n}}}"
        raise _Unsupported("unnamed type")

    # -- template arguments ---------------------------------------------------------------
    def template_args(self) -> list:
        self.need("I")
        self.enter()
        args: list = []
        while not self.eat("E"):
            if not self.peek():
                raise _Unsupported("unterminated template args")
            args.append(self.template_arg())
        self.depth -= 1
        return args

    def template_arg(self) -> object:
        c = self.peek()
        if c == "L":
            return self.literal()
        if c == "J":
            self.i += 1
            items = []
            while not self.eat("E"):
                if not self.peek():
                    raise _Unsupported("unterminated pack")
                items.append(self.template_arg())
            return _Pack(items)
        if c == "X":
            raise _Unsupported("template expression")
        return self.type()

    def literal(self) -> str:
        self.need("L")
        if self.eat("_Z"):
            out = self.encoding(top=False)
            self.need("E")
            return out
        if self.peek() == "Z":  # some compilers omit the underscore
            self.i += 1
            out = self.encoding(top=False)
            self.need("E")
            return out
        c = self.peek()
        if c == "b" and self.peek(1) in "01" and self.peek(2) == "E":
            self.i += 3
            return "true" if self.s[self.i - 2] == "1" else "false"
        if c in _LITERAL_SUFFIX:
            self.i += 1
            v = self.number()
            self.need("E")
            return f"{v}{_LITERAL_SUFFIX[c]}"
        if c == "D" and self.peek(1) == "n":
            self.i += 2
            self.eat("0")
            self.need("E")
            return "nullptr"
        t = _render(self.type())
        j = self.i
        while self.peek() and self.peek() != "E":
            self.i += 1
        raw = self.s[j:self.i]
        self.need("E")
        value = "-" + raw[1:] if raw.startswith("n") else raw
        return f"({t}){value}"

    def template_param(self) -> object:
        self.need("T")
        idx = self.seq_id()
        if self.tmpl is None or idx >= len(self.tmpl):
            raise _Unsupported("unresolvable template parameter")
        return self.tmpl[idx]

    def substitution(self) -> object:
        self.need("S")
        c = self.peek()
        if c in _STD_SUBST and c != "t":
            self.i += 1
            return _STD_SUBST[c]
        idx = self.seq_id()
        if idx >= len(self.subs):
            raise _Unsupported("substitution out of range")
        return self.subs[idx]

    # -- types ------------------------------------------------------------------------------
    def type(self) -> object:
        self.enter()
        try:
            return self._type()
        finally:
            self.depth -= 1

    def _type(self) -> object:
        c = self.peek()
        if c in _BUILTIN:
            self.i += 1
            return _BUILTIN[c]
        if c in ("r", "V", "K"):
            quals = ""
            while self.peek() in ("r", "V", "K"):
                quals = {"r": " restrict", "V": " volatile", "K": " const"}[self.s[self.i]] + quals
                self.i += 1
            t = _add_mod(self.type(), quals)
            self.subs.append(t)
            return t
        if c in ("P", "R", "O"):
            self.i += 1
            t = _add_mod(self.type(), {"P": "*", "R": "&", "O": "&&"}[c])
            self.subs.append(t)
            return t
        if c == "F":
            self.i += 1
            self.eat("Y")
            ret = self.type()
            params = []
            while self.peek() not in ("E", "R", "O") or (
                self.peek() in ("R", "O") and self.peek(1) != "E"
            ):
                if not self.peek():
                    raise _Unsupported("function type")
                params.append(self.type())
            if self.peek() in ("R", "O"):
                self.i += 1
            self.need("E")
            t = _Fn(ret, params)
            self.subs.append(t)
            return t
        if c == "A":
            self.i += 1
            dim = "" if self.peek() == "_" else str(self.number())
            self.need("_")
            t = _Arr(self.type(), dim)
            self.subs.append(t)
            return t
        if c == "M":
            self.i += 1
            cls = _render(self.type())
            member = self.type()
            if isinstance(member, _Fn):
                t = _Fn(member.ret, member.params, f"{cls}::*")
            else:
                t = f"{_render(member)} {cls}::*"
            self.subs.append(t)
            return t
        if c == "T":
            t = self.template_param()
            self.subs.append(t)
            if self.peek() == "I":
                t = _render(t) + _fmt_args(self.template_args())
                self.subs.append(t)
            return t
        if c == "S":
            if self.peek(1) == "t":
                text, _, _, _ = self.name()
                self.subs.append(text)
                return text
            t = self.substitution()
            if self.peek() == "I":
                t = _render(t) + _fmt_args(self.template_args())
                self.subs.append(t)
            return t
        if c == "D":
            d = self.peek(1)
            if d == "p":
                self.i += 2
                t = self.type()
                self.subs.append(t)
                return t
            if d == "F":  # DF<N>_ / DF16b: _Float<N>, std::bfloat16_t
                self.i += 2
                n = self.number()
                if self.eat("b"):
                    return "std::bfloat16_t"
                self.need("_")
                return f"_Float{n}"
            if d == "v":
                self.i += 2
                n = self.number()
                self.need("_")
                t = f"{_render(self.type())} __vector({n})"
                self.subs.append(t)
                return t
            if d in _BUILTIN_D:
                self.i += 2
                return _BUILTIN_D[d]
            raise _Unsupported("D-type")
        if c == "u":
            self.i += 1
            t = self.source_name()
            self.subs.append(t)
            return t
        if c.isdigit() or c in ("N", "Z"):
            text, _, _, _ = self.name()
            self.subs.append(text)
            return text
        raise _Unsupported(f"type at {self.i}: {c!r}")


def _base_name(qualified: str) -> str:
    """``a::b<c::d>`` -> ``b``: the last top-level component without its template args."""
    depth = 0
    start = 0
    cut = len(qualified)
    for k, ch in enumerate(qualified):
        if ch in "<(":
            if depth == 0 and ch == "<":
                cut = k
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif ch == ":" and depth == 0 and qualified.startswith("::", k):
            start, cut = k + 2, len(qualified)
    return qualified[start:cut]


def _fmt_args(args: list) -> str:
    parts: list[str] = []
    for a in args:
        if isinstance(a, _Pack):
            parts.extend(_render(x) for x in a.items)
        else:
            parts.append(_render(a))
    inner = ", ".join(parts)
    return f"<{inner} >" if inner.endswith(">") else f"<{inner}>"


def _with_args(text: str, args: list) -> str:
    """``name<args>``; c++filt separates ``operator<`` from its argument list by a space."""
    return text + (" " if text.endswith("<") else "") + _fmt_args(args)


def demangle(name: str) -> str:
    """Readable form of an Itanium-mangled name; anything else (or anything odd) unchanged."""
    if not isinstance(name, str) or not name.startswith("_Z") or len(name) > _MAX_LEN:
        return name
    return _demangle_cached(name)


@lru_cache(maxsize=16384)
def _demangle_cached(name: str) -> str:
    try:
        base, dot, suffix = name.partition(".")
        p = _Parser(base)
        p.i = 2
        out = p.encoding(top=True)
        if p.i != len(base):
            return name
        if dot:  # compiler clones: foo.cold, foo.constprop.0
            out += "".join(f" [clone .{part}]" for part in suffix.split(".") if part)
        return out
    except (_Unsupported, RecursionError, ValueError, IndexError, KeyError, TypeError):
        return name
