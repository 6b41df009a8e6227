#pragma once
/// The linear layers of a layer (and the head) as types: what a parameter row belongs to, what
/// LoRA targets, what reads each saved input, and what a workspace's gradients and casts start
/// from. Names are transformers' and are printed, never looked up.
#include <array>
#include <cstddef>
#include <cstdint>

namespace memcalc {

/// `none` first: a value-initialised Linear (a Workspace's `{}`) names no linear.
enum class Linear : std::uint8_t {
    none,
    q,
    k,
    v,
    o,
    gate,
    up,
    down,
    router,
    q_a,
    q_b,
    kv_a,
    kv_b,
    shared_gate,
    shared_up,
    shared_down,
    shared_expert_gate,
    head,
    mamba_in,
    mamba_x,
    mamba_dt,
    mamba_out,
    deltanet_qkvz,  ///< a Gated DeltaNet's in_proj_qkvz
    deltanet_ba     ///< and its in_proj_ba
};
using LinearSet = std::uint32_t;
/// Linear::none is no member of any set (its bit is 0).
constexpr LinearSet bit(Linear l) { return (LinearSet{1} << static_cast<unsigned>(l)) >> 1; }

struct LinearRow {
    Linear linear;
    const char* tensor;  ///< its weight's row in the parameter table ("" for none)
    const char* bias;    ///< its bias's row, where the model has one
    bool row_parallel;   ///< Megatron-LM splits its input (o_proj, down_proj); else its output
    /// Fine-tuning's tables know it (LayerTuning's bits, the adapters' splits, the weight pass's
    /// reads): Mamba's mixer reads no LayerTuning, and its linears split by their widths.
    bool tuned;
    /// The linear whose input tensor it reads, the same tensor object (k and v read q's, up reads
    /// gate's): a deferred weight pass holds it once. Linear::none: its own.
    Linear reads_input_of = Linear::none;
};

/// Indexed by Linear.
inline constexpr std::array<LinearRow, 24> linear_rows{{
    {Linear::none, "", "", false, false},
    {Linear::q, "q_proj", "q_proj.bias", false, true},
    {Linear::k, "k_proj", "k_proj.bias", false, true, Linear::q},
    {Linear::v, "v_proj", "v_proj.bias", false, true, Linear::q},
    {Linear::o, "o_proj", "o_proj.bias", true, true},
    {Linear::gate, "gate_proj", "gate_proj.bias", false, true},
    {Linear::up, "up_proj", "up_proj.bias", false, true, Linear::gate},
    {Linear::down, "down_proj", "down_proj.bias", true, true},
    {Linear::router, "router", "router.bias", false, true},
    {Linear::q_a, "q_a_proj", "q_a_proj.bias", false, true},
    {Linear::q_b, "q_b_proj", "q_b_proj.bias", false, true},
    {Linear::kv_a, "kv_a_proj_with_mqa", "kv_a_proj_with_mqa.bias", false, true, Linear::q_a},
    {Linear::kv_b, "kv_b_proj", "kv_b_proj.bias", false, true},
    {Linear::shared_gate, "shared_expert.gate_proj", "shared_expert.gate_proj.bias", false, true},
    {Linear::shared_up, "shared_expert.up_proj", "shared_expert.up_proj.bias", false, true,
     Linear::shared_gate},
    {Linear::shared_down, "shared_expert.down_proj", "shared_expert.down_proj.bias", true, true},
    {Linear::shared_expert_gate, "shared_expert_gate", "shared_expert_gate.bias", false, true},
    {Linear::head, "lm_head", "lm_head.bias", false, true},
    {Linear::mamba_in, "in_proj", "in_proj.bias", false, false},
    {Linear::mamba_x, "x_proj", "x_proj.bias", false, false},
    {Linear::mamba_dt, "dt_proj", "dt_proj.bias", false, false},
    {Linear::mamba_out, "out_proj", "out_proj.bias", false, false},
    {Linear::deltanet_qkvz, "in_proj_qkvz", "in_proj_qkvz.bias", false, false},
    {Linear::deltanet_ba, "in_proj_ba", "in_proj_ba.bias", false, false},
}};

constexpr const LinearRow& linear_row(Linear l) { return linear_rows[static_cast<std::size_t>(l)]; }

/// The first of `set` in the table's order; none when it is empty.
constexpr Linear first_linear(LinearSet set) {
    for (const LinearRow& row : linear_rows)
        if ((set & bit(row.linear)) != 0) return row.linear;
    return Linear::none;
}

/// What a parameter row is to its module: the weight, its bias, or a LoRA adapter's row beside
/// the weight.
/// scale: LLaMA-Adapter v2's scale and bias on a linear's output, a value per output.
enum class ParamRole : std::uint8_t { weight, bias, lora_a, lora_b, magnitude, scale };

}  // namespace memcalc
