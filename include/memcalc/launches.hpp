#pragma once
/// Kernel launches: how many kernels each op of a layer launches in its forward and its backward as
/// eager PyTorch runs it. The host dispatches each one (Python, the dispatcher, the launch), so a
/// step is at least its launches times that cost (Gpu::launch_seconds): what bounds a small
/// model's step. Counted with torch 1.13 on CPU (validation/kernel_launches.py: every aten op
/// but views), which the CUDA kernels match but where a kernel fact says otherwise (dropout).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace memcalc {

/// Kernels an op launches, forward and backward (a trained op's: its input's gradient and its
/// weight's).
struct Launches {
    double forward = 0, backward = 0;
    constexpr Launches& operator+=(const Launches& o) {
        forward += o.forward, backward += o.backward;
        return *this;
    }
    constexpr Launches operator*(double n) const { return {forward * n, backward * n}; }
    constexpr Launches operator+(const Launches& o) const {
        return {forward + o.forward, backward + o.backward};
    }
    constexpr double total() const { return forward + backward; }
};

/// The ops whose launches a layer's blocks count (their matrix products come from the parameter
/// table: LayerLaunches).
enum class LaunchOp : std::uint8_t {
    layer_norm,     ///< one fused kernel each way
    rmsnorm,        ///< transformers' eager RMSNorm: pow, mean, + eps, rsqrt, two products
    rmsnorm_casts,  ///< its x.float() and .to(dtype), where the input is not fp32
    fused_norm,     ///< a fused RMSNorm (Transformer Engine's, Apex's)
    rotary,         ///< rotate_half and the two products and their sum, for q or for k
    repeat_kv,   ///< k or v copied to every query head (x[:, :, None], expand, reshape); backward
                 ///< its sum and the indexing's two slice_backward
    eager_core,  ///< Q K^T, / sqrt(d), + mask, softmax, x V; backward four products, the
                 ///< softmax's, the scale's and a copy
    /// gpt-oss's sink column joined to the scores, the row's max taken off; backward the dropped
    /// column's slice, max's scatter, the difference's two and the sinks' sum over tokens
    attention_sinks,
    softmax_casts,    ///< the scores' fp32 copy and the weights' cast back (softmax in fp32)
    mask_fill,        ///< a registered mask's comparison and masked_fill; backward, the fill
    mask_select,      ///< torch.where on a bool mask buffer: its gradient one kernel more
    gradient_copy,    ///< a gradient handed back transposed, copied contiguous for a reshape
    flash_core,       ///< one fused attention kernel each way
    fused_glu,        ///< act(gate) x up as one kernel each way (Megatron-LM's, Liger's)
    merge_heads,      ///< the attention's output made contiguous for the output projection
    gated_product,    ///< act(gate) x up: one product; backward one for each factor
    residual_add,     ///< the residual sum; backward, the stream's gradient summed at its fork
    gradient_sum,     ///< a tensor read by one more op: its gradients summed in backward
    bias_gradient,    ///< a trained bias: its gradient summed over the tokens
    embedding,        ///< the lookup; backward, its dense gradient
    cast,             ///< a tensor's copy in another dtype; backward, its gradient's cast back
    concat,           ///< two tensors concatenated (torch.cat); backward views its gradient's parts
    split,            ///< a tensor split in parts read apart; backward concatenates their gradients
    expand_gradient,  ///< a tensor broadcast to every head (expand); backward sums its gradient
    /// transformers' sparse block's router after its linear: softmax and top-k; backward the
    /// softmax's and top-k's zeroed gradient and scatter
    router_topk,
    topk_renormalize,  ///< the top-k weights divided by their sum (norm_topk_prob), in place
    /// Phi-3.5-MoE's sparsemixer router: two passes of a masked softmax, a Gumbel-sampled expert
    /// and its Heun-corrected weight; backward the corrections' products and scatters
    sparsemixer,
    input_jitter,  ///< the block's input multiplied in place by uniform noise
    /// The sparse block's output zeroed and the experts it hits found: one_hot's sum, > 0, nonzero
    expert_hits,
    /// One expert of the model's own loop, beside its linears and activation: torch.where on its
    /// mask, its tokens and weights indexed, the weighting, index_add_; backward the index_add's
    /// gather, two zeroed gradients and index_put, the weighting's two products and its sum, and
    /// the block input's gradient summed
    expert_loop,
    /// gpt-oss's loop (GptOssExperts) beyond Mixtral's, each expert: the stacked weights and
    /// biases indexed, the biases added, the output selected; backward their gradients zeroed and
    /// put, the clamps' masks (measured: its loop's kernels less a Mixtral expert's count)
    stacked_expert_loop,
    /// Qwen2-MoE's shared expert scaled by sigmoid(gate(x)): the sigmoid, the product; backward
    /// theirs, the gate's gradient summed over the width, its input's summed with the block's
    shared_expert_gate,
    /// DeepSeek-V3.2's lightning indexer under no_grad, its three products among them: q and k
    /// (LayerNorm, rotary), the ReLU'd scores weighted per head, top-k, and the mask it fills
    sparse_indexer,
    count
};

struct LaunchRow {
    LaunchOp op;
    Launches launches;
};

// clang-format off
/// Counted on CPU (torch 1.13, bf16), each op alone (validation/kernel_launches.py --ops; the
/// MoE and latent attention rows in validation/reference_trainer.py's layers, micro-batch 1:
/// kernel_launches.py --reference).
inline constexpr std::array<LaunchRow, static_cast<std::size_t>(LaunchOp::count)> launch_rows{{
    {LaunchOp::layer_norm,    {1, 1}},
    {LaunchOp::rmsnorm,       {6, 14}},
    {LaunchOp::rmsnorm_casts, {2, 2}},
    {LaunchOp::fused_norm,    {1, 1}},
    {LaunchOp::rotary,        {5, 7}},
    {LaunchOp::repeat_kv,     {1, 3}},
    {LaunchOp::eager_core,    {5, 7}},
    {LaunchOp::attention_sinks, {3, 7}},
    {LaunchOp::softmax_casts, {2, 2}},
    {LaunchOp::mask_fill,     {1, 1}},
    {LaunchOp::mask_select,   {0, 1}},
    {LaunchOp::gradient_copy, {0, 1}},
    {LaunchOp::flash_core,    {1, 1}},
    {LaunchOp::fused_glu,     {1, 1}},
    {LaunchOp::merge_heads,   {1, 1}},
    {LaunchOp::gated_product, {1, 2}},
    {LaunchOp::residual_add,  {1, 1}},
    {LaunchOp::gradient_sum,  {0, 1}},
    {LaunchOp::bias_gradient, {0, 1}},
    {LaunchOp::embedding,     {1, 1}},
    {LaunchOp::cast,          {1, 1}},
    {LaunchOp::concat,        {1, 0}},
    {LaunchOp::split,         {0, 1}},
    {LaunchOp::expand_gradient, {0, 1}},
    {LaunchOp::router_topk,   {2, 3}},
    {LaunchOp::topk_renormalize, {3, 7}},
    {LaunchOp::sparsemixer,   {45, 9}},
    {LaunchOp::input_jitter,  {2, 1}},
    {LaunchOp::expert_hits,   {4, 0}},
    {LaunchOp::expert_loop,   {5, 9}},
    {LaunchOp::stacked_expert_loop, {6, 20}},
    {LaunchOp::shared_expert_gate, {2, 5}},
    {LaunchOp::sparse_indexer, {31, 0}},
}};
// clang-format on

static_assert(
    [] {
        for (std::size_t i = 0; i < launch_rows.size(); ++i)
            if (launch_rows[i].op != static_cast<LaunchOp>(i)) return false;
        return true;
    }(),
    "launch_rows in LaunchOp's order: launches_of reads a row by its op");

inline constexpr Launches launches_of(LaunchOp op) {
    return launch_rows[static_cast<std::size_t>(op)].launches;
}

/// Host calls torch.utils.checkpoint (non-reentrant) makes for each tensor its recomputation
/// rebuilds: the pack hook in forward, again in the recomputation, and the unpack hook; each taken
/// to cost what a launch does.
inline constexpr double checkpoint_hook_calls = 3;

/// A matrix product's launches: one forward; backward its input's gradient, and its weight's where
/// the weight trains.
inline constexpr Launches matmul_launches(bool trained) { return {1, trained ? 2.0 : 1.0}; }

/// How many launches a multi-tensor kernel (torch's foreach and fused optimisers) makes for one op
/// over `tensors` tensors of `elements` in all: one per 36 tensors (four lists: params, grads, m,
/// v) or per 320 blocks of 65,536 elements, whichever fills first (ATen's MultiTensorApply.cuh:
/// depth_to_max_tensors, depth_to_max_blocks, kChunkSize).
inline double multi_tensor_launches(double tensors, double elements) {
    constexpr double max_tensors = 36, max_elements = 320.0 * 65536;
    return std::max(std::ceil(tensors / max_tensors), std::ceil(elements / max_elements));
}

}  // namespace memcalc
