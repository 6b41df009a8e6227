#pragma once
/// bitsandbytes' 4-bit weights as QLoRA programs make and run them: how a weight is stored, which
/// program quantises which linears from which dtype, and what its matmul keeps by release. Each a
/// row, so a new quantiser or release is one.
#include <array>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "memcalc/dtype.hpp"
#include "memcalc/text.hpp"

namespace memcalc {

/// bitsandbytes' NF4 as QLoRA stores a weight (functional.quantize_4bit): two values a byte, an
/// absmax per 64 values quantised to 8 bits, and an fp32 scale per 256 of those
/// (compress_statistics), each Linear4bit's rounded up on its own; per tensor also an fp32 offset
/// and a 16-entry fp32 code, 68 bytes.
inline constexpr Storage nf4_double_quant{DType::nf4, 64,          DType::int8,
                                          256,        DType::fp32, 4 + 16 * 4};
/// The same without double quantisation: an fp32 absmax per 64 values, and the 16-entry code.
inline constexpr Storage nf4_single_quant{DType::nf4, 64, DType::fp32, 0, DType::fp32, 16 * 4};

/// The program that turns a model's linears into bitsandbytes' Linear4bit.
enum class Quantizer : std::uint8_t { transformers, lightning };

struct QuantizerRow {
    Quantizer quantizer;
    const char* name;
    bool head;       ///< the output head is quantised too
    bool from_fp16;  ///< each weight is quantised from an fp16 copy, whatever its dtype
    const char* summary;
};

inline constexpr std::array<QuantizerRow, 2> quantizer_rows{{
    {Quantizer::transformers, "transformers", false, false,
     "transformers' BitsAndBytesConfig (peft's QLoRA): every linear but the head "
     "(get_keys_to_not_convert), each quantised from the weights as loaded"},
    {Quantizer::lightning, "lightning", true, true,
     "Lightning Fabric's BitsandbytesPrecision (lit-gpt's, LitGPT's --quantize bnb.nf4): every "
     "nn.Linear, the head too, each quantised from an fp16 copy (_quantize_weight)"},
}};

constexpr const QuantizerRow& quantizer_row(Quantizer q) {
    return quantizer_rows[static_cast<std::size_t>(q)];
}

/// bitsandbytes releases where what a 4-bit linear keeps or makes changes: each the first of a
/// row, which holds until the next (--bitsandbytes-version).
enum class BitsandbytesVersion : std::uint8_t { v0_39, v0_43_0, v0_43_2 };

struct BitsandbytesFacts {
    BitsandbytesVersion version;
    Text name;  ///< the row's first release
    int major, minor, patch;
    /// MatMul4Bit keeps its input for backward though no weight gradient reads it (ctx.tensors =
    /// (A, B)), until bitsandbytes#1270 (0.43.2) kept B alone.
    bool keeps_input;
    /// Params4bit quantises from an fp16 copy (.half() in its cuda()), until 0.43.0 quantised the
    /// weight in its own dtype.
    bool params_from_fp16;
};

// clang-format off
inline constexpr std::array<BitsandbytesFacts, 3> bitsandbytes_rows{{
    // version                       name      major minor patch input fp16
    {BitsandbytesVersion::v0_39,   "0.39.0", 0,    39,   0,    true,  true},
    {BitsandbytesVersion::v0_43_0, "0.43.0", 0,    43,   0,    true,  false},
    {BitsandbytesVersion::v0_43_2, "0.43.2", 0,    43,   2,    false, false},
}};
// clang-format on

inline const BitsandbytesFacts& bitsandbytes_facts(BitsandbytesVersion v) {
    return bitsandbytes_rows[static_cast<std::size_t>(v)];
}

inline const char* bitsandbytes_version_name(BitsandbytesVersion v) {
    return bitsandbytes_facts(v).name.data();  // a literal: terminated
}

/// The row a release "MAJOR.MINOR[.PATCH][anything]" runs with ("0.41.1", "0.45.0.dev0"): the
/// newest row not after it; none for text that is no version or a release before 4-bit weights.
inline std::optional<BitsandbytesVersion> bitsandbytes_version_of(std::string_view text) {
    int part[3] = {0, 0, 0};
    const char* at = text.data();
    const char* end = text.data() + text.size();
    for (int i = 0; i < 3; ++i) {
        const auto [next, ec] = std::from_chars(at, end, part[i]);
        if (ec != std::errc()) return std::nullopt;
        at = next;
        if (i < 2 && (at == end || *at != '.')) {
            if (i == 0) return std::nullopt;  // a minor release is needed
            break;
        }
        if (i < 2) ++at;
    }
    std::optional<BitsandbytesVersion> found;
    for (const BitsandbytesFacts& r : bitsandbytes_rows)
        if (std::array{part[0], part[1], part[2]} >= std::array{r.major, r.minor, r.patch})
            found = r.version;
    return found;
}

/// What a program's 4-bit linears do, from its quantiser and bitsandbytes release.
struct QuantizedLinears {
    Quantizer quantizer = Quantizer::transformers;
    BitsandbytesVersion bitsandbytes = bitsandbytes_rows.back().version;
    bool double_quant = true;

    Storage storage() const {
        Storage s = double_quant ? nf4_double_quant : nf4_single_quant;
        if (quantizer_row(quantizer).from_fp16 || bitsandbytes_facts(bitsandbytes).params_from_fp16)
            s.quantized_from = DType::fp16;
        return s;
    }
    bool head() const { return quantizer_row(quantizer).head; }
    bool keeps_input() const { return bitsandbytes_facts(bitsandbytes).keeps_input; }
};

/// Bytes an element of a 4-bit weight takes while it computes: dequantised to the dtype it was
/// quantised from (`from`, Storage::quantized_from), then, where that is not `compute`, cast to
/// it, both alive for the cast.
inline std::uint64_t dequantized_bytes(std::optional<DType> from, DType compute) {
    const bool cast = from && *from != compute;
    return bytes_per_element(compute) + (cast ? bytes_per_element(*from) : 0);
}

}  // namespace memcalc
