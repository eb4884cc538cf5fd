#!/usr/bin/env python3
"""Reads `simctl snapshot` on stdin; fails when a job runs on more than one node.

A migration's overlap runs two instances for a moment, so this is asked once migrations
are done: then every job id has its instances on one node only, each instance key once.
"""
import json
import sys

snapshot = json.load(sys.stdin)
where = {}
for node in snapshot["nodes"]:
    if node["phase"] in ("stopped", "terminated"):
        continue
    for instance in node["instances"]:
        if instance["phase"] in ("starting", "running"):
            where.setdefault(instance["jobId"], []).append(f'{node["id"]}:{instance["role"]}')
problems = {job: places for job, places in where.items() if len(places) > 1}
for job, places in sorted(where.items()):
    print(f"{job}: {', '.join(places)}")
if problems:
    for job, places in sorted(problems.items()):
        print(f"job {job} runs {len(places)} times: {', '.join(places)}", file=sys.stderr)
    sys.exit(1)
if not where:
    print("no job runs anywhere", file=sys.stderr)
    sys.exit(1)
