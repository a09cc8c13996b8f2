"""exchange stage."""
