"""The engine: the attention probe (Eq. 1 / Eq. 2 inside the attention function, head masking) and the one
greedy decoding loop that drives it, single and batched, with tracing (``tracing``: every head's scores at every
step) as its simplest policy."""
