# Copied from /work/shared/peers/hf_zaya_train.py (the [cuda] issue's peer measurement, as provided to this
# project); the method and every number are unchanged. Added only: a last JSON line with the same
# quantities, for bench/cuda_train.sh to read.
# Peer measurement: HF transformers ZayaForCausalLM training throughput on one GPU (random init, reduced depth
# and vocab), bf16 autocast + fused AdamW. Usage on the GPU machine: python3 hf_zaya_train.py [layers]
import time, sys, torch, transformers
from transformers import ZayaConfig, ZayaForCausalLM
torch.manual_seed(0)
L = int(sys.argv[1]) if len(sys.argv) > 1 else 8
cfg = ZayaConfig(vocab_size=50304, num_hidden_layers=L, layer_types=['hybrid']*L, max_position_embeddings=4096)
m = ZayaForCausalLM(cfg).cuda()
total = sum(p.numel() for p in m.parameters())
expert = sum(p.numel() for n,p in m.named_parameters() if "experts" in n)
active = total - expert + expert*cfg.num_experts_per_tok//cfg.num_experts
print(f"transformers {transformers.__version__}: layers {L} total {total/1e6:.0f}M expert {expert/1e6:.0f}M active~{active/1e6:.0f}M")
opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
B,T = 4,4096
x = torch.randint(0, cfg.vocab_size, (B,T), device='cuda')
def step():
    with torch.autocast('cuda', dtype=torch.bfloat16):
        out = m(input_ids=x, labels=x)
    out.loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    return out.loss
for _ in range(3): step()
torch.cuda.synchronize(); t=time.time(); n=8
for _ in range(n): l=step()
torch.cuda.synchronize(); dt=(time.time()-t)/n
tok=B*T/dt
flops_tok = 6*active + 6*L*1024*T  # 8 q heads x 128 = 1024 latent; rough attention term
print(f"hf zaya train: {dt*1000:.0f} ms/step, {tok:.0f} tok/s, est MFU {flops_tok*tok/989e12*100:.1f}% of 989 TF, peak mem {torch.cuda.max_memory_allocated()/2**30:.1f} GiB, loss {l.item():.3f}")
import json
print(json.dumps({"peer": "hf_zaya_train", "transformers": transformers.__version__, "torch": torch.__version__,
                  "layers": L, "B": B, "T": T, "total_params": total, "expert_params": expert, "active_params": active,
                  "ms_per_step": dt * 1000, "tokens_per_s": tok, "flops_per_token_peer": flops_tok,
                  "mfu_peer": flops_tok * tok / 989e12, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
                  "loss": l.item()}))
