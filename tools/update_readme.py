"""Regenerate the README's generated blocks from their sources (``make readme``).

- ``ladder``: the kernel table, from the registry (``tilegemm kernels --markdown``).
- ``results``: the ladder tables of the results files named in RESULTS below, rendered by
  the benchmark's own Markdown report.

tests/test_readme.py fails when the README is out of date, so the README cannot drift from
the registry.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# Committed results whose ladder tables the README shows (Markdown written by `tilegemm bench`).
RESULTS = ["benchmarks/results/nvidia-h200-2026-11-27.md",
           "benchmarks/results/nvidia-h100-80gb-hbm3-2026-11-23.md",
           "benchmarks/results/cpu-opencl-amd-epyc-m26-2-2026-11-25.md"]


def ladder_block() -> str:
    import tilegemm
    from tilegemm.commands.kernels import markdown_table

    return markdown_table(tilegemm.kernels())


def results_block() -> str:
    """The ladder sections of each committed results file, with its provenance line."""
    parts = []
    for name in RESULTS:
        text = (ROOT / name).read_text()
        provenance = next(line for line in text.splitlines() if line.startswith("- tilegemm"))
        sections = re.findall(r"(### Ladder.*?)(?=\n### |\Z)", text, re.S)
        parts.append(f"From [{name}]({name}) ({provenance[2:]}):\n")
        parts.extend(s.strip().replace("### ", "#### ") + "\n" for s in sections)
    return "\n".join(parts)


def replace_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md has no <!-- {name}:begin/end --> markers")
    return pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)


def render(text: str) -> str:
    text = replace_block(text, "ladder", ladder_block())
    return replace_block(text, "results", results_block())


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing: exit 1 if README.md is out of date")
    args = parser.parse_args(argv)
    text = README.read_text()
    new = render(text)
    if new == text:
        print("README.md is up to date")
        return 0
    if args.check:
        print("README.md is out of date: run make readme")
        return 1
    README.write_text(new)
    print("README.md updated")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
