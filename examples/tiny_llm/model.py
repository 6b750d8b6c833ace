"""A tiny, deterministic, tensor-parallel GQA transformer for pdkv examples.

Why this exists: pdkv moves a request's paged KV cache from prefill ranks
(tensor parallelism P) to decode ranks (tensor parallelism D, possibly
P != D).  To show end to end that the bytes land in the right heads, pages
and slots, the decode ranks must continue generation from the transferred
cache and produce *exactly* the tokens a single process produces.  This
module provides such a model, small enough to run on CPU in seconds.

Design choices and the reasons for them:

* Everything is torch.float64 (weights, activations, KV cache).  Tensor
  parallelism changes the order of floating point reductions (all_reduce of
  partial sums); in float64 the resulting differences are ~1e-15, far below
  the gap between the best and second-best logit, so greedy tokens match a
  tp=1 reference exactly in practice.
* Weights come from a fixed-seed torch.Generator, so every process builds
  the same full weights and slices its own shard; nothing is communicated
  but the two all_reduces per layer.
* The KV cache is paged, token-major ("nhd", like SGLang): per layer one K
  and one V tensor of shape [num_pages, page_size, local_kv_heads,
  head_dim].  Position ``pos`` of a sequence lives at page
  ``pages[pos // page_size]``, slot ``pos % page_size``.
* RoPE with absolute positions: a token's K depends only on its own
  position, so a cache filled by prefill (in any number of chunks) is
  directly usable by decode at any later position.
* Untied lm_head: with tied embeddings a tiny random model tends to predict
  its input token, giving boring constant sequences.

Head ownership under tensor parallelism (the mapping pdkv must respect):

* Query heads are split evenly: rank r owns q heads
  [r*q/tp, (r+1)*q/tp).
* If tp <= kv_heads, KV heads are split evenly the same way.  If
  tp > kv_heads, each KV head is replicated on tp/kv_heads consecutive
  ranks: rank r owns kv head r // (tp // kv_heads).
* Query head i attends with kv head i // (q_heads // kv_heads).

This module does not import pdkv; it is the workload, not the transport.
"""

import math
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist

DTYPE = torch.float64
ELEMENT_BYTES = 8  # sizeof(float64)


# --------------------------------------------------------------------------
# Configuration and head ownership
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelConfig:
    """Shape of the tiny model; hidden = q_heads * head_dim."""

    vocab: int = 97
    layers: int = 4
    q_heads: int = 8
    kv_heads: int = 8
    head_dim: int = 32
    ffn: int = 512
    rope_base: float = 10000.0
    norm_eps: float = 1e-6

    def __post_init__(self):
        if self.q_heads % self.kv_heads != 0:
            raise ValueError("q_heads must be a multiple of kv_heads")
        if self.head_dim % 2 != 0:
            raise ValueError("head_dim must be even for RoPE")

    @property
    def hidden(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def group_size(self) -> int:
        """Query heads sharing one KV head."""
        return self.q_heads // self.kv_heads


def q_head_range(cfg: ModelConfig, tp_rank: int,
                 tp_size: int) -> Tuple[int, int]:
    """(first global q head, count) owned by tp_rank."""
    _check_rank(tp_rank, tp_size)
    if cfg.q_heads % tp_size != 0:
        raise ValueError(f"q_heads={cfg.q_heads} not divisible by "
                         f"tp_size={tp_size}")
    count = cfg.q_heads // tp_size
    return tp_rank * count, count


def kv_head_range(cfg: ModelConfig, tp_rank: int,
                  tp_size: int) -> Tuple[int, int]:
    """(first global kv head, count) owned by tp_rank.

    Split evenly when tp_size <= kv_heads; otherwise each rank holds one
    head, replicated on tp_size // kv_heads consecutive ranks.
    """
    _check_rank(tp_rank, tp_size)
    kv = cfg.kv_heads
    if tp_size <= kv:
        if kv % tp_size != 0:
            raise ValueError(f"kv_heads={kv} not divisible by "
                             f"tp_size={tp_size}")
        count = kv // tp_size
        return tp_rank * count, count
    if tp_size % kv != 0:
        raise ValueError(f"tp_size={tp_size} not a multiple of "
                         f"kv_heads={kv}")
    return tp_rank // (tp_size // kv), 1


def _check_rank(tp_rank: int, tp_size: int) -> None:
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise ValueError(f"bad tp_rank={tp_rank} for tp_size={tp_size}")


# --------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------

def _weight_shapes(cfg: ModelConfig) -> List[Tuple[str, Tuple[int, ...]]]:
    """Every parameter's name and shape, in the fixed order they are drawn.

    Linear weights are [out_features, in_features] (y = x @ W.T), as in
    torch.nn.Linear, so column-parallel slices rows and row-parallel
    slices columns.
    """
    h, d, f = cfg.hidden, cfg.head_dim, cfg.ffn
    shapes = [("embed", (cfg.vocab, h))]
    for i in range(cfg.layers):
        p = f"layers.{i}."
        shapes += [
            (p + "attn_norm", (h,)),
            (p + "wq", (cfg.q_heads * d, h)),
            (p + "wk", (cfg.kv_heads * d, h)),
            (p + "wv", (cfg.kv_heads * d, h)),
            (p + "wo", (h, cfg.q_heads * d)),
            (p + "mlp_norm", (h,)),
            (p + "w_gate", (f, h)),
            (p + "w_up", (f, h)),
            (p + "w_down", (h, f)),
        ]
    shapes += [("final_norm", (h,)), ("lm_head", (cfg.vocab, h))]
    return shapes


def _init_std(name: str, shape: Tuple[int, ...]) -> float:
    """Standard deviation for one parameter.

    std = 1/sqrt(fan_in) keeps activations O(1) through every layer.  The
    lm_head is scaled up (x4) so logits spread over several units: the
    top-1/top-2 gap is then many orders of magnitude above float64 noise.
    The embedding has std 1 so the residual stream starts at unit scale.
    """
    if name == "embed":
        return 1.0
    if name == "lm_head":
        return 4.0 / math.sqrt(shape[1])
    return 1.0 / math.sqrt(shape[-1])


def make_weights(cfg: ModelConfig,
                 seed: int = 1234) -> Dict[str, torch.Tensor]:
    """Full (unsharded) float64 weights, identical on every process."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, shape in _weight_shapes(cfg):
        if name.endswith("norm"):
            # Norm gains near 1; the small jitter keeps them non-trivial.
            w = 1.0 + 0.1 * torch.randn(shape, generator=gen, dtype=DTYPE)
        else:
            std = _init_std(name, shape)
            w = std * torch.randn(shape, generator=gen, dtype=DTYPE)
        weights[name] = w
    return weights


# --------------------------------------------------------------------------
# Paged KV cache
# --------------------------------------------------------------------------

class PagedKVCache:
    """One rank's paged KV cache, token-major ("nhd") like SGLang.

    k[layer] and v[layer] are contiguous float64 tensors of shape
    [num_pages, page_size, local_kv_heads, head_dim].  One page of one
    buffer is item_bytes() contiguous bytes, which is what a transfer
    engine moves.
    """

    def __init__(self, cfg: ModelConfig, local_kv_heads: int,
                 num_pages: int, page_size: int):
        if local_kv_heads < 1 or num_pages < 1 or page_size < 1:
            raise ValueError("local_kv_heads, num_pages, page_size must "
                             "be positive")
        self.cfg = cfg
        self.local_kv_heads = local_kv_heads
        self.num_pages = num_pages
        self.page_size = page_size
        shape = (num_pages, page_size, local_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=DTYPE) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, dtype=DTYPE) for _ in range(cfg.layers)]

    def buffers(self) -> List[torch.Tensor]:
        """All K layers then all V layers (SGLang's buffer order)."""
        return list(self.k) + list(self.v)

    def item_bytes(self) -> int:
        """Bytes of one page of one buffer."""
        return (self.page_size * self.local_kv_heads * self.cfg.head_dim
                * ELEMENT_BYTES)


def pages_needed(num_tokens: int, page_size: int) -> int:
    """Pages that hold num_tokens positions."""
    return -(-num_tokens // page_size)


# --------------------------------------------------------------------------
# Small math helpers
# --------------------------------------------------------------------------

def rms_norm(x: torch.Tensor, weight: torch.Tensor,
             eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope_cos_sin(cfg: ModelConfig,
                 positions: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [T, 1, head_dim/2] for absolute positions."""
    half = cfg.head_dim // 2
    exponent = torch.arange(half, dtype=DTYPE) * 2.0 / cfg.head_dim
    inv_freq = cfg.rope_base ** (-exponent)
    angles = positions.to(DTYPE)[:, None] * inv_freq[None, :]
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on x of shape [T, heads, head_dim]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def greedy(logits: torch.Tensor) -> int:
    """Argmax over the vocabulary; ties go to the lowest index."""
    flat = logits.reshape(-1)
    best = torch.nonzero(flat == flat.max(), as_tuple=False)
    return int(best[0, 0])


# --------------------------------------------------------------------------
# The tensor-parallel model
# --------------------------------------------------------------------------

class TPModel:
    """One tensor-parallel rank of the model.

    QKV and MLP gate/up are column-parallel (each rank computes its heads /
    its ffn slice); the attention output and MLP down projections are
    row-parallel, followed by an all_reduce(SUM) over `group` when
    tp_size > 1.  Embedding and lm_head are replicated, so every rank ends
    with the full logits and picks the same greedy token.
    """

    def __init__(self, cfg: ModelConfig, weights: Dict[str, torch.Tensor],
                 tp_rank: int, tp_size: int, group=None):
        if cfg.ffn % tp_size != 0:
            raise ValueError(f"ffn={cfg.ffn} not divisible by "
                             f"tp_size={tp_size}")
        self.cfg = cfg
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.group = group
        self.q_head_offset, self.local_q_heads = q_head_range(
            cfg, tp_rank, tp_size)
        self.kv_head_offset, self.local_kv_heads = kv_head_range(
            cfg, tp_rank, tp_size)
        self._kv_index = self._local_kv_index()
        self.embed = weights["embed"]
        self.final_norm = weights["final_norm"]
        self.lm_head = weights["lm_head"]
        self.layers = [self._shard_layer(weights, i)
                       for i in range(cfg.layers)]

    # -- construction ------------------------------------------------------

    def _local_kv_index(self) -> torch.Tensor:
        """For each local q head, the index of its kv head in this rank's
        cache; refuses an ownership where a q head's kv head lives on
        another rank (attention would then need communication)."""
        index = []
        for i in range(self.local_q_heads):
            global_kv = (self.q_head_offset + i) // self.cfg.group_size
            local_kv = global_kv - self.kv_head_offset
            if not 0 <= local_kv < self.local_kv_heads:
                raise ValueError(
                    f"rank {self.tp_rank}: q head {self.q_head_offset + i} "
                    f"needs kv head {global_kv}, not owned here")
            index.append(local_kv)
        return torch.tensor(index, dtype=torch.long)

    def _shard_layer(self, weights: Dict[str, torch.Tensor],
                     i: int) -> Dict[str, torch.Tensor]:
        """This rank's slices of layer i's weights."""
        p, d = f"layers.{i}.", self.cfg.head_dim
        q0, nq = self.q_head_offset * d, self.local_q_heads * d
        k0, nk = self.kv_head_offset * d, self.local_kv_heads * d
        f = self.cfg.ffn // self.tp_size
        f0 = self.tp_rank * f
        return {
            "attn_norm": weights[p + "attn_norm"],
            "wq": _rows(weights[p + "wq"], q0, nq),
            "wk": _rows(weights[p + "wk"], k0, nk),
            "wv": _rows(weights[p + "wv"], k0, nk),
            "wo": _cols(weights[p + "wo"], q0, nq),
            "mlp_norm": weights[p + "mlp_norm"],
            "w_gate": _rows(weights[p + "w_gate"], f0, f),
            "w_up": _rows(weights[p + "w_up"], f0, f),
            "w_down": _cols(weights[p + "w_down"], f0, f),
        }

    # -- public forward API ------------------------------------------------

    @torch.no_grad()
    def prefill(self, tokens: Sequence[int], cache: PagedKVCache,
                pages: Sequence[int], start_pos: int = 0) -> torch.Tensor:
        """Run tokens at positions start_pos.., store their K/V in the
        cache, attend causally to every earlier cached position, and return
        the logits [vocab] of the last token.

        Calling it with consecutive chunks (same `pages`) is chunked
        prefill; positions < start_pos must already be in the cache.
        """
        if len(tokens) == 0:
            raise ValueError("prefill needs at least one token")
        self._check_cache(cache)
        end = start_pos + len(tokens)
        page_idx, slot_idx = _slots(pages, end, cache)
        positions = torch.arange(start_pos, end)
        cos, sin = rope_cos_sin(self.cfg, positions)
        x = self.embed[torch.tensor(list(tokens), dtype=torch.long)]
        eps = self.cfg.norm_eps
        for layer_id, w in enumerate(self.layers):
            h = rms_norm(x, w["attn_norm"], eps)
            x = x + self._attention(h, w, layer_id, cache, positions,
                                    (cos, sin), (page_idx, slot_idx))
            h = rms_norm(x, w["mlp_norm"], eps)
            x = x + self._mlp(h, w)
        last = rms_norm(x[-1], self.final_norm, eps)
        return last @ self.lm_head.t()

    def decode_step(self, token: int, pos: int, cache: PagedKVCache,
                    pages: Sequence[int]) -> torch.Tensor:
        """One token at position pos: writes its K/V, attends to 0..pos."""
        return self.prefill([token], cache, pages, start_pos=pos)

    # -- layer pieces ------------------------------------------------------

    def _attention(self, h, w, layer_id, cache, positions, rope, slots):
        """Causal GQA attention over the paged cache for this rank's heads."""
        cos, sin = rope
        page_idx, slot_idx = slots
        t, d = h.shape[0], self.cfg.head_dim
        q = apply_rope((h @ w["wq"].t()).view(t, self.local_q_heads, d),
                       cos, sin)
        k = apply_rope((h @ w["wk"].t()).view(t, self.local_kv_heads, d),
                       cos, sin)
        v = (h @ w["wv"].t()).view(t, self.local_kv_heads, d)
        # Store the new tokens first, then read back the whole prefix, so
        # the new tokens and the cached ones take the same path.
        start = int(positions[0])
        new = slice(start, None)
        cache.k[layer_id][page_idx[new], slot_idx[new]] = k
        cache.v[layer_id][page_idx[new], slot_idx[new]] = v
        keys = cache.k[layer_id][page_idx, slot_idx][:, self._kv_index]
        vals = cache.v[layer_id][page_idx, slot_idx][:, self._kv_index]
        scores = torch.einsum("tqd,lqd->qtl", q, keys) / math.sqrt(d)
        key_pos = torch.arange(page_idx.shape[0])
        future = key_pos[None, :] > positions[:, None]  # [T, L]
        scores = scores.masked_fill(future[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.einsum("qtl,lqd->tqd", probs, vals).reshape(t, -1)
        return self._all_reduce(out @ w["wo"].t())

    def _mlp(self, h, w):
        """SwiGLU on this rank's ffn slice, then row-parallel down proj."""
        gated = torch.nn.functional.silu(h @ w["w_gate"].t()) * (
            h @ w["w_up"].t())
        return self._all_reduce(gated @ w["w_down"].t())

    def _all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """Sum row-parallel partial outputs over the TP group."""
        if self.tp_size > 1:
            partial = partial.contiguous()
            dist.all_reduce(partial, op=dist.ReduceOp.SUM, group=self.group)
        return partial

    def _check_cache(self, cache: PagedKVCache) -> None:
        if cache.local_kv_heads != self.local_kv_heads:
            raise ValueError(
                f"cache has {cache.local_kv_heads} kv heads, rank owns "
                f"{self.local_kv_heads}")
        if len(cache.k) != self.cfg.layers:
            raise ValueError("cache built for a different layer count")


def _rows(w: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """Column-parallel shard: output features [start, start+count)."""
    return w[start:start + count].contiguous()


def _cols(w: torch.Tensor, start: int, count: int) -> torch.Tensor:
    """Row-parallel shard: input features [start, start+count)."""
    return w[:, start:start + count].contiguous()


def _slots(pages: Sequence[int], end: int,
           cache: PagedKVCache) -> Tuple[torch.Tensor, torch.Tensor]:
    """(page id, slot) of every position 0..end-1 of the sequence."""
    ps = cache.page_size
    if len(pages) * ps < end:
        raise ValueError(f"{len(pages)} pages of {ps} cannot hold "
                         f"{end} positions")
    page_ids = torch.tensor(list(pages), dtype=torch.long)
    if page_ids.numel() and (page_ids.min() < 0
                             or page_ids.max() >= cache.num_pages):
        raise ValueError("page id outside the cache")
    pos = torch.arange(end)
    return page_ids[pos // ps], pos % ps


# --------------------------------------------------------------------------
# Generation helpers
# --------------------------------------------------------------------------

def decode_tokens(model: TPModel, cache: PagedKVCache, pages: Sequence[int],
                  first_token: int, pos: int,
                  max_new_tokens: int) -> List[int]:
    """Greedy continuation from a filled cache.

    first_token is the token prefill produced, to be placed at position pos
    (the prompt length).  Returns max_new_tokens tokens, first_token
    included, i.e. runs max_new_tokens - 1 decode steps.  With tp_size > 1
    every rank of the group must call this together.
    """
    out = [first_token]
    token = first_token
    for step in range(max_new_tokens - 1):
        token = greedy(model.decode_step(token, pos + step, cache, pages))
        out.append(token)
    return out


def reference_generate(cfg: ModelConfig, weights: Dict[str, torch.Tensor],
                       prompt: Sequence[int],
                       max_new_tokens: int) -> List[int]:
    """Single-process (tp=1, no torch.distributed) greedy generation.

    The first token comes from the prompt's last logits; then
    max_new_tokens - 1 decode steps, so len(result) == max_new_tokens.
    """
    if max_new_tokens < 1:
        return []
    page_size = 16
    num_pages = pages_needed(len(prompt) + max_new_tokens, page_size)
    model = TPModel(cfg, weights, tp_rank=0, tp_size=1)
    cache = PagedKVCache(cfg, model.local_kv_heads, num_pages, page_size)
    pages = list(range(num_pages))
    first = greedy(model.prefill(prompt, cache, pages))
    return decode_tokens(model, cache, pages, first, len(prompt),
                         max_new_tokens)


def make_prompts(n: int, seed: int, min_len: int, max_len: int,
                 vocab: int = 97) -> List[List[int]]:
    """n deterministic prompts with lengths in [min_len, max_len]."""
    if not 1 <= min_len <= max_len:
        raise ValueError("need 1 <= min_len <= max_len")
    gen = torch.Generator().manual_seed(seed)
    prompts = []
    for _ in range(n):
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
        tokens = torch.randint(0, vocab, (length,), generator=gen)
        prompts.append([int(t) for t in tokens])
    return prompts
