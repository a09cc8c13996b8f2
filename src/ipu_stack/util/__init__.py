"""Small helpers every stage may import: structured logging, atomic file writes, errors."""
