"""Per-turn counts for tests/mcp_real.rs runs, from the server side (issue #61).

    python3 turns_from_logs.py nginx ACCESS_LOG      # turns split by the harness's MCP_REAL_MARK GETs
    python3 turns_from_logs.py python LOG.jsonl HARNESS_OUTPUT   # turns split by the printed unix windows

The nginx log must be in the format
`log_format ms '$msec $request_time $status $request_method $request_uri $request_length';`
(arrival = $msec - $request_time). Prints per turn: requests (POSTs for
nginx), refusals (429s / refused calls), the first one's offset, and the
most requests that arrived in any 1 s window starting at or after it.
Add -v for every request.
"""
import json
import re
import sys


def report(k, reqs, t0):
    reqs.sort()
    refused = [t for t, ref in reqs if ref]
    best = 0
    if refused:
        after = [t for t, _ in reqs if t >= refused[0]]
        best = max(sum(1 for t in after if a <= t < a + 1.0) for a in after)
    first = f"{refused[0] - t0:.3f}" if refused else "-"
    print(k, len(reqs), len(refused), first, best)
    if "-v" in sys.argv:
        for t, ref in reqs:
            print(f"   {t - t0:7.3f} {'refused' if ref else 'ok'}")


def nginx(path):
    turns, cur, rows = {}, None, []
    for line in open(path):
        p = line.split()
        if len(p) < 6 or not p[0][0].isdigit():
            continue
        end, took = float(p[0]), float(p[1])
        rows.append((end, end - took, int(p[2]), p[3], p[4]))
    for end, start, status, method, uri in rows:  # as logged: in the order they ended
        if "mark-t" in uri:
            k, what = uri.split("mark-t")[1].split("-")
            cur = int(k) if what == "start" else None
            turns.setdefault(int(k), [])
        elif cur is not None and method == "POST":
            turns[cur].append((start, status == 429))
    for k, reqs in sorted(turns.items()):
        report(k, reqs, min((t for t, _ in reqs), default=0))


def python(path, harness):
    log = [json.loads(line) for line in open(path)]
    text = open(harness).read()
    windows = re.findall(r"turn (\d+): unix ([\d.]+) \.\. ([\d.]+)", text)
    for k, a, b in windows:
        a, b = float(a), float(b)
        reqs = [(r["t"], r["refused"]) for r in log if a - 0.001 <= r["t"] <= b + 0.001]
        report(int(k), reqs, a)


print("turn requests refusals first_at max_in_1s_from_first")
if sys.argv[1] == "nginx":
    nginx(sys.argv[2])
else:
    python(sys.argv[2], sys.argv[3])
