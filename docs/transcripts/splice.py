#!/usr/bin/env python3
"""Puts the sessions a transcript script ran into a page, or checks that the page holds them.

    splice.py PAGE SCRIPT SESSIONS [--check]

SESSIONS is what the script printed: sections, each opened by a line `@@ NAME` (and
optionally a fence language, `@@ NAME text`; `console` when left out). Each goes between
`<!-- transcript: SCRIPT NAME -->` and the next `<!-- end of transcript -->` in PAGE (a
session named `-` goes under `<!-- transcript: SCRIPT -->`). With --check nothing is written:
any difference, once the volatile fields below are masked, is printed and fails.
"""
import difflib
import re
import sys

END = "<!-- end of transcript -->"

# What differs from run to run and nothing else may: dates, timestamps, durations,
# lease and run ids, process ids, byte counts of bodies that hold any of those.
VOLATILE = [
    (re.compile(r"(?im)^(date: ).*$"), r"\1DATE"),
    (re.compile(r"\d{4}-\d{2}-\d{2}T[\d:.]+Z"), "TIME"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "ID32"),
    (re.compile(r"\bload-[0-9a-f]{8}\b"), "load-RUNID"),
    (re.compile(r"\brun id [0-9a-f]{8}\b"), "run id RUNID"),
    (re.compile(r"\bpid=\d+"), "pid=PID"),
    (re.compile(r"\bkill -9 \d+"), "kill -9 PID"),
    (re.compile(r"^\[\d+\] \d+$", re.M), "[JOB] PID"),
    (re.compile(r"(?m)^(real|user|sys)\t\d+m[\d.]+s$"), r"\1\tDURATION"),
    (re.compile(r"(?m)^[0-9]+\.[0-9]+ [0-9]+\.[0-9]+ "), "START END "),
]


def mask(text):
    for pattern, replacement in VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def sessions(text):
    """(name, language, body) for each `@@` section."""
    found, name, lang, lines = [], None, None, []
    for line in text.split("\n"):
        if line.startswith("@@ "):
            if name is not None:
                found.append((name, lang, "\n".join(lines).rstrip("\n")))
            parts = line[3:].split()
            name, lang, lines = parts[0], (parts[1] if len(parts) > 1 else "console"), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        found.append((name, lang, "\n".join(lines).rstrip("\n")))
    return found


def splice(page_text, script, found):
    """The page with each session in place, and the names whose marker is missing."""
    lines = page_text.split("\n")
    missing = []
    for name, lang, body in found:
        begin = f"<!-- transcript: {script} -->" if name == "-" else f"<!-- transcript: {script} {name} -->"
        try:
            start = lines.index(begin)
            stop = lines.index(END, start)
        except ValueError:
            missing.append(begin)
            continue
        block = [f"```{lang}", *body.split("\n"), "```"]
        lines[start + 1 : stop] = block
    return "\n".join(lines), missing


def main(argv):
    if len(argv) not in (4, 5) or (len(argv) == 5 and argv[4] != "--check"):
        sys.exit(__doc__)
    page, script, sessions_file = argv[1:4]
    check = len(argv) == 5
    with open(page, encoding="utf-8") as f:
        current = f.read()
    with open(sessions_file, encoding="utf-8") as f:
        found = sessions(f.read())
    if not found:
        sys.exit(f"{script} printed no session (no `@@ NAME` line)")
    new, missing = splice(current, script, found)
    for marker in missing:
        print(f"{page}: no {marker} (followed by {END})", file=sys.stderr)
    if missing:
        sys.exit(1)
    if not check:
        if new != current:
            with open(page, "w", encoding="utf-8") as f:
                f.write(new)
        print(f"wrote {len(found)} session(s) of {script} into {page}")
        return
    diff = list(
        difflib.unified_diff(
            mask(current).split("\n"), mask(new).split("\n"), f"{page} (as committed)", f"{page} (as {script} ran now)", lineterm=""
        )
    )
    if diff:
        print("\n".join(diff), file=sys.stderr)
        sys.exit(f"{page}: its sessions differ from what the programs do now (above); run {script}")
    print(f"ok: {page}: {len(found)} session(s) of {script} are what ran")


if __name__ == "__main__":
    main(sys.argv)
