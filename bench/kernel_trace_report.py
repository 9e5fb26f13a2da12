#!/usr/bin/env python3
"""Reads the CSV of bench/kernel_trace.c (every kernel, memset and memcpy of a process, GPU timestamps) and
reports, for the last steps of a training run (or any window between two marker kernels):

  - the window's wall time, the time the GPU ran anything (union of all records), its idle time and the
    longest idle gaps with the records on either side;
  - the time two or more records ran at once (the side streams' overlap);
  - per kernel (memsets by size, copies by kind: many zeroings of one size stand out) and per category (GEMM,
    attention, optimizer, norms, memsets and copies, other passes): calls and summed duration, largest first;
  - with --html: one self-contained page with the last window as an SVG timeline (a lane per stream, a bar
    per record coloured by category, its name and time on hover, the GPU's idle gaps marked) and the tables.

  bench/kernel_trace_report.py trace.csv [--marker REGEX] [--steps N] [--top N] [--json OUT] [--html OUT]

A window ends where the last of a run of marker kernels ends (default 'adamw': the trainer's optimizer,
the last kernels of a step); a run is the markers closer than --merge-ms (default 1 ms) to each other.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys


def demangle(names):
    """c++filt over the distinct names when it is installed, else the names as they are"""
    uniq = sorted(set(names))
    if not uniq or not shutil.which("c++filt"):
        return {n: n for n in uniq}
    out = subprocess.run(["c++filt"], input="\n".join(uniq) + "\n", capture_output=True, text=True).stdout
    lines = out.split("\n")
    return {n: (lines[i] if i < len(lines) and lines[i] else n) for i, n in enumerate(uniq)}


def short(name):
    """the function's name with its template arguments, without the parameter list"""
    if name is None:
        return "?"
    name = name.replace("(anonymous namespace)::", "")
    if name.startswith("void "):
        name = name[5:]
    if name.startswith("("):
        return name
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    s = name[:cut]
    return s if len(s) <= 90 else s[:87] + "..."


# category of a record by its (demangled, shortened) name; the first pattern that matches
CATEGORIES = [
    ("GEMM", "#3b6fb6", re.compile(r"^nvjet|cutlass|gemm|splitKreduce|Kernel2|matmul(?!_dq)|edw::dw_wg_kernel", re.I)),
    ("attention", "#8e44ad", re.compile(r"sdpa|fmha|attn|attention|matmul_dq|dot_do_o", re.I)),
    ("optimizer", "#c0392b", re.compile(r"adamw|muon|sumsq", re.I)),
    ("norms", "#27ae60", re.compile(r"^rn::|rmsnorm|layernorm|l2norm|qk_(fwd|bwd)", re.I)),
    ("memset / copy", "#7f8c8d", re.compile(r"^memset|^memcpy")),
    ("other passes", "#e67e22", re.compile(r"")),
]


def category(name):
    for c, _, rx in CATEGORIES:
        if rx.search(name):
            return c
    return CATEGORIES[-1][0]


def load(path):
    recs, apis = [], []  # (start, end, stream, kind, name); (start, end, thread, name)
    with open(path) as f:
        next(f, None)
        for line in f:
            p = line.rstrip("\n").split(",", 13)
            if p[0] == "api" and len(p) >= 6:
                apis.append((int(p[1]), int(p[2]), int(p[3]), p[5]))
            elif p[0] == "kernel" and len(p) >= 14:
                recs.append((int(p[1]), int(p[2]), int(p[3]), "kernel", p[13]))
            elif p[0] == "memset" and len(p) >= 6:
                recs.append((int(p[1]), int(p[2]), int(p[3]), "memset", "memset %s B" % p[5]))
            elif p[0].startswith("memcpy") and len(p) >= 6:
                recs.append((int(p[1]), int(p[2]), int(p[3]), "memcpy", "memcpy kind %s" % p[0][6:]))
    recs.sort()
    apis.sort()
    return recs, apis


def windows(recs, names, marker, gap_ns):
    """(t0, t1) of each step: from the end of one run of marker kernels to the end of the next"""
    rx = re.compile(marker)
    ends, last = [], None
    for s, e, _, kind, n in recs:
        if kind != "kernel" or not rx.search(names[n]):
            continue
        if last is not None and s - last > gap_ns:
            ends.append(last)
        last = e if last is None else max(last, e)
    if last is not None:
        ends.append(last)
    return list(zip(ends[:-1], ends[1:]))


def host_calls(apis, a, b, n=4):
    """the host's CUDA calls that overlap [a, b], longest overlap first (with KILN_TRACE_API=1)"""
    out = []
    for s, e, _, name in apis:
        if s >= b:
            break
        ov = min(e, b) - max(s, a)
        if ov > 0:
            out.append((ov, e - s, name))
    out.sort(reverse=True)
    return ["%s %.1f/%.1f us" % (name, ov / 1e3, d / 1e3) for ov, d, name in out[:n]]


def analyse(recs, apis, names, t0, t1, top):
    inw = [(max(s, t0), min(e, t1), st, k, n) for s, e, st, k, n in recs if e > t0 and s < t1]
    inw.sort()
    busy, cur_s, cur_e, gaps, prev = 0, None, None, [], None
    for s, e, _, _, n in inw:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
                gaps.append((s - cur_e, prev, n, cur_e))
            elif s > t0:
                gaps.append((s - t0, "(window start)", n, t0))
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
        if e >= (cur_e or 0):
            prev = n
    if cur_e is not None:
        busy += cur_e - cur_s
        if t1 > cur_e:
            gaps.append((t1 - cur_e, prev, "(window end)", cur_e))
    total = sum(e - s for s, e, *_ in inw)
    per = {}
    for s, e, _, k, n in inw:
        key = short(names[n]) if k == "kernel" else n  # "memset 8388608 B", "memcpy kind 2"
        c = per.setdefault(key, [0, 0])
        c[0] += 1
        c[1] += e - s
    streams, cats = {}, {}
    for s, e, st, k, n in inw:
        streams[st] = streams.get(st, 0) + e - s
        c = cats.setdefault(category(short(names[n]) if k == "kernel" else n), [0, 0])
        c[0] += 1
        c[1] += e - s
    gaps.sort(reverse=True)
    return {
        "wall_ms": (t1 - t0) / 1e6,
        "busy_ms": busy / 1e6,
        "idle_ms": (t1 - t0 - busy) / 1e6,
        "records": len(inw),
        "summed_ms": total / 1e6,
        "overlap_ms": (total - busy) / 1e6,
        "gaps_over_5us": sum(1 for g in gaps if g[0] > 5000),
        "idle_in_gaps_over_5us_ms": sum(g[0] for g in gaps if g[0] > 5000) / 1e6,
        "longest_gaps": [{"us": g[0] / 1e3, "at_ms": (g[3] - t0) / 1e6, "after": short(names.get(g[1], g[1])),
                          "before": short(names.get(g[2], g[2])), "host": host_calls(apis, g[3], g[3] + g[0])}
                         for g in gaps[:top]],
        "host_api_ms": api_totals(apis, t0, t1),
        "streams_ms": {str(k): v / 1e6 for k, v in sorted(streams.items(), key=lambda kv: -kv[1])},
        "kernels": [{"name": k, "calls": c, "ms": t / 1e6} for k, (c, t) in sorted(per.items(), key=lambda kv: -kv[1][1])],
        "categories": [{"name": k, "calls": c, "ms": t / 1e6} for k, (c, t) in sorted(cats.items(), key=lambda kv: -kv[1][1])],
        "gaps": [((g[3] - t0) / 1e6, g[0] / 1e6) for g in gaps],
        "timeline": [((s - t0) / 1e6, (e - s) / 1e6, st, short(names[n]) if k == "kernel" else n) for s, e, st, k, n in inw],
    }


def api_totals(apis, t0, t1):
    """the host's time in each CUDA call inside the window (with KILN_TRACE_API=1), largest first"""
    tot = {}
    for s, e, _, name in apis:
        if e > t0 and s < t1:
            tot[name] = tot.get(name, 0) + min(e, t1) - max(s, t0)
    return {k: v / 1e6 for k, v in sorted(tot.items(), key=lambda kv: -kv[1])}


def esc(t):
    return str(t).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def html_page(r, title, px_per_ms):
    """one window as an SVG timeline (a lane per stream, most busy first; idle gaps in red above) and the tables"""
    lanes = list(r["streams_ms"].keys())
    colour = {c: col for c, col, _ in CATEGORIES}
    left, lane_h, top = 70, 16, 44
    width = left + int(r["wall_ms"] * px_per_ms) + 20
    height = top + lane_h * len(lanes) + 30
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="10">'
           % (width, height)]
    step = 1 if r["wall_ms"] <= 20 else 5 if r["wall_ms"] <= 200 else 50
    t = 0.0
    while t <= r["wall_ms"] + 1e-9:
        x = left + t * px_per_ms
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (x, top - 6, x, height - 24))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%g ms</text>' % (x, height - 10, t))
        t += step
    out.append('<text x="4" y="%d">idle</text>' % (top - 14))
    for at, ms in r["gaps"]:
        out.append('<rect class="gap" x="%.2f" y="%d" width="%.2f" height="8" fill="#e74c3c"><title>idle %.1f us at %.3f ms'
                   '</title></rect>' % (left + at * px_per_ms, top - 22, max(ms * px_per_ms, 0.5), ms * 1e3, at))
    for i, st in enumerate(lanes):
        y = top + i * lane_h
        out.append('<text x="4" y="%d">stream %s</text>' % (y + 11, esc(st)))
    index = {st: i for i, st in enumerate(lanes)}
    for at, ms, st, name in r["timeline"]:
        y = top + index[str(st)] * lane_h
        out.append('<rect class="rec" x="%.2f" y="%d" width="%.2f" height="%d" fill="%s"><title>%s: %.1f us at %.3f ms'
                   '</title></rect>' % (left + at * px_per_ms, y + 1, max(ms * px_per_ms, 0.3), lane_h - 2,
                                        colour[category(name)], esc(name), ms * 1e3, at))
    out.append("</svg>")
    legend = " ".join('<span style="background:%s;color:#fff;padding:1px 6px;margin-right:4px">%s</span>' % (col, c)
                      for c, col, _ in CATEGORIES)

    def table(rows, head):
        h = "".join("<th>%s</th>" % x for x in head)
        b = "".join("<tr><td>%s</td><td>%d</td><td>%.3f</td><td>%.1f%%</td></tr>"
                    % (esc(x["name"]), x["calls"], x["ms"], 100 * x["ms"] / r["wall_ms"]) for x in rows)
        return "<table><tr>%s</tr>%s</table>" % (h, b)

    gaps = "".join("<tr><td>%.1f</td><td>%.3f</td><td>%s</td><td>%s</td><td>%s</td></tr>"
                   % (g["us"], g["at_ms"], esc(g["after"]), esc(g["before"]), esc("; ".join(g["host"])))
                   for g in r["longest_gaps"][:20])
    return """<!DOCTYPE html><html><head><meta charset="utf-8"><title>%s</title><style>
body{font-family:sans-serif;margin:16px} table{border-collapse:collapse;margin:8px 0 16px} td,th{border:1px solid #ccc;
padding:2px 6px;font-size:12px;text-align:left} .tl{overflow-x:auto;border:1px solid #ccc}</style></head><body>
<h1>%s</h1><p id="summary">wall %.2f ms, GPU busy %.2f ms, idle %.2f ms (%d gaps over 5 us: %.2f ms); %d records summing
%.2f ms, %.2f ms of it overlapped.</p><p>%s</p><div class="tl">%s</div>
<h2>By category</h2>%s<h2>Longest idle gaps</h2><table><tr><th>us</th><th>at ms</th><th>after</th><th>before</th>
<th>host calls in it</th></tr>%s</table><h2>By kernel</h2>%s</body></html>
""" % (esc(title), esc(title), r["wall_ms"], r["busy_ms"], r["idle_ms"], r["gaps_over_5us"], r["idle_in_gaps_over_5us_ms"],
       r["records"], r["summed_ms"], r["overlap_ms"], legend, "\n".join(out),
       table(r["categories"], ["category", "records", "ms", "share of wall"]), gaps,
       table(r["kernels"], ["kernel", "calls", "ms", "share of wall"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--marker", default="adamw")
    ap.add_argument("--steps", type=int, default=2, help="report the last N windows")
    ap.add_argument("--merge-ms", type=float, default=1.0,
                    help="marker kernels closer than this end one window together (default 1)")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--json")
    ap.add_argument("--html", help="the last window as an SVG timeline with the tables")
    ap.add_argument("--px-per-ms", type=float, default=40.0, help="the timeline's scale (default 40)")
    a = ap.parse_args()
    recs, apis = load(a.csv)
    if not recs:
        sys.exit("%s: no records" % a.csv)
    names = demangle([r[4] for r in recs if r[3] == "kernel"])
    for r in recs:
        names.setdefault(r[4], r[4])
    ws = windows(recs, names, a.marker, int(a.merge_ms * 1e6))
    if not ws:
        span = (recs[0][0], max(r[1] for r in recs))
        print("no two runs of marker kernels /%s/: the whole trace is one window" % a.marker)
        ws = [span]
    res = []
    for i, (t0, t1) in enumerate(ws[-a.steps:]):
        r = analyse(recs, apis, names, t0, t1, a.top)
        r["window"] = len(ws) - min(a.steps, len(ws)) + i + 1
        res.append(r)
        print("== window %d of %d (between runs of /%s/)" % (r["window"], len(ws), a.marker))
        print("wall %.2f ms, GPU busy %.2f ms, idle %.2f ms (%d gaps over 5 us: %.2f ms); %d records summing %.2f ms, "
              "%.2f ms of it overlapped" % (r["wall_ms"], r["busy_ms"], r["idle_ms"], r["gaps_over_5us"],
                                            r["idle_in_gaps_over_5us_ms"], r["records"], r["summed_ms"], r["overlap_ms"]))
        print("streams (ms of records): " + ", ".join("%s %.2f" % kv for kv in list(r["streams_ms"].items())[:10]))
        print("longest idle gaps:")
        for g in r["longest_gaps"][:15]:
            print("  %8.1f us at %7.3f ms  after %s  before %s" % (g["us"], g["at_ms"], g["after"][:55], g["before"][:55]))
            if g["host"]:
                print("             host: " + "; ".join(g["host"]))
        if r["host_api_ms"]:
            print("host time in CUDA calls (ms): " +
                  ", ".join("%s %.2f" % kv for kv in list(r["host_api_ms"].items())[:12]))
        print("by category (ms of records): " + ", ".join("%s %.2f" % (c["name"], c["ms"]) for c in r["categories"]))
        print("%-92s %6s %9s %6s" % ("kernel", "calls", "ms", "share"))
        for k in r["kernels"][:a.top]:
            print("%-92s %6d %9.3f %5.1f%%" % (k["name"], k["calls"], k["ms"], 100 * k["ms"] / r["wall_ms"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{k: v for k, v in r.items() if k not in ("timeline", "gaps")} for r in res], f, indent=1)
    if a.html:
        r = res[-1]
        page = html_page(r, "%s: window %d of %d" % (a.csv, r["window"], len(ws)), a.px_per_ms)
        with open(a.html + ".tmp", "w") as f:
            f.write(page)
        os.replace(a.html + ".tmp", a.html)


if __name__ == "__main__":
    main()
