"""L2P's prompt pool: prompts with keys, chosen per sample (or per batch) by how well the keys match a query."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from avalanche_color.peers.l2p.config import PROMPT_INITS, PromptInit
from avalanche_color.peers.prompts import new_prompts
from avalanche_color.utils.checks import one_of, require


class PromptPool(nn.Module):
    """M prompts of ``prompt_length`` tokens, each with a key of the query's width.

    A sample's query (the frozen ViT's [CLS] feature) picks the ``top_n``
    prompts whose keys are most cosine-similar to it; the surrogate loss pulls
    the chosen keys towards their queries (L2P, Wang et al., CVPR 2022, Eq. 5).
    Keys start uniform in [-1, 1], as in Avalanche's port (L2P's code: [0, 0.01)).

    Args:
        pool_size: M, the number of prompts.
        prompt_length: L_p, tokens per prompt.
        width: token width of the ViT (prompts) and width of its queries (keys).
        key_width: width of the queries, if it differs from ``width``.
        prompt_init: prompts start ``"uniform"`` in [-1, 1] (Avalanche's port's default) or at
            ``"zero"`` (the port's other option; the prompt outputs then start as
            image-driven as the [CLS] output, which helps small, untrained ViTs); ``"code"``:
            prompts and keys in [0, 0.01), L2P's code's flax ``uniform()``.
    """

    def __init__(self, pool_size: int, prompt_length: int, width: int, key_width: int | None = None,
                 prompt_init: PromptInit = "uniform") -> None:
        super().__init__()
        require("prompt_init", prompt_init, one_of(PROMPT_INITS))
        if prompt_init == "code":  # flax's uniform(): [0, 0.01), prompts and keys alike
            self.prompts = nn.Parameter(torch.empty(pool_size, prompt_length, width).uniform_(0.0, 0.01))
            self.keys = nn.Parameter(torch.empty(pool_size, key_width or width).uniform_(0.0, 0.01))
            return
        bound = 1.0 if prompt_init == "uniform" else 0.0
        self.prompts = nn.Parameter(torch.empty(pool_size, prompt_length, width).uniform_(-bound, bound))
        self.keys = new_prompts(pool_size, key_width or width, 1.0)

    @property
    def pool_size(self) -> int:
        return self.prompts.shape[0]

    @property
    def prompt_length(self) -> int:
        return self.prompts.shape[1]

    def similarity(self, query: Tensor) -> Tensor:
        """(batch, M) cosine similarity of each query (batch, width) to each key, in the keys' dtype (a bfloat16
        backbone's query is cast up to float32 keys)."""
        query = query.to(self.keys.dtype)
        return nn.functional.normalize(query, dim=-1) @ nn.functional.normalize(self.keys, dim=-1).T

    def select(self, query: Tensor, top_n: int, *, batchwise: bool = False) -> Tensor:
        """(batch, top_n) indices of the best-matching keys per query, best first; with ``batchwise``,
        the batch's :func:`majority_selection` for every sample."""
        selection = self.similarity(query.detach()).topk(top_n, dim=1).indices
        return majority_selection(selection, self.pool_size) if batchwise else selection

    def selected_prompts(self, selection: Tensor) -> Tensor:
        """(batch, top_n * prompt_length, width): the selected prompts, concatenated in selection order."""
        return self.prompts[selection].flatten(1, 2)

    def surrogate_loss(self, query: Tensor, selection: Tensor) -> Tensor:
        """Cosine distance of each query to its selected keys, summed over keys, averaged over the batch.

        Only the keys receive its gradient (the query comes from the frozen backbone).
        """
        chosen = self.similarity(query.detach()).gather(1, selection)
        return (1 - chosen).sum(dim=1).mean()


def majority_selection(selection: Tensor, pool_size: int) -> Tensor:
    """The ``top_n`` prompts a batch's samples chose most often, for every sample of the batch.

    L2P's code's ``batchwise_prompt`` (``models/prompt.py``, ``Prompt.__call__``): ``jnp.unique``
    counts the ids in the batch's (batch, top_n) ``selection`` and ``jax.lax.top_k`` takes the
    ``top_n`` largest counts, the lower id first among equal counts.

    Args:
        selection: (batch, top_n) prompt indices chosen per sample.
        pool_size: the number of prompts in the pool.

    Returns:
        (batch, top_n): the same ``top_n`` indices in every row, the most often chosen first.
    """
    counts = torch.bincount(selection.flatten(), minlength=pool_size)
    majority = counts.sort(descending=True, stable=True).indices[: selection.shape[1]]
    return majority.unsqueeze(0).expand(selection.shape[0], -1)
