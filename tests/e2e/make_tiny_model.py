"""Builds the tiny model the real-vLLM end-to-end test serves, in seconds, with no download:
a byte-level BPE tokenizer trained on a few sentences (a few hundred tokens, a chat template)
and a random-weight LlamaForCausalLM (hidden 128, 2 layers, 4 heads, 2 KV heads, 16k positions,
bfloat16). Runs inside the vLLM virtual environment (it needs torch, transformers, tokenizers).

    python make_tiny_model.py OUT_DIR
"""

import json
import sys
from pathlib import Path

SENTENCES = [
    "The on-call engineer learned that one replica was in trouble before users did.",
    "A long prompt fills the KV cache and every other request waits for its first token.",
    "Prometheus scrapes the sidecar every few seconds and evaluates the alerting rules.",
    "GPU utilization was high while tokens per second were low on the sick replica.",
    "Time to first token and inter-token latency are the service level indicators.",
    "The quick brown fox jumps over the lazy dog while the model generates text.",
] * 20


def main(out: str) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant: {% endif %}")
    fast.model_max_length = 16384
    fast.save_pretrained(out_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16384,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                      pad_token_id=fast.pad_token_id, torch_dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    (out_dir / "vocab-size.json").write_text(json.dumps({"vocab_size": len(fast)}))


if __name__ == "__main__":
    main(sys.argv[1])
