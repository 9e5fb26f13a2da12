#!/usr/bin/env python3
"""kiln ckpt export-hf, checked against HF transformers' ZayaForCausalLM (run on the GPU machine,
where torch and transformers exist):

    bash -c 'source scripts/gpu_machine_build.sh && kiln_gpu_build build-gpu OFF kiln &&
             python3 tests/hf/check_export_hf.py --kiln build-gpu/kiln --work /tmp/export_hf_check'

Without --from it trains a small run first (the built-in corpus and tokenizer, prepared once under
runs/default/, then --steps steps of the built-in model into WORK/run), so the checkpoint holds trained
weights, optimizer state and moved balancing biases. Then:
  1. kiln ckpt export-hf --from RUN --to WORK/hf
  2. kiln logits on WORK/hf for random token ids (and on the trainer's own RUN/model: identical bytes)
  3. ZayaForCausalLM.from_pretrained(WORK/hf) in float64 and float32 on the same ids.
transformers 5.17's from_pretrained resets each layer's skip-class balancing bias to -1 after loading
(it re-runs the bias initialisation); kiln's checkpoint holds the trained value, so the check copies
every layer's `balancing_biases` back from model.safetensors before comparing, and also reports the
raw from_pretrained numbers to show the quirk. Exit status 1 when the logits differ by more than
--tol (relative to the largest |logit|) with the file's biases.
"""
import argparse, os, subprocess, sys

import torch
from safetensors.torch import load_file, save_file
from transformers import ZayaForCausalLM


def run(*cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln", default="build-gpu/kiln")
    ap.add_argument("--work", default="/tmp/export_hf_check")
    ap.add_argument("--from", dest="src", help="an existing run or checkpoint directory (default: train one)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--tol", type=float, default=1e-4)
    a = ap.parse_args()
    kiln = os.path.abspath(a.kiln)
    os.makedirs(a.work, exist_ok=True)
    src = a.src
    if not src:
        src = os.path.join(a.work, "run")
        run(kiln, "train", "--steps", str(a.steps), "--out", src, "--quiet")
    hf = os.path.join(a.work, "hf")
    if os.path.exists(os.path.join(hf, "model.safetensors")):
        os.remove(os.path.join(hf, "model.safetensors"))
    run(kiln, "ckpt", "export-hf", "--from", src, "--to", hf)

    cfg = __import__("json").load(open(os.path.join(hf, "config.json")))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (2, 24), generator=g, dtype=torch.int64)
    inp, kout = os.path.join(a.work, "in.safetensors"), os.path.join(a.work, "kiln_out.safetensors")
    save_file({"input_ids": ids}, inp)
    run(kiln, "logits", "--model", hf, "--input", inp, "--out", kout)
    ref = load_file(kout)
    if not a.src and os.path.exists(os.path.join(src, "model", "model.safetensors")):
        same = open(os.path.join(src, "model", "model.safetensors"), "rb").read() == open(os.path.join(hf, "model.safetensors"), "rb").read()
        print(f"export-hf model.safetensors == the trainer's own {src}/model: {same}")

    w = load_file(os.path.join(hf, "model.safetensors"))
    worst = 0.0
    for dt in (torch.float64, torch.float32):
        m = ZayaForCausalLM.from_pretrained(hf, dtype=dt).eval()
        if hasattr(m, "set_experts_implementation"):
            m.set_experts_implementation("eager")
        with torch.no_grad():
            raw = m(input_ids=ids, labels=ids)
            moved = 0
            for i, layer in enumerate(m.model.layers):
                b = layer.mlp.gate.balancing_biases
                f = w[f"model.layers.{i}.mlp.gate.balancing_biases"].to(b.dtype)
                moved += int((b != f).sum())
                b.copy_(f)
            out = m(input_ids=ids, labels=ids)
        print(f"{dt}: from_pretrained left {moved} balancing-bias entries different from the file (the skip-class reset)")
        for name, o in (("raw from_pretrained", raw), ("with the file's balancing biases", out)):
            rel = float((o.logits.double() - ref["logits"].double()).abs().max() / ref["logits"].double().abs().max())
            print(f"  {name}: logits max rel err {rel:.2e}, loss {o.loss.item():.6f} vs kiln {ref['loss'].item():.6f}")
        worst = max(worst, rel)
    ok = worst <= a.tol
    print(f"{'PASS' if ok else 'FAIL'}: exported checkpoint vs HF ZayaForCausalLM, worst logits rel err {worst:.2e} (tol {a.tol:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
