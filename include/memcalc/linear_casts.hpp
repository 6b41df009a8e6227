#pragma once
/// Quantised linears that save their inputs as they came and cast them to a narrow format in each
/// pass (torchao's float8 and MXFP8 training): each pass of one linear is a short program of
/// tensors made and freed, read from the library's autograd function, and its peak falls out of
/// running it. A new library or scaling is a row of `linear_cast_rows`.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "memcalc/units.hpp"

namespace memcalc {

/// The tensor a step's bytes scale with: the linear's input, its weight, or its output (in
/// backward: the output's gradient).
enum class Operand : std::uint8_t { input, weight, output };

/// What a step's bytes are: a narrow cast (with its scales), a narrow copy of one in another
/// layout, an eager cast's fp32 temporaries (fused away under torch.compile), or a result in the
/// compute dtype (per32 counts 32nds of it).
enum class StepBytes : std::uint8_t { narrow, copy, eager_fp32, result };

/// One step of a pass: `per32` bytes per 32 elements of `of` made (positive) or freed (negative).
struct CastStep {
    std::int16_t per32;
    Operand of;
    StepBytes kind = StepBytes::narrow;
};

inline constexpr std::size_t max_cast_steps = 24;

/// A pass's steps in the order its autograd function runs them.
struct CastProgram {
    std::array<CastStep, max_cast_steps> steps{};
    std::size_t count = 0;
};

/// The elements of a linear's operands, and the compute dtype's bytes.
struct LinearOperands {
    Count input, weight, output;
    std::uint64_t compute_bytes;
    bool compiled;  ///< torch.compile fuses the casts: no fp32 temporaries
};

/// The most a pass holds at once: its steps run in order, each tensor's bytes rounded up.
inline Count cast_pass_peak(const CastProgram& p, const LinearOperands& x) {
    std::int64_t live = 0, peak = 0;
    for (std::size_t i = 0; i < p.count; ++i) {
        const CastStep& s = p.steps[i];
        if (s.kind == StepBytes::eager_fp32 && x.compiled) continue;
        const Count n = s.of == Operand::input    ? x.input
                        : s.of == Operand::weight ? x.weight
                                                  : x.output;
        const std::uint64_t unit = s.kind == StepBytes::result ? x.compute_bytes : 1;
        const std::uint64_t magnitude =
            static_cast<std::uint64_t>(s.per32 < 0 ? -s.per32 : s.per32);
        const std::int64_t bytes =
            static_cast<std::int64_t>((n * Count(magnitude * unit)).value() + 31) / 32;
        live += s.per32 < 0 ? -bytes : bytes;
        peak = std::max(peak, live);
    }
    return Count(static_cast<std::uint64_t>(peak));
}

/// Bytes a pass's casts move per element of `of`: each tensor made is written once, a narrow cast
/// reads its source in the compute dtype and a copy its narrow source, and an eager cast's fp32
/// temporary is read back once (fused away under torch.compile). The GEMM's own reads and its
/// result are the matrix product's time, not the casts'.
inline double cast_traffic(const CastProgram& p, Operand of, std::uint64_t compute_bytes,
                           bool compiled) {
    double per32 = 0;  // 32nds of a byte
    for (std::size_t i = 0; i < p.count; ++i) {
        const CastStep& s = p.steps[i];
        if (s.of != of || s.per32 <= 0 || s.kind == StepBytes::result) continue;
        if (s.kind == StepBytes::eager_fp32 && compiled) continue;
        const double read = s.kind == StepBytes::narrow ? 32.0 * static_cast<double>(compute_bytes)
                                                        : static_cast<double>(s.per32);
        per32 += s.per32 + read;
    }
    return per32 / 32;
}

/// A library's quantised linear: the dtype its casts take and what each pass makes.
struct LinearCasts {
    std::string_view key;     ///< a recipe file's linear_casts: "torchao-float8-tensorwise"
    std::string_view name;    ///< in the tables: "torchao float8, tensorwise"
    std::string_view format;  ///< "float8 e4m3/e5m2, one fp32 scale a tensor"
    std::string_view source;  ///< the file and function the steps are read from
    CastProgram forward;      ///< from the input and weight to the output
    CastProgram backward;     ///< from the output's gradient to the input's (the weight's gradient
                              ///< is the step's own: Workspace::linear)
    /// Bytes a linear weight's element is gathered in under ZeRO-3 (FSDP2's float8 all-gather,
    /// which then casts no weight); 0: the weights' dtype.
    std::uint8_t gathered_weight_bytes = 0;

    /// Bytes both passes' casts move per element of a linear's input and of its output, averaged
    /// (a layer's operands are counted together: weight_pass_reads).
    double operand_traffic(std::uint64_t compute_bytes, bool compiled) const {
        double sum = 0;
        for (Operand of : {Operand::input, Operand::output})
            sum += cast_traffic(forward, of, compute_bytes, compiled) +
                   cast_traffic(backward, of, compute_bytes, compiled);
        return sum / 2;
    }
    /// The same per element of its weight, each micro-batch.
    double weight_traffic(std::uint64_t compute_bytes, bool compiled) const {
        return cast_traffic(forward, Operand::weight, compute_bytes, compiled) +
               cast_traffic(backward, Operand::weight, compute_bytes, compiled);
    }
};

namespace cast_steps {  // short names for the programs' cells
inline constexpr Operand in = Operand::input, w = Operand::weight, out = Operand::output;
inline constexpr StepBytes fp32 = StepBytes::eager_fp32, result = StepBytes::result,
                           copy = StepBytes::copy;

/// torchao's eager cast of a bf16 tensor (hp_tensor_and_scale_to_float8, to_fp8_saturated): an
/// fp32 copy times its scale, clamped, then cast: two fp32 tensors beside the float8 result.
constexpr void float8_cast(CastProgram& p, Operand of, std::int16_t narrow) {
    p.steps[p.count++] = {256, of, fp32};
    p.steps[p.count++] = {narrow, of};
    p.steps[p.count++] = {-256, of, fp32};
}
constexpr void add(CastProgram& p, CastStep s) { p.steps[p.count++] = s; }

/// torchao's matmul_with_hp_or_float8_args: the input and the weight (transposed) cast, the GEMM.
/// `weight_cast`: false where FSDP2 gathered the weight in float8 already.
constexpr CastProgram float8_forward(std::int16_t narrow, bool weight_cast = true) {
    CastProgram p;
    float8_cast(p, in, narrow);
    if (weight_cast) float8_cast(p, w, narrow);
    add(p, {32, out, result});
    return p;
}

/// Its backward: the output's gradient and the weight cast for the input's gradient, whose GEMM
/// copies the weight's cast column-major; then the output's gradient and the input cast again
/// along the other dimension, and the weight gradient's GEMM copies both (preprocess_addmm).
/// `rowwise`: a GEMM without fast accumulation scales its output afterwards by an fp32 outer
/// product of the two operands' scales, made eagerly (addmm_float8_unwrapped).
constexpr CastProgram float8_backward(std::int16_t narrow, bool rowwise, bool weight_cast = true) {
    CastProgram p;
    float8_cast(p, out, narrow);
    if (weight_cast) float8_cast(p, w, narrow);
    add(p, {narrow, w, copy});
    if (rowwise) add(p, {128, in, fp32});
    add(p, {32, in, result});
    if (rowwise) add(p, {-128, in, fp32});
    add(p, {static_cast<std::int16_t>(-narrow), w, copy});
    float8_cast(p, out, narrow);
    float8_cast(p, in, narrow);
    add(p, {narrow, out, copy});
    add(p, {narrow, in, copy});
    if (rowwise) add(p, {128, w, fp32});
    return p;
}

/// An MX cast of `of` (one E8M0 scale per 32 elements), and the swizzled copies of two operands'
/// scales a GEMM takes (1/32 B an element).
constexpr void mx_cast(CastProgram& p, Operand of) { add(p, {33, of}); }
constexpr void swizzled_scales(CastProgram& p, Operand a, Operand b) {
    add(p, {1, a, copy});
    add(p, {1, b, copy});
}

/// torchao's mx_mm with its default kernels (Triton along rows, CUDA along columns): no fp32
/// temporaries; forward casts input and weight, backward the output's gradient and the weight,
/// then the gradient and the input along the other dimension.
constexpr CastProgram mxfp8_forward() {
    CastProgram p;
    mx_cast(p, in);
    mx_cast(p, w);
    swizzled_scales(p, in, w);
    add(p, {32, out, result});
    return p;
}
constexpr CastProgram mxfp8_backward() {
    CastProgram p;
    mx_cast(p, out);
    mx_cast(p, w);
    swizzled_scales(p, out, w);
    add(p, {32, in, result});
    mx_cast(p, out);
    mx_cast(p, in);
    swizzled_scales(p, out, in);
    return p;
}
}  // namespace cast_steps

inline constexpr std::array<LinearCasts, 4> linear_cast_rows = [] {
    using namespace cast_steps;
    // A rowwise cast's fp32 scale per row counts as 1/32 B an element: exact for rows of 128,
    // high for longer ones.
    return std::array<LinearCasts, 4>{{
        {"torchao-float8-tensorwise", "torchao float8, tensorwise",
         "float8 e4m3 (e5m2 gradients), one fp32 scale a tensor",
         "torchao v0.18 torchao/float8/float8_linear.py, matmul_with_hp_or_float8_args",
         float8_forward(32), float8_backward(32, false)},
        {"torchao-float8-rowwise", "torchao float8, rowwise", "float8 e4m3, one fp32 scale a row",
         "torchao v0.18 torchao/float8/float8_linear.py, matmul_with_hp_or_float8_args; "
         "float8_ops.py, addmm_float8_unwrapped",
         float8_forward(33), float8_backward(33, true)},
        {"torchao-mxfp8", "torchao MXFP8", "float8 e4m3, one E8M0 scale per 32 elements",
         "torchao v0.18 torchao/prototype/moe_training/mxfp8_linear.py, mx_mm", mxfp8_forward(),
         mxfp8_backward()},
        {"torchao-float8-all-gather", "torchao float8, tensorwise, float8 all-gather",
         "float8 e4m3 (e5m2 gradients), one fp32 scale a tensor; weights gathered in float8",
         "torchao v0.18 torchao/float8/fsdp_utils.py, WeightWithDynamicFloat8CastTensor; "
         "float8_linear.py, matmul_with_hp_or_float8_args (tensor_already_casted_to_fp8)",
         float8_forward(32, false), float8_backward(32, false, false), 1},
    }};
}();

/// The row of that key; nullptr for none.
inline const LinearCasts* find_linear_casts(std::string_view key) {
    for (const auto& row : linear_cast_rows)
        if (row.key == key) return &row;
    return nullptr;
}

}  // namespace memcalc
