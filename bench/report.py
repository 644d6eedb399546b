#!/usr/bin/env python3
"""`make bench`'s report: the arm64 packages' sizes, and the default scenario played RUNS times
with the x86-64 release binaries under the local runner, each function's figures the median of
the runs (the machine is shared and noisy; one run's figures are not evidence)."""

import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import time
import zipfile

FUNCTIONS = ["search-offerings", "purchase-capacity", "launch-workloads",
             "replace-unhealthy", "cleanup-expired"]
# the runner's functions table: name, memory, init ms, invokes, quiet, errors, peak RSS MiB,
# max ms, mean ms, max cpu ms, mean cpu ms, recommend MB, ddb/inv, ddb/quiet, aws/inv
COLUMNS = ["memory", "init_ms", "invokes", "quiet", "errors", "rss_mib", "max_ms", "mean_ms",
           "max_cpu_ms", "mean_cpu_ms", "recommend_mb", "ddb_inv", "ddb_quiet", "aws_inv"]


def zips(lambda_dir):
    print("== arm64 packages (make build; zip as SAM packs a CodeUri folder) ==")
    print(f"{'function':<18} {'bootstrap MiB':>14} {'zip MiB':>8}")
    for f in FUNCTIONS:
        path = os.path.join(lambda_dir, f, "bootstrap")
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.write(path, "bootstrap")
        print(f"{f:<18} {os.path.getsize(path) / 2**20:>14.2f} {len(buf.getvalue()) / 2**20:>8.2f}")


def play(local_cloud, bin_dir, scenario):
    start = time.monotonic()
    out = subprocess.run([local_cloud, "run", "--bin-dir", bin_dir, scenario],
                         capture_output=True, text=True, check=True).stdout
    wall = time.monotonic() - start
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] in FUNCTIONS and len(parts) == len(COLUMNS) + 1:
            rows[parts[0]] = dict(zip(COLUMNS, map(float, parts[1:])))
    played = re.search(r"([\d.]+) s wall", out)
    if len(rows) != len(FUNCTIONS) or not played:
        sys.exit("the runner's report has no functions table:\n" + out)
    return rows, wall, float(played.group(1))


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--target", required=True)
    a.add_argument("--lambda-dir", required=True)
    a.add_argument("--scenario", required=True)
    a.add_argument("--runs", type=int, default=5)
    args = a.parse_args()
    zips(args.lambda_dir)
    bin_dir = os.path.join(args.target, "release")
    runs = [play(os.path.join(bin_dir, "local-cloud"), bin_dir, args.scenario)
            for _ in range(args.runs)]
    med = lambda xs: statistics.median(xs)
    print(f"\n== x86-64 release under the local runner: medians of {args.runs} runs ==")
    print(f"{'function':<18} {'init ms':>8} {'peak RSS MiB':>13} {'max ms':>7} {'mean ms':>8} "
          f"{'max cpu ms':>11} {'mean cpu ms':>12} {'recommend MB':>13} {'ddb/inv':>8} {'aws/inv':>8}")
    for f in FUNCTIONS:
        v = lambda k: med(r[0][f][k] for r in runs)
        print(f"{f:<18} {v('init_ms'):>8g} {v('rss_mib'):>13.1f} {v('max_ms'):>7g} "
              f"{v('mean_ms'):>8.1f} {v('max_cpu_ms'):>11.1f} {v('mean_cpu_ms'):>12.2f} "
              f"{v('recommend_mb'):>13g} {v('ddb_inv'):>8.1f} {v('aws_inv'):>8.1f}")
    print(f"init ms of each run: " + json.dumps(
        {f: [r[0][f]["init_ms"] for r in runs] for f in FUNCTIONS}))
    print(f"default scenario wall time: {med(r[2] for r in runs):.1f} s (median; the runner's own "
          f"clock, moto's start to the judged end), {med(r[1] for r in runs):.1f} s for the "
          f"whole local-cloud process; each run: " + json.dumps([round(r[2], 1) for r in runs]))


if __name__ == "__main__":
    main()
