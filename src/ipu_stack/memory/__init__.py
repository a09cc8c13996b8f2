"""Storage placement: lifetimes, per-tile allocation by memory class, reports."""
