"""lowering stage."""
