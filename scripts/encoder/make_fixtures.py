#!/usr/bin/env python3
"""Build TINY randomly initialised Hugging Face models and record their outputs.

Developer-run (not CI). Needs a venv with CPU torch, transformers, tokenizers and
sentence-transformers, e.g.:

    python3 -m venv /work/venvs/hf && /work/venvs/hf/bin/pip install torch transformers \
        safetensors sentence-transformers
    /work/venvs/hf/bin/python scripts/encoder/make_fixtures.py [ARCH ...]

ARCH is any of: bert modernbert qwen2 llama qwen2-bf16-sharded llama-rope-llama3 bert-dense
(default: all; bert-dense builds on tiny-bert). Each model goes to
crates/infembed-encoder/tests/fixtures/tiny-<arch>/ with config.json, tokenizer.json,
model.safetensors, sentence-transformers files and expected.json holding, for fixed inputs
(unequal lengths, padding, one text over the maximum length), the token ids, the last-layer
hidden states of the real tokens and the pooled embeddings computed by transformers itself.
"""
import json
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "crates", "infembed-encoder", "tests", "fixtures")

TEXTS = [
    "the cat sat on the mat",
    "a dog",
    "retrieval models follow instructions when the query asks for recent news about cats and dogs",
    "hello world",
    "x",
    "find documents about the ocean and ships",
]
MAX_SEQ_LENGTH = 16  # the long text above is truncated
# Width of every tiny model (4 heads of 4 dimensions): small enough that the four fixtures
# together stay near 300 KB, wide enough for multi-head attention, rotary pairs and GQA.
HIDDEN = 16

WORDS = ("the a an cat dog sat on mat hello world find documents about ocean ships and "
         "retrieval models follow instructions when query asks for recent news is of to in").split()


def wordpiece_vocab():
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    pieces = ["##" + c for c in letters]
    punct = list(".,!?'-")
    return specials + letters + pieces + punct + [w for w in WORDS if len(w) > 1]


def perturb(model, seed, scale):
    """Random weights everywhere (LayerNorm/RMSNorm gains too), so every tensor matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and ("norm" in name.lower()):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=g))


def write_st_files(out, dim, pooling, normalize=True):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    json.dump(modules, open(os.path.join(out, "modules.json"), "w"), indent=2)
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    json.dump({"word_embedding_dimension": dim,
               "pooling_mode_cls_token": pooling == "cls",
               "pooling_mode_mean_tokens": pooling == "mean",
               "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False,
               "pooling_mode_lasttoken": pooling == "last"},
              open(os.path.join(out, "1_Pooling", "config.json"), "w"), indent=2)
    json.dump({"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False},
              open(os.path.join(out, "sentence_bert_config.json"), "w"), indent=2)


def pooled(hidden, mask, pooling):
    m = mask.unsqueeze(-1).float()
    if pooling == "mean":
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
    if pooling == "cls":
        first = mask.float().argmax(1)
        return hidden[torch.arange(hidden.shape[0]), first]
    # last real token (works for left and right padding)
    idx = (mask.float() * torch.arange(1, mask.shape[1] + 1)).argmax(1)
    return hidden[torch.arange(hidden.shape[0]), idx]


def record(out, model, tok, pooling, arch, extra=None):
    model.eval()
    enc = tok(TEXTS, padding=True, truncation=True, max_length=MAX_SEQ_LENGTH, return_tensors="pt")
    with torch.no_grad():
        hidden = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).last_hidden_state
    mask = enc["attention_mask"]
    p = pooled(hidden, mask, pooling)
    pn = torch.nn.functional.normalize(p, p=2, dim=1)
    cases = []
    for i, text in enumerate(TEXTS):
        keep = mask[i].bool()
        cases.append({
            "text": text,
            "input_ids": enc["input_ids"][i][keep].tolist(),
            "hidden": [[round(float(x), 7) for x in row] for row in hidden[i][keep]],
            "pooled": [round(float(x), 7) for x in p[i]],
            "embedding": [round(float(x), 7) for x in pn[i]],
        })
    st = None
    try:
        from sentence_transformers import SentenceTransformer
        stm = SentenceTransformer(out, device="cpu")
        st = stm.encode(TEXTS, batch_size=len(TEXTS), normalize_embeddings=False,
                        convert_to_numpy=True).round(7).tolist()
    except Exception as e:  # pragma: no cover - informative only
        print("sentence-transformers check skipped:", e)
    doc = {"arch": arch, "pooling": pooling, "max_seq_length": MAX_SEQ_LENGTH,
           "padding_side": tok.padding_side,
           "generator": "scripts/encoder/make_fixtures.py, torch %s, transformers %s" % (
               torch.__version__, __import__("transformers").__version__),
           "cases": cases, "sentence_transformers_embeddings": st}
    if extra:
        doc.update(extra)
    json.dump(doc, open(os.path.join(out, "expected.json"), "w"))
    print(arch, "->", out)


def make_bert():
    from transformers import BertConfig, BertModel, BertTokenizerFast
    out = os.path.join(FIXTURES, "tiny-bert")
    os.makedirs(out, exist_ok=True)
    vocab = wordpiece_vocab()
    vocab_path = os.path.join(out, "vocab.txt")
    open(vocab_path, "w").write("\n".join(vocab) + "\n")
    from tokenizers import BertWordPieceTokenizer
    raw = BertWordPieceTokenizer(vocab_path, lowercase=True)
    tok = BertTokenizerFast(tokenizer_object=raw._tokenizer, unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")
    assert tok("the cat")["input_ids"] == [2, vocab.index("the"), vocab.index("cat"), 3], tok("the cat")
    cfg = BertConfig(vocab_size=len(vocab), hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=2 * HIDDEN, max_position_embeddings=64, type_vocab_size=2,
                     layer_norm_eps=1e-12, pad_token_id=0)
    torch.manual_seed(0)
    model = BertModel(cfg)
    perturb(model, 1, 0.3)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    write_st_files(out, cfg.hidden_size, "mean")
    record(out, model, tok, "mean", "bert")


def wordpiece_tokenizer(out):
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast
    vocab = wordpiece_vocab()
    vocab_path = os.path.join(out, "vocab.txt")
    open(vocab_path, "w").write("\n".join(vocab) + "\n")
    raw = BertWordPieceTokenizer(vocab_path, lowercase=True)
    return vocab, BertTokenizerFast(tokenizer_object=raw._tokenizer, unk_token="[UNK]", cls_token="[CLS]",
                                    sep_token="[SEP]", pad_token="[PAD]", mask_token="[MASK]")


def make_modernbert():
    from transformers import ModernBertConfig, ModernBertModel
    out = os.path.join(FIXTURES, "tiny-modernbert")
    os.makedirs(out, exist_ok=True)
    vocab, tok = wordpiece_tokenizer(out)
    # 3 layers: global, local, local; a local window of 2 tokens each side so that the
    # sliding window matters on these short inputs.
    cfg = ModernBertConfig(vocab_size=len(vocab), hidden_size=HIDDEN, intermediate_size=3 * HIDDEN // 2, num_hidden_layers=3,
                           num_attention_heads=4, max_position_embeddings=64, local_attention=4,
                           global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0,
                           pad_token_id=0, cls_token_id=2, sep_token_id=3, bos_token_id=2, eos_token_id=3,
                           norm_eps=1e-5, attn_implementation="eager")
    torch.manual_seed(0)
    model = ModernBertModel(cfg)
    perturb(model, 2, 0.3)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    write_st_files(out, cfg.hidden_size, "cls")
    record(out, model, tok, "cls", "modernbert")


def bpe_tokenizer(bos):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<s>"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t.train_from_iterator(TEXTS * 3 + WORDS, trainer)
    if bos:
        t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", t.token_to_id("<s>"))])
    tok = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<|endoftext|>", eos_token="<|endoftext|>",
                                  bos_token="<s>")
    tok.padding_side = "left"
    return tok


def make_decoder(arch):
    from transformers import LlamaConfig, LlamaModel, Qwen2Config, Qwen2Model
    out = os.path.join(FIXTURES, "tiny-" + arch)
    os.makedirs(out, exist_ok=True)
    tok = bpe_tokenizer(bos=(arch == "llama"))
    common = dict(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
                  pad_token_id=tok.pad_token_id, attn_implementation="eager")
    if arch == "qwen2":
        cfg = Qwen2Config(rope_theta=10000.0, **common)
        model_cls = Qwen2Model
    else:
        cfg = LlamaConfig(rope_theta=500000.0, **common)
        model_cls = LlamaModel
    torch.manual_seed(0)
    model = model_cls(cfg)
    perturb(model, 3, 0.3)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    write_st_files(out, cfg.hidden_size, "last")
    record(out, model, tok, "last", arch)


def make_qwen2_bf16_sharded():
    """Qwen2 as the larger checkpoints ship: bf16 weights in two shards with an index."""
    from transformers import Qwen2Config, Qwen2Model
    out = os.path.join(FIXTURES, "tiny-qwen2-bf16-sharded")
    os.makedirs(out, exist_ok=True)
    tok = bpe_tokenizer(bos=False)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6,
                      pad_token_id=tok.pad_token_id, attn_implementation="eager", rope_theta=1000000.0)
    torch.manual_seed(0)
    model = Qwen2Model(cfg)
    perturb(model, 5, 0.3)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True, max_shard_size="12KB")
    shards = sorted(f for f in os.listdir(out) if f.startswith("model-") and f.endswith(".safetensors"))
    assert len(shards) >= 2 and os.path.exists(os.path.join(out, "model.safetensors.index.json")), shards
    tok.save_pretrained(out)
    write_st_files(out, cfg.hidden_size, "last")
    # The reference: the bf16 weights loaded afresh in f32 (so the rotary frequencies are
    # computed in f32 too, not the bf16-rounded buffer of `model.to(bfloat16)`), what infembed
    # does after its cast. sentence-transformers loads the checkpoint in its own dtype (bf16)
    # and so computes in bf16: its embeddings are a bf16 reference.
    f32_model = Qwen2Model.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
    record(out, f32_model, tok, "last", "qwen2",
           extra={"weights": "bfloat16, %d shards" % len(shards), "sentence_transformers_dtype": "bfloat16"})


def make_llama_rope_llama3():
    """Llama 3's rotary scaling, with an original context (8) shorter than the inputs (16)."""
    from transformers import LlamaConfig, LlamaModel
    out = os.path.join(FIXTURES, "tiny-llama-rope-llama3")
    os.makedirs(out, exist_ok=True)
    tok = bpe_tokenizer(bos=True)
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
    # Two heads of 8 dimensions: four frequencies, so scaled, interpolated and kept ones.
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
                      rms_norm_eps=1e-6, pad_token_id=tok.pad_token_id, attn_implementation="eager",
                      rope_parameters=rope)
    torch.manual_seed(0)
    model = LlamaModel(cfg)
    assert model.config.rope_parameters["rope_type"] == "llama3", model.config.rope_parameters
    perturb(model, 6, 0.3)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    write_st_files(out, cfg.hidden_size, "last")
    record(out, model, tok, "last", "llama", extra={"rope": rope})


def make_bert_dense():
    """A sentence-transformers pipeline with a Dense module (16 -> 8, tanh), no Normalize,
    dot-product similarity and prompts; the expected values are sentence-transformers' own."""
    from sentence_transformers import SentenceTransformer, models
    src = os.path.join(FIXTURES, "tiny-bert")
    out = os.path.join(FIXTURES, "tiny-bert-dense")
    transformer = models.Transformer(src, max_seq_length=MAX_SEQ_LENGTH)
    pooling = models.Pooling(HIDDEN, pooling_mode="mean")
    dense = models.Dense(HIDDEN, 8, activation_function=torch.nn.Tanh())
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        dense.linear.weight.copy_(0.5 * torch.randn(dense.linear.weight.shape, generator=g))
        dense.linear.bias.copy_(0.1 * torch.randn(dense.linear.bias.shape, generator=g))
    prompts = {"query": "query: ", "document": "passage: "}
    st = SentenceTransformer(modules=[transformer, pooling, dense], device="cpu", prompts=prompts,
                             similarity_fn_name="dot")
    st.save(out)
    os.remove(os.path.join(out, "README.md"))  # the generated model card: not needed
    st = SentenceTransformer(out, device="cpu")
    enc = lambda **kw: st.encode(TEXTS, batch_size=len(TEXTS), convert_to_numpy=True, **kw).round(7).tolist()
    import sentence_transformers as stm
    doc = {"generator": "scripts/encoder/make_fixtures.py, sentence-transformers %s, torch %s"
                        % (stm.__version__, torch.__version__),
           "texts": TEXTS, "max_seq_length": MAX_SEQ_LENGTH, "prompts": prompts,
           "plain": enc(), "query_prompt": enc(prompt_name="query"),
           "document_prompt": enc(prompt_name="document")}
    json.dump(doc, open(os.path.join(out, "expected.json"), "w"))
    print("bert-dense ->", out)


BUILDERS = {"bert": make_bert, "modernbert": make_modernbert,
            "qwen2": lambda: make_decoder("qwen2"), "llama": lambda: make_decoder("llama"),
            "qwen2-bf16-sharded": make_qwen2_bf16_sharded, "llama-rope-llama3": make_llama_rope_llama3,
            "bert-dense": make_bert_dense}

if __name__ == "__main__":
    torch.set_num_threads(2)
    for arch in (sys.argv[1:] or list(BUILDERS)):
        BUILDERS[arch]()
