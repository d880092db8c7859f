"""Attributes one compute-sanitizer tool's reports to kernels, and decides whether the run is
clean for our kernels (scripts/sanitize.sh's verdict):

- memcheck and racecheck name the kernel that made the bad access or the race. A report in a
  kernel of namespace customops (every kernel of this library; the CUTLASS kernels through the
  epilogue's types) fails; reports in cuBLAS's or ATen's kernels, which the generic path calls,
  are listed apart and do not.
- initcheck names the kernel that read uninitialized memory, not the one that should have
  written it: a kernel of ours that leaves an output unwritten shows up in whatever reads it
  next. So every initcheck report fails.
- A report with no kernel (a CUDA API error, a hardware exception), or more reports in the
  tool's summary than it printed (its --print-limit), cannot be attributed: it fails.

    python scripts/sanitizer_reports.py --tool memcheck|racecheck|initcheck LOG   (exit 1: not clean)
"""

import argparse
import collections
import re
import sys

# The kernel a report names: "at <kernel>+0x1a0", maybe followed by " in file.cu:12" (-lineinfo).
AT = re.compile(r"\bat (.+?)\+0x[0-9a-f]+(?: in \S+)?(?: \[\d+ hazards?\])?$")
NOT_REPORTS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Target application")


def parse(path):
    """(reports, summary count): each report is [header, kernel or None]."""
    reports, summary = [], None
    for raw in open(path, errors="replace"):
        # compute-sanitizer's lines start with exactly nine '=' (pytest's progress dots may
        # precede them); pytest's own banners are longer runs that also end in '='.
        m = re.search(r"(?<!=)={9}(?!=)(.*)$", raw.rstrip("\n"))
        if not m or m.group(1).rstrip().endswith("="):
            continue
        body = m.group(1)
        s = re.search(r"(?:ERROR SUMMARY: (\d+) errors?|RACECHECK SUMMARY: (\d+) hazards? displayed)", body)
        if s:
            summary = int(s.group(1) or s.group(2))
            continue
        if body.startswith("  "):  # a report's continuation: "    at ...", "    by thread", host frames
            if reports and reports[-1][1] is None and "Host Frame" not in body:
                at = AT.search(body.strip())
                if at:
                    reports[-1][1] = at.group(1).strip()
            continue
        body = body.strip()
        if not body or body.startswith(NOT_REPORTS):
            continue
        at = AT.search(body) if "Race reported" in body else None
        reports.append([body, at.group(1).strip() if at else None])
    return reports, summary


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--tool", required=True, choices=["memcheck", "racecheck", "initcheck"])
    p.add_argument("log")
    args = p.parse_args(argv)
    reports, summary = parse(args.log)
    ours, others, unnamed = collections.Counter(), collections.Counter(), []
    for header, kernel in reports:
        if kernel is None:
            unnamed.append(header)
        else:
            (ours if "customops" in kernel else others)[kernel[:120]] += 1
    print(f"reports in our kernels: {sum(ours.values())}")
    for name, n in ours.most_common(10):
        print(f"  {n:5d}  {name}")
    print(f"reports in other libraries' kernels: {sum(others.values())}")
    for name, n in others.most_common(10):
        print(f"  {n:5d}  {name}")
    reasons = []
    if ours:
        reasons.append("reports in our kernels")
    if unnamed:
        reasons.append(f"{len(unnamed)} report(s) name no kernel, e.g. {unnamed[0][:100]!r}")
    if summary is not None and summary > len(reports):
        reasons.append(f"the summary counts {summary} reports and {len(reports)} were printed (--print-limit)")
    if args.tool == "initcheck" and reports:
        reasons.append("initcheck names the reader, not the kernel that left memory unwritten")
    print("verdict: " + ("NOT CLEAN: " + "; ".join(reasons) if reasons else "clean for our kernels"))
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main())
