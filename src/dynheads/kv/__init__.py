"""KV retention from heads: the simulated retention policies and the loop that applies them, the real per-head
cache, the head-guided token votes, and kvpress's presses beside them."""
