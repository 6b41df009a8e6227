#pragma once
/// The sizes a layer's tensors are made of, and the bytes of a formula's term.
#include <cstdint>
#include <optional>
#include <string>

#include "memcalc/kernels.hpp"
#include "memcalc/model.hpp"
#include "memcalc/recipe.hpp"
#include "memcalc/framework.hpp"
#include "memcalc/activations.hpp"

namespace memcalc::detail {

/// The sizes a layer's tensors are made of, for sequence s and micro-batch b.
struct Sizes {
    std::uint64_t seq;  ///< s
    Count tokens;       ///< s b
    Count key_tokens;   ///< the keys' tokens: s b, or the images' under cross-attention
    Count sbh;          ///< the residual stream
    Count sbq;          ///< queries: s b a d
    Count sbkv;         ///< keys or values: s b k d
    Count sbv;          ///< the attention's output (and values at every head): s b a d_v
    Count sbf;          ///< the MLP's hidden width
    Count scores;       ///< a s^2 b
    /// The letters of the keys' tensors: the sequence's, or under cross-attention the images' N.
    struct KeyShapes {
        Shape kv = shape::sbkv, repeated = shape::sbq, per_head = shape::ksb,
              scores = shape::scores;
    } keyed;
    DType compute;    ///< the recipe's compute dtype
    std::uint64_t d;  ///< its bytes per activation
    DType
        stream;  ///< the residual stream's dtype: the compute dtype, or the weights' under autocast
    std::uint64_t s;  ///< its bytes per element
    bool autocast;    ///< each matmul saves a copy of its input cast to the compute dtype
    /// Linear layers save their inputs cast once to this narrower format (Transformer Engine's
    /// fp8 or NVFP4).
    std::optional<Storage> narrow;
    /// Linear layers keep their inputs as they came and cast them in each pass (torchao).
    const LinearCasts* casts;
    const KernelFacts* kernels;  ///< the platform's (kernel_rows)
    const TorchFacts* torch;     ///< the PyTorch version's (torch_rows)
    /// Bytes per element of the copy a kernel that does not cast as it reads makes of a compute-
    /// dtype operand when the other is the stream's wider dtype (autocast's fp32 mask or residual).
    std::uint64_t upcast;
    bool fused_rmsnorm;     ///< every weighted RMSNorm is one kernel (Architecture::rmsnorm_kernel)
    bool rmsnorm_upcast;    ///< RMSNorm's ops run on an fp32 copy of x, else in x's dtype
    bool compiled = false;  ///< a compiled layer's: pointwise chains recomputed (inside_layer)
    Runtime runtime;        ///< whose kernels: the platform's, the version's, the experts' loop

    Sizes(const Architecture& m, std::uint64_t seq, std::uint64_t b, Precision p,
          Runtime where = {})
        : seq(seq),
          tokens(Count(seq) * b),
          key_tokens(tokens),
          sbh(tokens * m.hidden),
          sbq(tokens * m.heads * m.head_size()),
          sbkv(tokens * m.key_value_heads() * m.head_size()),
          sbv(tokens * m.heads * m.value_head_size()),
          sbf(tokens * m.ffn),
          scores(Count(m.heads) * seq * seq * b),
          compute(p.compute),
          d(bytes_per_element(p.compute)),
          stream(p.stream),
          s(bytes_per_element(p.stream)),
          autocast(p.autocast),
          narrow(p.linear_inputs),
          casts(p.linear_casts),
          kernels(&kernels_of(where.platform)),
          torch(&torch_facts(where.torch)),
          upcast(!kernels->casts_on_read && s != d ? s : 0),
          fused_rmsnorm(rmsnorm_kernel(m.rmsnorm_kernel).fused),
          rmsnorm_upcast(rmsnorm_kernel(m.rmsnorm_kernel).upcast),
          runtime(where) {}

    /// Inside a layer torch.compile runs (Architecture::compile); outside the layers (the final
    /// norm) eager.
    void inside_layer(Compile c) { compiled = c == Compile::layers; }

    /// The same sizes with keys and values of `keys` tokens a sequence (mllama's cross-attention
    /// over its images' tokens): k, v and the scores are theirs; the queries stay the sequence's.
    Sizes with_keys(const Architecture& m, std::uint64_t keys) const {
        Sizes cross = *this;
        const std::uint64_t b = tokens.value() / seq;
        cross.key_tokens = Count(keys) * b;
        cross.sbkv = cross.key_tokens * m.key_value_heads() * m.head_size();
        cross.scores = Count(m.heads) * seq * keys * b;
        cross.keyed = {shape::Nbkv, shape::Nbq, shape::kNb, shape::asNb};
        return cross;
    }

    /// The same sizes for a linear layer that runs in the compute dtype (a router, Megatron-LM's
    /// head).
    Sizes wide_linears() const {
        Sizes wide = *this;
        wide.narrow.reset();
        wide.casts = nullptr;
        return wide;
    }
};

/// "4 as^2b" for 4 bytes of `symbol`.
inline std::string bytes_of(std::uint64_t bytes, const std::string& symbol) {
    return std::to_string(bytes) + " " + symbol;
}

}  // namespace memcalc::detail
