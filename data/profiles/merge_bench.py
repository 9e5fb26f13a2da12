#!/usr/bin/env python3
"""Fold `kiln bench` measurements into a `kiln size` hardware profile (data/profiles/NAME.json), in place.

The same selection as `kiln size --bench` (src/sizing/hw.c): bf16 gemm records replace gemm.records;
the best GPU membw copy replaces memory.achieved_gbs; reduce_scatter/all_gather records over 2+ ranks
(measured over GPUs: the nccl backend) replace comm.records; full-causal bf16 attention records off the CPU (`kiln bench
attention --device cuda`, a fwd and the matching fwd_bwd per shape; per head dim the one with the most
work) replace attention.records. Each replaced section's `source` names the files. kiln's own timed
kernels go to the kiln_kernels section: attention fwd/bwd per full-causal shape, the expert op (balanced
routing) fwd/bwd per shape, the GPU copy sweep (bytes moved per kernel -> GB/s); kiln_kernels.rates (class
rates of a calibration run) are written by bench/size_validate.sh, not here.

usage: merge_bench.py PROFILE.json BENCH.json [BENCH.json ...]
"""
import datetime
import json
import os
import sys
import tempfile


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    path, benches = argv[1], argv[2:]
    with open(path) as f:
        prof = json.load(f)
    if prof.get("kiln_hw_profile") != 1:
        sys.exit(f"{path}: not a kiln_hw_profile 1 file")
    gemm, comm, copy, attn = [], [], 0.0, {}
    # kiln's own timed kernels (the kiln_kernels section, as kiln size --bench reads them): a shape measured
    # again replaces the earlier record
    k_attn, k_moe, k_copy = {}, {}, {}
    for b in benches:
        with open(b) as f:
            p = json.load(f)
        if p.get("kiln_profile") != 1:
            sys.exit(f"{b}: not a kiln bench profile (kiln_profile 1)")
        for r in p.get("gemm", []):
            if r.get("dtype") == "bf16" and r.get("tflops", 0) > 0:
                gemm.append({k: r[k] for k in ("dtype", "m", "n", "k", "tflops")})
        for r in p.get("membw", []):
            if r.get("device") != "cpu" and r.get("kernel") == "copy":
                copy = max(copy, r.get("gbs_best", 0))
                # the sweep: the GPU's own copy kernel, not the pinned host<->device copies (h2d, d2h)
                if r.get("device") == "cuda" and r.get("gbs_best", 0) > 0 and r.get("bytes_per_array", 0) > 0:
                    k_copy[2 * r["bytes_per_array"]] = r["gbs_best"]
        moe = p.get("moe", [])
        # with several grouped-GEMM paths timed, the one the trainer runs (default_path)
        any_default = any(x.get("default_path") is True for x in moe)
        for r in moe:
            if r.get("backend") != "cuda" or r.get("part") != "op" or r.get("routing") != "balanced" or r.get("pass") != "fwd":
                continue
            if any_default and r.get("default_path") is not True:
                continue
            key = ("tokens", "hidden", "inter", "experts", "top_k", "path")
            both = [x for x in moe if x.get("backend") == "cuda" and x.get("part") == "op" and x.get("routing") == "balanced"
                    and x.get("pass") == "fwd_bwd" and all(x.get(k) == r.get(k) for k in key)]
            if both and 0 < r.get("time_us", 0) < both[0]["time_us"]:
                k_moe[tuple(r[k] for k in key[:5])] = (r["time_us"], both[0]["time_us"] - r["time_us"])
        recs = p.get("attention", [])
        for r in recs:
            # `kiln bench attention --device cuda`: full-causal bf16 records off the CPU, a fwd and the matching
            # fwd_bwd per shape; per head dim the one with the most work (as kiln size --bench reads them)
            if r.get("backend") == "cpu" or r.get("dtype") != "bf16" or r.get("pass") != "fwd" or r.get("window", 0):
                continue
            key = ("device", "backend", "impl", "dtype", "batch", "seq", "heads", "kv_heads", "head_dim", "window")
            both = [x for x in recs if x.get("pass") == "fwd_bwd" and all(x.get(k) == r.get(k) for k in key)]
            if not both or r.get("time_us", 0) <= 0 or both[0]["time_us"] <= r["time_us"]:
                continue
            if "kv_heads" in r:
                k_attn[tuple(r[k] for k in ("batch", "seq", "heads", "kv_heads", "head_dim"))] = (
                    r["time_us"], both[0]["time_us"] - r["time_us"])
            fwd = r["flops"] / (r["time_us"] * 1e-6) / 1e12
            bwd = 2.5 * r["flops"] / ((both[0]["time_us"] - r["time_us"]) * 1e-6) / 1e12
            work = r["batch"] * r["seq"] * r["seq"]
            if r["head_dim"] not in attn or work > attn[r["head_dim"]][0]:
                attn[r["head_dim"]] = (work, fwd, bwd)
        for r in p.get("comm", []):
            if (r.get("collective") in ("reduce_scatter", "all_gather") and r.get("backend") == "nccl"
                    and r.get("ranks", 0) >= 2 and r.get("busbw_gbs", 0) > 0 and r.get("bytes", 0) > 0):
                comm.append({k: r[k] for k in ("collective", "bytes", "ranks", "busbw_gbs")})
    if not (gemm or comm or copy or attn or k_moe):
        sys.exit("no GPU measurements in " + " ".join(benches))
    day = datetime.date.today().isoformat()
    names = ", ".join(os.path.basename(b) for b in benches)
    if gemm:
        prof["gemm"] = {"source": f"measured {day}: kiln bench gemm --device cuda --dtype bf16 ({names})",
                        "records": gemm}
    if copy:
        prof["memory"]["achieved_gbs"] = round(copy, 1)
        prof["memory"]["source"] = f"{prof['memory']['source'].split(';')[0]}; achieved: measured {day}, kiln bench membw --device cuda copy"
    if comm:
        prof["comm"] = {"source": f"measured {day}: kiln bench comm --backend nccl ({names})", "records": comm}
    if attn:
        peak = prof["compute"]["peak_tflops"]["bf16"]
        prof["attention"]["records"] = [{"head_dim": d, "fwd_eff": round(f / peak, 4), "bwd_eff": round(bw / peak, 4)}
                                        for d, (_, f, bw) in sorted(attn.items())]
        prof["attention"]["source"] = f"measured {day}: kiln bench attention --device cuda ({names})"
    if k_attn or k_moe or k_copy:
        kk = prof.get("kiln_kernels", {})
        old_a = {tuple(x[k] for k in ("batch", "seq", "heads", "kv_heads", "head_dim")): x for x in kk.get("attention", [])}
        for key, (f, b) in k_attn.items():
            old_a[key] = dict(zip(("batch", "seq", "heads", "kv_heads", "head_dim"), key), window=0, fwd_us=f, bwd_us=b)
        old_m = {tuple(x[k] for k in ("tokens", "hidden", "inter", "experts", "top_k")): x for x in kk.get("moe", [])}
        for key, (f, b) in k_moe.items():
            old_m[key] = dict(zip(("tokens", "hidden", "inter", "experts", "top_k"), key), fwd_us=f, bwd_us=b)
        old_c = {x["bytes"]: x for x in kk.get("copy_sweep", [])}
        for b, g in k_copy.items():
            old_c[b] = {"bytes": b, "gbs": g}
        kk.update({"source": f"measured {day}: kiln bench attention/moe/membw --device cuda ({names})",
                   "attention": list(old_a.values()), "moe": list(old_m.values()),
                   "copy_sweep": sorted(old_c.values(), key=lambda x: x["bytes"])})
        kk.setdefault("rates", [])
        prof["kiln_kernels"] = kk
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(prof, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


if __name__ == "__main__":
    main(sys.argv)
