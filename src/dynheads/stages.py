"""The stages of ``dynheads reproduce``. A stage's name is its sub-folder of the study and its key in
``stages.json``: ``reproduce`` writes under these names and the report reads them, so both import them from here.
"""

from __future__ import annotations

# NIAH (Section 3): the traced grid, static copy heads, then Claims 1-3.
NIAH = "niah"
STATIC = "static"
DYNAMISM = "dynamism"
ABLATION = "ablation"
PROGRESSIVE = "progressive"
CCA = "cca"
PROBE = "probe"
# HotpotQA (Section 4): static reasoning heads, the traced grid, then Claims 1-3 on Eq. 2 scores.
HOTPOTQA_STATIC = "hotpotqa-static"
HOTPOTQA = "hotpotqa"
HOTPOTQA_DYNAMISM = "hotpotqa-dynamism"
HOTPOTQA_CCA = "hotpotqa-cca"
HOTPOTQA_PROBE = "hotpotqa-probe"
HOTPOTQA_ABLATION = "hotpotqa-ablation"
HOTPOTQA_PROGRESSIVE = "hotpotqa-progressive"
# Dynamic RAG (Section 5).
RAG = "rag"

