"""transformers models built for the tests and the benchmarks alike (torch and transformers
imported when called: the ``torch`` extra).

transformers starts some parameters at constants that would leave a path untested: a
Swin's relative position bias tables are zeros, so the bias would add nothing and a wrong
gather of it would pass. The models here draw them at random."""

from __future__ import annotations

from typing import Any


def swin(classify: bool = False, **config: Any) -> Any:
    """A ``SwinModel`` (or ``SwinForImageClassification``) from ``SwinConfig(**config)``, in
    eval mode, its relative position bias tables drawn as N(0, 0.02) from torch's current
    random state."""
    import torch
    import transformers

    settings = transformers.SwinConfig(**config)
    kind = transformers.SwinForImageClassification if classify else transformers.SwinModel
    model = kind(settings).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "relative_position_bias_table" in name:
                parameter.normal_(0, 0.02)
    return model


# HuggingFaceTB/SmolVLM-256M-Instruct's widths (random weights): the builtin smolvlm-256m
SMOLVLM_VISION = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                  "num_attention_heads": 12, "image_size": 512, "patch_size": 16,
                  "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6}
SMOLVLM_TEXT = {"vocab_size": 49280, "hidden_size": 576, "intermediate_size": 1536,
                "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
                "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
                "tie_word_embeddings": True}


def smolvlm(vision: dict[str, Any] | None = None, text: dict[str, Any] | None = None,
            scale_factor: int = 4) -> Any:
    """A ``SmolVLMForConditionalGeneration`` in eval mode at SmolVLM-256M's widths, with
    ``vision`` and ``text`` overriding its configurations' entries."""
    import transformers

    config = transformers.SmolVLMConfig(
        vision_config={**SMOLVLM_VISION, **(vision or {})},
        text_config={**SMOLVLM_TEXT, **(text or {})}, scale_factor=scale_factor,
        image_token_id=49190, tie_word_embeddings=True)
    return transformers.SmolVLMForConditionalGeneration(config).eval()


def smolvlm_image_part(model: Any) -> Any:
    """The model's image program as one module: pixels through the vision tower and the
    connector to its image rows, ``[B, image tokens, text width]`` (the parts transformers'
    ``TorchExportableModuleForVLM`` exports one by one, joined so that the tower's rows stay
    on the device)."""
    import torch

    class ImagePart(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vision_model = model.model.vision_model
            self.connector = model.model.connector

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.connector(self.vision_model(pixel_values).last_hidden_state)

    return ImagePart().eval()


def static_cache_step(model: Any, context: int) -> Any:
    """``model`` (a decoder, in eval mode) wrapped by transformers'
    ``TorchExportableModuleForDecoderOnlyLM`` with a static cache of ``context`` positions
    for one sequence, as transformers exports a language model for on-device runtimes."""
    import transformers
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    model.eval().generation_config = transformers.GenerationConfig(
        use_cache=True, cache_implementation="static", max_length=context,
        cache_config={"batch_size": 1, "max_cache_len": context, "device": "cpu"})
    return TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=context)


def smolvlm_decoder_step(model: Any, context: int) -> Any:
    """The model's decoder (its text model and LM head, as ``LlamaForCausalLM``) with a
    static cache of ``context`` positions (:func:`static_cache_step`): export it with
    ``inputs_embeds`` so that a prompt can open with an image's rows."""
    import transformers

    decoder = transformers.LlamaForCausalLM(model.config.text_config)
    decoder.model, decoder.lm_head = model.model.text_model, model.lm_head
    return static_cache_step(decoder, context)


def export_smolvlm_parts(model: Any, context: int) -> tuple[Any, Any]:
    """The model's image program (pixels to its image rows) and its decoder step (embeddings
    ``[1, T, width]`` of any length below ``context`` at their cache positions to logits),
    exported with ``torch.export``."""
    import torch

    side = model.config.vision_config.image_size
    image = torch.export.export(smolvlm_image_part(model), (torch.randn(1, 3, side, side),),
                                strict=False)
    width = model.config.text_config.hidden_size
    tokens = torch.export.Dim("tokens", min=1, max=context - 1)
    decoder = smolvlm_decoder_step(model, context).export(
        inputs_embeds=torch.zeros((1, 4, width)), cache_position=torch.arange(4), strict=False,
        dynamic_shapes={"inputs_embeds": {1: tokens}, "cache_position": {0: tokens}})
    return image, decoder
