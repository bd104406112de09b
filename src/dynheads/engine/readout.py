"""What a head writes toward a token: the unembedding row of the token read back through each head's slice of its
layer's output projection (the write score's readout; ``dynheads.scores.write_scores``).

Head (l, h) adds ``W_O^{l,h} z`` to the residual stream, where ``z`` is its attention output (a weighted sum of
value rows) and ``W_O^{l,h}`` the columns ``h * D .. (h + 1) * D`` of the layer's output projection. Its direct
contribution to token y's logit is ``u_yᵀ W_O^{l,h} z`` with ``u_y`` the unembedding row of y (LOCOS,
arXiv 2607.01002; the final norm and any logit soft-cap are not folded in, as there). ``HeadReadout(token)`` is
``W_O^{l,h}ᵀ u_y`` for every head, ``[L, H, D]``: one vector-matrix product per layer, the cost of one output
projection of one token. The projections are found by module, never by architecture name: every attention module
that transformers numbers (``layer_idx``) and that holds a linear ``o_proj`` (Llama, Qwen2/3, Mistral, Phi-3,
Gemma 2/3).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from dynheads.errors import DynheadsError


class HeadReadout:
    """``readout(token) -> [L, H, D]`` float32: each head's output-space direction toward ``token``'s logit."""

    def __init__(self, model: PreTrainedModel, num_layers: int, num_heads: int):
        self.model, self.num_layers, self.num_heads = model, num_layers, num_heads
        self._projections: list[torch.Tensor] | None = None  # per layer, [d_model, H * D] (found at first use)
        self._unembedding: torch.Tensor | None = None  # [V, d_model]

    def projections(self) -> list[torch.Tensor]:
        """Each layer's output projection weight ``[d_model, H * D]``, in layer order (views, never copies)."""
        if self._projections is None:
            found: dict[int, torch.Tensor] = {}
            for module in self.model.modules():
                layer, projection = getattr(module, "layer_idx", None), getattr(module, "o_proj", None)
                if isinstance(layer, int) and isinstance(projection, torch.nn.Linear):
                    found[layer] = projection.weight.detach()
            if sorted(found) != list(range(self.num_layers)):
                raise DynheadsError(
                    f"the write score needs every layer's attention output projection (o_proj); "
                    f"{type(self.model).__name__} has {len(found)} of {self.num_layers}"
                )
            widths = {weight.shape[1] for weight in found.values()}
            if len(widths) != 1 or next(iter(widths)) % self.num_heads:
                raise DynheadsError(
                    f"the output projections of {type(self.model).__name__} take {sorted(widths)} inputs, "
                    f"not one multiple of its {self.num_heads} heads"
                )
            self._projections = [found[layer] for layer in range(self.num_layers)]
        return self._projections

    def unembedding(self) -> torch.Tensor:
        """The model's output embedding matrix ``[V, d_model]``."""
        if self._unembedding is None:
            embeddings = self.model.get_output_embeddings()
            if embeddings is None:
                raise DynheadsError(f"{type(self.model).__name__} has no output embeddings: the write score needs them")
            self._unembedding = embeddings.weight.detach()
        return self._unembedding

    def __call__(self, token: int) -> torch.Tensor:
        row = self.unembedding()[token]  # [d_model]
        directions = []
        for weight in self.projections():  # one vector-matrix product per layer, no copy of the weights
            same = row.device == weight.device and row.dtype == weight.dtype
            direction = (row if same else row.to(weight.device, weight.dtype)) @ weight
            directions.append(direction if direction.device == row.device else direction.to(row.device))
        stacked = torch.stack(directions)
        stacked = stacked if stacked.dtype == torch.float32 else stacked.float()
        return stacked.view(self.num_layers, self.num_heads, -1)
