#!/usr/bin/env python3
"""Draws the workspace from its code, and checks fencing-layer's modules read one way.

    python3 docs/architecture/graph.py           # write crates.dot and fencing-layer.dot (and .svg with graphviz)
    python3 docs/architecture/graph.py --check   # fail on a cycle between fencing-layer's modules, an
                                                  # edge FORBIDDEN names, a function over 80 lines, or a
                                                  # .dot file that no longer matches the code

Modules are fencing-layer's files under src/ (a directory module is its files; `mod.rs`
is the directory's own node). A module naming an item of the directory module it is in
(`super::`) is drawn dashed and is not a cycle: that is how Rust modules share a vocabulary.
An edge A -> B means code in A (outside its `#[cfg(test)]`
and `#[cfg(loom)]` parts and its comments) names an item of B: a `use crate::...`,
`super::...` or `self::...` path, or a `crate::...` path in the code itself. Crates and
their edges come from `cargo metadata` (normal dependencies between workspace members).
"""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "fencing-layer" / "src"
OUT = Path(__file__).resolve().parent


def module_of(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return "/".join(parts) or "lib"


def resolve(segments, modules):
    """The longest prefix of `segments` that is a module."""
    for n in range(len(segments), 0, -1):
        name = "/".join(segments[:n])
        if name in modules:
            return name
    return "lib"


def library_code(text: str) -> str:
    """The file without comments, test modules and loom models."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    out, skip_depth, depth, pending = [], None, 0, False
    for line in text.split("\n"):
        if skip_depth is None and re.match(r"\s*#\[cfg\((all\()?(test|loom)\b", line):
            pending = True
        if pending and skip_depth is None and "{" in line:
            skip_depth, pending = depth, False
        elif pending and skip_depth is None and line.strip().endswith(";"):
            pending = False  # a cfg'd `mod x;` or `use`: its file is skipped by name below
            depth += line.count("{") - line.count("}")
            continue
        depth += line.count("{") - line.count("}")
        if skip_depth is not None:
            if depth <= skip_depth:
                skip_depth = None
            continue
        if not pending:
            out.append(line)
    return "\n".join(out)


def paths_in(code: str):
    """Every path a `use` or an expression names, as lists of segments (`{a, b}` expanded)."""
    for use in re.finditer(r"\buse\s+([^;]+);", code, flags=re.S):
        yield from expand(re.sub(r"\s+", "", use.group(1)))
    for path in re.finditer(r"\b(crate(?:::\w+)+)", code):
        yield path.group(1).split("::")


def expand(tree: str):
    """`a::{b, c::d}` as [a, b] and [a, c, d]."""
    if "{" not in tree:
        yield tree.split(" as ")[0].split("::")
        return
    head, rest = tree.split("{", 1)
    body = rest[: rest.rfind("}")]
    parts, level, cur = [], 0, ""
    for ch in body:
        if ch == "," and level == 0:
            parts.append(cur)
            cur = ""
            continue
        level += (ch == "{") - (ch == "}")
        cur += ch
    parts.append(cur)
    for part in filter(None, parts):
        for sub in expand(head + part):
            yield sub


def module_graph():
    files = [p for p in SRC.rglob("*.rs") if "loom_model" not in p.name]
    modules = {module_of(p) for p in files}
    edges = set()
    for path in files:
        me = module_of(path)
        for segs in paths_in(library_code(path.read_text())):
            segs = [s for s in segs if s]
            if not segs:
                continue
            if segs[0] == "crate":
                target = resolve(segs[1:], modules)
            elif segs[0] in ("super", "self"):
                base = [] if me == "lib" else me.split("/")
                while segs and segs[0] in ("super", "self"):
                    if segs.pop(0) == "super":
                        base = base[:-1]
                target = resolve(base + segs, modules) if base + segs else "lib"
            else:
                continue
            # The crate root only declares and re-exports: left out.
            if target not in (me, "lib") and me != "lib":
                edges.add((me, target))
    return sorted(modules - {"lib"}), sorted(edges)


def upward(a, b):
    """Whether `a` names an item of a module it is inside (`super::`): a directory
    module's `mod.rs` is its children's common vocabulary, so that is not a cycle."""
    return a.startswith(b + "/")


def cycles(nodes, edges):
    """Strongly connected components with more than one module (Tarjan), leaving out
    the edges from a module up to the directory module it is in."""
    succ = {n: [b for a, b in edges if a == n and not upward(a, b)] for n in nodes}
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for n in nodes:
        if n not in index:
            visit(n)
    return out


# Edges the design forbids, beyond cycles: the future knows nothing above it, and the
# answers (rejection, respond, metrics) know nothing of the middleware that gives them.
FORBIDDEN = [
    ("future", "layer"), ("future", "service"),
    ("rejection", "future"), ("rejection", "service"), ("rejection", "layer"),
    ("respond", "future"), ("respond", "service"), ("respond", "layer"),
    ("metrics", "future"), ("metrics", "service"), ("metrics", "layer"),
]

# The longest function fencing-layer/src may have, in lines (signature to closing brace).
MAX_FN_LINES = 80


def forbidden(edges):
    def within(module, top):
        return module == top or module.startswith(top + "/")
    return [(a, b) for a, b in edges for top_a, top_b in FORBIDDEN if within(a, top_a) and within(b, top_b)]


def long_functions():
    """(lines, file:line, name) of every fn longer than MAX_FN_LINES, tests included."""
    found = []
    for path in sorted(SRC.rglob("*.rs")):
        lines = path.read_text().split("\n")
        for i, line in enumerate(lines):
            m = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?fn\s+(\w+)", line)
            if not m:
                continue
            depth, opened = 0, False
            for j in range(i, len(lines)):
                code = re.sub(r"//.*", "", lines[j])
                code = re.sub(r"'(?:\\.|[^'\\])'", "", re.sub(r'"(?:\\.|[^"\\])*"', "", code))
                if not opened and ";" in code and "{" not in code:
                    break  # a declaration without a body
                depth += code.count("{") - code.count("}")
                opened = opened or "{" in code
                if opened and depth <= 0:
                    length = j - i + 1
                    if length > MAX_FN_LINES:
                        found.append((length, f"{path.relative_to(ROOT)}:{i + 1}", m.group(1)))
                    break
    return sorted(found, reverse=True)


def crate_graph():
    meta = json.loads(subprocess.check_output(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT))
    members = {p["name"] for p in meta["packages"]}
    edges = set()
    for p in meta["packages"]:
        for d in p["dependencies"]:
            if d["name"] in members and d.get("kind") is None:
                edges.add((p["name"], d["name"]))
    return sorted(members), sorted(edges)


def dot(name, nodes, edges, cluster=False):
    lines = [f"digraph \"{name}\" {{", "  rankdir=LR;", "  node [shape=box, fontname=\"Helvetica\", fontsize=11];"]
    groups = {}
    directories = {n.split("/")[0] for n in nodes if "/" in n}
    for n in nodes:
        top = n.split("/")[0]
        groups.setdefault(top if cluster and top in directories else "", []).append(n)
    for group, members in sorted(groups.items()):
        if group:
            lines.append(f"  subgraph \"cluster_{group}\" {{ label=\"{group}/\"; style=rounded;")
            lines += [f"    \"{m}\";" for m in members]
            lines.append("  }")
        else:
            lines += [f"  \"{m}\";" for m in members]
    lines += [f"  \"{a}\" -> \"{b}\"{' [style=dashed]' if upward(a, b) else ''};" for a, b in edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


def main():
    check = "--check" in sys.argv[1:]
    nodes, edges = module_graph()
    found = cycles(nodes, edges)
    crates, crate_edges = crate_graph()
    drawings = {
        "fencing-layer.dot": dot("fencing-layer modules", nodes, edges, cluster=True),
        "crates.dot": dot("workspace crates", crates, crate_edges),
    }
    bad = forbidden(edges)
    long = long_functions()
    print(f"fencing-layer: {len(nodes)} modules, {len(edges)} edges, {len(found)} cycles, "
          f"{len(bad)} forbidden edges, {len(long)} functions over {MAX_FN_LINES} lines")
    for comp in found:
        print("  cycle among: " + ", ".join(comp))
    for a, b in bad:
        print(f"  forbidden: {a} -> {b}")
    for length, where, name in long:
        print(f"  {where} fn {name}: {length} lines")
    stale = []
    for name, text in drawings.items():
        path = OUT / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            try:
                subprocess.run(["dot", "-Tsvg", str(path), "-o", str(path.with_suffix(".svg"))], check=True)
            except FileNotFoundError:
                print("graphviz's `dot` is not installed: wrote the .dot files only", file=sys.stderr)
    for name in stale:
        print(f"docs/architecture/{name} does not match the code: run python3 docs/architecture/graph.py")
    if check and (found or stale or bad or long):
        sys.exit(1)


if __name__ == "__main__":
    main()
