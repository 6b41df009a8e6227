#pragma once
// A safetensors file's header: 8 bytes little-endian length, then that many bytes of JSON naming
// each tensor's dtype, shape and byte range. memcalc reads the header alone, never the data.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace memcalc::cli {

struct SafetensorsTensor {
    std::string name, dtype;  ///< "model.layers.0.self_attn.q_proj.weight", "BF16"
    std::vector<std::uint64_t> shape;
    std::uint64_t elements =
        1;  ///< the product of shape (a packed dtype's storage elements: U8 for MXFP4)
    std::uint64_t bytes = 0;   ///< data_offsets' end minus begin, checked against dtype and shape
    std::uint64_t offset = 0;  ///< data_offsets' begin: where its bytes start in the data
};

/// The bits of one element of a safetensors dtype ("BF16" -> 16, "F4" -> 4); 0 for a name it does
/// not list.
unsigned safetensors_dtype_bits(std::string_view dtype);

/// The largest header memcalc reads (the safetensors format's own limit is 100 MB).
inline constexpr std::uint64_t max_safetensors_header = 100'000'000;

/// Parses the start of a safetensors file: `head` holds its first bytes (the 8-byte length and the
/// header, or fewer: an error says it is truncated), `file_size` the whole file's size. Every error
/// names `origin` and what is wrong.
std::vector<SafetensorsTensor> parse_safetensors_header(std::string_view head,
                                                        std::uint64_t file_size,
                                                        const std::string& origin);

/// Reads only the header of the file at `path`.
std::vector<SafetensorsTensor> read_safetensors_header(const std::string& path);

}  // namespace memcalc::cli
