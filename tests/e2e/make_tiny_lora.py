"""Builds a tiny LoRA adapter for the tiny model of make_tiny_model.py, in a second, with no
download: PEFT's on-disk layout (adapter_config.json + adapter_model.safetensors), rank 8, on
q_proj and v_proj of every layer, small random weights (seeded). vLLM serves it with
`--enable-lora --lora-modules NAME=OUT_DIR --max-loras 2 --max-lora-rank 8`. Runs inside the vLLM
virtual environment (it needs torch and safetensors).

    python make_tiny_lora.py MODEL_DIR OUT_DIR [RANK [SEED]]
"""

import json
import sys
from pathlib import Path


def main(model_dir: str, out: str, rank: int = 8, seed: int = 0) -> None:
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    hidden = cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
    q_out = cfg["num_attention_heads"] * head_dim
    v_out = cfg["num_key_value_heads"] * head_dim
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for proj, out_features in (("q_proj", q_out), ("v_proj", v_out)):
            base = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            tensors[f"{base}.lora_A.weight"] = (torch.randn(rank, hidden, generator=gen) * 0.01).contiguous()
            tensors[f"{base}.lora_B.weight"] = (torch.randn(out_features, rank, generator=gen) * 0.01).contiguous()
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(model_dir),
        "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "target_modules": ["q_proj", "v_proj"], "modules_to_save": None, "inference_mode": True,
    }, indent=1) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 8,
         int(sys.argv[4]) if len(sys.argv) > 4 else 0)
