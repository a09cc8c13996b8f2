"""The compile stages and what they hand on; ``ipu_stack.pipeline`` runs them in order."""
