"""Registers and SASS instruction counts (whole kernel; unrolled main time loop) per case and tree, and which trees'
SASS is identical, from compile_fwd(_gated).py's OUTDIR/TAG_CASE.{sass,hex.sass,cubin} files.

usage: .venv-triton36/bin/python results/cpu_2026-12-01i/kla_fwd/sass_table.py OUTDIR TAG,... CASE,...

Identity is judged as `diff <(grep -v '^\\s*//' a.sass) <(grep -v '^\\s*//' b.sass)` would (comment lines dropped);
a missing file is shown as "-". Loop counts: results/cpu_2026-12-01g/ss/loop_table.py's main loops.
"""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "cpu_2026-12-01g" / "ss"))
from loop_table import main_loops, registers  # noqa: E402


def code(stem: Path) -> list[str]:
    return [line for line in stem.with_suffix(".sass").read_text().splitlines() if not re.match(r"^\s*//", line)]


def instructions(lines: list[str]) -> int:
    return sum(bool(re.search(r"/\*[0-9a-f]{4}\*/", line)) for line in lines)


def main() -> None:
    out, tags, cases = Path(sys.argv[1]), sys.argv[2].split(","), sys.argv[3].split(",")
    print("| case | " + " | ".join(f"{t}: registers / SASS / loop SASS" for t in tags) + " | identical SASS |")
    print("|---|" + "---:|" * len(tags) + "---|")
    for case in cases:
        cells, texts = [], {}
        for tag in tags:
            stem = out / f"{tag}_{case}"
            if not stem.with_suffix(".sass").exists():
                cells.append("-")
                continue
            texts[tag] = code(stem)
            loop = "+".join(str(len(body)) for _, body in main_loops(str(stem)))
            cells.append(f"{registers(str(stem))} / {instructions(texts[tag])} / {loop}")
        groups = []
        for tag, text in texts.items():
            for group in groups:
                if texts[group[0]] == text:
                    group.append(tag)
                    break
            else:
                groups.append([tag])
        same = "; ".join(" = ".join(g) for g in groups if len(g) > 1) or "none"
        print(f"| {case} | " + " | ".join(cells) + f" | {same} |")


if __name__ == "__main__":
    main()
