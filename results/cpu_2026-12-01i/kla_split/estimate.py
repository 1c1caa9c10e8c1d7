"""The per-step instruction model of ../../cpu_2026-12-01h/kla_bwd/README.md applied to the split kernels at B2 L16384
M1024 S16 (32 segments of 512 steps). A model, not a measurement.

The model: the KLA backward walk at B16 L2048 M1024 (1,024 one-warp programs x 2,048 steps) costs 0.00334 ms per SASS
instruction per step, i.e. 0.00334 ms / (1,024 x 2,048) per warp-instruction issued GPU-wide (a throughput of ~628 G
warp-instructions/s). A kernel running P programs of T steps then costs that times P x T per instruction per step.
The carry kernels are latency-bound (64 and 128 programs walking 31 segments in order); for them the table's one-warp
cycles per segment (loop_counts.py, global loads taken as 500 cycles) are used instead, at 1.98 GHz.

usage: python results/cpu_2026-12-01i/kla_split/estimate.py
"""

MS_PER_WARP_INSTRUCTION = 0.00334 / (1024 * 2048)
B, L, M, N_SEG, SEG_STEPS, LAYERS = 2, 16384, 1024, 32, 512, 6  # kla_45m: 6 KLA layers, T = 16384, 32,768 tokens/step
GHZ = 1.98
# kernel -> (programs, steps per program, {row: (HEAD SASS/step, patched SASS/step)}), from loop_counts.md
SUMMARIES = {
    "fwd summary": (B * (M // 32) * (N_SEG - 1), SEG_STEPS, {"bf16": (474.25, 449.5), "fp32": (451.5, 421.5)}),
    "bwd summary": (B * (M // 16) * (N_SEG - 1), SEG_STEPS, {"bf16": (314, 265), "fp32": (285, 246)}),
}
CARRIES = {"fwd carry": (2821, 714), "bwd carry": (1642, 220)}  # one-warp cycles per segment, HEAD and patched


def main() -> None:
    total = {"bf16": 0.0, "fp32": 0.0}
    print("| kernel | programs x steps | ms per instruction/step | row | SASS/step HEAD -> patch | model ms per call |")
    print("|---|---:|---:|---|---|---:|")
    for name, (programs, steps, rows) in SUMMARIES.items():
        per = MS_PER_WARP_INSTRUCTION * programs * steps
        for row, (head, patch) in rows.items():
            delta = per * (patch - head)
            total[row] += delta
            print(f"| {name} | {programs} x {steps} | {per:.5f} | {row} | {head:g} -> {patch:g} | {delta:+.3f} |")
    carry = 0.0
    for name, (head, patch) in CARRIES.items():
        delta = (patch - head) * (N_SEG - 1) / GHZ / 1e6
        carry += delta
        print(f"| {name} | latency | | both | {head} -> {patch} cycles/segment | {delta:+.3f} |")
    for row, ms in total.items():
        print(f"summaries, {row}: {ms:+.3f} ms per f+b call; x {LAYERS} layers: {LAYERS * ms:+.2f} ms per step")
    print(f"carries: {carry:+.3f} ms per f+b call; x {LAYERS} layers: {LAYERS * carry:+.2f} ms per step")


if __name__ == "__main__":
    main()
