"""Inline PTX for the host build: each ``asm`` statement becomes a call of a host helper.

Every ``asm("op %0, %1, ...;" : "=c"(out) : "c"(in), ...)`` of a kernel source
is rewritten, before g++ sees the text, into a call of the function of
``shim/cudasim_ptx.h`` that implements that one PTX instruction with the PTX
ISA's semantics. Only the forms listed in :data:`FORMS` are known; any other
asm (another instruction, several instructions, symbolic operands, clobbers,
an operand whose constraint does not fit the instruction) raises
:class:`PtxError` naming the file and line: the build fails loudly, it never
falls back to anything.

What each form does with NaN, signed zeros and out-of-range values (checked
against the PTX ISA text and the CUDA Programming Guide; the helpers' header
cites the passages):

==================  ===============================================================
form                special values
==================  ===============================================================
div/mul/sub.rn.f32  IEEE, round to nearest even, subnormals kept; a NaN result is
                    0x7fffffff (CUDA Programming Guide 20.3: single-precision NaN)
fma.rn.f32          a * b + c rounded once (IEEE fusedMultiplyAdd), subnormals kept;
                    a NaN result is 0x7fffffff
min.f32, max.f32    the non-NaN operand if one is NaN, 0x7fffffff if both;
                    -0.0 < +0.0 (min(-0, +0) = -0, max = +0)
cvt.rni.s32.f32     nearest even, saturating; NaN -> 0
cvt.rni.s32.f64     nearest even, saturating; NaN -> INT32_MIN
cvt.rni.sat.s8.f32  nearest even, saturating to [-128, 127]; NaN -> 0; the 32-bit
                    register holds the code sign-extended
cvt.rni.sat.u8.f32  nearest even, saturating to [0, 255]; NaN -> 0; zero-extended
cvt.rni.s64.f32     nearest even, saturating; NaN -> INT64_MIN
cvt.rni.s64.f64     nearest even, saturating; NaN -> INT64_MIN
cvt.rn.satfinite.   (sm_89+) d, a, b: a's code in the high byte, b's in the low; each
 e4m3x2/e5m2x2.f32  nearest even, |x| > MAX_NORM (Inf included) -> +-MAX_NORM,
                    zeros keep their sign; NaN -> 0x7f with its sign
cvt.rn.f16x2.e4m3x2 (sm_89+) d, a: a's low byte widened exactly into d's low half, its
                    high byte into the high half; NaN -> 0x7fff
cvt.rn.f32.s64      one rounding, nearest even
cvt.rn.f64.s64      one rounding, nearest even
cvt.rn.f32.f64      nearest even, subnormals kept, overflow to Inf; NaN -> 0x7fffffff
cvt.f64.f32         exact; NaN keeps its payload, quiet bit set (ISA: f64 keeps payloads)
cvt.f32.f16         exact; NaN -> 0x7fffffff
cvt.rn.f16.f32      nearest even, subnormals kept, |x| >= 65520 -> Inf; NaN -> 0x7fff
==================  ===============================================================

(PTX ISA 9.7.9.21, cvt, Integer Notes: NaN converts to 0 "if source is not
.f64 and destination is not .s64, .u64", otherwise to 1 << (BitWidth(dst) - 1),
MININT for a signed destination; float-to-integer conversions clamp to the
destination range by default; "If the destination register is wider than the
destination format, the result is extended to the destination register width
after chopping. The type of extension (sign or zero) is based on the
destination format.")

>>> translate('asm("min.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));')
"(::cudasim::ptx::out<'f'>((r)) = ::cudasim::ptx::min_f32(::cudasim::ptx::in<'f', float>((a)), \
::cudasim::ptx::in<'f', float>((b))));"
"""

from __future__ import annotations

from dataclasses import dataclass

from .source import (
    SourceError,
    Token,
    matching,
    replace_spans,
    split_top,
    tokenize,
    where,
)


class PtxError(SourceError):
    """An inline asm statement the translator does not know."""


@dataclass(frozen=True)
class Form:
    """One PTX instruction form: its host helper, the register class of the
    destination and of each source ('f' f32, 'd' f64, 'h' 16-bit, 'r' 32-bit,
    'l' 64-bit, as in CUDA's asm constraints)."""

    helper: str
    dst: str
    srcs: tuple[str, ...]


#: The known forms: PTX instruction -> host helper (shim/cudasim_ptx.h).
FORMS: dict[str, Form] = {
    "div.rn.f32": Form("div_rn_f32", "f", ("f", "f")),
    "mul.rn.f32": Form("mul_rn_f32", "f", ("f", "f")),
    "sub.rn.f32": Form("sub_rn_f32", "f", ("f", "f")),
    "fma.rn.f32": Form("fma_rn_f32", "f", ("f", "f", "f")),
    "min.f32": Form("min_f32", "f", ("f", "f")),
    "max.f32": Form("max_f32", "f", ("f", "f")),
    "cvt.rni.s32.f32": Form("cvt_rni_s32_f32", "r", ("f",)),
    "cvt.rni.sat.s8.f32": Form("cvt_rni_sat_s8_f32", "r", ("f",)),
    "cvt.rni.sat.u8.f32": Form("cvt_rni_sat_u8_f32", "r", ("f",)),
    "cvt.rn.satfinite.e4m3x2.f32": Form("cvt_rn_satfinite_e4m3x2_f32", "h", ("f", "f")),
    "cvt.rn.satfinite.e5m2x2.f32": Form("cvt_rn_satfinite_e5m2x2_f32", "h", ("f", "f")),
    "cvt.rn.f16x2.e4m3x2": Form("cvt_rn_f16x2_e4m3x2", "r", ("h",)),
    "cvt.rni.s32.f64": Form("cvt_rni_s32_f64", "r", ("d",)),
    "cvt.rni.s64.f32": Form("cvt_rni_s64_f32", "l", ("f",)),
    "cvt.rni.s64.f64": Form("cvt_rni_s64_f64", "l", ("d",)),
    "cvt.rn.f32.s64": Form("cvt_rn_f32_s64", "f", ("l",)),
    "cvt.rn.f64.s64": Form("cvt_rn_f64_s64", "d", ("l",)),
    "cvt.rn.f32.f64": Form("cvt_rn_f32_f64", "f", ("d",)),
    "cvt.f64.f32": Form("cvt_f64_f32", "d", ("f",)),
    "cvt.f32.f16": Form("cvt_f32_f16", "f", ("h",)),
    "cvt.rn.f16.f32": Form("cvt_rn_f16_f32", "h", ("f",)),
}

#: C++ type of each register class as a helper parameter, and its raw bits.
REG_CTYPE = {"f": "float", "d": "double", "h": "uint16_t", "r": "int32_t", "l": "int64_t"}
REG_BITS = {"f": "uint32_t", "d": "uint64_t", "h": "uint16_t", "r": "uint32_t", "l": "uint64_t"}

_ASM_WORDS = {"asm", "__asm__", "__asm"}
_QUALIFIERS = {"volatile", "__volatile__", "__volatile", "inline", "__inline__"}


@dataclass(frozen=True)
class Operand:
    constraint: str
    expr: str


@dataclass(frozen=True)
class AsmStatement:
    """One ``asm(...)`` of the source: its span, instruction text and operands."""

    start: int
    end: int  # just past the closing parenthesis
    where: str
    instruction: str
    outputs: tuple[Operand, ...]
    inputs: tuple[Operand, ...]


def _unescape(literal: str, loc: str) -> str:
    if not literal.startswith('"'):
        raise PtxError(f"{loc}: asm template must be an ordinary string literal, got {literal[:12]}...")
    body = literal[1:-1]
    out = []
    i = 0
    simple = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0"}
    while i < len(body):
        c = body[i]
        if c == "\\":
            nxt = body[i + 1]
            if nxt not in simple:
                raise PtxError(f"{loc}: unsupported escape \\{nxt} in an asm template")
            out.append(simple[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _operands(text: str, toks: list[Token], loc: str) -> tuple[Operand, ...]:
    if not toks:
        return ()
    out = []
    for part in split_top(toks, ","):
        if not part:
            raise PtxError(f"{loc}: empty asm operand")
        if part[0].text == "[":
            raise PtxError(f"{loc}: symbolic asm operand names are not supported")
        if part[0].kind != "string" or len(part) < 3 or part[1].text != "(" or matching(part, 1) != len(part) - 1:
            raise PtxError(f"{loc}: cannot read asm operand {text[part[0].start:part[-1].end]!r}")
        constraint = _unescape(part[0].text, loc)
        expr = text[part[2].start:part[-2].end] if len(part) > 3 else ""
        if not expr:
            raise PtxError(f"{loc}: asm operand without an expression")
        out.append(Operand(constraint, expr))
    return tuple(out)


def find_asm(text: str) -> list[AsmStatement]:
    """Every ``asm`` statement of ``text``, parsed (not yet checked against :data:`FORMS`)."""
    toks = tokenize(text)
    found = []
    k = 0
    while k < len(toks):
        t = toks[k]
        if not (t.kind == "ident" and t.text in _ASM_WORDS):
            k += 1
            continue
        loc = where(text, t.start)
        j = k + 1
        while j < len(toks) and toks[j].kind == "ident" and toks[j].text in _QUALIFIERS:
            j += 1
        if j < len(toks) and toks[j].kind == "ident" and toks[j].text == "goto":
            raise PtxError(f"{loc}: asm goto is not supported")
        if j >= len(toks) or toks[j].text != "(":
            raise PtxError(f"{loc}: cannot read the asm statement")
        close = matching(toks, j)
        sections = split_top(toks[j + 1:close], ":")
        if len(sections) > 4:
            raise PtxError(f"{loc}: asm with goto labels is not supported")
        while len(sections) < 4:
            sections.append([])
        template_toks, out_toks, in_toks, clobber_toks = sections
        if not template_toks or any(x.kind != "string" for x in template_toks):
            raise PtxError(f"{loc}: the asm template must be string literals")
        if clobber_toks:
            raise PtxError(f"{loc}: asm clobbers are not supported: {text[clobber_toks[0].start:clobber_toks[-1].end]}")
        instruction = "".join(_unescape(x.text, loc) for x in template_toks)
        found.append(AsmStatement(t.start, toks[close].end, loc, instruction,
                                  _operands(text, out_toks, loc), _operands(text, in_toks, loc)))
        k = close + 1
    return found


def _parse_instruction(stmt: AsmStatement) -> tuple[str, list[int]]:
    body = stmt.instruction.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    parts = [p.strip() for p in body.split(";")]
    parts = [p for p in parts if p]
    if len(parts) != 1:
        raise PtxError(f"{stmt.where}: asm must hold exactly one instruction, got {stmt.instruction!r}")
    words = parts[0].split(None, 1)
    opcode = words[0]
    if opcode not in FORMS:
        raise PtxError(f"{stmt.where}: unknown PTX instruction {opcode!r} in asm {stmt.instruction!r} "
                       f"(known: {', '.join(sorted(FORMS))})")
    refs = []
    for op in (words[1].split(",") if len(words) > 1 else []):
        op = op.strip()
        if not (op.startswith("%") and op[1:].isdigit()):
            raise PtxError(f"{stmt.where}: operand {op!r} of {opcode} is not a %N reference")
        refs.append(int(op[1:]))
    return opcode, refs


def translate_statement(stmt: AsmStatement) -> str:
    """The C++ expression replacing one asm statement (checked against :data:`FORMS`)."""
    opcode, refs = _parse_instruction(stmt)
    form = FORMS[opcode]
    if len(refs) != 1 + len(form.srcs):
        raise PtxError(f"{stmt.where}: {opcode} takes {1 + len(form.srcs)} operands, got {len(refs)}")
    if len(stmt.outputs) != 1:
        raise PtxError(f"{stmt.where}: {opcode} needs exactly one output operand, got {len(stmt.outputs)}")
    operands = stmt.outputs + stmt.inputs
    if sorted(refs) != list(range(len(operands))):
        raise PtxError(f"{stmt.where}: the operands of {opcode} must use each of %0..%{len(operands) - 1} once")
    if refs[0] != 0:
        raise PtxError(f"{stmt.where}: the destination of {opcode} must be the output operand %0")
    out = stmt.outputs[0]
    if out.constraint != "=" + form.dst:
        raise PtxError(f"{stmt.where}: the destination of {opcode} needs constraint '={form.dst}', "
                       f"got {out.constraint!r}")
    args = []
    for ref, cls in zip(refs[1:], form.srcs):
        op = operands[ref]
        if op.constraint != cls:
            raise PtxError(f"{stmt.where}: source %{ref} of {opcode} needs constraint '{cls}', got {op.constraint!r}")
        args.append(f"::cudasim::ptx::in<'{cls}', {REG_CTYPE[cls]}>(({op.expr}))")
    return (f"(::cudasim::ptx::out<'{form.dst}'>(({out.expr})) = "
            f"::cudasim::ptx::{form.helper}({', '.join(args)}))")


def translate(text: str) -> str:
    """``text`` with every asm statement replaced by its helper call (line breaks kept)."""
    edits = [(s.start, s.end, translate_statement(s)) for s in find_asm(text)]
    return replace_spans(text, edits)


def helper_exports() -> str:
    """C++ of a test library exporting every helper as ``cudasim_ptx_<helper>``
    over raw bits (so no NaN payload is touched on the way through ctypes),
    each call under the launch's floating-point environment."""
    lines = ['#include "cudasim_dialect.h"', '#include "cudasim_runtime.h"', ""]
    for form in FORMS.values():
        params = ", ".join(f"{REG_BITS[c]} a{i}" for i, c in enumerate(form.srcs))
        args = []
        for i, c in enumerate(form.srcs):
            args.append(f"cast<{REG_CTYPE[c]}>(a{i})")
        lines.append(f'extern "C" __attribute__((visibility("default"))) {REG_BITS[form.dst]} '
                     f"cudasim_ptx_{form.helper}({params}) {{")
        lines.append("    ::cudasim::FpEnvGuard env;")
        lines.append(f"    return cast<{REG_BITS[form.dst]}>(::cudasim::ptx::{form.helper}({', '.join(args)}));")
        lines.append("}")
    prologue = ["template <class T, class U> static T cast(U u) {",
                "    static_assert(sizeof(T) == sizeof(U));",
                "    T t;",
                "    std::memcpy(&t, &u, sizeof t);",
                "    return t;",
                "}", ""]
    return "\n".join(lines[:3] + prologue + lines[3:]) + "\n"
