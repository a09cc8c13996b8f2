"""The zoo: every ViT-family vision tower class of transformers, at real widths, 2 layers.

``python benchmarks/bench_frontend.py zoo`` builds each class below from the published
configuration named beside it (random weights, ``torch.manual_seed``), with 2 layers,
exports it at batch 1 and 2, and runs ``ipu-stack bench MODEL.pt2`` at FP8 and F16; a
class that cannot be exported or imported gets its one-line reason.  ``--import-only``
stops after the import and its conversion check (seconds per class).

Classes left out, and why: video towers (X-CLIP, TimeSformer, ViViT: a time axis), SAM's
windowed encoder and DPT (dense heads), and towers whose forward needs more than pixels
(Pixtral: a list of images and their sizes; Siglip2: patch masks and spatial shapes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

LAYERS = 2


@dataclass(frozen=True)
class Tower:
    """One class: how to build it (``layers`` -> module) and what it stands for."""

    name: str
    checkpoint: str
    build: Callable[[int], Any]
    image: int


def _make(cls: str, config: str, **kwargs: Any) -> Callable[[int], Any]:
    def build(layers: int) -> Any:
        import transformers

        settings = dict(kwargs)
        extra = settings.pop("_model", {})
        made = getattr(transformers, config)(num_hidden_layers=layers, **settings)
        return getattr(transformers, cls)(made, **extra)
    return build


def _vision(cls: str, config: str, **kwargs: Any) -> Callable[[int], Any]:
    """A composite model's vision config class (``...VisionConfig``)."""
    return _make(cls, config, **kwargs)


B16 = dict(hidden_size=768, intermediate_size=3072, num_attention_heads=12, patch_size=16,
           image_size=224)
L14 = dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, patch_size=14,
           image_size=224)

ZOO: tuple[Tower, ...] = (
    Tower("ViT (pooler)", "google/vit-base-patch16-224", _make("ViTModel", "ViTConfig", **B16),
          224),
    Tower("DeiT (distilled, pooler)", "facebook/deit-base-distilled-patch16-224",
          _make("DeiTModel", "DeiTConfig", **B16), 224),
    Tower("BEiT", "microsoft/beit-base-patch16-224", _make(
        "BeitModel", "BeitConfig", **B16, use_relative_position_bias=True,
        use_mean_pooling=True, layer_scale_init_value=0.1), 224),
    Tower("Data2Vec-Vision", "facebook/data2vec-vision-base", _make(
        "Data2VecVisionModel", "Data2VecVisionConfig", **B16, use_relative_position_bias=True,
        use_mean_pooling=True, layer_scale_init_value=0.1), 224),
    Tower("DINOv2", "facebook/dinov2-base", _make(
        "Dinov2Model", "Dinov2Config", **{**B16, "patch_size": 14}), 224),
    Tower("DINOv2 with registers", "facebook/dinov2-with-registers-base", _make(
        "Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", **{**B16, "patch_size": 14},
        num_register_tokens=4), 224),
    Tower("DINOv3 ViT", "facebook/dinov3-vitb16-pretrain-lvd1689m", _make(
        "DINOv3ViTModel", "DINOv3ViTConfig", **B16, num_register_tokens=4), 224),
    Tower("I-JEPA", "facebook/ijepa_vith14_1k (base widths)", _make(
        "IJepaModel", "IJepaConfig", **B16), 224),
    Tower("ViT-MSN", "facebook/vit-msn-base", _make("ViTMSNModel", "ViTMSNConfig", **B16), 224),
    Tower("ViT-MAE (mask ratio 0)", "facebook/vit-mae-base", _make(
        "ViTMAEModel", "ViTMAEConfig", **B16, mask_ratio=0.0), 224),
    Tower("YOLOS", "hustvl/yolos-base (224 image)", _make(
        "YolosModel", "YolosConfig", **{**B16, "image_size": [224, 224]},
        _model={"add_pooling_layer": False}), 224),
    Tower("CLIP ViT-L/14-336", "openai/clip-vit-large-patch14-336", _vision(
        "CLIPVisionModel", "CLIPVisionConfig", **{**L14, "image_size": 336}), 336),
    Tower("MetaCLIP 2", "facebook/metaclip-2-worldwide-huge-quickgelu (L/14 widths)", _vision(
        "MetaClip2VisionModel", "MetaClip2VisionConfig", **L14), 224),
    Tower("Chinese-CLIP", "OFA-Sys/chinese-clip-vit-base-patch16", _vision(
        "ChineseCLIPVisionModel", "ChineseCLIPVisionConfig", **B16), 224),
    Tower("AltCLIP", "BAAI/AltCLIP", _vision(
        "AltCLIPVisionModel", "AltCLIPVisionConfig", **L14), 224),
    Tower("CLIPSeg", "CIDAS/clipseg-rd64-refined", _vision(
        "CLIPSegVisionModel", "CLIPSegVisionConfig", **{**B16, "patch_size": 16}), 352),
    Tower("OWL-ViT", "google/owlvit-base-patch32", _vision(
        "OwlViTVisionModel", "OwlViTVisionConfig", **{**B16, "patch_size": 32,
                                                        "image_size": 768}), 768),
    Tower("OWLv2", "google/owlv2-base-patch16 (768 image)", _vision(
        "Owlv2VisionModel", "Owlv2VisionConfig", **{**B16, "image_size": 768}), 768),
    Tower("GIT", "microsoft/git-base", _vision("GitVisionModel", "GitVisionConfig", **B16), 224),
    Tower("SigLIP so400m (head)", "google/siglip-so400m-patch14-384", _vision(
        "SiglipVisionModel", "SiglipVisionConfig", hidden_size=1152, intermediate_size=4304,
        num_attention_heads=16, patch_size=14, image_size=384), 384),
    Tower("AIMv2", "apple/aimv2-large-patch14-224", _vision(
        "Aimv2VisionModel", "Aimv2VisionConfig", hidden_size=1024, intermediate_size=2816,
        num_attention_heads=8, patch_size=14, image_size=224), 224),
    Tower("BLIP", "Salesforce/blip-image-captioning-base", _vision(
        "BlipVisionModel", "BlipVisionConfig", **{**B16, "image_size": 384}), 384),
    Tower("BLIP-2 (EVA ViT-g)", "Salesforce/blip2-opt-2.7b", _vision(
        "Blip2VisionModel", "Blip2VisionConfig", hidden_size=1408, intermediate_size=6144,
        num_attention_heads=16, patch_size=14, image_size=224), 224),
    Tower("InstructBLIP", "Salesforce/instructblip-vicuna-7b", _vision(
        "InstructBlipVisionModel", "InstructBlipVisionConfig", hidden_size=1408,
        intermediate_size=6144, num_attention_heads=16, patch_size=14, image_size=224), 224),
    Tower("MLCD", "DeepGlint-AI/mlcd-vit-bigG-patch14-448 (L/14 widths)", _vision(
        "MLCDVisionModel", "MLCDVisionConfig", **L14), 224),
    Tower("InternVL vision", "OpenGVLab/InternVL3-1B-hf", _vision(
        "InternVLVisionModel", "InternVLVisionConfig", hidden_size=1024, intermediate_size=4096,
        num_attention_heads=16, patch_size=[14, 14], image_size=[448, 448]), 448),
    Tower("Janus vision", "deepseek-community/Janus-Pro-1B", _vision(
        "JanusVisionModel", "JanusVisionConfig", hidden_size=1024, intermediate_size=4096,
        num_attention_heads=16, patch_size=16, image_size=384), 384),
)


def prepare(model: Any) -> Any:
    """What random init leaves trivial gets a real draw: relative position bias tables
    start at zero in transformers (BEiT draws them with std 0.02, as here)."""
    import torch

    for module in model.modules():
        table = getattr(module, "relative_position_bias_table", None)
        if isinstance(table, torch.nn.Parameter):
            torch.nn.init.trunc_normal_(table, std=0.02)
    return model.eval()
