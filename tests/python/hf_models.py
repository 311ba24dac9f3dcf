"""Small random Hugging Face models and their reference outputs, for tests/nn/test_pretrained*.cc.

  hf_models.py cases ROOT NAME=ARCH[,--untied|,--tied][,--shard][,--f16|,--bf16][,--ids|,--default_ids]
                    [,--sampling][,--tokenizer][,--generate,N] ...
      per case, a random model saved with save_pretrained in ROOT/NAME/model (in f16 or bf16; with
      special ids, or transformers' defaults; with sampling defaults in generation_config.json; with
      a small word-level tokenizer), and
      ROOT/NAME/ref.safetensors: a random batch ("tokens", "targets" i32 [B, S], "prompt" [B, P])
      and transformers' outputs on it: "logits", "loss", "grad.<name>" per parameter, greedy
      "generated" [B, N]
  hf_models.py logits MODEL_DIR REF OUT [MODEL_DIR REF OUT ...]
      OUT gets the "logits" of the model in MODEL_DIR (e.g. one we exported) on REF's tokens
  hf_models.py roundtrip OUT_JSON SOURCE EXPORT [SOURCE EXPORT ...]
      OUT_JSON gets, per EXPORT (a model we saved from SOURCE), what transformers reads from each
      of the two: the dtype from_pretrained(dtype="auto") picks, config.json's special ids, the
      generation config, and the ids the tokenizer (when there is one) gives a text with its
      special ids
  hf_models.py decode MODEL_DIR TOKENIZER_DIR OUT_JSON N PROMPT [PROMPT ...]
      a random Llama over the tokenizer in TOKENIZER_DIR (its bos/eos), saved with the tokenizer
      files in MODEL_DIR; OUT_JSON gets, per prompt, AutoTokenizer's ids (with its special tokens)
      and generate()'s greedy new ids (up to N, stopping at the EOS)
  hf_models.py check OUT_JSON N MODEL_DIR PROMPTS [MODEL_DIR PROMPTS ...]
      for a model we exported (PROMPTS: "1,2,3;4,5"): OUT_JSON gets, per MODEL_DIR, the dtype
      from_pretrained(dtype="auto") picks, the special ids transformers read (config and
      generation_config), greedy generate() of up to N new tokens of each prompt alone with the
      ids of generation_config.json (it stops at EOS), and the f32 logits of the first prompt

One process handles every case: importing torch costs seconds.

Nothing is downloaded: configs are built here and weights drawn at random.
"""
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file


def make_config(arch, tied, flags):
    # No special ids, or (--ids) some, or (--default_ids) the class defaults (GPT-2's 50256, beyond
    # this vocabulary).
    ids = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if "--ids" in flags:
        ids = dict(bos_token_id=1, eos_token_id=[2, 5], pad_token_id=0)
    elif "--default_ids" in flags:
        ids = {}
    common = dict(vocab_size=96, max_position_embeddings=64, **ids)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids,
                                      tie_word_embeddings=True if tied is None else tied)
        return cfg, transformers.GPT2LMHeadModel
    llama_like = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, rms_norm_eps=1e-5, **common)
    if arch == "llama":
        # Llama 3 shape: GQA, large theta and llama3 rope scaling.
        cfg = transformers.LlamaConfig(
            **llama_like, tie_word_embeddings=False if tied is None else tied,
            rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                 high_freq_factor=4.0, original_max_position_embeddings=16))
        return cfg, transformers.LlamaForCausalLM
    if arch == "llama2":
        cfg = transformers.LlamaConfig(**{**llama_like, "num_key_value_heads": 4},
                                       tie_word_embeddings=False if tied is None else tied)
        return cfg, transformers.LlamaForCausalLM
    if arch == "mistral":
        cfg = transformers.MistralConfig(**llama_like, sliding_window=4,
                                         tie_word_embeddings=False if tied is None else tied)
        return cfg, transformers.MistralForCausalLM
    if arch == "qwen2":
        cfg = transformers.Qwen2Config(**llama_like, tie_word_embeddings=True if tied is None else tied)
        return cfg, transformers.Qwen2ForCausalLM
    raise SystemExit(f"unknown arch {arch}")


def write_tokenizer(out_dir):
    """A small word-level tokenizer (tokenizer.json and tokenizer_config.json) beside the model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["<unk>", "<s>", "</s>"] + [chr(ord("a") + i) for i in range(26)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                         eos_token="</s>").save_pretrained(out_dir)


def make(arch, out_dir, flags):
    tied = True if "--tied" in flags else False if "--untied" in flags else None
    cfg, cls = make_config(arch, tied, flags)
    torch.manual_seed(0)
    model = cls(cfg).float()
    # Random values everywhere (HF zero-inits biases), norms near one.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if name.endswith("weight") else 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    if "--sampling" in flags:  # a generation config beyond the ids
        model.generation_config.update(do_sample=True, temperature=0.7, top_p=0.9, top_k=20, repetition_penalty=1.1,
                                       max_new_tokens=40)
    for flag, dtype in (("--f16", torch.float16), ("--bf16", torch.bfloat16)):
        if flag in flags:
            model = model.to(dtype)
    kw = dict(max_shard_size="20KB") if "--shard" in flags else {}
    model.save_pretrained(out_dir, safe_serialization=True, **kw)
    if "--tokenizer" in flags:
        write_tokenizer(out_dir)


def load(model_dir):
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32,
                                                              attn_implementation="eager")
    model.eval()
    return model


def reference(model_dir, out_path, flags):
    model = load(model_dir)
    g = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    batch = {"tokens": torch.randint(0, vocab, (2, 12), generator=g, dtype=torch.int32),
             "targets": torch.randint(0, vocab, (2, 12), generator=g, dtype=torch.int32),
             "prompt": torch.randint(0, vocab, (2, 8), generator=g, dtype=torch.int32)}
    tokens, targets = batch["tokens"].long(), batch["targets"].long()
    # With a pad_token_id, the embedding's padding_idx row gets no gradient in torch; ours trains
    # every row, so compare gradients as if there were none.
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding):
            m.padding_idx = None
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    out = dict(batch)
    out.update({"logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)})
    for name, p in model.named_parameters():
        out["grad." + name] = p.grad.detach().contiguous()
    if "--generate" in flags:
        n = int(flags[flags.index("--generate") + 1])
        # Greedy with no EOS and none of the model's sampling defaults (generate() fills what a
        # generation_config argument leaves unset from the model's): the test decodes n tokens.
        model.generation_config = transformers.GenerationConfig()
        with torch.no_grad():
            ids = model.generate(batch["prompt"].long(), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 pad_token_id=0, attention_mask=torch.ones_like(batch["prompt"].long()))
        out["generated"] = ids[:, batch["prompt"].shape[1]:].to(torch.int32).contiguous()
    save_file(out, out_path)


def described(model_dir):
    """What transformers reads from a model directory, but the weights: the dtype it picks, the
    config's special ids, the generation config, and the tokenizer's ids of a text (if any)."""
    import os
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    gc = model.generation_config.to_dict()
    for key in ("transformers_version", "_from_model_config"):
        gc.pop(key, None)
    c = model.config
    out = {"dtype": str(model.dtype).replace("torch.", ""),
           "config_ids": [c.bos_token_id, c.eos_token_id, c.pad_token_id], "generation": gc, "tokenizer": None}
    if any(os.path.exists(os.path.join(model_dir, f)) for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        tok = transformers.AutoTokenizer.from_pretrained(model_dir)
        out["tokenizer"] = [tok("a b c")["input_ids"], tok.bos_token_id, tok.eos_token_id, tok.pad_token_id]
    return out


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "cases":
        for spec in args[1:]:
            name, rest = spec.split("=")
            arch, *flags = rest.split(",")
            case_dir = f"{args[0]}/{name}"
            make(arch, case_dir + "/model", flags)
            reference(case_dir + "/model", case_dir + "/ref.safetensors", flags)
    elif cmd == "logits":
        for i in range(0, len(args), 3):
            with torch.no_grad():
                logits = load(args[i])(load_file(args[i + 1])["tokens"].long()).logits
            save_file({"logits": logits.contiguous()}, args[i + 2])
    elif cmd == "roundtrip":
        import json
        out = {args[i + 1]: {"source": described(args[i]), "export": described(args[i + 1])}
               for i in range(1, len(args), 2)}
        with open(args[0], "w") as f:
            json.dump(out, f)
    elif cmd == "decode":
        import json
        import os
        import shutil
        model_dir, tok_dir, out_path, n, prompts = args[0], args[1], args[2], int(args[3]), args[4:]
        tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
        cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=None)
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(1.0 + 0.1 * torch.randn_like(p) if "norm" in name else 0.3 * torch.randn_like(p))
        model.save_pretrained(model_dir, safe_serialization=True)
        for f in os.listdir(tok_dir):
            if f.startswith("tokenizer"):
                shutil.copy(os.path.join(tok_dir, f), model_dir)
        model = load(model_dir)
        tok = transformers.AutoTokenizer.from_pretrained(model_dir)
        out = []
        for text in prompts:
            ids = tok(text, return_tensors="pt")["input_ids"]
            with torch.no_grad():  # greedy, stopping at the EOS of generation_config.json
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
            out.append({"prompt": text, "prompt_ids": ids[0].tolist(), "new": gen[0, ids.shape[1]:].tolist()})
        with open(out_path, "w") as f:
            json.dump({"eos": tok.eos_token_id, "rows": out}, f)
    elif cmd == "check":
        import json
        out, n = {}, int(args[1])
        for i in range(2, len(args), 2):
            model_dir, prompts = args[i], [[int(t) for t in p.split(",")] for p in args[i + 1].split(";")]
            auto = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
            model = load(model_dir)
            gc = model.generation_config
            res = {"dtype": str(auto.dtype).replace("torch.", ""), "config_eos": model.config.eos_token_id,
                   "bos": gc.bos_token_id, "eos": gc.eos_token_id, "pad": gc.pad_token_id, "new": []}
            with torch.no_grad():
                for p in prompts:
                    ids = torch.tensor([p])
                    # No eos/pad arguments: generate() takes them from generation_config.json.
                    gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
                    res["new"].append(gen[0, len(p):].tolist())
                res["logits"] = model(torch.tensor([prompts[0]])).logits.float().reshape(-1).tolist()
            out[model_dir] = res
        with open(args[0], "w") as f:
            json.dump(out, f)
    else:
        raise SystemExit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
