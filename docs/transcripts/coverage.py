#!/usr/bin/env python3
"""Every console block in README.md and docs/*.md is made by a transcript script, or listed.

    coverage.py            # fails on a console block outside transcript markers and not listed
    coverage.py --list     # prints the list file as it would be today

A block between `<!-- transcript: SCRIPT ... -->` and `<!-- end of transcript -->` is written
by SCRIPT and checked in CI (`SCRIPT --check`). Any other console block must be named in
docs/transcripts/not-yet-checked.txt (page and first line), the blocks still written by hand:
the list may only shrink, so a new hand-written session fails here, as does a listed block that
is gone or has become a transcript (take it off the list).

A console block is a ```console fence, or any other fence (```text, ```sh, none...) with a
line that starts with `$ ` (a prompt): a session shown under another name is one too.
"""
import glob
from collections import Counter
import os
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
LIST = os.path.join(ROOT, "docs", "transcripts", "not-yet-checked.txt")


def blocks(path):
    """(first line, made by a script) for each console block of the page."""
    found, script, fence, body = [], None, None, []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for line in lines:
        if fence is None and line.startswith("<!-- transcript: "):
            script = line
        elif fence is None and line == "<!-- end of transcript -->":
            script = None
        elif fence is None and line.startswith("```"):
            fence, body = line[3:].strip(), []
        elif fence is not None and line.startswith("```"):
            if fence == "console" or any(row.startswith("$ ") for row in body):
                found.append((body[0] if body else "", script is not None))
            fence = None
        elif fence is not None:
            body.append(line)
    return found


def main():
    pages = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]
    made, by_hand = 0, []
    for page in pages:
        rel = os.path.relpath(page, ROOT)
        for first, scripted in blocks(page):
            if scripted:
                made += 1
            else:
                by_hand.append(f"{rel}: {first}")
    if sys.argv[1:] == ["--list"]:
        print("\n".join(by_hand))
        return
    with open(LIST, encoding="utf-8") as f:
        listed = [line for line in f.read().split("\n") if line and not line.startswith("#")]
    # As multisets: a page may show two blocks that open alike.
    new = list((Counter(by_hand) - Counter(listed)).elements())
    gone = list((Counter(listed) - Counter(by_hand)).elements())
    for entry in new:
        print(f"{entry}\n  a console block written by hand: make it with a transcript script (docs/transcripts/)", file=sys.stderr)
    for entry in gone:
        print(f"{entry}\n  listed in {os.path.relpath(LIST, ROOT)} but no such hand-written block: take it off", file=sys.stderr)
    total = made + len(by_hand)
    print(f"console blocks: {made} of {total} made by transcript scripts and checked, {len(by_hand)} still by hand")
    if new or gone:
        sys.exit(1)


if __name__ == "__main__":
    main()
