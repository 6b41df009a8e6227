#pragma once
/// Optimisers as rows: the state each keeps for one tensor, by a rule of its dimensions, and the
/// temporaries of its step. New optimisers are rows of the table, not special cases in code.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "memcalc/dtype.hpp"
#include "memcalc/framework.hpp"
#include "memcalc/params.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

/// Which tensors keep an optimiser's main state; the others keep its fallback state.
enum class StateScope {
    every_tensor,     ///< one kind of state for all (Adam, SGD, Lion)
    large_tensors,    ///< tensors of at least `min_elements` (bitsandbytes' min_8bit_size)
    matrices,         ///< tensors of two or more dimensions (Adafactor factors their second moment)
    hidden_matrices,  ///< the layers' matrices, not the embedding, the head, norms or biases (Muon)
};

/// What the step allocates beside the state, for the tensor it steps (the for-loop's rule).
enum class StepWork {
    none,           ///< updates in place, or runs one kernel of its own that allocates nothing
    elementwise,    ///< `copies` of the tensor stepped beside `previous` of the one before, in the
                    ///< state dtype
    newton_schulz,  ///< Muon: Newton-Schulz on the largest layer matrix, in bf16; the rest
                    ///< elementwise
};

/// An optimiser as a row. Full-size slots are in the recipe's state dtype (`Recipe::state`):
/// torch.optim keeps them in the parameters' dtype, a mixed-precision optimiser in fp32.
struct Optimizer {
    std::string_view name;
    std::string_view slots;    ///< as a report names them: "Adam m, v"
    std::uint64_t slot_count;  ///< the main state's full-size slots (of the state dtype, unless
                               ///< `slot_storage`)
    StateScope scope;
    std::uint64_t fallback_slots;  ///< full-size slots of the tensors outside the scope
    std::uint64_t min_elements;    ///< large_tensors: the smallest tensor the main state is for
    /// The main slots' own storage (8-bit with a scale per block) instead of the state dtype.
    std::optional<Storage> slot_storage;
    bool factored;  ///< the main state is a row and a column vector of each matrix, in the state
                    ///< dtype
    std::uint64_t scalar_bytes;  ///< a 0-dim state tensor of every tensor (Adafactor's RMS, fp32)
    StepWork step;
    std::uint64_t copies,
        previous;  ///< elementwise: temporaries of the tensor stepped and of the one before
    bool upcast;   ///< fp32 copies of a narrower weight and its gradient, live through its step
    /// Its code runs the step this way whatever the framework's switch (bitsandbytes' own kernel, a
    /// Python loop); none: as the switch says (torch.optim).
    std::optional<OptimizerImpl> own_impl;
    std::string_view
        rule;  ///< the state per tensor in words, when it is not whole bytes per parameter
    std::string_view source;  ///< whose code the row follows, when not torch.optim's
    /// Passes over each stepped tensor, in the state dtype, its step makes as torch.optim's foreach
    /// or one-tensor-at-a-time code runs it (each op reads its operands and writes its result);
    /// 0: it has only its own kernel. A fused kernel reads and writes each tensor once.
    std::uint64_t unfused_passes;
    /// Kernels its step launches for each tensor one tensor at a time, as many foreach ops over a
    /// list (each in multi-tensor launches: launches.hpp); with its own kernel, one a tensor.
    std::uint64_t loop_launches;

    /// Bytes per parameter of every tensor, when the state is that simple.
    std::optional<std::uint64_t> uniform_bytes(DType state) const {
        if (scope != StateScope::every_tensor || slot_storage || factored || scalar_bytes > 0)
            return std::nullopt;
        return slot_count * bytes_per_element(state);
    }
    /// What a piece of a split tensor, or a ZeRO shard, may need beyond its share of `state`-dtype
    /// state: its own last block's scales, and fp32 state if it falls below the 8-bit threshold.
    Count piece_slack(DType state) const {
        if (!slot_storage) return 0;
        const std::uint64_t narrower = fallback_slots * bytes_per_element(state) -
                                       slot_count * bytes_per_element(slot_storage->dtype);
        return Count(slot_count * bytes_per_element(slot_storage->scale)) +
               Count(min_elements > 0 ? min_elements - 1 : 0) * narrower;
    }
};

namespace optimizer_table {  // short names for the table's cells
inline constexpr auto all = StateScope::every_tensor, large = StateScope::large_tensors,
                      matrices = StateScope::matrices, hidden = StateScope::hidden_matrices;
inline constexpr auto none = StepWork::none, elementwise = StepWork::elementwise,
                      newton_schulz = StepWork::newton_schulz;
inline constexpr std::optional<Storage> plain = std::nullopt,
                                        int8_blocks = Storage{DType::int8, 256, DType::fp32};
inline constexpr std::optional<OptimizerImpl> switched = std::nullopt,
                                              kernel = OptimizerImpl::fused,
                                              loop = OptimizerImpl::for_loop;
}  // namespace optimizer_table

inline constexpr std::array<Optimizer, 6> optimizers = [] {
    using namespace optimizer_table;
    return std::array<Optimizer, 6>{{
        // clang-format off
        // name, slots label, main slots, scope, fallback slots, min elements, storage, factored,
        // scalar bytes, step, copies, previous, upcast, impl, rule, source, unfused passes
        // (counted in torch.optim's _multi_tensor_* and the rows' sources, an op's operands and
        // result one pass each), loop launches (the ops of torch.optim's _single_tensor_* and the
        // rows' sources, its step count's increment among them)
        // Adam's step computes sqrt(v), then its quotient, of the tensor stepped while the loop's
        // variable still holds the previous tensor's quotient (measured with torch.optim.AdamW on
        // CPU).
        // Unfused AdamW: decay (2), lerp m (3), scale v (2), addcmul v (3), sqrt v (2), its
        // division (2) and eps (2), addcdiv into the weight (4): 20 passes. Its loop: the step's
        // increment, decay, m's scale and add (torch 1.13; one lerp since), v's scale and addcmul,
        // sqrt, division, eps, addcdiv: 10 ops (counted on CPU, torch 1.13).
        {"adam", "Adam m, v", 2, all, 0, 0, plain, false, 0, elementwise, 2, 1, false, switched,
            "", "", 20, 10},
        // Unfused SGD: scale momentum (2), add the gradient (3), step the weight (3): 8; 3 ops.
        {"sgd-momentum", "momentum", 1, all, 0, 0, plain, false, 0, none, 0, 0, false, switched,
            "", "", 8, 3},
        // Lion (Chen et al. 2023): one momentum; the update is the sign of an interpolation of it
        // and the gradient, signed in place: the previous update beside the next interpolation, two
        // of the tensor (measured with timm's loop, validation/optimizer_state.py; lion-pytorch's
        // clone and sum alike).
        // Its loop: decay, the interpolation's scale and add, sign, the step, m's scale and add.
        {"lion", "Lion momentum", 1, all, 0, 0, plain, false, 0, elementwise, 2, 0, false,
            switched, "", "", 19, 7},
        // bitsandbytes >= 0.44 AdamW8bit (optim/optimizer.py Optimizer2State.init_state): m and v
        // in uint8 with an fp32 absmax per block of 256 (2048 before 0.44) for tensors of at least
        // min_8bit_size = 4096 elements, fp32 m and v below; its one fused kernel updates them in
        // place and allocates nothing (optimizer_update_8bit_blockwise).
        {"adam-8bit", "Adam m, v", 2, large, 2, 4096, int8_blocks, false, 0, none, 0, 0, false,
            kernel,
         "n >= 4096: 2 x (n x 1 B + ceil(n/256) x 4 B); smaller: 2 x n x state",
         "bitsandbytes >= 0.44 AdamW8bit: blocksize 256, min_8bit_size 4096", 0, 1},
        // transformers' Adafactor with its defaults (beta1=None: no first moment): a matrix keeps a
        // row and a column vector of its second moment, a vector the whole of it. Its Python loop
        // squares the gradient (two of the tensor beside the previous tensor's update), and steps
        // fp32 copies of a bf16 weight and gradient. Each tensor's RMS is a 0-dim fp32 tensor in
        // its state. Its loop, for a matrix: 24 ops (read from its step: the squared gradient, two
        // means, the factors' updates, their approximation, the update's RMS and clip, the step,
        // the casts).
        {"adafactor", "Adafactor v", 0, matrices, 1, 0, plain, true, 4, elementwise, 2, 1, true,
            loop,
         "matrix R x C: (R + C) x state; vector of n: n x state; 4 B (RMS) each",
         "transformers Adafactor (optimization.py), beta1=None", 16, 24},
        // Keller Jordan's MuonWithAuxAdam (KellerJordan/Muon muon.py, Moonlight's split): a
        // momentum for the layers' matrices, AdamW's m and v for the embedding, head, norms and
        // biases. Its aux Adam returns m^ / (sqrt(v^) + eps) out of place: four of the tensor
        // beside the previous update. Its loop for a matrix: 33 ops (read from muon.py: five
        // Newton-Schulz steps of three products and two sums, the momentum, normalisation, casts
        // and the step).
        {"muon", "Muon momentum; AdamW m, v", 1, hidden, 2, 0, plain, false, 0, newton_schulz, 4,
            1, false, loop,
         "layers' matrices: n x state; embedding, head, norms, biases: 2 x n x state",
         "KellerJordan/Muon MuonWithAuxAdam, 5 Newton-Schulz steps in bf16", 11, 33},
        // clang-format on
    }};
}();

/// The rows by name, for the recipe table.
inline constexpr const Optimizer &adam = optimizers[0], &sgd_momentum = optimizers[1],
                                 &lion = optimizers[2], &adam_8bit = optimizers[3],
                                 &adafactor = optimizers[4], &muon = optimizers[5];

/// Returns nullptr for an unknown name, so callers can suggest the nearest one.
inline const Optimizer* find_optimizer(std::string_view name) {
    for (const auto& o : optimizers)
        if (o.name == name) return &o;
    return nullptr;
}

/// Optimiser state of one tensor, or of many summed, by how each part divides when a tensor is
/// split.
struct StateCount {
    Count main, fallback;  ///< elements in main and in fallback slots: multiplied after dividing,
                           ///< as ZeRO pads
    Count other;           ///< bytes of block scales and factored vectors: dividing rounds up
    /// Bytes a piece may need beyond its share when its tensor is split: its own last block's
    /// scales, fp32 state if it falls below the 8-bit threshold, the factored vector along the
    /// unsplit side.
    Count slack;

    friend StateCount operator+(const StateCount& x, const StateCount& y) {
        return {x.main + y.main, x.fallback + y.fallback, x.other + y.other, x.slack + y.slack};
    }
    friend StateCount operator*(Count n, const StateCount& x) {
        return {n * x.main, n * x.fallback, n * x.other, n * x.slack};
    }
};

/// The dimensions of one tensor of row `r`: one expert's of an expert row.
inline std::size_t tensor_dims(const ParamRow& r) { return r.dims.size() - (r.expert ? 1 : 0); }
/// Elements of one tensor of row `r`.
inline Count tensor_elements(const ParamRow& r) {
    return r.expert ? Count(r.count.value() / *r.dims.begin()) : r.count;
}
/// A matrix of a layer (attention, MLP, router): what Muon orthogonalises.
inline bool layer_matrix(const ParamRow& r) {
    return r.group == Group::layer && tensor_dims(r) >= 2;
}

/// Whether `o`'s main state is for tensor `r` (one expert of an expert row).
inline bool in_scope(const Optimizer& o, const ParamRow& r) {
    switch (o.scope) {
        case StateScope::every_tensor: return true;
        case StateScope::large_tensors: return tensor_elements(r) >= o.min_elements;
        case StateScope::matrices: return tensor_dims(r) >= 2;
        case StateScope::hidden_matrices: return layer_matrix(r);
    }
    return true;
}

/// Bytes Newton-Schulz holds for a rows x cols matrix (KellerJordan/Muon
/// zeropower_via_newtonschulz5): at X = a X + B X, the old and new X, a X and B X (m M each) beside
/// A = X X^T and B (m^2 each), in bf16.
inline Count newton_schulz_bytes(std::uint64_t rows, std::uint64_t cols) {
    const Count m = std::min(rows, cols), M = std::max(rows, cols);
    return (Count(4) * m * M + Count(2) * m * m) * dtype::bf16;
}

/// FLOPs of Newton-Schulz on a rows x cols matrix (KellerJordan/Muon zeropower_via_newtonschulz5):
/// five steps on X, m x M (transposed so m <= M), each A = X X^T (2 m^2 M), B = b A + c A A
/// (2 m^3) and X = a X + B X (2 m^2 M).
inline double newton_schulz_flops(std::uint64_t rows, std::uint64_t cols) {
    const double m = static_cast<double>(std::min(rows, cols)),
                 M = static_cast<double>(std::max(rows, cols));
    return 5 * (4 * m * m * M + 2 * m * m * m);
}

/// The state of tensor `r` (every expert of an expert row, each a tensor of its own), `state` the
/// recipe's state dtype.
inline StateCount tensor_state(const Optimizer& o, DType state, const ParamRow& r) {
    const Count tensors = r.expert ? Count(*r.dims.begin()) : Count(1), one = tensor_elements(r);
    StateCount s{0, 0, tensors * o.scalar_bytes,
                 tensors * o.scalar_bytes};  // a piece keeps a scalar of its own
    if (!in_scope(o, r)) {
        s.fallback = r.count;
        return s;
    }
    s.main = r.count;
    if (o.slot_storage) {  // each slot's block scales
        const std::uint64_t block = o.slot_storage->block;
        const Count blocks =
            block == 0 ? Count(0) : Count(one.value() / block + (one.value() % block != 0));
        s.other += tensors * blocks * (o.slot_count * bytes_per_element(o.slot_storage->scale));
        s.slack += tensors * o.piece_slack(state);
    }
    if (o.factored) {  // the row and column vectors of the last two dimensions (a stacked tensor:
                       // of each)
        const std::uint64_t* d = r.dims.end() - 2;
        const std::uint64_t rows = d[0], cols = d[1];
        const Count matrices = Count(one.value() / (rows * cols)) * tensors;
        s.other += matrices * (rows + cols) * bytes_per_element(state);
        s.slack += matrices * std::max(rows, cols) *
                   bytes_per_element(state);  // the side a split leaves whole
    }
    return s;
}

/// Bytes of state `s` under `o` with state dtype `state`; with `shards` > 1 one ZeRO shard of it.
/// ZeRO hands the optimiser flat 1-D partitions (DeepSpeed's, FSDP1's flat parameters): a shard's
/// elements divide as its buffers are padded, its scales round up with a block of its own, and a
/// factored rule sees one vector, whose second moment is whole (FSDP2's per-parameter shards would
/// factor: less).
inline Count state_bytes(const Optimizer& o, DType state, const StateCount& s, bool zero = false,
                         std::uint64_t shards = 1) {
    const std::uint64_t main_width =
        o.slot_storage ? bytes_per_element(o.slot_storage->dtype) : bytes_per_element(state);
    const std::uint64_t fallback_width = o.fallback_slots * bytes_per_element(state);
    const auto share = [&](Count n) {
        return Count(n.value() / shards + (n.value() % shards != 0));
    };
    if (s.main == 0 && s.fallback == 0 && s.other == 0) return 0;  // no tensor: no shard, no slack
    if (zero && o.factored) return share(s.main + s.fallback) * fallback_width + o.scalar_bytes;
    const Count slack = shards > 1 ? o.piece_slack(state) : Count(0);
    return share(s.main) * (o.slot_count * main_width) + share(s.fallback) * fallback_width +
           share(s.other) + slack;
}

}  // namespace memcalc
