"""Small byte-level BPE tokenizers trained here with the `tokenizers` package, and their outputs
on a test corpus, for tests/text/test_bpe.cc.

  hf_tokenizers.py llama2 DIR  Llama 2 style directories around DIR/tokenizer.model (see llama2_styles)
  hf_tokenizers.py OUT_DIR     writes OUT_DIR/<style>/tokenizer.json (+ tokenizer_config.json)
                               for the gpt2, llama3, qwen2 and flags styles, and OUT_DIR/expected.json:
                               {style: [{"text", "ids", "special_ids", "decoded", "prefix_ids",
                               "prefix_decoded"}]} ("special_ids": encoded with add_special_tokens,
                               through the post-processor)

Nothing is downloaded: the tokenizers are trained on the corpus below.
"""
import json
import os
import sys

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")

TRAIN = [
    "The quick brown fox jumps over the lazy dog. It's 2024, and we'll see what they've done.",
    "Le cœur a ses raisons que la raison ne connaît point. Ça va très bien, merci !",
    "Über den Wolken muss die Freiheit wohl grenzenlos sein. Straße, Größe, Äpfel.",
    "Москва — столица России. Привет, как дела? Всё хорошо.",
    "日本語のテキストです。東京は日本の首都です。漢字とひらがなとカタカナ。",
    "中文文本：北京是中国的首都。你好，世界！",
    "مرحبا بالعالم. اللغة العربية جميلة.",
    "नमस्ते दुनिया। हिंदी एक सुंदर भाषा है।",
    "def main():\n    return {'a': [1, 2, 3]}  # code\n\tindent\r\n",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧 ❤️ and symbols ©®™ ±×÷ €£¥",
    "Numbers 1234567890 3.14159 -42 1e10 0x1F 100,000",
] * 3

TEST = [
    "Hello world",
    " leading space and trailing space ",
    "I'M SHOUTING, YOU'RE NOT. Don't we'd they'll",
    "Le cœur a ses raisons, mais l'été est chaud.",
    "Größenwahn über alles",
    "Съешь же ещё этих мягких французских булок",
    "東京タワーと富士山",
    "我爱北京天安门",
    "العربية",
    "हिंदी भाषा",
    "Combining: cafe\u0301 vs café, Å vs A\u030a",
    "👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🇫🇷 flag",
    "1234567890123 and 3.14159265358979",
    "tabs\tand\nnewlines\r\n\n\n   spaces     end",
    "control \x01\x02\x7f bytes and nbsp\u00a0here and zero\u200bwidth",
    "<|endoftext|>special in the middle<|endoftext|>",
    "<|begin_of_text|>Hi<|end_of_text|><|im_start|>user\nHey<|im_end|>",
    "unseen words: xylophone quizzical zephyr",
    "",
    " ",
    "\n",
    "a" * 50,
    "ʕ•ᴥ•ʔ ¯\\_(ツ)_/¯ ∀x∈ℝ: x²≥0",
    # Added-token flags (the flags style): lstrip, rstrip, single_word, normalized.
    "I saw a <mask> here and   <mask>\t<mask>",
    "<mask>start and end<mask>",
    "x[SEP]   y [SEP]\n\nz",
    "ony Anthony ony, tony_ony oný (ony) 1ony",
    "cafe\u0301 café and cafécafe\u0301",
    "<sw> a<sw> <sw>b <sw>, <sw>",
]


# Texts for the SentencePiece-style directories (tests/text/test_bpe.cc trains their model on
# sentences like the first ones).
SPM_TEST = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Numbers 1234 and 56.78 here",
    "Привет, как дела?",
    "  two leading spaces, trailing one ",
    "unseen: zebra ქართული 🦊",
]


def train(pre, specials, ignore_merges=False, normalizer=None, post=None):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    if post is not None:
        tok.post_processor = post
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAIN, trainer)
    return tok


def template(single, tok_names, specials):
    """TemplateProcessing over the ids the trainer gave `specials` (the first len(specials) ids)."""
    return processors.TemplateProcessing(single=single, special_tokens=[(t, specials.index(t)) for t in tok_names])


def flags_style():
    """NFC, "<s> $A </s>", and added tokens with every flag."""
    specials = ["<s>", "</s>"]
    tok = train(pre_tokenizers.ByteLevel(add_prefix_space=False), specials, normalizer=normalizers.NFC(),
                post=template("<s> $A </s>", specials, specials))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, normalized=False, special=True),
                            AddedToken("[SEP]", rstrip=True, normalized=False, special=True),
                            AddedToken("<sw>", single_word=True, lstrip=True, rstrip=True, normalized=False,
                                       special=True)])
    tok.add_tokens([AddedToken("ony", single_word=True, normalized=False),
                    AddedToken("caf\u00e9", normalized=True)])
    return tok


def llama2_styles(out):
    """Llama 2 style directories around OUT/tokenizer.model (a SentencePiece BPE model): its
    tokenizer.json as transformers' LlamaTokenizer writes it (Metaspace, byte fallback, merges from
    the pieces' scores), the model beside it, and tokenizer_config.json's add_bos_token /
    add_eos_token; OUT/expected.json: AutoTokenizer's ids per style, as main() writes them."""
    from transformers import AutoTokenizer, LlamaTokenizer
    from transformers.convert_slow_tokenizer import import_protobuf
    from transformers.tokenization_utils_base import generate_merges

    proto = import_protobuf().ModelProto()
    with open(os.path.join(out, "tokenizer.model"), "rb") as f:
        proto.ParseFromString(f.read())
    pieces = [(p.piece, p.score) for p in proto.pieces]
    vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
    merges = generate_merges(vocab, dict(pieces))
    names = {k: proto.pieces[getattr(proto.trainer_spec, k + "_id")].piece for k in ("unk", "bos", "eos")}
    styles = {  # name: (LlamaTokenizer's add_bos_token, add_eos_token)
        "llama2": (True, False),  # Llama 2 itself: "<s> $A"
        "bos_eos": (True, True),
        "eos_only": (False, True),
        "none": (False, False),
    }
    expected = {}
    for name, (bos, eos) in styles.items():
        d = os.path.join(out, name)
        tok = LlamaTokenizer(vocab=vocab, merges=merges, unk_token=names["unk"], bos_token=names["bos"],
                             eos_token=names["eos"], add_bos_token=bos, add_eos_token=eos)
        tok.save_pretrained(d)
        with open(os.path.join(d, "tokenizer_config.json")) as f:
            cfg = json.load(f)
        cfg.update(add_bos_token=bos, add_eos_token=eos)
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f)
        with open(os.path.join(out, "tokenizer.model"), "rb") as src, open(os.path.join(d, "tokenizer.model"), "wb") as dst:
            dst.write(src.read())
        auto = AutoTokenizer.from_pretrained(d)
        rows = [{"text": t, "ids": auto(t, add_special_tokens=False)["input_ids"], "special_ids": auto(t)["input_ids"]}
                for t in SPM_TEST]
        expected[name] = {"rows": rows, "bos": auto.bos_token_id, "eos": auto.eos_token_id}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False)


def main():
    if sys.argv[1] == "llama2":
        return llama2_styles(sys.argv[2])
    out = sys.argv[1]
    llama3_specials = ["<|begin_of_text|>", "<|end_of_text|>"]
    styles = {
        # GPT-2's own post-processor is ByteLevel: no BOS although tokenizer_config names one.
        "gpt2": (train(pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"],
                       post=processors.ByteLevel(trim_offsets=False)),
                 {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}),
        "gpt2_prefix_space": (train(pre_tokenizers.ByteLevel(add_prefix_space=True), ["<|endoftext|>"]), {}),
        "llama3": (train(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            llama3_specials, ignore_merges=True,
            post=processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                      template("<|begin_of_text|> $A", llama3_specials[:1], llama3_specials)])),
            {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}),
        "qwen2": (train(pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
            ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], normalizer=normalizers.NFC()),
            {"eos_token": {"content": "<|im_end|>"}, "pad_token": "<|endoftext|>"}),
        "flags": (flags_style(), {"bos_token": "<s>", "eos_token": "</s>"}),
    }
    expected = {}
    for name, (tok, cfg) in styles.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"))
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump(cfg, f)
        rows = []
        for text in TEST:
            ids = tok.encode(text, add_special_tokens=False).ids
            k = len(ids) // 2
            rows.append({"text": text, "ids": ids, "special_ids": tok.encode(text).ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                         "prefix_ids": ids[:k], "prefix_decoded": tok.decode(ids[:k], skip_special_tokens=False)})
        expected[name] = {"rows": rows, "vocab_size": tok.get_vocab_size(with_added_tokens=True)}
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump(expected, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
