#!/usr/bin/env python3
"""Runs shell commands in turns and compares them: what decides a speed change on a VM whose
speed drifts by several per cent within minutes (docs/speed.md). Each round runs every
command once (in reverse order every other round); $PRE, if set, runs untimed before each.

    python3 scripts/turns.py ROUNDS CMD [CMD ...]

Prints each command's median wall, user and system time (ms) and CPUs busy, then each
command's time against the first's: the median of the rounds' ratios, and every round's.
"""
import os
import resource
import statistics
import subprocess
import sys
import time


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rounds, cmds = int(sys.argv[1]), sys.argv[2:]
    pre = os.environ.get("PRE")
    runs = {c: [] for c in cmds}
    for i in range(rounds):
        for c in cmds if i % 2 == 0 else cmds[::-1]:
            if pre:
                subprocess.run(pre, shell=True, check=True)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(c, shell=True, stdout=subprocess.DEVNULL)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            runs[c].append((wall, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime))
    for c, r in runs.items():
        med = [statistics.median(x[k] for x in r) * 1000 for k in range(3)]
        busy = statistics.median((x[1] + x[2]) / x[0] for x in r)
        print(f"wall {med[0]:8.1f}  user {med[1]:8.1f}  sys {med[2]:7.1f}  cpus {busy:4.2f}  {c}")
    first = runs[cmds[0]]
    for c in cmds[1:]:
        ratios = [x[0] / f[0] for x, f in zip(runs[c], first)]
        listed = " ".join(f"{x:.3f}" for x in ratios)
        print(f"x{statistics.median(ratios):.3f} the first's time (rounds: {listed})  {c}")


if __name__ == "__main__":
    main()
