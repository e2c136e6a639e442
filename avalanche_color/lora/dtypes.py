"""The dtype trained weights are kept in beside a frozen backbone, and the dtype they compute in.

A trained weight (a LoRA factor, a head) is kept in float32, or in the backbone's dtype when that is
wider (float64): kept in bfloat16, an SGD update smaller than 2⁻⁸ of the weight would be rounded away
(one step at lr 1e-3 changes no LoRA entry). It computes in the dtype of the activations it meets
(a bfloat16 backbone's, or autocast's), cast at each forward as autocast casts a linear layer's weight:
the cast is of the small factors, not of the tokens, and its backward hands the gradient to the
float32 weight. On a float32 backbone without autocast every cast is the tensor itself.
"""

from __future__ import annotations

import torch


def trained_dtype(backbone_dtype: torch.dtype) -> torch.dtype:
    """The dtype of weights trained beside a backbone of ``backbone_dtype``: float32, or the backbone's if wider."""
    return torch.promote_types(backbone_dtype, torch.float32)
