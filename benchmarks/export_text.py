"""Export transformers' text encoders at ByteMLPerf's shapes with ``torch.export``, for
``ipu-stack bench MODEL.pt2`` (docs/benchmarks.md, "Text encoders beside the vendor's C600
figures").

Usage: ``python benchmarks/export_text.py clip|bert|bert-encoder|bert-qa|roberta-qa|smollm2
--batch B --out MODEL.pt2``
(``smollm2``: a causal LM's prefill, ``--tokens`` long, returning its logits); an
``--out MODEL.onnx`` is written by ``torch.onnx.export`` instead (opset 18, the ``[onnx]``
extra), for ``ipu-stack bench MODEL.onnx`` (docs/onnx.md).  Random init
(``torch.manual_seed(0)``) at the real widths; the module returns plain tensors (the last
hidden state and the pooled output), because ``torch.export.load`` cannot read back
transformers' output classes.  Needs the ``torch`` extra (transformers).
"""

from __future__ import annotations

import argparse

import torch
import transformers


class Outputs(torch.nn.Module):
    """A transformers model called with ``input_ids`` only, returning the output fields
    ``names`` as plain tensors."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids=input_ids)
        return tuple(getattr(out, name) for name in self.names)


def clip_text() -> tuple[torch.nn.Module, int, int]:
    """Stable Diffusion's CLIP ViT-L/14 text encoder: 77 tokens, width 768, 12 layers."""
    config = transformers.CLIPTextConfig(
        vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
        num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu",
        layer_norm_eps=1e-5, bos_token_id=49406, eos_token_id=49407)
    return transformers.CLIPTextModel(config), 77, 49406


def bert_base() -> tuple[torch.nn.Module, int, int]:
    """BERT-base at SQuAD's 384 tokens (the token types are the default zeros)."""
    return transformers.BertModel(transformers.BertConfig()), 384, 30522


class EncoderWithTypes(torch.nn.Module):
    """BERT's encoder called with ``input_ids`` and ``token_type_ids`` (both looked up on
    the device), returning the last hidden state: the builtin ``bert-base``'s program."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, token_type_ids=token_type_ids).last_hidden_state


class Logits(torch.nn.Module):
    """A causal LM's prefill (``use_cache=False``) returning its logits only."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def smollm2() -> tuple[torch.nn.Module, int, int]:
    """HuggingFaceTB/SmolLM2-135M's configuration: 30 layers, width 576, 9 query and 3
    key/value heads, SwiGLU 1536, RoPE theta 100,000, the LM head tied to the embedding."""
    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, hidden_act="silu")
    return Logits(transformers.LlamaForCausalLM(config)), 128, 49152


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=("clip", "bert", "bert-encoder", "bert-qa",
                                          "roberta-qa", "smollm2"))
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=0, help="smollm2: the prompt length "
                        "(default 128)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    build = {"clip": clip_text, "smollm2": smollm2}.get(args.model, bert_base)
    model, tokens, vocab = build()
    tokens = args.tokens or tokens
    if args.model == "bert-encoder":
        model = EncoderWithTypes(transformers.BertModel(model.config, add_pooling_layer=False))
    elif args.model == "bert-qa":
        model = Outputs(transformers.BertForQuestionAnswering(model.config),
                        ("start_logits", "end_logits"))
    elif args.model == "roberta-qa":  # roberta-base: vocabulary 50,265, positions from ids
        config = transformers.RobertaConfig(vocab_size=50265, max_position_embeddings=514,
                                            type_vocab_size=1, layer_norm_eps=1e-5)
        model, tokens = Outputs(transformers.RobertaForQuestionAnswering(config),
                                ("start_logits", "end_logits")), 384
        vocab = 50265
    elif args.model != "smollm2":  # the LM's module returns its logits already
        model = Outputs(model, ("last_hidden_state", "pooler_output"))
    with torch.no_grad():  # biases and norms drawn too: an ONNX exporter would store each
        for parameter in model.parameters():  # init value (zeros, ones) once for all layers
            if parameter.dim() == 1:
                parameter.add_(0.02 * torch.randn_like(parameter))
    inputs: tuple[torch.Tensor, ...] = (torch.randint(0, vocab, (args.batch, tokens)),)
    if args.model == "bert-encoder":  # SQuAD's two segments: question, then context
        inputs += (torch.randint(0, 2, (args.batch, tokens)),)
    if args.out.endswith(".onnx"):
        torch.onnx.export(model.eval(), inputs, args.out, dynamo=True, opset_version=18,
                          input_names=["input_ids", "token_type_ids"][:len(inputs)],
                          verbose=False)
    else:
        torch.export.save(torch.export.export(model.eval(), inputs), args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
