"""Export a decoder step with a static KV cache, as a user hands one to ``ipu-stack generate``.

Usage: ``python benchmarks/export_llama_step.py OUT.pt2 [--layers 30] [--context 160]
[--dynamic] [--gpt2 | --qwen3 | --pythia]``
(needs the ``[torch]`` extra and transformers).  The model is ``LlamaForCausalLM`` at
SmolLM2-135M's configuration, or with ``--gpt2`` ``GPT2LMHeadModel`` at GPT-2 small's (124M:
12 layers unless ``--layers`` says otherwise, a learned position embedding of 1024 rows), or
with ``--qwen3`` ``Qwen3ForCausalLM`` at Qwen3-0.6B's (28 layers; the builtin
``qwen3-0.6b`` is its step), or with ``--pythia`` ``GPTNeoXForCausalLM`` at Pythia-160M's (12
layers, RoPE on a quarter of each head) (random weights, seed 0), exported one token a step through
``transformers.integrations.executorch`` with a cache of ``--context`` positions (with
``--dynamic``, any number of tokens a step: the prompt's pass from the same file); the builtin
``smollm2-135m --context N --tokens 1`` is the same step (docs/language-models.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

SMOLLM2 = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
           "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
           "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True}
QWEN3 = {"vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
         "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
         "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
         "tie_word_embeddings": True}
PYTHIA = {"vocab_size": 50304, "hidden_size": 768, "intermediate_size": 3072,
          "num_attention_heads": 12, "rotary_pct": 0.25, "max_position_embeddings": 2048,
          "use_parallel_residual": True, "tie_word_embeddings": False}


def export_step(out: Path, layers: int, context: int, dynamic: bool = False,
                gpt2: bool = False, qwen3: bool = False, pythia: bool = False) -> None:
    """Write the step program to ``out`` (``torch.export.save``)."""
    import torch
    import transformers

    from ipu_stack.testing.models import static_cache_step

    torch.manual_seed(0)
    if gpt2:  # GPT-2 small's configuration is transformers' default
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=layers))
    elif pythia:
        model = transformers.GPTNeoXForCausalLM(
            transformers.GPTNeoXConfig(num_hidden_layers=layers, **PYTHIA))
    elif qwen3:
        model = transformers.Qwen3ForCausalLM(
            transformers.Qwen3Config(num_hidden_layers=layers, **QWEN3))
    else:
        model = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(num_hidden_layers=layers, **SMOLLM2))
    step = static_cache_step(model, context)
    if dynamic:  # any prompt length: the prompt's pass from the same file
        tokens = torch.export.Dim("tokens", min=1, max=context - 1)
        program = step.export(input_ids=torch.zeros((1, 4), dtype=torch.long),
                              cache_position=torch.arange(4), strict=False,
                              dynamic_shapes={"input_ids": {1: tokens},
                                              "cache_position": {0: tokens}})
    else:
        program = step.export(input_ids=torch.zeros((1, 1), dtype=torch.long),
                              cache_position=torch.tensor([0]))
    torch.export.save(program, str(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=None,
                        help="decoder layers (default: 30, GPT-2 small's and Pythia-160M's 12, "
                        "Qwen3-0.6B's 28)")
    parser.add_argument("--context", type=int, default=160)
    parser.add_argument("--dynamic", action="store_true",
                        help="a dynamic sequence length (the prompt's pass from the same file)")
    family = parser.add_mutually_exclusive_group()
    family.add_argument("--gpt2", action="store_true",
                        help="GPT2LMHeadModel at GPT-2 small's widths instead of SmolLM2's Llama")
    family.add_argument("--qwen3", action="store_true",
                        help="Qwen3ForCausalLM at Qwen3-0.6B's widths instead of SmolLM2's Llama")
    family.add_argument("--pythia", action="store_true",
                        help="GPTNeoXForCausalLM at Pythia-160M's widths instead of SmolLM2's")
    args = parser.parse_args(argv)
    layers = args.layers or (12 if args.gpt2 or args.pythia else 28 if args.qwen3 else 30)
    export_step(args.out, layers, args.context, args.dynamic, args.gpt2, args.qwen3,
                args.pythia)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
