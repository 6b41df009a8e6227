#pragma once
/// Dropout: what its backward keeps.
#include <cstdint>
#include <string>

#include "memcalc/blocks/layer_builder.hpp"
#include "memcalc/blocks/sizes.hpp"

namespace memcalc::detail {

/// A dropout's saved tensor: CUDA's kernel keeps a 1-byte mask; on CPU, F.dropout multiplies by a
/// noise tensor of the input's dtype (`input`: bernoulli / (1 - p)) and the product keeps that.
inline void dropout_row(TableBuilder& t, const Sizes& z, DType input, const std::string& op,
                        const Shape& shape, Count elements, Keep keep = Keep::always,
                        std::uint64_t copies = 1) {
    t.launch(z.kernels->dropout_launches * static_cast<double>(copies));
    if (z.kernels->dropout_mask)
        t.add(op, "mask (1 byte)", "which elements were zeroed", shape, elements, dtype::mask, keep,
              copies);
    else
        t.add(op, std::string("noise (") + dtype_name(input) + ", CPU F.dropout)",
              "the gradient is multiplied by the same noise", shape, elements,
              bytes_per_element(input), keep, copies);
}

}  // namespace memcalc::detail
