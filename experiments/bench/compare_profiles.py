"""Two profile_driver.py files side by side: the operators and kernels whose call count or self time differs
most, then the totals.

    python experiments/bench/compare_profiles.py /tmp/old-rank0.json /tmp/new-rank0.json [rows]
"""
from __future__ import annotations

import json
import sys


def main() -> None:
    old, new = (json.load(open(path)) for path in sys.argv[1:3])
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 40
    names = set(old["ops"]) | set(new["ops"])
    zero = [0, 0.0, 0.0]
    diffs = []
    for name in names:
        (oc, od, ocpu), (nc, nd, ncpu) = old["ops"].get(name, zero), new["ops"].get(name, zero)
        diffs.append((abs(nd - od) + abs(ncpu - ocpu) / 10, name, oc, nc, od / 1e3, nd / 1e3, ocpu / 1e3, ncpu / 1e3))
    diffs.sort(reverse=True)
    print(f"{'name':70s} {'calls old':>9s} {'new':>7s} {'device ms old':>13s} {'new':>8s} {'cpu ms old':>10s} {'new':>8s}")
    for _, name, oc, nc, od, nd, ocpu, ncpu in diffs[:rows]:
        print(f"{name[:70]:70s} {oc:9d} {nc:7d} {od:13.1f} {nd:8.1f} {ocpu:10.1f} {ncpu:8.1f}")
    for tree, data in (("old", old), ("new", new)):
        device = sum(v[1] for v in data["ops"].values()) / 1e3
        print(f"{tree}: wall {data['wall_s']:.2f} s, GPU busy {data['gpu_busy_us'] / 1e3:.1f} ms, "
              f"self device time summed {device:.1f} ms")


if __name__ == "__main__":
    main()
