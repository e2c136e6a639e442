"""CL-LoRA's adapters (``backbone/vit_cllora.py`` of the authors' code) and the token paths through them.

* Shared blocks (``general_pos``, the first ones): one :class:`QVAdapter` each for the whole stream, its
  D frozen from the start, its U trained in every experience and never reset, coefficient 1. The
  distillation teacher is a copy of the shared U's at the previous experience's end (its D's are the
  shared ones, which never change).
* Task-specific blocks (``specfic_pos``, the rest): per experience one new adapter each (D and U train,
  frozen after it) and block weights (3 x task-specific blocks, rows q, k, v, init U(0.5, 1.5)); row q
  scales q's update and row v v's, row k is unused in the forward (but in the orthogonality term).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from avalanche_color.lora import block_forward
from avalanche_color.peers.cl_lora.layer import QVAdapter, QVUpdate


class AdapterBank(nn.Module):
    """The shared adapters, their teacher, and each experience's task-specific adapters and block weights.

    Args:
        num_blocks, num_shared: the ViT's blocks and how many first ones are shared.
        width, rank: the qkv layers' input width and the adapters' rank.
        generator: draws the shared adapters' D's (block by block, q then v).
        like: a tensor of the trained weights' dtype (float32 beside a bfloat16 ViT) and the backbone's device.
    """

    teacher_up: Tensor

    def __init__(self, num_blocks: int, num_shared: int, width: int, rank: int, generator: torch.Generator,
                 like: Tensor) -> None:
        super().__init__()
        self.num_shared, self.num_specific, self.width, self.rank = num_shared, num_blocks - num_shared, width, rank
        self.shared = nn.ModuleList(QVAdapter(width, rank, generator, like) for _ in range(num_shared))
        self.register_buffer("teacher_up", like.new_zeros(num_shared, 2, width, rank))
        self.specific = nn.ModuleList()  # per experience: a ModuleList of one QVAdapter per task-specific block
        self.block_weights = nn.ParameterList()  # per experience: (3, task-specific blocks)

    def add_experience(self, generator: torch.Generator, like: Tensor) -> None:
        """New task-specific adapters (block by block, q then v), then block weights U(0.5, 1.5)."""
        self.specific.append(nn.ModuleList(QVAdapter(self.width, self.rank, generator, like)
                                           for _ in range(self.num_specific)))
        weights = torch.rand(3, self.num_specific, generator=generator, dtype=torch.float64) + 0.5
        self.block_weights.append(nn.Parameter(weights.to(like.device, like.dtype)))

    @torch.no_grad()
    def snapshot_teacher(self) -> None:
        """The shared U's as they are now become the distillation teacher."""
        if self.num_shared:
            self.teacher_up.copy_(torch.stack([adapter.up for adapter in self.shared]))

    def shared_tokens(self, blocks: nn.Sequential, tokens: Tensor, teacher: bool = False) -> Tensor:
        """Through the shared blocks with the shared adapters (``teacher``: the teacher's U's instead)."""
        for index, adapter in enumerate(self.shared):
            up = self.teacher_up[index] if teacher else adapter.up
            tokens = block_forward(blocks[index], tokens, QVUpdate(adapter.down, up))  # type: ignore[arg-type]
        return tokens

    def specific_tokens(self, blocks: nn.Sequential, tokens: Tensor, experience: int) -> Tensor:
        """Through the task-specific blocks with ``experience``'s adapters and its q and v block weights."""
        weights = self.block_weights[experience]
        for j, adapter in enumerate(self.specific[experience]):
            update = QVUpdate(adapter.down, adapter.up, weights[0::2, j])
            tokens = block_forward(blocks[self.num_shared + j], tokens, update)  # type: ignore[arg-type]
        return tokens
