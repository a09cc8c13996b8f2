"""``ipu-stack fp8-recipe``: which layers an FP8 model must keep in F16 (``search``)."""
