"""How many times each needle occurs in a process's writable memory (heap, thread stacks,
anonymous mappings), read through /proc/PID/mem.

Usage: scan_memory.py PID HEX...   prints one count a line, in the order given; each needle is
the bytes the hex digits spell, or, with a t: prefix, the text after it."""
import re
import sys


def main():
    pid = int(sys.argv[1])
    needles = [a[2:].encode() if a.startswith("t:") else bytes.fromhex(a) for a in sys.argv[2:]]
    counts = [0] * len(needles)
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if not fields[1].startswith("rw"):
                continue
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except OSError as e:  # a mapping the kernel will not show
                print("scan_memory: skipped %s (%s)" % (fields[0], e), file=sys.stderr)
                continue
            for i, n in enumerate(needles):
                counts[i] += len(re.findall(re.escape(n), data))
    for c in counts:
        print(c)


if __name__ == "__main__":
    main()
