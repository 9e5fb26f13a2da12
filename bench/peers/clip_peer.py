#!/usr/bin/env python3
"""The peer of kiln's CLIP image embedder (bench/clip_bench.sh): transformers CLIPModel on the CPU in
fp32, same machine, same thread count, same random weights and pixels.

  clip_peer.py make NAME DIR            a random-weight CLIPModel (ViT-B/32 or ViT-L/14 config) saved
                                        with save_pretrained, plus the tokenizer and processor files
                                        kiln's loader wants, and DIR/pixels.safetensors (pixel_values
                                        [BATCH,3,S,S], seeded) for both sides
  clip_peer.py time DIR BATCH ITERS THREADS [cpu|cuda]
                                        torch images/s of get_image_features (+ L2 normalisation) on
                                        those pixels; on the CPU in fp32 (writes DIR/torch_embeds.safetensors
                                        so kiln's numbers can be checked against it), on CUDA in bf16, timed
                                        both with the pixels already on the GPU and from host pixels to host
                                        embeddings (what kiln's API does); on CUDA also the bf16 embeddings'
                                        error against DIR/torch_embeds.safetensors (the fp32 reference kiln's
                                        side is checked against, by the same metric); prints one JSON object
"""
import json
import os
import shutil
import sys
import time

import torch
from safetensors.torch import save_file

CONFIGS = {
    # openai/clip-vit-base-patch32 and clip-vit-large-patch14 shapes (text towers as in those checkpoints)
    "vit-b-32": dict(projection_dim=512,
                     text=dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8),
                     vision=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                                 image_size=224, patch_size=32)),
    "vit-l-14": dict(projection_dim=768,
                     text=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12),
                     vision=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                                 image_size=224, patch_size=14)),
}
PIXEL_BATCH = 256


def make(name, d):
    from transformers import CLIPConfig, CLIPModel

    spec = CONFIGS[name]
    os.makedirs(d, exist_ok=True)
    here = os.path.dirname(os.path.abspath(__file__))
    fixture = os.path.join(here, "..", "..", "tests", "fixtures", "clip", "tiny_quickgelu")
    # the text tower's special ids are the small tokenizer's (copied below), so that kiln's loader does not warn
    # that texts would pool at their first token
    with open(os.path.join(fixture, "config.json")) as f:
        text = json.load(f)["text_config"]
    ids = {k: text[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    torch.manual_seed(0)
    cfg = CLIPConfig(text_config=dict(spec["text"], hidden_act="quick_gelu", max_position_embeddings=77, **ids),
                     vision_config=dict(spec["vision"], hidden_act="quick_gelu"), projection_dim=spec["projection_dim"])
    # random init on the GPU when there is one (L/14's 428M parameters take ~40 s to initialise on the
    # CPU); both sides then read the same saved file
    try:
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = CLIPModel(cfg).eval()
    except Exception as e:  # a GPU init problem costs time, not the run
        print(f"clip_peer: GPU init failed ({e}); initialising on the CPU", file=sys.stderr)
        torch.manual_seed(0)
        model = CLIPModel(cfg).eval()
    model.save_pretrained(d)
    del model
    # a small CLIP tokenizer (the fixture's): the benchmark embeds images, the loader wants one
    shutil.copy(os.path.join(fixture, "tokenizer.json"), os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "preprocessor_config.json"), "w") as f:
        json.dump({"crop_size": {"height": 224, "width": 224}, "do_center_crop": True, "do_normalize": True,
                   "do_rescale": True, "do_resize": True, "resample": 3, "rescale_factor": 1 / 255,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073],
                   "image_std": [0.26862954, 0.26130258, 0.27577711], "size": {"shortest_edge": 224}}, f)
    g = torch.Generator().manual_seed(1)
    px = torch.randn(PIXEL_BATCH, 3, 224, 224, generator=g, dtype=torch.float32)
    save_file({"pixel_values": px}, os.path.join(d, "pixels.safetensors"))


def timed_cuda(d, batch, iters):
    from safetensors.torch import load_file
    from transformers import CLIPModel

    model = CLIPModel.from_pretrained(d, dtype=torch.bfloat16).to("cuda").eval()
    host = load_file(os.path.join(d, "pixels.safetensors"))["pixel_values"][:batch].contiguous().pin_memory()
    dev = host.to("cuda", torch.bfloat16)

    def run(px):
        feats = model.visual_projection(model.vision_model(pixel_values=px).pooler_output)
        return feats / feats.norm(dim=-1, keepdim=True)

    def clock(f):
        with torch.inference_mode():
            for _ in range(3):
                f()
            torch.cuda.synchronize()
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                f()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    resident = clock(lambda: run(dev))
    roundtrip = clock(lambda: run(host.to("cuda", non_blocking=True).to(torch.bfloat16)).float().cpu())
    # the peer's own precision, by kiln_bench_clip's metric against the same fp32 CPU reference (its first
    # rows): max |e - ref| / max |ref| and the worst cosine per row. e: the bf16 model's projected features
    # (as get_image_features returns them), L2-normalised in f64, so the bf16 tower is measured and not a
    # bf16 rounding of the unit vectors (kiln's side returns f32 unit vectors)
    rel_err = worst_cos = None
    ref_path = os.path.join(d, "torch_embeds.safetensors")
    if os.path.exists(ref_path):
        ref = load_file(ref_path)["image_embeds"].double()
        with torch.inference_mode():
            feats = model.visual_projection(model.vision_model(pixel_values=dev).pooler_output).double().cpu()
        n = min(ref.shape[0], feats.shape[0])
        e, ref = feats[:n] / feats[:n].norm(dim=-1, keepdim=True), ref[:n]
        rel_err = ((e - ref).abs().max() / ref.abs().max()).item()
        worst_cos = torch.nn.functional.cosine_similarity(e, ref, dim=1).min().item()
    print(json.dumps({"side": "torch", "device": "cuda", "dtype": "bf16", "batch": batch, "iters": iters,
                      "images_per_s_median": batch / roundtrip, "images_per_s_resident": batch / resident,
                      "rel_err_vs_ref": rel_err, "worst_cosine_vs_ref": worst_cos,
                      "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                      "attn": getattr(model.config, "_attn_implementation", None)}))


def timed(d, batch, iters, threads):
    from safetensors.torch import load_file
    from transformers import CLIPModel

    torch.set_num_threads(threads)
    model = CLIPModel.from_pretrained(d, dtype=torch.float32).eval()
    px = load_file(os.path.join(d, "pixels.safetensors"))["pixel_values"][:batch].contiguous()

    def run():  # what get_image_features computes, spelled out (its return type changed across versions)
        feats = model.visual_projection(model.vision_model(pixel_values=px).pooler_output)
        return feats / feats.norm(dim=-1, keepdim=True)

    with torch.inference_mode():
        emb = run()  # warm-up
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
    save_file({"image_embeds": emb.contiguous()}, os.path.join(d, "torch_embeds.safetensors"))
    best, med = min(times), sorted(times)[len(times) // 2]
    print(json.dumps({"side": "torch", "device": "cpu", "batch": batch, "threads": threads, "iters": iters,
                      "images_per_s_median": batch / med, "images_per_s_best": batch / best,
                      "torch": torch.__version__, "sdpa": getattr(model.config, "_attn_implementation", None)}))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    elif sys.argv[1] == "time" and len(sys.argv) > 6 and sys.argv[6] == "cuda":
        timed_cuda(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif sys.argv[1] == "time":
        timed(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit(__doc__)
