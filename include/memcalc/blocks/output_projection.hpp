#pragma once
/// The attention's output projection.

#include "memcalc/blocks/linear.hpp"

namespace memcalc::detail {

/// The output projection's output: row-parallel, so its gradient is the whole residual stream's.
inline LinearOutput output_projection(const Sizes& z) {
    return {z.sbh, "sbh", Linear::o, ActivationSplit::replicated, {}, {}};
}

}  // namespace memcalc::detail
