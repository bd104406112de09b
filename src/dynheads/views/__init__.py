"""Readings of finished runs: what is computed from a run folder without decoding (dynamism, CCA and Figure 1, the
head predictor trained on a run's hidden states, thresholds fitted on a run, hallucination detection, KV tables
and the join of KV runs, record comparison). The experiments that decode sit a floor above and read these."""
