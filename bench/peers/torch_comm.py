#!/usr/bin/env python3
"""The peer of `kiln bench comm --backend nccl`: the same five collectives through torch.distributed (NCCL),
timed the same way (per call: the collective, then torch.cuda.synchronize(); wall clock; the slowest
rank's mean), with nccl-tests' bus-bandwidth factors (and kiln's 0 on one rank). Launch with torchrun --nproc_per_node N.
Prints one JSON object on rank 0: {"torch": version, "nccl": version, "ranks": N, "comm": [records]}.
Usage: torch_comm.py MINBYTES MAXBYTES DTYPE(float|bfloat16) [ITERS] [WARMUP]"""
import json, os, sys, time
import torch
import torch.distributed as dist

def busbw_factor(coll, n):
    # kiln's convention (src/bench/comm_formulas.h): one rank moves nothing between ranks, broadcast included
    if n <= 1:
        return 0.0
    if coll == "all_reduce":
        return 2 * (n - 1) / n
    if coll in ("reduce_scatter", "all_gather", "alltoall"):
        return (n - 1) / n
    return 1.0

def main():
    minb, maxb = int(sys.argv[1]), int(sys.argv[2])
    dtype = {"float": torch.float32, "bfloat16": torch.bfloat16}[sys.argv[3]]
    iters = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    warmup = int(sys.argv[5]) if len(sys.argv) > 5 else 5
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, n = dist.get_rank(), dist.get_world_size()
    ts = torch.tensor([], dtype=dtype).element_size()
    big_a = torch.ones(maxb // ts + 64, dtype=dtype, device="cuda")
    big_b = torch.zeros_like(big_a)
    recs = []
    for coll in ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "alltoall"]:
        s = minb
        while s <= maxb:
            # kiln's counts (comm_formulas.h): whole elements, and a multiple of the ranks where blocks are per rank
            count = s // ts // n * n if coll in ("reduce_scatter", "all_gather", "alltoall") else s // ts
            blk = count // n
            if count == 0:
                s *= 2
                continue
            a, b = big_a[:count], big_b[:count]
            if coll == "all_reduce":
                f = lambda: dist.all_reduce(b)
            elif coll == "reduce_scatter":
                f = lambda: dist.reduce_scatter_tensor(b[:blk], a)
            elif coll == "all_gather":
                f = lambda: dist.all_gather_into_tensor(b, a[:blk])
            elif coll == "broadcast":
                f = lambda: dist.broadcast(b, 0)
            else:
                f = lambda: dist.all_to_all_single(b, a)
            for _ in range(warmup):
                f()
            torch.cuda.synchronize()
            dist.barrier()
            t = []
            for _ in range(iters):
                t0 = time.perf_counter()
                f()
                torch.cuda.synchronize()
                t.append((time.perf_counter() - t0) * 1e6)
            avg = torch.tensor([sum(t) / len(t)], dtype=torch.float64, device="cuda")
            dist.all_reduce(avg, op=dist.ReduceOp.MAX)
            us = avg.item()
            nbytes = count * ts
            algbw = nbytes / (us * 1e-6) / 1e9
            if n == 1 and coll in ("all_reduce", "broadcast"):
                algbw = 0.0  # in place on one rank nothing moves (kiln's "moved": none)
            recs.append({"collective": coll, "bytes": nbytes, "count": count, "ranks": n, "time_us_avg": us,
                         "algbw_gbs": algbw, "busbw_gbs": algbw * busbw_factor(coll, n)})
            s *= 2
    if rank == 0:
        v = torch.cuda.nccl.version()
        print(json.dumps({"torch": torch.__version__, "nccl": ".".join(map(str, v)) if isinstance(v, tuple) else str(v),
                          "ranks": n, "dtype": sys.argv[3], "comm": recs}))
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
