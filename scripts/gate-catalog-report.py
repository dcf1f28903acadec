#!/usr/bin/env python3
"""Which gate IDs no catalog mutant names: a static report for the gate proof (docs/MUTATIONS.md,
"Proving every gate").

    scripts/gate-catalog-report.py --build build [--build build-cuda] [--proof P.json ...] \
        [--outcomes O.json ...] --out-md R.md --out-json R.json

Gate IDs: every gate source of every gate program in the build's compile_commands.json is run
through the preprocessor with its own flags, and each Catch2 test case name registered there
(NameAndTags{"...", ...}, adjacent literals joined, so the preset rows of KVGATE_PRESETS expand)
gives its first word. Nothing is built or run: for a built program the IDs are exactly those of
`<program> --list-tests`. A gate named in no mutant's `expect_killed_by` in any catalog
(mutations/catalog.json, mutations/adversarial*.json) can only be proven by a mutant that
resembles it; --proof (a proof.json) and --outcomes (an outcomes.json) mark the ones already shown
able to go red.
"""
import argparse
import glob
import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIT = re.compile(r'"((?:[^"\\]|\\.)*)"')
NAME = re.compile(r'NameAndTags\s*\{\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')


def gate_ids(build):
    path = os.path.join(build, "compile_commands.json")
    try:
        cc = json.load(open(path))
    except (OSError, ValueError) as e:
        sys.exit(f"gate-catalog-report: {path}: {e}; fix: configure the build first (cmake -S . -B {build})")
    ids = {}
    for c in cc:
        src = c["file"]
        args = shlex.split(c["command"])
        if "-o" not in args:
            continue
        m = re.search(r"CMakeFiles/(gate_[^/]+)\.dir/", args[args.index("-o") + 1])
        if not m:
            continue
        i = args.index("-o")
        cmd = [a for a in args[:i] + args[i + 2:] if a not in ("-c", src)] + ["-E", "-P", src]
        pp = subprocess.run(cmd, cwd=c["directory"], capture_output=True, text=True)
        if pp.returncode != 0:
            sys.exit(f"gate-catalog-report: preprocessing {src} failed:\n{pp.stderr[:2000]}")
        for n in NAME.finditer(pp.stdout):
            gid = "".join(LIT.findall(n.group(1))).split(" ")[0]
            lst = ids.setdefault(m.group(1), [])
            if gid not in lst:
                lst.append(gid)
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="append", required=True, help="a configured build folder (repeatable)")
    ap.add_argument("--proof", action="append", default=[], help="a proof.json whose proven gates count")
    ap.add_argument("--outcomes", action="append", default=[], help="an outcomes.json whose kills count")
    ap.add_argument("--out-md", required=True)
    ap.add_argument("--out-json", required=True)
    a = ap.parse_args()

    programs = {}
    in_builds = {}  # gate -> the builds that register it (a CUDA build adds gate_cuda and CUDA cases)
    for b in a.build:
        for p, v in gate_ids(b).items():
            programs.setdefault(p, [])
            programs[p] += [g for g in v if g not in programs[p]]
            for g in v:
                in_builds.setdefault(g, []).append(b)
    named = {}
    catalogs = [os.path.join(ROOT, "mutations", "catalog.json")] + sorted(
        glob.glob(os.path.join(ROOT, "mutations", "adversarial*.json")))
    for f in catalogs:
        for m in json.load(open(f))["mutants"]:
            for g in m.get("expect_killed_by", []):
                named.setdefault(g, []).append(m["id"])
    proven = {}
    for f in a.proof:
        for p in json.load(open(f))["proven"]:
            if p.get("status") in ("failed", "crashed") and not p.get("detail", "").startswith("interrupted"):
                proven.setdefault(p["gate"], f"{p['mutant']} ({os.path.basename(f)})")
    for f in a.outcomes:
        for m in json.load(open(f))["mutants"]:
            for g in m.get("killed_by", []):
                proven.setdefault(g, f"{m['id']} ({os.path.basename(f)})")

    rows = []
    for p in sorted(programs):
        for g in programs[p]:
            fam = g.rsplit(".", 1)[0]
            siblings = sorted(n for n in named if n != g and n.rsplit(".", 1)[0] == fam)
            rows.append({"gate": g, "program": p, "builds": in_builds[g], "named_by": named.get(g, []),
                         "family_named": siblings, "proven_by": proven.get(g)})
    unnamed = [r for r in rows if not r["named_by"]]
    doc = {"catalogs": [os.path.relpath(c, ROOT) for c in catalogs], "builds": a.build,
           "proofs": a.proof, "outcomes": a.outcomes,
           "summary": {"gates": len(rows), "named_by_no_mutant": len(unnamed),
                       "unnamed_and_unproven": sum(1 for r in unnamed if not r["proven_by"]),
                       "unnamed_unproven_no_family_named": sum(1 for r in unnamed if not r["proven_by"] and not r["family_named"])},
           "programs": {p: len(v) for p, v in sorted(programs.items())}, "gates": rows}

    first = a.build[0]
    doc["summary"]["in_" + first] = {
        "gates": sum(1 for r in rows if first in r["builds"]),
        "named_by_no_mutant": sum(1 for r in unnamed if first in r["builds"]),
        "unnamed_and_unproven": sum(1 for r in unnamed if first in r["builds"] and not r["proven_by"])}
    with open(a.out_json + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(a.out_json + ".tmp", a.out_json)
    s = doc["summary"]
    md = ["# Gate IDs no catalog mutant names", "",
          f"Generated by `scripts/gate-catalog-report.py` from {', '.join('`' + b + '`' for b in a.build)} "
          f"(each gate source preprocessed with its own flags; for a built program these are exactly its "
          f"`--list-tests` IDs) and the catalogs {', '.join('`' + c + '`' for c in doc['catalogs'])}.", "",
          f"**{s['gates']} gate IDs** in {len(programs)} programs; **{s['named_by_no_mutant']}** are named in no "
          f"mutant's `expect_killed_by` (only a resembling mutant can prove them); of those, "
          f"**{s['unnamed_and_unproven']}** are not yet shown able to go red by the proofs/outcomes given, and "
          f"**{s['unnamed_unproven_no_family_named']}** have no gate of their family (the ID less its last "
          f"component) named either. In `{first}` alone: {s['in_' + first]['gates']} gate IDs, "
          f"{s['in_' + first]['named_by_no_mutant']} named by no mutant, {s['in_' + first]['unnamed_and_unproven']} "
          f"of them not yet proven. The builds column says which builds register a gate.", "",
          "| program | gate IDs | named by no mutant | of those, not yet proven |", "|---|--:|--:|--:|"]
    for p in sorted(programs):
        pr = [r for r in unnamed if r["program"] == p]
        md.append(f"| {p} | {len(programs[p])} | {len(pr)} | {sum(1 for r in pr if not r['proven_by'])} |")
    md += ["", "## Named by no mutant and not yet proven", "",
           "| gate | program | builds | family gates named (candidates by resemblance) |", "|---|---|---|---|"]
    for r in unnamed:
        if not r["proven_by"]:
            fam = ", ".join(r["family_named"][:4]) + (" ..." if len(r["family_named"]) > 4 else "")
            md.append(f"| {r['gate']} | {r['program']} | {', '.join(r['builds'])} | {fam or '**none**'} |")
    md += ["", "## Named by no mutant, already proven (by resemblance)", "", "| gate | program | proven by |",
           "|---|---|---|"]
    for r in unnamed:
        if r["proven_by"]:
            md.append(f"| {r['gate']} | {r['program']} | {r['proven_by']} |")
    with open(a.out_md + ".tmp", "w") as f:
        f.write("\n".join(md) + "\n")
    os.replace(a.out_md + ".tmp", a.out_md)
    print(json.dumps(s))


if __name__ == "__main__":
    main()
