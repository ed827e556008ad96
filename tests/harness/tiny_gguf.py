"""A tiny llama-architecture GGUF (~297 KB, 467 tokens) that a real llama-server serves.

Random weights, so the text is nonsense, but it is readable ASCII: the rows of
`output.weight` that belong to non-NORMAL tokens (unknown, control, the 256 byte tokens)
are zero, so sampling only ever picks plain text pieces; `<|im_end|>` (logit 0) loses to
the best text piece, so replies run to `max_tokens` (`finish_reason: "length"`). The file
is byte-identical for a given seed.

    write_tiny_gguf(Path("tiny.gguf"))
    llama-server -m tiny.gguf --host 127.0.0.1 --port P -t 1 -tb 1 -c 2048

Needs `gguf` (0.19.0 tested) and `numpy`.
"""
from __future__ import annotations

import string
from pathlib import Path

import numpy as np

N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 4
N_FF = 128
N_BLOCK = 2
N_CTX = 2048

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

WORDS = (
    "the of and to in is it you that he was for on are with as his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your "
    "how said an each she which do their time if will way about many then them write would "
    "like so these her long make thing see him two has look more day could go come did number "
    "sound no most people my over know water than call first who may down side been now find "
    "hello world model server token test gateway llama tiny"
).split()


def _vocab() -> tuple[list[str], list[float], list[int]]:
    import gguf

    T = gguf.TokenType
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types: list[int] = [T.UNKNOWN, T.CONTROL, T.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [T.BYTE] * 256
    pieces = ["\u2581"]
    pieces += list(string.ascii_lowercase) + list(string.ascii_uppercase) + list(string.digits)
    pieces += list(".,!?;:-'()")
    pieces += ["\u2581" + c for c in string.ascii_lowercase]
    pieces += ["\u2581" + w for w in WORDS]
    seen: set[str] = set()
    normal = [p for p in pieces if not (p in seen or seen.add(p))]
    tokens += normal
    types += [T.NORMAL] * len(normal)
    tokens += ["<|im_start|>", "<|im_end|>"]
    types += [T.CONTROL, T.CONTROL]
    # SentencePiece scores: specials 0, byte tokens 0, normal pieces descending.
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(normal))] + [0.0, 0.0]
    return tokens, scores, [int(t) for t in types]


def write_tiny_gguf(path: Path, seed: int = 0) -> Path:
    """Write the tiny model to `path` and return it."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("llmgw-tiny-test")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_BLOCK)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_vocab_size(n_vocab)

    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)

    def mat(*shape: int, scale: float = 0.1) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(N_EMBD, dtype=np.float32)

    # numpy shape = reversed ggml shape: ggml token_embd is [n_embd, n_vocab].
    w.add_tensor("token_embd.weight", mat(n_vocab, N_EMBD, scale=1.0))
    w.add_tensor("output_norm.weight", norm())
    out = mat(n_vocab, N_EMBD, scale=1.0)
    normal = np.array(types) == int(gguf.TokenType.NORMAL)
    out[~normal] = 0  # only plain text pieces can win sampling
    w.add_tensor("output.weight", out)
    for i in range(N_BLOCK):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm())
        w.add_tensor(p + "attn_q.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(p + "attn_k.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(p + "attn_v.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(p + "attn_output.weight", mat(N_EMBD, N_EMBD))
        w.add_tensor(p + "ffn_norm.weight", norm())
        w.add_tensor(p + "ffn_gate.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", mat(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", mat(N_EMBD, N_FF))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    import sys

    out_path = write_tiny_gguf(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny.gguf"))
    print(out_path, out_path.stat().st_size)
