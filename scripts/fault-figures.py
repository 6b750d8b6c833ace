#!/usr/bin/python3
"""The fault campaign's figures (build/fault-campaign.jsonl) as a Markdown table.

One row per backend and fault: trials, trials that passed, trials in which the
fault was detected (a room failed), detection and recovery p50/p99 in ms, and
late landings (docs/reliability.md, limit 2).
"""
import json
import sys
from collections import defaultdict


def percentile(values, p):
    if not values:
        return "-"
    values = sorted(values)
    return str(values[min(len(values) - 1, int(p * (len(values) - 1) + 0.5))])


def main(path):
    rows = defaultdict(list)
    with open(path) as f:
        for line in f:
            if line.strip():
                trial = json.loads(line)
                rows[(trial["backend"], trial["fault"])].append(trial)
    print("| backend | fault | trials | passed | detected | detection p50 / p99 ms "
          "| recovery p50 / p99 ms | late landings | collateral |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (backend, fault), trials in sorted(rows.items()):
        detect = [t["detection_ms"] for t in trials if t["detection_ms"] is not None]
        recover = [t["recovery_ms"] for t in trials if t["recovery_ms"] is not None]
        print(f"| {backend} | {fault} | {len(trials)} | {sum(t['ok'] for t in trials)} "
              f"| {len(detect)} | {percentile(detect, 0.5)} / {percentile(detect, 0.99)} "
              f"| {percentile(recover, 0.5)} / {percentile(recover, 0.99)} "
              f"| {sum(t.get('late_landings', 0) for t in trials)} "
              f"| {sum(t.get('collateral', 0) for t in trials)} |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: fault-figures.py build/fault-campaign.jsonl")
    main(sys.argv[1])
