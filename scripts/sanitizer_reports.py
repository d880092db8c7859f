"""Attributes compute-sanitizer's reports to kernels: ours (a name in namespace customops, which
every kernel of this library has, CUTLASS's included through the epilogue's types) or someone
else's (cuBLAS's nvjet kernels, ATen's). Our generic path calls cuBLAS and ATen, whose reports
(racecheck hazards in cuBLAS's split-K GEMMs, initcheck reads of outputs written by TMA stores,
which initcheck does not see) are not ours to fix and are listed apart.

    python scripts/sanitizer_reports.py LOG     (one tool's output; exit 1 if a report is ours)
"""
import collections
import re
import sys

# The first line of each report: memcheck/initcheck "=== <kind>" then "===     at <kernel>";
# racecheck "=== Error: Race reported between <access> at <kernel>+0x...".
AT = re.compile(r"^=+\s+(?:at (.+)|Error: Race reported between .* at (.+?)\+0x[0-9a-f]+)$")


def kernel_of(line):
    m = AT.match(line.rstrip("\n"))
    if not m:
        return None
    name = (m.group(1) or m.group(2)).strip()
    return re.sub(r"\+0x[0-9a-f]+$", "", name)


def main(path):
    counts = collections.Counter()
    ours = collections.Counter()
    previous_was_header = False
    for line in open(path, errors="replace"):
        line = line[line.find("====="):] if "=====" in line else line  # pytest's dots may precede a report
        name = kernel_of(line)
        # memcheck/initcheck: the kernel is on the line after the report's header; racecheck: on it.
        if name is not None and ("Race reported" in line or previous_was_header):
            short = name[:120]
            (ours if "customops" in name else counts)[short] += 1
        previous_was_header = bool(re.match(r"^=+ (Invalid|Uninitialized|Program hit|Misaligned|Out-of-range)", line))
    for title, c in (("reports in our kernels", ours), ("reports in other libraries' kernels", counts)):
        print(f"{title}: {sum(c.values())}")
        for name, n in c.most_common(10):
            print(f"  {n:5d}  {name}")
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
