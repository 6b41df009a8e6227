#pragma once
/// The linears that read an MLP's input.
#include <cstdint>
#include <string>

#include "memcalc/blocks/linear.hpp"

namespace memcalc::detail {

/// The linear layers that read the MLP's input: gate and up, or up alone.
inline std::uint64_t mlp_input_projections(const Architecture& m) {
    return m.mlp == Mlp::gated ? 2 : 1;
}
/// The linears autocast casts the MLP's input for: gate and up made as one (fused_gate_up) cast
/// it once.
inline std::uint64_t mlp_input_casts(const Architecture& m) {
    return m.fused_gate_up ? 1 : mlp_input_projections(m);
}
inline LinearSet mlp_input_readers(const Architecture& m, bool shared = false) {
    return bit(shared ? Linear::shared_up : Linear::up) |
           (m.mlp == Mlp::gated ? bit(shared ? Linear::shared_gate : Linear::gate) : 0);
}

/// Their outputs, `sbf` elements each, of `shape`: the first weight they write a gradient to.
inline LinearOutput mlp_input_output(const Architecture& m, Count sbf, const Shape& shape) {
    const std::uint64_t n = mlp_input_projections(m);
    // act(gate(x)) is made before up(x) runs.
    return {sbf * n,
            n == 1 ? std::string(Text(shape.symbol))
                   : std::to_string(n) + " " + std::string(Text(shape.symbol)),
            n == 1 ? Linear::up : Linear::gate,
            ActivationSplit::tensor,
            m.fused_gate_up ? Count(0) : sbf,  // one fused linear's output is both
            n == 1 ? Count(0) : sbf};
}

}  // namespace memcalc::detail
