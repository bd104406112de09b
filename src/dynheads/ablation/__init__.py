"""Per-step head ablation: the cascade (greedy continues under masking), the teacher-forced dose-response and
the registry of strategies that choose the masked heads."""
