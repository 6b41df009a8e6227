#pragma once
/// DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2), as transformers'
/// DeepseekV32Indexer and DeepseekV32Attention run it (modeling_deepseek_v32.py): under
/// torch.no_grad, so autograd keeps nothing of it; what it costs is its forward's temporaries and
/// what the attention holds of its choice.
#include <algorithm>
#include <cstdint>
#include <string>

#include "memcalc/blocks/layer_builder.hpp"
#include "memcalc/blocks/sizes.hpp"

namespace memcalc::detail {

inline constexpr Shape sb_topk{"sb k_i", ActivationSplit::replicated};  ///< a value per choice
inline constexpr Shape sb_s{"s^2b", ActivationSplit::replicated};  ///< a value per query and key

/// The keys each query takes: index_topk, or every one of a shorter sequence.
inline std::uint64_t topk_keys(const Architecture& m, const Sizes& z) {
    return std::min<std::uint64_t>(m.mla.index_topk, z.seq);
}

/// The indexer's last ops, beside `before` (q, k and the rectified scores, held to its return): a
/// weight per head (fp32), their sum over the heads' scores (index scores, fp32 s^2 b), the causal
/// mask added out of place (a kernel that does not cast as it reads takes an fp32 copy of a
/// narrower mask), then top-k's values (fp32) and indices (int64) of k = min(index_topk, s).
inline void sparse_indexer_selection(TableBuilder& t, const Architecture& m, const Sizes& z,
                                     Count before, const std::string& formula) {
    const std::uint64_t k = topk_keys(m, z);
    const Count kept = before + Count(dtype::fp32) * z.tokens * m.mla.index_heads;
    const Count index_scores = Count(dtype::fp32) * z.tokens * z.seq;
    const bool copy = !z.kernels->casts_on_read && z.s != dtype::fp32;
    t.workspace_at(t.size(), false, "index scores + mask (indexer, no grad)",
                   copy ? "the index scores, an fp32 copy of the mask, their sum"
                        : "the index scores and their sum with the mask",
                   formula + " + 4 sb A_i + " + (copy ? "12" : "8") + " s^2b",
                   kept + index_scores * (copy ? 3 : 2), Linear::none, ActivationSplit::replicated);
    t.workspace_at(t.size(), false, "topk (indexer, no grad)",
                   "the index scores, top-k's values (fp32) and indices (int64)",
                   formula + " + 4 sb A_i + 4 s^2b + 12 sb k_i",
                   kept + index_scores + Count(12) * z.tokens * k, Linear::none,
                   ActivationSplit::replicated);
}

/// The indexer's temporaries, after latent attention's q, k and v are made (A_i heads of D_i, d_r
/// rotary; Ts = s^2 b): wq_b's output, its rotated rope part and q concatenated, k normed, rotated
/// and concatenated; then matmul(q.float(), k^T.float()) makes fp32 scores at every head (and, for
/// b > 1, copies k broadcast over the queries: torch.matmul cannot view the expanded batch), scaled
/// out of place and passed through F.relu out of place. Under autocast the matmul runs in bf16:
/// counted in fp32, leaning high.
inline void sparse_indexer_work(TableBuilder& t, const Architecture& m, const Sizes& z) {
    const bool batched = z.tokens != Count(z.seq);
    const LatentAttention& a = m.mla;
    const std::uint64_t A = a.index_heads, D = a.index_head_dim, rope = a.qk_rope_head_dim;
    const Count qk = z.tokens * (A * (2 * D + rope) + 2 * D + rope) * z.d;
    const Count scores = Count(dtype::fp32) * z.tokens * A * z.seq;
    const Count upcast =
        z.d == dtype::fp32 ? Count(0) : Count(dtype::fp32) * z.tokens * (A + 1) * D;
    const Count broadcast = batched ? Count(dtype::fp32) * z.tokens * D * z.seq : Count(0);
    const std::string operands = bytes_of(z.d, "sb(A_i(2D_i+d_r)+2D_i+d_r)");
    t.workspace_at(
        t.size(), false, "matmul(q.float(), k^T) (indexer, no grad)",
        batched ? "q and k, fp32 copies, k broadcast over the queries, scores"
                : "q and k, their fp32 copies, the scores (fp32)",
        operands + " + 4 sb(A_i+1)D_i" + (batched ? " + 4 s^2b D_i" : "") + " + 4 s^2b A_i",
        qk + upcast + broadcast + scores, Linear::none, ActivationSplit::replicated);
    t.workspace_at(t.size(), false, "scores x scale, F.relu (indexer, no grad)",
                   "q and k, the scores and their scaled or rectified copy",
                   operands + " + 8 s^2b A_i", qk + scores * 2, Linear::none,
                   ActivationSplit::replicated);
    sparse_indexer_selection(t, m, z, qk + scores, operands + " + 4 s^2b A_i");
}

/// The indexer's choice as the attention uses it: top-k indices (int32, k = min(index_topk, s)),
/// held until the attention returns. Eager attention reads it as a mask: a bool one scattered from
/// the indices and the causal mask filled where it is set (the stream's dtype), held beside the
/// kernel's ops; a sparse kernel (flash) takes the indices, and its backward is assumed to keep
/// them. Returns what is held, for held_beside.
inline Count sparse_indexer_choice(TableBuilder& t, const Architecture& m, const Sizes& z,
                                   Attention attention) {
    const std::uint64_t k = topk_keys(m, z);
    const Count indices = Count(dtype::fp32) * z.tokens * k;
    if (attention == Attention::flash) {
        t.add("sparse attention", "the indexer's top-k indices (int32)",
              "assumed: the sparse kernel's backward reads which keys each query took (not "
              "measured)",
              sb_topk, z.tokens * k, dtype::fp32);
        return Count(0);
    }
    return indices + z.tokens * z.seq * (1 + z.s);
}

/// The indexer, then what the attention holds of its choice beside the core's forward ops; a
/// checkpointed core attention (selective) keeps the filled mask, its input.
inline void sparse_indexer_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                                Attention attention) {
    t.launch(LaunchOp::sparse_indexer);
    sparse_indexer_work(t, m, z);
    const Count held = sparse_indexer_choice(t, m, z, attention);
    t.held_beside("the indexer's top-k indices and mask (bool) and the causal mask it fills", held);
    if (attention == Attention::flash) return;
    const Module before = t.section(Module::core_attn);
    t.add("core attention checkpoint", "the causal mask the indexer's top-k fills",
          "the checkpoint reruns the core attention from it", sb_s, z.tokens * z.seq, z.s,
          Keep::only_selective);
    t.section(before);
}

}  // namespace memcalc::detail
