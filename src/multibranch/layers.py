"""The papers' building blocks under stable names, for use in your own `torch.nn.Module`s.

    from multibranch.layers import MultiBranchAttention, DropHead

    attn = MultiBranchAttention(d_model=512, heads=8, branches=3)    # MAT: N_a = 3 branches of 8 heads
    y = attn(x, key_padding_mask=pad)                                # x [B, L, 512] -> y [B, L, 512]

Shapes: B batch, L query length, S key/memory length, d = d_model, H heads. A padding mask is bool
[B, L] (or [B, S]), True at padding. Every module works in train and eval mode like any torch module;
the scheduled ones (PathDropout, DropHead, and every module holding them) take the training step through
`on_update_start(step, warmup, total)`, as the trainer calls it before each update.

Attention and feed-forward (MAT, docs/papers.md#mat)
    MultiBranchAttention (= ParallelAttention)(d_model, heads, branches=1, head_dim=None, dropout=0.0,
        merge="mean", drop_branch=None, head_drop=False, drophead=None, relative=None)
        forward(x [B, L, d], memory [B, S, d] | None, key_padding_mask [B, S] | None, causal=False,
        need_weights=False) -> [B, L, d] (and weights [B, N_a*H, L, S]); branches=1 is standard multi-head
        attention (fairseq's parameter layout: in_proj [3*N_a*H*d_k, d], out_proj [d, N_a*H*d_k],
        out_bias [N_a, d]).
    MultiBranchFeedForward (= FeedForward)(d_model, hidden_dim, activation="relu", activation_dropout=0.0,
        branches=1, merge="mean", drop_branch=None): [B, L, d] -> [B, L, d].
Structured dropout (MAT drop-branch; Scheduled DropHead)
    PathDropout(paths, rate, per_sample=False): forward(batch_size, device) -> scales [1 or B, paths] or
        None when inactive (eval mode, or a rate that is always 0).
    DropHead(heads, rate, max_redraws=10): forward(batch_size, device) -> scales [B, heads] or None.
    `rate`: a float (constant) or a RateConfig (schedules "constant", "linear", "v", "curriculum",
    "anti_curriculum"); RateConfig / ScheduledRate / rate_at compute it, LRConfig / learning_rate_at
    the learning rate.
Weighted Transformer (docs/papers.md#weighted-transformer)
    BranchWeights(branches, normalization="simplex", top_k=None): kappa [M] and alpha [M];
        project_simplex(v [..., M]) -> the Euclidean projection onto the simplex.
    BranchedAttention(cfg: ModelConfig, layer: WeightedLayerConfig, role, weights: BranchWeights);
    WeightedEncoderLayer / WeightedDecoderLayer(cfg, layer).
MUTE (docs/papers.md#mute): MuteEncoderLayer(cfg, MuteLayerConfig) (units, bias modules, fusion),
    UnitSelfAttention, UnitFeedForward.
MUSE (docs/papers.md#muse): DynamicConv(d_model, heads, kernel_sizes, causal, ...): v [B, L, d] -> [B, L, d];
    MultiScaleSelfAttention(attn: MultiBranchAttention, conv: DynamicConv | None);
    MuseEncoderLayer / MuseDecoderLayer(cfg, MuseLayerConfig, index).
Standard and MAT layers: TransformerEncoderLayer / TransformerDecoderLayer(cfg, TransformerLayerConfig,
    index=0); encoder layers map (x [B, L, d], padding_mask [B, L] | None) -> [B, L, d].
Positions: SinusoidalPositions, LearnedPositions, RelativePositions.
Proximal initialisation (MAT §3.3): proximal_init(payload, attention_branches, ffn_branches=1, ...) turns a
    standard checkpoint's payload into a MAT one whose outputs equal it (`multibranch convert proximal`).

The layer classes take the model-wide `ModelConfig` and their layer kind's config, as the models build
them: `ModelConfig(d_model=.., heads=.., ffn_dim=..)` and e.g. `MuseLayerConfig()`.
"""

from __future__ import annotations

from multibranch.convert.proximal import proximal_init
from multibranch.models.config import ModelConfig
from multibranch.models.layers.muse import (
    MultiScaleSelfAttention,
    MuseDecoderLayer,
    MuseEncoderLayer,
    MuseLayerConfig,
)
from multibranch.models.layers.mute import (
    MuteEncoderLayer,
    MuteLayerConfig,
    UnitFeedForward,
    UnitSelfAttention,
)
from multibranch.models.layers.transformer import (
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    TransformerLayerConfig,
)
from multibranch.models.layers.weighted import (
    BranchedAttention,
    WeightedDecoderLayer,
    WeightedEncoderLayer,
    WeightedLayerConfig,
)
from multibranch.modules.attention import ParallelAttention
from multibranch.modules.dynconv import DynamicConv
from multibranch.modules.feedforward import FeedForward
from multibranch.modules.positions import LearnedPositions, RelativePositions, SinusoidalPositions
from multibranch.modules.simplex import BranchWeights, project_simplex
from multibranch.modules.structured_dropout import DropHead, PathDropout
from multibranch.schedules import LRConfig, RateConfig, ScheduledRate, learning_rate_at, rate_at

MultiBranchAttention = ParallelAttention  # the paper's name (MAT); N_a branches fused into one attention
MultiBranchFeedForward = FeedForward  # N_f parallel feed-forward networks, averaged

__all__ = [
    "BranchWeights", "BranchedAttention", "DropHead", "DynamicConv", "FeedForward", "LRConfig", "LearnedPositions",
    "ModelConfig", "MultiBranchAttention", "MultiBranchFeedForward", "MultiScaleSelfAttention", "MuseDecoderLayer",
    "MuseEncoderLayer", "MuseLayerConfig", "MuteEncoderLayer", "MuteLayerConfig", "ParallelAttention", "PathDropout",
    "RateConfig", "RelativePositions", "ScheduledRate", "SinusoidalPositions", "TransformerDecoderLayer",
    "TransformerEncoderLayer", "TransformerLayerConfig", "UnitFeedForward", "UnitSelfAttention",
    "WeightedDecoderLayer", "WeightedEncoderLayer", "WeightedLayerConfig", "learning_rate_at", "project_simplex",
    "proximal_init", "rate_at",
]
