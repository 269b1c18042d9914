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
    # The lock service's time left on a held lock (docs/lock-service.md), counted in ms.
    (re.compile(r'(?<="expires_in_ms":)\d+\b'), "MS"),
    (re.compile(r"(?<= for another )\d+(?= ms)"), "MS"),
    # How long demo-resource's one fsync took (docs/metrics.md): the buckets it fell in, its sum.
    (re.compile(r'(?m)^(fencing_durable_record_seconds_bucket\{layer="demo-resource",le="[0-9.]+"\}) [01]$'), r"\1 N"),
    (re.compile(r'(?m)^(fencing_durable_record_seconds_sum\{layer="demo-resource"\}) [0-9.e-]+$'), r"\1 SECONDS"),
    # The key pair `demo-lock-service keygen` makes afresh (docs/authenticity.md), and so the
    # proof the lock service signs a grant with.
    (re.compile(r"(?m)(?<=^public key: lock\.pub \()[A-Za-z0-9_-]{43}(?=\)$)"), "PUBLIC_KEY"),
    (re.compile(r'(?<=grants are signed public_key=")[A-Za-z0-9_-]{43}(?=")'), "PUBLIC_KEY"),
    (re.compile(r'(?<="proof":")[A-Za-z0-9_-]{86}(?=")'), "PROOF"),
    # How long a write waited for a raise (docs/replicas.md: curl -w '%{http_code} after %{time_total}s').
    (re.compile(r"(?m)^(\d{3} after )\d+\.\d+s$"), r"\1SECONDS"),
    # An etcd claim's grant number (docs/replicas.md, etcdctl get): a replica's count of grant
    # tries, which grows with each retry of a waiting raise.
    (re.compile(r"(?m)^(\d{20}) \d{20}$"), r"\1 GRANT"),
    # The port curl connected from, in demo-resource's admin-reset log line (docs/operating-marks.md).
    (re.compile(r'(?<=through the admin routes )(.*) peer="127\.0\.0\.1:\d+"'), r'\1 peer="127.0.0.1:PORT"'),
    # How long etcdctl's health check took to commit (docs/token-sources.md: etcdctl endpoint health).
    (re.compile(r"(?<=is healthy: successfully committed proposal: took = )[\d.]+[µm]?s\b"), "DURATION"),
    # The etcd lease id the etcd_lock example prints (docs/etcd.md): etcd makes it from the time.
    (re.compile(r"(?<=, etcd lease )[0-9a-f]{16}(?=, granted ttl )"), "LEASEID"),
    # How soon after the lease's loss client_layer's in-flight write was cancelled (docs/integrating.md).
    (re.compile(r"\(\d+(?:\.\d+)?(?:ns|µs|ms|s) after the loss\)"), "(DURATION after the loss)"),
    # The lock service's seconds until its earliest lease expires (docs/authenticity.md, a
    # full table): 30 s leases, one second less if the session ran slow.
    (re.compile(r"(?m)^(retry-after: )(?:29|30)$"), r"\1SECONDS"),
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
