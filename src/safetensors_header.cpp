#include "safetensors_header.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <utility>

#include "json_reader.hpp"
#include "memcalc/units.hpp"
#include "model_file.hpp"

namespace memcalc::cli {

unsigned safetensors_dtype_bits(std::string_view dtype) {
    // The dtypes of the safetensors format (huggingface/safetensors, safetensors/src/tensor.rs,
    // Dtype).
    static const std::array<std::pair<std::string_view, unsigned>, 21> bits{{
        {"BOOL", 8},        {"U8", 8},   {"I8", 8},      {"F8_E5M2", 8}, {"F8_E4M3", 8},
        {"F8_E8M0", 8},     {"I16", 16}, {"U16", 16},    {"F16", 16},    {"BF16", 16},
        {"I32", 32},        {"U32", 32}, {"F32", 32},    {"F64", 64},    {"I64", 64},
        {"U64", 64},        {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"C64", 64},
        {"F8_E4M3FNUZ", 8},
    }};
    for (const auto& [name, size] : bits)
        if (name == dtype) return size;
    return 0;
}

namespace {
/// The header's length: the file's first 8 bytes, little-endian.
std::uint64_t header_length(std::string_view first8) {
    std::uint64_t length = 0;
    for (int i = 7; i >= 0; --i)
        length = length << 8 | static_cast<unsigned char>(first8[static_cast<std::size_t>(i)]);
    return length;
}

/// A tensor and its byte range as the header writes it: "tensor 'w' [0, 8]".
std::string range_of(const SafetensorsTensor& t) {
    const std::uint64_t end = t.offset + t.bytes;
    return "tensor '" + t.name + "' [" + std::to_string(t.offset) + ", " + std::to_string(end) +
           "]";
}

/// A stretch of the data no tensor's range covers.
std::string unused_bytes(std::uint64_t begin, std::uint64_t end) {
    return "bytes " + std::to_string(begin) + " to " + std::to_string(end) +
           " of the data are in no tensor";
}

/// The tensors' byte ranges must tile the data, as the safetensors library checks: sorted by start,
/// each begins where the one before ended, the first at 0, the last at the data's end.
void check_tiling(const std::vector<SafetensorsTensor>& tensors, std::uint64_t data_size,
                  const std::string& origin) {
    std::vector<const SafetensorsTensor*> sorted;
    for (const auto& t : tensors) sorted.push_back(&t);
    const auto by_range = [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
        return std::make_pair(a->offset, a->bytes) < std::make_pair(b->offset, b->bytes);
    };
    std::sort(sorted.begin(), sorted.end(), by_range);
    const auto fail = [&](const std::string& what) {
        throw error(origin + ": " + what + " (the tensors' data_offsets must tile the data)");
    };
    const SafetensorsTensor* previous = nullptr;
    std::uint64_t end = 0;  // where the data covered so far ends
    for (const SafetensorsTensor* t : sorted) {
        if (t->offset < end) fail(range_of(*previous) + " and " + range_of(*t) + " overlap");
        if (t->offset > end) {
            const std::string at = previous ? "between " + range_of(*previous) + " and" : "before";
            fail(unused_bytes(end, t->offset) + " (" + at + " " + range_of(*t) + ")");
        }
        previous = t, end = t->offset + t->bytes;
    }
    if (end == data_size) return;
    const std::string where = previous ? "after " + range_of(*previous) : "the header names none";
    fail(unused_bytes(end, data_size) + " (" + where + ")");
}
}  // namespace

namespace {

/// One tensor's entry of a header whose data part is `data_size` bytes: its dtype, shape and range,
/// each checked.
SafetensorsTensor tensor_entry(const std::string& name, const nlohmann::json& entry,
                               std::uint64_t data_size, const std::string& origin) {
    const auto fail = [&](const std::string& what) -> void { throw error(origin + ": " + what); };
    const std::string where = "tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
        fail(where + " needs dtype, shape and data_offsets");
    const auto& dtype = entry.at("dtype");
    const auto& shape = entry.at("shape");
    const auto& offsets = entry.at("data_offsets");
    if (!dtype.is_string()) fail(where + ": dtype must be a string");
    SafetensorsTensor t{name, dtype.get<std::string>(), {}, 1, 0};
    const unsigned bits = safetensors_dtype_bits(t.dtype);
    if (bits == 0) fail(where + ": dtype '" + t.dtype + "' is not a safetensors dtype");
    if (!shape.is_array()) fail(where + ": shape must be an array of non-negative integers");
    Count elements = 1;
    try {
        for (const auto& d : shape) {
            if (!d.is_number_unsigned())
                fail(where + ": shape must be an array of non-negative integers");
            t.shape.push_back(d.get<std::uint64_t>());
            elements *= t.shape.back();
        }
        t.elements = elements.value();
        (void)(elements * bits);  // the size in bits fits in 64 bits
    } catch (const overflow_error&) {
        fail(where + ": its shape has more than 2^64 elements");
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
        fail(where + ": data_offsets must be [begin, end]");
    const auto begin = offsets[0].get<std::uint64_t>(), end = offsets[1].get<std::uint64_t>();
    if (begin > end || end > data_size)
        fail(where + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
             "] fall outside the file's " + std::to_string(data_size) +
             " bytes of data (truncated?)");
    t.bytes = end - begin, t.offset = begin;
    const std::uint64_t expected = (t.elements * bits + 7) / 8;
    if (t.bytes != expected)
        fail(where + ": " + std::to_string(t.bytes) + " bytes of data, but " + t.dtype +
             " of this shape takes " + std::to_string(expected));
    return t;
}

}  // namespace

std::vector<SafetensorsTensor> parse_safetensors_header(std::string_view head,
                                                        std::uint64_t file_size,
                                                        const std::string& origin) {
    const auto fail = [&](const std::string& what) -> void { throw error(origin + ": " + what); };
    if (head.size() < 8 || file_size < 8)
        fail("truncated: " + std::to_string(std::min<std::uint64_t>(head.size(), file_size)) +
             " bytes, and a safetensors file starts with an 8-byte header length");
    const std::uint64_t length = header_length(head);
    if (length > max_safetensors_header)
        fail("header length " + std::to_string(length) +
             " is over the format's limit of 100,000,000 bytes");
    if (length > file_size - 8)
        fail("header length " + std::to_string(length) + " runs past the end of the file (" +
             std::to_string(file_size) + " bytes)");
    if (head.size() - 8 < length)
        fail("truncated: the header is " + std::to_string(length) + " bytes, " +
             std::to_string(head.size() - 8) + " read");
    const std::uint64_t data_size = file_size - 8 - length;
    const nlohmann::json header =
        parse_json(head.substr(8, static_cast<std::size_t>(length)), origin + " (header)");
    if (!header.is_object())
        fail(std::string("the header is not a JSON object (got ") + header.type_name() + ")");

    std::vector<SafetensorsTensor> tensors;
    for (const auto& [name, entry] : header.items()) {
        if (name == "__metadata__") continue;  // free text: the format's string-to-string map
        tensors.push_back(tensor_entry(name, entry, data_size, origin));
    }
    check_tiling(tensors, data_size, origin);
    return tensors;
}

std::vector<SafetensorsTensor> read_safetensors_header(const std::string& path) {
    std::error_code code;
    if (!std::filesystem::is_regular_file(path, code))
        throw error("cannot read '" + path + "': not a regular file");
    const std::uint64_t size = std::filesystem::file_size(path, code);
    if (code) throw error("cannot read '" + path + "': " + code.message());
    std::ifstream in(path, std::ios::binary);
    if (!in) throw error("cannot read '" + path + "'");
    remember_input(path);  // no output of this run may replace it
    std::string head(static_cast<std::size_t>(std::min<std::uint64_t>(size, 8)), '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    if (head.size() == 8) {  // then the header, as far as the length says and the file allows
        const std::uint64_t length = header_length(head);
        if (length <= max_safetensors_header && length <= size - 8) {
            head.resize(8 + static_cast<std::size_t>(length));
            in.read(head.data() + 8, static_cast<std::streamsize>(length));
            head.resize(8 + static_cast<std::size_t>(in.gcount()));
        }
    }
    return parse_safetensors_header(head, size, path);
}

}  // namespace memcalc::cli
