#!/usr/bin/env python3
"""Run a command while sampling GPU 0's power draw, SM clock and clock-limit reasons with nvidia-smi.

    python3 bench/peers/gpu_power.py OUT.jsonl LABEL -- command [args...]

Why: on an H200 a sustained tensor-core load hits the board's power limit, and the driver then lowers the SM
clock until the draw fits under it. Two programs doing the same work compete on energy per item, not only
on kernel speed, and the clock each one ran at explains the spread between runs on different chips. The
command's output passes through untouched; one JSON line per call is appended to OUT.jsonl and a summary
line goes to stderr: the busy samples only (draw at or above 40% of the limit), their mean draw and SM clock,
and the share of them with the software power cap (reason bit 0x4) set. Exit status: the command's.
"""
import json
import shutil
import subprocess
import sys
import tempfile
import time

FIELDS = ("power.draw", "power.limit", "clocks.sm", "clocks_event_reasons.active")
OLD_REASONS = "clocks_throttle_reasons.active"  # the same field's name before driver 535


def sampler(sink):
    """nvidia-smi writing a line every 50 ms into sink (a file: a pipe left unread would fill and stall it)"""
    if shutil.which("nvidia-smi") is None:
        return None
    for reasons in (FIELDS[3], OLD_REASONS):
        q = ",".join(FIELDS[:3] + (reasons,))
        probe = subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={q}", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True)
        if probe.returncode == 0:
            return subprocess.Popen(["nvidia-smi", "-i", "0", f"--query-gpu={q}", "--format=csv,noheader,nounits",
                                     "-lms", "50"], stdout=sink, stderr=subprocess.DEVNULL)
    return None


def summarise(lines):
    rows = []
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        try:
            rows.append((float(parts[0]), float(parts[1]), float(parts[2]), int(parts[3], 16)))
        except (ValueError, IndexError):
            continue  # "[N/A]" or a torn line
    if not rows:
        return {"samples": 0}
    limit = max(r[1] for r in rows)
    busy = [r for r in rows if r[0] >= 0.4 * limit]
    out = {"samples": len(rows), "busy_samples": len(busy), "power_limit_w": limit}
    if busy:
        out.update(power_mean_w=sum(r[0] for r in busy) / len(busy), power_max_w=max(r[0] for r in busy),
                   sm_clock_mean_mhz=sum(r[2] for r in busy) / len(busy), sm_clock_min_mhz=min(r[2] for r in busy),
                   power_capped_share=sum(1 for r in busy if r[3] & 0x4) / len(busy))
    return out


def main():
    if len(sys.argv) < 5 or sys.argv[3] != "--":
        sys.exit("usage: gpu_power.py OUT.jsonl LABEL -- command [args...]")
    path, label, cmd = sys.argv[1], sys.argv[2], sys.argv[4:]
    with tempfile.TemporaryFile("w+") as sink:
        s = sampler(sink)
        t0 = time.time()
        rc = subprocess.call(cmd)
        wall = time.time() - t0
        res = {"label": label, "wall_s": wall}
        if s is None:
            res["samples"] = 0
            res["note"] = "nvidia-smi gave no power readings"
        else:
            s.terminate()
            s.wait()
            sink.seek(0)
            res.update(summarise(sink.read().splitlines()))
    with open(path, "a") as f:
        f.write(json.dumps(res) + "\n")
    if res.get("busy_samples"):
        print(f"power {label}: {res['busy_samples']} busy samples, {res['power_mean_w']:.0f} W mean (limit "
              f"{res['power_limit_w']:.0f}), SM clock {res['sm_clock_mean_mhz']:.0f} MHz mean "
              f"({res['sm_clock_min_mhz']:.0f} min), power-capped in {100 * res['power_capped_share']:.0f}% of them",
              file=sys.stderr)
    else:
        print(f"power {label}: no busy samples ({res.get('samples', 0)} in all)", file=sys.stderr)
    sys.exit(rc)


if __name__ == "__main__":
    main()
