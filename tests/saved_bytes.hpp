#pragma once
/// The bytes of a layer's saved rows made by an op whose name holds `op` and, if given, whose
/// tensor is `tensor`: what a block's tests check by hand.
#include <cstdint>
#include <string>

#include "memcalc/activations.hpp"

namespace fixtures {

inline std::uint64_t saved_bytes_where(const memcalc::LayerActivations& layer,
                                       const std::string& op, const std::string& tensor = "") {
    std::uint64_t sum = 0;
    for (const memcalc::SavedTensor& row : layer.rows)
        if (std::string(row.op).find(op) != std::string::npos &&
            (tensor.empty() || std::string(row.tensor) == tensor))
            sum += row.bytes.value();
    return sum;
}

}  // namespace fixtures
