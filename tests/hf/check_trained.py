#!/usr/bin/env python3
"""A model and tokenizer trained by kiln, loaded by HF: encodings and logits must match kiln's.
Prepare with tests/hf/prepare_trained_check.py, then run where transformers exists:
    python3 tests/hf/check_trained.py devcheck
"""
import json, sys, torch
from tokenizers import Tokenizer
from safetensors.torch import load_file
from transformers import ZayaForCausalLM
d = sys.argv[1]
tok = Tokenizer.from_file(f"{d}/model/tokenizer.json")
cases = json.load(open(f"{d}/kiln_tok.json"))
bad = sum(tok.encode(c["text"], add_special_tokens=False).ids != c["ids"] for c in cases)
dec = sum(tok.decode(c["ids"], skip_special_tokens=False) != c["text"] for c in cases)
print(f"kiln-trained tokenizer in HF tokenizers {__import__('tokenizers').__version__}: {len(cases)} texts, "
      f"{bad} encodings differ from kiln's, {dec} decodes differ from the text")
ids = load_file(f"{d}/in.safetensors")["input_ids"]
ref = load_file(f"{d}/kiln_out.safetensors")
w = load_file(f"{d}/model/model.safetensors")
for dt in [torch.float64]:
    m = ZayaForCausalLM.from_pretrained(f"{d}/model", dtype=dt).eval()
    m.set_experts_implementation("eager")
    with torch.no_grad():
        raw = m(input_ids=ids, labels=ids)
        for i, l in enumerate(m.model.layers):  # the file's balancing biases (HF's loader resets the skip one)
            l.mlp.gate.balancing_biases.copy_(w[f"model.layers.{i}.mlp.gate.balancing_biases"])
        out = m(input_ids=ids, labels=ids)
    for name, o in [("HF from_pretrained", raw), ("HF with the file's biases", out)]:
        rel = float((o.logits.float() - ref["logits"]).abs().max() / ref["logits"].abs().max())
        print(f"{name}: logits rel err {rel:.2e}, loss {o.loss.item():.6f} vs kiln {ref['loss'].item():.6f}")
