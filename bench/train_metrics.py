# kiln train's RUN_DIR/metrics.jsonl as the benchmarks read it (bench/cuda_train.sh, bench/multi_gpu.sh).
import json


def rows(run_dir):
    return [json.loads(l) for l in open(f"{run_dir}/metrics.jsonl")]


def steady_tokens_per_s(rs, warm=3, profiled_last=True):
    """Tokens a second over the steps after the first `warm` (start-up, autotuning). tokens_per_s in the metrics
    is cumulative (tokens / elapsed), so each step's elapsed time is recovered from it. With profiled_last, the last
    step (timed with per-op CUDA events under KILN_CUDA_PROFILE) is left out when there are enough others.
    Returns (tokens/s, first step timed, last step timed)."""
    el = [(r["step"], r["tokens"], r["tokens"] / r["tokens_per_s"]) for r in rs if r["tokens_per_s"] > 0]
    warm = max(0, min(warm, len(el) - 2))
    s0, t0, e0 = el[warm]
    s1, t1, e1 = el[-2] if profiled_last and len(el) - warm > 3 else el[-1]
    return (t1 - t0) / (e1 - e0), s0 + 1, s1


def losses(rs):
    return {r["step"]: r["loss"] for r in rs}


def worst_rel(a, b, steps):
    """The largest |a - b| / |b| over the given steps, and where (step); steps missing from either count as inf."""
    w, at = 0.0, None
    for s in steps:
        d = abs(a[s] - b[s]) / max(abs(b[s]), 1e-30) if s in a and s in b else float("inf")
        if not d <= w:
            w, at = d, s
    return w, at
