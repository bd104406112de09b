"""What the paper ("Retrieval Heads are Dynamic") reports: every published number and stated result the code
compares against, one constant per table or figure, each with where it is in the paper.

Section numbers count the paper's sections as printed (1 Introduction, 2 Related Works, 3 Analysis, 4 HotpotQA,
5 Dynamic RAG; appendices A-D); the LaTeX label follows in brackets. This module imports nothing from dynheads:
every floor may read it, and it holds no code that computes anything of ours.
"""

from __future__ import annotations

import math

# The model of the paper's single-model results (Figures 1-8, the CCA numbers, Table 6).
PAPER_MODEL = "llama3.1-8b"

# Table 1 (Sec. 3.2 [tab:dynamism_stats]; Jaccard w/ static top-20) and Table 5 (App. B
# [tab:jaccard_k_sensitivity]; top-50, top-100), keyed like ``DynamismStats.to_dict()``.
DYNAMISM_COLUMNS = (
    "mean_size",
    "std_size",
    "unique_heads",
    "total_heads",
    "jaccard_static_k20",
    "jaccard_static_k50",
    "jaccard_static_k100",
    "adjacent_jaccard",
    "entropy",
)
PAPER_DYNAMISM: dict[str, dict[str, float]] = {
    model: dict(zip(DYNAMISM_COLUMNS, row, strict=True))
    for model, row in {
        "llama3.1-8b": (12.97, 7.69, 238, 1024, 0.3512, 0.2106, 0.1236, 0.2793, 3.8154),
        "llama3.2-3b": (9.69, 6.18, 149, 672, 0.3126, 0.1755, 0.0964, 0.3188, 3.0083),
        "qwen3-8b": (20.18, 10.43, 415, 1152, 0.4611, 0.3011, 0.1799, 0.3668, 4.1038),
        "llama2-13b": (6.20, 5.49, 172, 1600, 0.2077, 0.1116, 0.0612, 0.4979, 4.8973),
        "phi4-mini": (6.13, 7.09, 176, 768, 0.1845, 0.1087, 0.0606, 0.5056, 3.5532),
    }.items()
}

# Entropy of uniform use of exactly the top-20 static heads, the baseline of Table 1's entropy (App. A.3
# [ap:entropy_baseline]: ln 20 ≈ 2.9957).
ENTROPY_BASELINE = math.log(20)

# Figure 2 (Sec. 3.3 [fig:dynamic_masking]) and Figure 6 (Sec. 4.2 [fig:dynamic_masking_hotpotqa]) in words, per
# task of the ablation grid: the paper gives no numbers per strategy.
PAPER_GRID = {
    "niah": (
        "dynamic masking drives accuracy to about 0 in almost every cell, while masking as many static or "
        "random heads leaves most cells intact (Figure 2; 5 runs per cell)"
    ),
    "hotpotqa": (
        "masking the dynamic reasoning heads degrades F1 far more than masking as many static or random "
        "heads (Figure 6)"
    ),
}
# Figures 2 and 6 as the report's verdict cards show them: what each masked strategy's heat map looks like.
PAPER_ABLATION = {
    "NIAH": {"dynamic": "≈ 0", "static": "mostly intact", "random": "mostly intact"},
    "HotpotQA": {"dynamic": "far lower", "static": "near un-ablated", "random": "near un-ablated"},
}
# Figure 6 as the report's HotpotQA ablation section states it.
PAPER_FIGURE6 = (
    "Figure 6 (llama3.1-8b): masking the dynamic heads (Eq. 2) lowers F1 far more than masking as many "
    "static or random heads."
)

# Figure 3 (Sec. 3.3.1 [fig:irreplaceability]; setting in App. A.2).
PAPER_PROGRESSIVE = (
    "accuracy falls from 1.0 to 0.0 as k reaches 20, while the overlap of the compensating heads "
    "with the static top-20 rises to 4.5-7 for k >= 5 (Figure 3; 5000-token haystack, 20 runs)"
)
# Figure 7 (Sec. 4.2 [fig:irreplaceability_hotpotqa]).
PAPER_FIGURE7 = "Figure 7 (llama3.1-8b): HotpotQA degrades as more dynamic heads are masked per step."

# Figure 4's first canonical correlation (in-sample) per temporal offset k, read from the text of Sec. 3.4
# [sec:analysis_predictable] (NIAH); the paper states it for one model only.
PAPER_TOP1: dict[str, dict[int, float]] = {PAPER_MODEL: {0: 0.966, 1: 0.931, 2: 0.915}}

# Figure 5 (Sec. 4.2 [fig:retrieval_dynamics_hotpotqa]).
PAPER_FIGURE5 = (
    "Figure 5 (llama3.1-8b): the Eq. 2 scores of ten heads change over one answer; the paper gives no "
    "Table 1 numbers for HotpotQA."
)
# Figure 8 (Sec. 4.2 [fig:predictability_hotpotqa]).
PAPER_FIGURE8 = "Figure 8: the correlation persists on HotpotQA (the paper states no numbers)."

# Table 2 (Sec. 3.4 [tab:predictability]; NIAH, binary copy scores) and Table 3 (Sec. 4.2
# [tab:predictability_hotpotqa]; HotpotQA, continuous reasoning scores): the MLP probe on the test split.
PAPER_PROBE_BINARY: dict[str, dict[str, float]] = {
    "llama3.1-8b": {"f1": 0.8349, "precision": 0.8344, "recall": 0.8353, "auprc": 0.9173},
    "llama3.2-3b": {"f1": 0.8456, "precision": 0.8564, "recall": 0.8351, "auprc": 0.9289},
    "qwen3-8b": {"f1": 0.8566, "precision": 0.8780, "recall": 0.8362, "auprc": 0.9339},
    "llama2-13b": {"f1": 0.8336, "precision": 0.8455, "recall": 0.8220, "auprc": 0.9183},
    "phi4-mini": {"f1": 0.8038, "precision": 0.8219, "recall": 0.7865, "auprc": 0.8862},
}
PAPER_PROBE_CONTINUOUS: dict[str, dict[str, float]] = {
    "llama3.1-8b": {"mse": 0.0023, "mae": 0.0177, "r2": 0.8120},
    "llama3.2-3b": {"mse": 0.0036, "mae": 0.0247, "r2": 0.8015},
    "qwen3-8b": {"mse": 0.0050, "mae": 0.0255, "r2": 0.7200},
    "llama2-13b": {"mse": 0.0009, "mae": 0.0121, "r2": 0.7669},
    "phi4-mini": {"mse": 0.0014, "mae": 0.0109, "r2": 0.7333},
}

# Table 4 (Sec. 5 [tab:dynrag]; HotpotQA, k = 5, five models): (EM, F1) per RAG strategy.
PAPER_TABLE4 = {
    "llama3.1-8b": {
        "dynamic": (0.456, 0.5586),
        "static": (0.398, 0.5098),
        "dynamic-random": (0.272, 0.3670),
        "fixed-random": (0.272, 0.3763),
        "none": (0.252, 0.3257),
    },
    "llama3.2-3b": {
        "dynamic": (0.384, 0.4993),
        "static": (0.428, 0.5386),
        "dynamic-random": (0.224, 0.3143),
        "fixed-random": (0.226, 0.3051),
        "none": (0.184, 0.2439),
    },
    "qwen3-8b": {
        "dynamic": (0.286, 0.3580),
        "static": (0.278, 0.3429),
        "dynamic-random": (0.210, 0.2804),
        "fixed-random": (0.210, 0.2804),
        "none": (0.220, 0.2961),
    },
    "llama2-13b": {
        "dynamic": (0.284, 0.3838),
        "static": (0.278, 0.3789),
        "dynamic-random": (0.276, 0.3762),
        "fixed-random": (0.272, 0.3751),
        "none": (0.192, 0.2750),
    },
    "phi4-mini": {
        "dynamic": (0.202, 0.2690),
        "static": (0.186, 0.2505),
        "dynamic-random": (0.082, 0.1090),
        "fixed-random": (0.086, 0.1111),
        "none": (0.172, 0.2331),
    },
}
# Table 6 (App. C [tab:robustness_k]; llama3.1-8b, HotpotQA) at k = 10 and 20: (EM, F1); its k = 5 column is
# Table 4's llama3.1-8b row.
PAPER_TABLE6 = {
    10: {
        "dynamic": (0.286, 0.3877),
        "static": (0.280, 0.3767),
        "dynamic-random": (0.280, 0.3807),
        "fixed-random": (0.276, 0.3711),
    },
    20: {
        "dynamic": (0.292, 0.3967),
        "static": (0.282, 0.3810),
        "dynamic-random": (0.274, 0.3713),
        "fixed-random": (0.276, 0.3751),
    },
}
