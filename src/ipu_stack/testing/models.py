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
