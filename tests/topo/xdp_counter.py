#!/usr/bin/python3
"""Prints one counter of the xesp classifier attached to an interface, summed over CPUs, read
with bpftool from the program's own map: it works with no daemon running (after a stop, the
classifier stays and counts what it drops). The classifier is the interface's XDP program, or,
on a protected interface in tun mode, its tc ingress program (the counters are the same map's).

Usage: xdp_counter.py DEV NAME      (run in the interface's network namespace)
NAME is a counter's name as `xesp stats` shows it, e.g. xsk-missing.
"""
import json
import os
import re
import subprocess
import sys

ABI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../bpf/xesp_xdp_abi.h")


def run_json(*cmd):
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main():
    dev, name = sys.argv[1], sys.argv[2]
    names = re.findall(r'^\s*X\(\w+, "([^"]+)"\)', open(ABI).read(), re.M)
    index = names.index(name)
    link = run_json("ip", "-j", "-d", "link", "show", "dev", dev)[0]
    if "xdp" in link:
        prog = link["xdp"]["prog"]["id"]
    else:
        prog = next(f["options"]["prog"]["id"]
                    for f in run_json("tc", "-j", "filter", "show", "dev", dev, "ingress")
                    if f.get("options", {}).get("prog", {}).get("name", "").startswith("xesp_tc"))
    maps = run_json("bpftool", "-j", "prog", "show", "id", str(prog))["map_ids"]
    for m in maps:
        if run_json("bpftool", "-j", "map", "show", "id", str(m))["name"] != "counters":
            continue
        for e in run_json("bpftool", "-j", "map", "dump", "id", str(m)):
            key = e.get("key", e.get("formatted", {}).get("key"))
            if isinstance(key, list):
                key = int.from_bytes(bytes(int(b, 16) for b in key), "little")
            if key != index:
                continue
            vals = e.get("values") or e.get("formatted", {}).get("values")
            total = 0
            for v in vals:
                x = v["value"]
                total += int.from_bytes(bytes(int(b, 16) for b in x), "little") \
                    if isinstance(x, list) else int(x)
            print(total)
            return 0
    print("no counters map on " + dev, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
