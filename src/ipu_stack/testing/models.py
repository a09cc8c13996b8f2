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
