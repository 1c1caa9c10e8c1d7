"""Per-iteration counts of the backward's innermost loops (SASS and PTX), by kind.
usage: python bwd_count.py STEM [STEM...]  (STEM.sass, STEM.ptx)"""
import re, sys
from bf16_count import count  # the same per-kind count of a loop's lines

def loops(lines, label_re, branch_re):
    labels = {}
    for i, l in enumerate(lines):
        m = re.match(label_re, l.strip())
        if m: labels[m[1]] = i
    spans = []
    for i, l in enumerate(lines):
        m = re.search(branch_re, l)
        if m and m[1] in labels and labels[m[1]] < i:
            spans.append((labels[m[1]], i))
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    return sorted(inner)

def sass_loops(text):
    lines = text.splitlines()
    out = []
    for a, b in loops(lines, r'^(\.L_x_\d+):', r'BRA `\((\.L_x_\d+)\)'):
        out.append([l for l in lines[a:b + 1] if re.search(r'/\*[0-9a-f]{4}\*/', l)])
    return out

def ptx_loops(text):
    lines = text.splitlines()
    out = []
    for a, b in loops(lines, r'^(\$L__BB\d+_\d+):', r'bra(?:\.uni)?\s+(\$L__BB\d+_\d+)'):
        out.append([l.strip() for l in lines[a:b + 1] if l.strip() and not re.match(r'(\.|//|\$|\{|\})', l.strip())])
    return out

SASS_CATS = [
    ("NOP / @!PT LDS RZ padding", r"\bNOP\b|LDS RZ, \[RZ\]"),
    ("LDGSTS (cp.async)", r"\bLDGSTS"), ("LDGDEPBAR/DEPBAR", r'\bLDGDEPBAR|\bDEPBAR'), ("LDG (global load)", r"\bLDG\b|\bLDG\."),
    ("STG (global store)", r'\bSTG'), ("STS (shared store)", r'\bSTS'), ("LDS/LDSM (shared load)", r'\bLDS'),
    ("BAR.SYNC", r'\bBAR\b'), ("SHFL", r'\bSHFL'), ("MUFU", r'\bMUFU'), ("FFMA", r'\bFFMA\b'), ("FMUL", r'\bFMUL\b'),
    ("FADD", r'\bFADD\b'), ("FSETP/FMNMX", r'\bFSETP|\bFMNMX'), ("F2F/F2FP (cvt)", r'\bF2F'), ("PRMT", r'\bPRMT'),
    ("STL/LDL (spill)", r'\bSTL|\bLDL'),
    ("int 64-bit (IADD3.X/IMAD.WIDE/LEA.HI.X/IMAD.X)", r'\.X\b|IMAD\.WIDE|LEA\.HI'),
    ("SHF/SHL/LOP3 (int bit ops)", r'\bSHF|\bLOP3|\bSHL\b|\bIMAD\.SHL'),
    ("MOV/IMAD.MOV", r'\bMOV\b|IMAD\.MOV'), ("SEL/FSEL", r'\bF?SEL\b'), ("ISETP", r'\bISETP'),
    ("IADD3/IMAD/LEA (int 32)", r'\bIADD3|\bIMAD|\bLEA'),
    ("S2R/S2UR/CS2R/R2UR", r'\bS2R|\bS2UR|\bCS2R|\bR2UR'), ("UNIFORM (U*)", r'^\s*U[A-Z]'), ("BRA/other", r'.'),
]
PTX_CATS = [
    ("ld.global", r'^(@\S+\s+)?ld\.global'), ("cp.async", r'cp\.async\.(ca|cg)'), ("cp.async.wait/commit", r'cp\.async\.(wait|commit)'),
    ("st.global", r'^(@\S+\s+)?st\.global'), ("st.shared", r'^(@\S+\s+)?st\.shared'), ("ld.shared", r'^(@\S+\s+)?ld\.shared'),
    ("bar.sync", r'bar\.sync'), ("shfl", r'shfl'), ("rcp.approx", r'rcp\.approx'), ("fma.f32", r'^fma\.rn\.f32'),
    ("mul.f32", r'^mul\.(rn\.)?f32'), ("add/sub.f32", r'^(add|sub)\.(rn\.)?f32'), ("neg.f32", r'^neg\.f32'), ("cvt", r'^cvt'),
    ("64-bit int (.s64/.u64/.b64)", r'^\S+\.(s64|u64|b64)\b|^mul\.wide'),
    ("32-bit int arith", r'^(add|sub|mul|mad|shl|shr|and|or|xor)\.(s32|u32|b32|lo\.s32)'),
    ("mov", r'^mov'), ("selp", r'^selp'), ("setp", r'^setp'), ("other", r'.'),
]

if __name__ == "__main__":
    ONLY_MAIN = sys.argv[1] == "--main"
    names = sys.argv[2:] if ONLY_MAIN else sys.argv[1:]
    cols = []
    for n in names:
        s = sass_loops(open(n + ".sass").read()); p = ptx_loops(open(n + ".ptx").read())
        # the two largest innermost loops in code order: recompute (first), reverse walk (second)
        s2 = [x for x in s if len(x) > 20]; p2 = [x for x in p if len(x) > 20]
        kinds = ("recompute", "recompute rem", "reverse", "reverse rem") if len(s2) == 4 else [f"loop{i}" for i in range(len(s2))]
        if ONLY_MAIN and len(s2) == 4:
            s2, p2, kinds = [s2[0], s2[2]], [p2[0], p2[2]], ("recompute", "reverse")
        for which, sl, pl in zip(kinds, s2, p2):
            cols.append((f"{n.split('/')[-1]} {which}", len(sl), count(sl, SASS_CATS), len(pl), count(pl, PTX_CATS)))
        print(f"{n}: sass innermost loop sizes {[len(x) for x in s]}, ptx {[len(x) for x in p]}", file=sys.stderr)
    print("| per loop iteration (main loops: 2 steps; rem: 1) | " + " | ".join(c[0] for c in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    print("| SASS instructions | " + " | ".join(str(c[1]) for c in cols) + " |")
    for name, _ in SASS_CATS:
        print(f"| SASS {name} | " + " | ".join(str(c[2][name]) for c in cols) + " |")
    print("| PTX instructions | " + " | ".join(str(c[3]) for c in cols) + " |")
    for name, _ in PTX_CATS:
        print(f"| PTX {name} | " + " | ".join(str(c[4][name]) for c in cols) + " |")
