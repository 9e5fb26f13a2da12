#!/usr/bin/env python3
"""Prepare the check that a model and tokenizer trained by kiln load in HF (run here, no deps):
    python3 tests/hf/prepare_trained_check.py runs/default/model devcheck
copies the model (with its tokenizer.json), encodes the multilingual test text with
`kiln tokenizer encode`, runs `kiln logits` on a few tokens, and leaves devcheck/ for
tests/hf/check_trained.py, which runs where transformers and tokenizers exist:
    python3 tests/hf/check_trained.py devcheck
"""
import json, os, shutil, struct, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.path.join(ROOT, "build", "kiln")


def main():
    model, out = sys.argv[1], sys.argv[2]
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(model, os.path.join(out, "model"))
    tok = os.path.join(out, "model", "tokenizer.json")
    text = open(os.path.join(ROOT, "tests/fixtures/tokenizer/multilingual.txt"), encoding="utf-8", newline="").read()
    cases = []
    for t in [l for l in text.split("\n") if l] + [text, "Anna went to the park with the dog. Ben said, \"Thank you!\"\n\n  x\t"]:
        r = subprocess.run([KILN, "tokenizer", "encode", "--tokenizer", tok, "--text", t], capture_output=True, text=True, check=True)
        cases.append({"text": t, "ids": [int(x) for x in r.stdout.strip().split(",")] if r.stdout.strip() else []})
    json.dump(cases, open(os.path.join(out, "kiln_tok.json"), "w"))
    ids = cases[-1]["ids"][:24]
    B, T = 2, len(ids) // 2
    data = struct.pack("<%dq" % (B * T), *ids[: B * T])
    hdr = json.dumps({"input_ids": {"dtype": "I64", "shape": [B, T], "data_offsets": [0, len(data)]}}).encode()
    hdr += b" " * ((8 - len(hdr) % 8) % 8)
    open(os.path.join(out, "in.safetensors"), "wb").write(struct.pack("<Q", len(hdr)) + hdr + data)
    subprocess.run([KILN, "logits", "--model", os.path.join(out, "model"), "--input", os.path.join(out, "in.safetensors"),
                    "--out", os.path.join(out, "kiln_out.safetensors")], check=True)


if __name__ == "__main__":
    main()
