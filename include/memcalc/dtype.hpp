#pragma once
/// Storage types as rows: a dtype is an enum whose row gives its name and width, so a name is never
/// guessed from a byte count (fp16 and bf16 are both 2 bytes; fp8 and int8 both 1). A Storage adds
/// block scales, which 8-bit optimiser state and 4-bit weights keep, and makes sub-byte widths
/// exact.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "memcalc/units.hpp"

namespace memcalc {

enum class DType : std::uint8_t {
    fp64,
    fp32,
    bf16,
    fp16,
    fp8_e4m3,
    fp8_e5m2,
    int8,
    mask,
    nf4,
    int4,
    fp4_e2m1
};

struct DTypeRow {
    DType dtype;
    const char* name;
    std::uint32_t bits;
};

/// One row per DType, in the enum's order.
inline constexpr std::array<DTypeRow, 11> dtype_rows{{
    {DType::fp64, "fp64", 64},
    {DType::fp32, "fp32", 32},
    {DType::bf16, "bf16", 16},
    {DType::fp16, "fp16", 16},
    {DType::fp8_e4m3, "fp8-e4m3", 8},
    {DType::fp8_e5m2, "fp8-e5m2", 8},
    {DType::int8, "int8", 8},
    {DType::mask, "bool", 8},  // a dropout mask: one byte per element
    {DType::nf4, "nf4", 4},
    {DType::int4, "int4", 4},
    {DType::fp4_e2m1, "fp4-e2m1", 4},  // NVFP4's values, two a byte
}};

constexpr const DTypeRow& dtype_row(DType d) { return dtype_rows[static_cast<std::size_t>(d)]; }
constexpr const char* dtype_name(DType d) { return dtype_row(d).name; }
constexpr std::uint32_t dtype_bits(DType d) { return dtype_row(d).bits; }
/// Bytes per element of a whole-byte dtype, which every computed tensor has; a sub-byte one is 0
/// here and only ever stored, through Storage::bytes.
constexpr std::uint64_t bytes_per_element(DType d) {
    return dtype_bits(d) % 8 == 0 ? dtype_bits(d) / 8 : 0;
}

namespace detail {
constexpr bool rows_in_enum_order() {
    for (std::size_t i = 0; i < dtype_rows.size(); ++i)
        if (static_cast<std::size_t>(dtype_rows[i].dtype) != i) return false;
    return true;
}
static_assert(rows_in_enum_order(), "dtype_rows must list the DTypes in their enum order");
}  // namespace detail

/// Byte widths of the dtypes tensors are computed in, for the formulas' arithmetic.
namespace dtype {
inline constexpr std::uint64_t fp32 = bytes_per_element(DType::fp32);
inline constexpr std::uint64_t bf16 = bytes_per_element(DType::bf16);
inline constexpr std::uint64_t fp16 = bytes_per_element(DType::fp16);
inline constexpr std::uint64_t int8 = bytes_per_element(DType::int8);
inline constexpr std::uint64_t mask = bytes_per_element(DType::mask);
}  // namespace dtype

/// How a tensor is stored: its dtype, and with `block` > 0 one `scale` per block of that many
/// elements (bitsandbytes' 8-bit state, QLoRA's nf4 weights); with `scale_block` > 0 the scales are
/// quantised in turn, one `scale_scale` per that many of them (QLoRA's double quantisation).
struct Storage {
    DType dtype = DType::bf16;
    std::uint32_t block = 0;
    DType scale = DType::fp32;
    std::uint32_t scale_block = 0;
    DType scale_scale = DType::fp32;
    std::uint32_t per_tensor =
        0;  ///< bytes each stored tensor keeps besides (bitsandbytes: an offset, a code)
    /// The dtype the values were quantised from, which dequantising returns (bitsandbytes'
    /// quant_state dtype); none: the compute dtype.
    std::optional<DType> quantized_from = std::nullopt;

    friend bool operator==(const Storage& x, const Storage& y) {
        return x.dtype == y.dtype && x.block == y.block && x.scale == y.scale &&
               x.scale_block == y.scale_block && x.scale_scale == y.scale_scale &&
               x.per_tensor == y.per_tensor && x.quantized_from == y.quantized_from;
    }
    friend bool operator!=(const Storage& x, const Storage& y) { return !(x == y); }

    /// Exact bytes of `elements`: the packed values, rounded up to a byte, and the block scales.
    Count bytes(Count elements) const {
        const std::uint64_t n = elements.value(), bits = dtype_bits(dtype);
        const Count packed = Count(n / 8) * bits + Count(((n % 8) * bits + 7) / 8);
        if (block == 0) return packed;
        const std::uint64_t blocks = n / block + (n % block != 0 ? 1 : 0);
        const Count scales = Count(blocks) * bytes_per_element(scale);
        if (scale_block == 0) return packed + scales;
        return packed + scales +
               Count(blocks / scale_block + (blocks % scale_block != 0 ? 1 : 0)) *
                   bytes_per_element(scale_scale);
    }
    /// One tensor of `elements` as stored on its own: its blocks and scales rounded up, and
    /// per_tensor.
    Count tensor_bytes(Count elements) const { return bytes(elements) + Count(per_tensor); }
    /// Whether it is a whole-byte dtype alone: bytes_per_element(dtype) a value, nothing besides.
    bool plain() const { return block == 0 && per_tensor == 0 && bytes_per_element(dtype) != 0; }
};

/// "fp8-e4m3"; "fp4-e2m1, an fp8-e4m3 scale per 16".
inline std::string storage_name(const Storage& s) {
    std::string out = dtype_name(s.dtype);
    if (s.block > 0)
        out += std::string(", an ") + dtype_name(s.scale) + " scale per " + std::to_string(s.block);
    return out;
}

}  // namespace memcalc
