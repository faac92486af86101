"""A tiny llama-architecture model with random weights, written as GGUF with
the ``gguf`` package, whose vocabulary is a ``tokenizers`` tokenizer.json
(byte-level BPE) with the template's markers as control tokens: enough for
llama.cpp's server to load it and generate ids on the CPU in milliseconds.

The metadata keys and tensor names are the ones llama.cpp reads for the
``llama`` architecture (gguf-py/gguf/constants.py: ``token_embd``,
``blk.N.attn_q`` …, ``output_norm``, ``output``; numpy shapes are the
reverse of GGUF's ``ne``, so a ``[n_embd, n_vocab]`` tensor is an array of
shape ``(n_vocab, n_embd)``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def write_tiny_llama(path: str | Path, tokenizer_json: str | Path, *, eog: int, control: Sequence[int] = (),
                     embd: int = 32, layers: int = 1, heads: int = 2, ff: int = 64, ctx: int = 512,
                     seed: int = 0, chain: Sequence[int] = (), after: int | None = None) -> None:
    """Write the model to ``path``; ``eog`` is the id that ends a generation
    (the end marker), ``control`` the ids of special tokens.

    With ``chain``, the model is a bigram model instead of a random one:
    after the id ``after`` (a prompt's last id) it generates ``chain``, over
    and over (greedily). The blocks add nothing (their output projections
    are zero), so the last layer sees the current token's embedding: each
    chain token (and ``after``, as the chain's last) gets a basis vector of
    its own, and the output row of the token that follows it points along
    that vector."""
    import gguf

    tok = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    by_id: dict[int, str] = {i: t for t, i in tok["model"]["vocab"].items()}
    for added in tok.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
    n_vocab = len(by_id)
    if sorted(by_id) != list(range(n_vocab)):
        raise ValueError("the vocabulary's ids are not 0..n-1")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"].get("merges", [])]
    specials = set(control) | {a["id"] for a in tok.get("added_tokens", []) if a.get("special")}

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(ctx)
    w.add_embedding_length(embd)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(embd // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([by_id[i] for i in range(n_vocab)])
    w.add_token_types([gguf.TokenType.CONTROL if i in specials else gguf.TokenType.NORMAL
                       for i in range(n_vocab)])
    w.add_token_merges(merges)
    w.add_eos_token_id(eog)
    w.add_bos_token_id(eog)
    w.add_add_bos_token(False)

    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    token_embd = weights(n_vocab, embd)
    # Scaled up so that sampling is far from uniform: a greedy answer is
    # the same on every call.
    output = weights(n_vocab, embd) * 8
    if chain:
        if len(set(chain)) != len(chain) or len(chain) > embd or after is None or after in chain:
            raise ValueError("chain: distinct ids, at most embd of them, and another id as 'after'")
        basis = np.eye(embd, dtype=np.float32)
        output[:] = 0
        for j, t in enumerate(chain):
            token_embd[t] = basis[j]
            output[chain[(j + 1) % len(chain)]] = 100 * basis[j]
        token_embd[after] = basis[len(chain) - 1]

    def block_out(*shape: int) -> np.ndarray:
        return np.zeros(shape, dtype=np.float32) if chain else weights(*shape)

    w.add_tensor("token_embd.weight", token_embd)
    for b in range(layers):
        w.add_tensor(f"blk.{b}.attn_norm.weight", np.ones(embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v"):
            w.add_tensor(f"blk.{b}.{name}.weight", weights(embd, embd))
        w.add_tensor(f"blk.{b}.attn_output.weight", block_out(embd, embd))
        w.add_tensor(f"blk.{b}.ffn_norm.weight", np.ones(embd, dtype=np.float32))
        w.add_tensor(f"blk.{b}.ffn_gate.weight", weights(ff, embd))
        w.add_tensor(f"blk.{b}.ffn_up.weight", weights(ff, embd))
        w.add_tensor(f"blk.{b}.ffn_down.weight", block_out(embd, ff))
    w.add_tensor("output_norm.weight", np.ones(embd, dtype=np.float32))
    w.add_tensor("output.weight", output)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
