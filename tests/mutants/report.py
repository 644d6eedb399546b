#!/usr/bin/env python3
"""Sums a mutation campaign's shards at one commit (`make mutants-report`, issue 51).

    report.py OUT/<commit>

reads OUT/<commit>/<campaign>/<shard>/mutants.out/outcomes.json, as `make mutants` and
`make mutants-store` write them, and prints per campaign: each shard's time and counts, the
totals, and every mutant not caught (missed, timed out), as markdown for tests/mutants/*.md.
A shard run twice (an interrupted run) counts once: its latest run.
"""
import json
import pathlib
import sys
from datetime import datetime

KINDS = ("caught", "missed", "timeout", "unviable")


def when(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")) if s else None


def shard_key(name):
    # shard-3-of-20 sorts by 3; "all" first
    parts = name.split("-")
    return (int(parts[1]) if len(parts) == 4 and parts[1].isdigit() else 0, name)


def mutant_name(outcome):
    # cargo-mutants' name: "<file>:<line>:<column>: <mutation>", as --list shows it
    return outcome["scenario"]["Mutant"]["name"]


def main(root):
    root = pathlib.Path(root)
    if not root.is_dir():
        sys.exit(f"no campaign output at {root}: run `make mutants` or `make mutants-store` first")
    print(f"# Campaign at {root.name}\n")
    for campaign in sorted(p for p in root.iterdir() if p.is_dir()):
        totals = dict.fromkeys(KINDS, 0)
        not_caught = []
        rows = []
        for shard in sorted((p for p in campaign.iterdir() if p.is_dir()), key=lambda p: shard_key(p.name)):
            f = shard / "mutants.out" / "outcomes.json"
            if not f.exists():
                rows.append(f"| {shard.name} | (no outcomes.json: not run, or running) | | | | | |")
                continue
            o = json.loads(f.read_text())
            start, end = when(o.get("start_time")), when(o.get("end_time"))
            took = f"{(end - start).total_seconds() / 60:.0f} min" if start and end else "unfinished"
            counts = {k: o.get(k, 0) for k in KINDS}
            for k in KINDS:
                totals[k] += counts[k]
            rows.append(
                f"| {shard.name} | {start:%Y-%m-%d %H:%M} | {took} | "
                + " | ".join(str(counts[k]) for k in KINDS)
                + " |"
            )
            for out in o.get("outcomes", []):
                if "Mutant" not in out.get("scenario", {}):
                    continue
                summary = out.get("summary")
                if summary in ("MissedMutant", "Timeout"):
                    not_caught.append((shard.name, summary, mutant_name(out)))
        print(f"## {campaign.name}\n")
        print("| shard | started (UTC) | took | caught | missed | timed out | unviable |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(rows))
        print(
            "| **total** | | | "
            + " | ".join(f"**{totals[k]}**" for k in KINDS)
            + " |\n"
        )
        print(f"{len(not_caught)} not caught:\n")
        for shard, summary, name in not_caught:
            print(f"- {'missed' if summary == 'MissedMutant' else 'timed out'} ({shard}): `{name}`")
        print()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else sys.exit(__doc__))
