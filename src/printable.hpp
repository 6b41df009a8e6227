#pragma once
// Text from a user's file or command line made safe to print: a terminal, a CSV row, an SVG or a
// log line shows it as characters, never as a control sequence, a forged line or reordered text.
#include <cstdint>
#include <string>
#include <string_view>

namespace memcalc::cli {

namespace printable_detail {

/// The code point a well-formed UTF-8 sequence at `text[at]` encodes, and its length; length 0 when
/// the bytes there are not one (a stray continuation byte, an overlong form, a surrogate, too
/// large).
struct Decoded {
    std::uint32_t code_point = 0;
    std::size_t length = 0;
};

inline Decoded decode_utf8(std::string_view text, std::size_t at) {
    const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[at + i]); };
    const unsigned char lead = byte(0);
    const std::size_t length = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 0;
    if (length == 0 || lead > 0xf4 || at + length > text.size()) return {};
    std::uint32_t code = lead & (0x7fu >> length);
    for (std::size_t i = 1; i < length; ++i) {
        if ((byte(i) & 0xc0) != 0x80) return {};
        code = code << 6 | (byte(i) & 0x3fu);
    }
    constexpr std::uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
    const bool surrogate = code >= 0xd800 && code <= 0xdfff;
    if (code < smallest[length] || surrogate || code > 0x10ffff) return {};
    return {code, length};
}

/// Code points that change how a terminal or a bidirectional renderer shows what follows them.
inline bool is_control(std::uint32_t c) {
    const bool c0_or_c1 = c < 0x20 || (c >= 0x7f && c <= 0x9f);
    const bool line_breaks = c == 0x2028 || c == 0x2029;  // line and paragraph separators
    const bool bidi = c == 0x061c || c == 0x200e || c == 0x200f || (c >= 0x202a && c <= 0x202e) ||
                      (c >= 0x2066 && c <= 0x2069);
    return c0_or_c1 || line_breaks || bidi;
}

inline std::string hex(std::uint32_t value, std::size_t digits) {
    std::string out(digits, '0');
    for (std::size_t i = digits; i-- > 0; value >>= 4) out[i] = "0123456789abcdef"[value & 15];
    return out;
}

}  // namespace printable_detail

/// `text` with every control character written as an escape: a C0 or C1 control, DEL, a line or
/// paragraph separator or a bidirectional override as \xNN or \uNNNN, and each byte of ill-formed
/// UTF-8 as \xNN (a lone 0x9b is a CSI to an 8-bit terminal). Everything else is kept as it is.
inline std::string printable(std::string_view text) {
    using namespace printable_detail;
    std::string out;
    out.reserve(text.size());
    for (std::size_t at = 0; at < text.size();) {
        const auto c = static_cast<unsigned char>(text[at]);
        const Decoded d = c < 0x80 ? Decoded{c, 1} : decode_utf8(text, at);
        if (d.length == 0) {
            out += "\\x" + hex(c, 2);
            ++at;
            continue;
        }
        if (!is_control(d.code_point))
            out.append(text.substr(at, d.length));
        else if (d.code_point < 0x100)
            out += "\\x" + hex(d.code_point, 2);
        else
            out += "\\u" + hex(d.code_point, 4);
        at += d.length;
    }
    return out;
}

}  // namespace memcalc::cli
