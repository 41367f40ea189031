"""Reading CUDA C++ source text: tokens, ``#line`` origins, ``__global__`` declarations.

The build (:mod:`cudasim.hostbuild`) and the asm translator (:mod:`cudasim.ptx`)
transform kernel text before g++ sees it; they find what they transform with
this tokenizer, which skips comments and keeps string and character literals
whole, so a word inside a comment or a string is never taken for code.

>>> [t.text for t in tokenize('a::b /* asm( */ "x;y" // z\\n(1)')]
['a', '::', 'b', '"x;y"', '(', '1', ')']
>>> origin('#line 1 "k.cu"\\nint a;\\nint b;\\n', 22)
('k.cu', 2)
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class SourceError(ValueError):
    """The kernel text has something the host build does not understand."""


@dataclass(frozen=True)
class Token:
    kind: str  # "ident", "number", "string", "char", "punct"
    text: str
    start: int
    end: int


_IDENT = re.compile(r"[A-Za-z_]\w*")
_NUMBER = re.compile(r"\.?\d(?:[\w.]|'\w|[eEpP][+-])*")
_RAW_PREFIX = re.compile(r'(?:u8|[uUL])?R"([^()\\\s]{0,16})\(')
_STR_PREFIX = re.compile(r'(?:u8|[uUL])?"')
_CHAR_PREFIX = re.compile(r"(?:u8|[uUL])?'")
_PUNCT = ("<<=", ">>=", "...", "->*", "::", "->", "++", "--", "<<", ">>", "<=", ">=", "==", "!=", "&&", "||",
          "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "##", ".*")


def tokenize(text: str) -> list[Token]:
    """The tokens of ``text`` (comments dropped). An unterminated comment or literal is an error."""
    out: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise SourceError(f"unterminated comment at {_where(text, i)}")
            i = j + 2
            continue
        m = _RAW_PREFIX.match(text, i)
        if m:
            close = ")" + m.group(1) + '"'
            j = text.find(close, m.end())
            if j < 0:
                raise SourceError(f"unterminated raw string at {_where(text, i)}")
            out.append(Token("string", text[i:j + len(close)], i, j + len(close)))
            i = j + len(close)
            continue
        m = _STR_PREFIX.match(text, i) or _CHAR_PREFIX.match(text, i)
        if m:
            quote = text[m.end() - 1]
            j = m.end()
            while j < n and text[j] != quote:
                if text[j] == "\\":
                    j += 1
                elif text[j] == "\n":
                    raise SourceError(f"unterminated literal at {_where(text, i)}")
                j += 1
            if j >= n:
                raise SourceError(f"unterminated literal at {_where(text, i)}")
            out.append(Token("string" if quote == '"' else "char", text[i:j + 1], i, j + 1))
            i = j + 1
            continue
        m = _IDENT.match(text, i)
        if m:
            out.append(Token("ident", m.group(), i, m.end()))
            i = m.end()
            continue
        m = _NUMBER.match(text, i)
        if m:
            out.append(Token("number", m.group(), i, m.end()))
            i = m.end()
            continue
        for p in _PUNCT:
            if text.startswith(p, i):
                out.append(Token("punct", p, i, i + len(p)))
                i += len(p)
                break
        else:
            out.append(Token("punct", c, i, i + 1))
            i += 1
    return out


_LINE = re.compile(r'^\s*#\s*line\s+(\d+)(?:\s+"([^"]*)")?')


def origin(text: str, pos: int) -> tuple[str, int]:
    """``(file, line)`` of offset ``pos``, following ``#line`` directives (the
    registry's ``source_text`` expands includes with them)."""
    file, line = "<source>", 1
    for physical in text[:pos].split("\n")[:-1]:
        m = _LINE.match(physical)
        if m:
            line = int(m.group(1))
            file = m.group(2) if m.group(2) is not None else file
        else:
            line += 1
    return file, line


def _where(text: str, pos: int) -> str:
    f, line = origin(text, pos)
    return f"{f}:{line}"


def where(text: str, pos: int) -> str:
    """``"file:line"`` of offset ``pos``."""
    return _where(text, pos)


def matching(tokens: list[Token], k: int) -> int:
    """Index of the token closing the bracket at ``tokens[k]``."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    opening = tokens[k].text
    closing = pairs[opening]
    depth = 0
    for j in range(k, len(tokens)):
        t = tokens[j].text
        if tokens[j].kind != "punct":
            continue
        if t in pairs:
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                if t != closing:
                    raise SourceError(f"mismatched {opening!r} at token {k}")
                return j
    raise SourceError(f"unbalanced {opening!r}")


def split_top(tokens: list[Token], sep: str) -> list[list[Token]]:
    """``tokens`` split at ``sep`` punctuators outside brackets."""
    parts: list[list[Token]] = [[]]
    depth = 0
    for t in tokens:
        if t.kind == "punct" and t.text in ("(", "[", "{"):
            depth += 1
        elif t.kind == "punct" and t.text in (")", "]", "}"):
            depth -= 1
        if depth == 0 and t.kind == "punct" and t.text == sep:
            parts.append([])
        else:
            parts[-1].append(t)
    return parts


@dataclass(frozen=True)
class GlobalDecl:
    """One ``__global__`` function declaration: its name and launch-bounds expression."""

    name: str
    launch_bounds: str | None  # the first argument's text, None without __launch_bounds__
    where: str


def global_functions(text: str) -> list[GlobalDecl]:
    """Every ``__global__`` declaration of ``text``, with its ``__launch_bounds__``.

    >>> global_functions('template <int N> __global__ void __launch_bounds__(256, 2) k(int* p) {}')
    [GlobalDecl(name='k', launch_bounds='256', where='<source>:1')]
    """
    toks = tokenize(text)
    out = []
    for k, t in enumerate(toks):
        if t.kind != "ident" or t.text != "__global__":
            continue
        bounds = None
        j = k + 1
        while j < len(toks):
            u = toks[j]
            if u.kind == "ident" and u.text == "__launch_bounds__":
                if j + 1 >= len(toks) or toks[j + 1].text != "(":
                    raise SourceError(f"__launch_bounds__ without arguments at {where(text, u.start)}")
                close = matching(toks, j + 1)
                args = split_top(toks[j + 2:close], ",")
                if not args or not args[0]:
                    raise SourceError(f"empty __launch_bounds__ at {where(text, u.start)}")
                bounds = text[args[0][0].start:args[0][-1].end]
                j = close + 1
                continue
            if u.kind == "ident" and j + 1 < len(toks) and toks[j + 1].text == "(":
                out.append(GlobalDecl(u.text, bounds, where(text, t.start)))
                break
            if u.kind == "punct" and u.text in (";", "{", "}"):
                raise SourceError(f"cannot find the name of the __global__ function at {where(text, t.start)}")
            j += 1
    return out


def replace_spans(text: str, edits: list[tuple[int, int, str]]) -> str:
    """``text`` with each ``(start, end, new)`` span replaced; the new text gets
    as many line breaks as the old had, so later line numbers stay right."""
    out = []
    at = 0
    for start, end, new in sorted(edits):
        if start < at:
            raise SourceError("overlapping source edits")
        old = text[start:end]
        breaks = "".join(" \\\n" if old[i - 1:i] == "\\" else "\n" for i, ch in enumerate(old) if ch == "\n")
        out.append(text[at:start])
        out.append(new + breaks)
        at = end
    out.append(text[at:])
    return "".join(out)


def dynamic_shared_edits(text: str) -> list[tuple[int, int, str]]:
    """``extern __shared__ T name[];`` declarations rewritten to pointers into
    the runtime's dynamic shared memory (16-byte aligned, 227 KiB: the largest opt-in)."""
    toks = tokenize(text)
    edits = []
    for k, t in enumerate(toks):
        if not (t.kind == "ident" and t.text == "extern" and k + 1 < len(toks) and toks[k + 1].text == "__shared__"):
            continue
        j = k + 2
        while j < len(toks) and toks[j].text != ";":
            j += 1
        body = toks[k + 2:j]
        # Expected: type tokens, name, "[", "]".
        if j >= len(toks) or len(body) < 4 or body[-3].kind != "ident" or body[-2].text != "[" \
                or body[-1].text != "]":
            raise SourceError(f"unsupported extern __shared__ declaration at {where(text, t.start)}")
        name = body[-3].text
        type_toks = []
        i = 0
        while i < len(body) - 3:
            b = body[i]
            if b.kind == "ident" and b.text == "__align__":
                close = matching(body, i + 1)
                align = "".join(x.text for x in body[i + 2:close])
                if not align.isdigit() or int(align) > 16:
                    raise SourceError(f"extern __shared__ alignment {align!r} above 16 at {where(text, b.start)}")
                i = close + 1
                continue
            type_toks.append(b)
            i += 1
        if not type_toks:
            raise SourceError(f"extern __shared__ without a type at {where(text, t.start)}")
        ctype = text[type_toks[0].start:type_toks[-1].end]
        new = f"{ctype}* const {name} = reinterpret_cast<{ctype}*>(::cudasim::g_dynamic_smem);"
        edits.append((t.start, toks[j].end, new))
    return edits


#: Words before a ``(`` that do not name the function being declared.
_NOT_A_NAME = frozenset({"__launch_bounds__", "__align__", "alignas", "decltype", "sizeof", "noexcept",
                         "__attribute__", "operator", "static_assert"})


def _top_items(toks: list[Token]) -> list[tuple[str | None, list[Token]]]:
    """``(name, tokens)`` of each namespace-scope declaration of ``toks``: a function's name is
    the word before its parameter list, a class's the word after ``struct``/``class``; None where
    neither is found (a ``using``, a variable). ``namespace X {`` is seen through."""
    items, start, k = [], 0, 0
    while k < len(toks):
        t = toks[k]
        if t.kind == "ident" and t.text == "namespace" and k + 2 < len(toks) and toks[k + 2].text == "{":
            k += 3
            start = k
            continue
        if t.kind == "punct" and t.text == "}" and k == start:  # a namespace's end
            k += 1
            start = k
            continue
        if t.kind == "punct" and t.text in ("{", ";"):
            end = matching(toks, k) if t.text == "{" else k
            if end + 1 < len(toks) and toks[end + 1].text == ";":
                end += 1
            items.append((_item_name(toks[start:k]), toks[start:end + 1]))
            k = start = end + 1
            continue
        if t.kind == "punct" and t.text in ("(", "["):
            k = matching(toks, k)
        k += 1
    return items


def _item_name(head: list[Token]) -> str | None:
    for j, t in enumerate(head):
        if t.kind == "ident" and t.text in ("struct", "class") and j + 1 < len(head):
            return head[j + 1].text
    for j, t in enumerate(head[:-1]):
        if t.kind == "ident" and head[j + 1].text == "(" and t.text not in _NOT_A_NAME:
            return t.text
    return None


def arch_dependent(text: str) -> set[str]:
    """The names of the namespace-scope functions and classes of ``text`` whose code can differ
    between GPU architectures: each whose declaration holds (or is preceded by, as the first
    line of an ``#if`` region) an architecture macro (``__CUDA_ARCH__``,
    ``__CUDA_ARCH_FEAT_SM90_ALL``, ...), and each that names one of those, and so on. By the
    words a declaration holds: an over-estimate (a name used for anything marks the user).

    >>> src = '''__device__ int soft(int x) { return x; }
    ... #if __CUDA_ARCH__ >= 890
    ... __device__ int hw(int x) { return x + 1; }
    ... #endif
    ... struct Op { __device__ int operator()(int x) const { return hw(x); } };
    ... template <int N> __global__ void k1(int* p) { p[0] = Op{}(N); }
    ... template <int N> __global__ void k2(int* p) { p[0] = soft(N); }'''
    >>> sorted(arch_dependent(src))
    ['Op', 'hw', 'k1']
    """
    items = _top_items(tokenize(text))
    marked = {name for name, toks in items
              if name and any(t.kind == "ident" and t.text.startswith("__CUDA_ARCH") for t in toks)}
    words = [(name, {t.text for t in toks if t.kind == "ident"}) for name, toks in items if name]
    grew = True
    while grew:
        grew = False
        for name, used in words:
            if name not in marked and used & marked:
                marked.add(name)
                grew = True
    return marked
