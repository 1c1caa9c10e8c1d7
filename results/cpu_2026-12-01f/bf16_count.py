"""Per-iteration counts of the unrolled main time loop (the largest backward-branch loop) in SASS and PTX."""
import re, sys
from collections import Counter

def pick(spans):
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    return max(inner, key=lambda s: s[1] - s[0])

def sass_loop(text):
    lines = text.splitlines()
    labels = {l.strip().rstrip(':'): i for i, l in enumerate(lines) if re.match(r'^\.L_x_\d+:', l.strip())}
    spans = []
    for i, l in enumerate(lines):
        m = re.search(r'BRA `\((\.L_x_\d+)\)', l)
        if m and m[1] in labels and labels[m[1]] < i:
            span = (labels[m[1]], i)
            spans.append(span)
    best = pick(spans)
    body = [l for l in lines[best[0]:best[1] + 1] if re.search(r'/\*[0-9a-f]{4}\*/', l)]
    return body

def ptx_loop(text):
    lines = text.splitlines()
    labels = {l.strip().split(':')[0]: i for i, l in enumerate(lines) if re.match(r'^\$L__BB\d+_\d+:', l.strip())}
    spans = []
    for i, l in enumerate(lines):
        m = re.search(r'bra(?:\.uni)?\s+(\$L__BB\d+_\d+)', l)
        if m and m[1] in labels and labels[m[1]] < i:
            span = (labels[m[1]], i)
            spans.append(span)
    best = pick(spans)
    return [l.strip() for l in lines[best[0]:best[1] + 1] if l.strip() and not re.match(r'(\.|//|\$|\{|\}|@?\$)', l.strip())]

SASS_CATS = [
    ("NOP / @!PT LDS RZ padding", r"\bNOP|LDS RZ, \[RZ\]"),
    ("LDGSTS (cp.async)", r"\bLDGSTS"), ("LDGDEPBAR/DEPBAR", r'\bLDGDEPBAR|\bDEPBAR'), ("LDG (global load)", r"\bLDG\b|\bLDG\."),
    ("STG (global store)", r'\bSTG'), ("STS (shared store)", r'\bSTS'), ("LDS/LDSM (shared load)", r'\bLDS'),
    ("BAR.SYNC", r'\bBAR\b'), ("SHFL", r'\bSHFL'), ("MUFU", r'\bMUFU'), ("FFMA", r'\bFFMA\b'), ("FMUL", r'\bFMUL\b'),
    ("FADD", r'\bFADD\b'), ("F2F/F2FP (cvt)", r'\bF2F'), ("PRMT", r'\bPRMT'), ("SHF/SHL/LOP3 (int bit ops)", r'\bSHF|\bLOP3|\bSHL\b|\bIMAD\.SHL|\bIMAD\.U32'),
    ("MOV", r'\bMOV\b'), ("SEL/FSEL", r'\bF?SEL\b'), ("ISETP", r'\bISETP'), ("IADD3/IMAD/LEA (int)", r'\bIADD3|\bIMAD(?!\.SHL|\.U32)|\bLEA'),
    ("STL/LDL (spill)", r'\bSTL|\bLDL'),
]
PTX_CATS = [
    ("ld.global", r'^(@\S+\s+)?ld\.global'), ("cp.async", r'cp\.async\.(ca|cg)'), ("cp.async.wait/commit", r'cp\.async\.(wait|commit)'),
    ("st.global", r'^(@\S+\s+)?st\.global'), ("st.shared", r'^(@\S+\s+)?st\.shared'), ("ld.shared", r'^(@\S+\s+)?ld\.shared'),
    ("bar.sync", r'bar\.sync'), ("shfl", r'shfl'), ("rcp.approx", r'rcp\.approx'), ("fma.f32", r'^fma\.rn\.f32'),
    ("mul.f32", r'^mul\.(rn\.)?f32'), ("add.f32", r'^add\.(rn\.)?f32'), ("cvt", r'^cvt'), ("prmt", r'^prmt'),
    ("shl/and/shr (b32)", r'^(shl|and|shr|or)\.b32'), ("mov", r'^mov'), ("selp", r'^selp'),
]

def count(lines, cats):
    c = Counter()
    for l in lines:
        op = re.sub(r'/\*[0-9a-f]+\*/', '', l).strip()
        op = re.sub(r'^@!?U?P\w+\s+', '', op)
        for name, pat in cats:
            if re.search(pat, op):
                c[name] += 1
                break
    return c

if __name__ == "__main__":
    names = sys.argv[1:]
    res = {}
    for n in names:
        s = sass_loop(open(n + ".sass").read()); p = ptx_loop(open(n + ".ptx").read())
        res[n] = (len(s), count(s, SASS_CATS), len(p), count(p, PTX_CATS))
    print("| per unrolled iteration (4 steps) | " + " | ".join(n.split('/')[-1] for n in names) + " |")
    print("|---|" + "---:|" * len(names))
    print("| SASS instructions | " + " | ".join(str(res[n][0]) for n in names) + " |")
    for name, _ in SASS_CATS:
        print(f"| SASS {name} | " + " | ".join(str(res[n][1][name]) for n in names) + " |")
    print("| PTX instructions | " + " | ".join(str(res[n][2]) for n in names) + " |")
    for name, _ in PTX_CATS:
        print(f"| PTX {name} | " + " | ".join(str(res[n][3][name]) for n in names) + " |")
