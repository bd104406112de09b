"""Figures: matplotlib with the Agg canvas only (no display needed), written atomically as PNG."""
