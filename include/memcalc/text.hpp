#pragma once
/// The text a table row shows (an op, a tensor, a shape in the paper's letters). Rows hold views,
/// so a table is plain values: building, copying and dropping one allocates no strings. A view is
/// of a string literal, or of text made once and kept for the life of the process (intern).
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

namespace memcalc {

using Text = std::string_view;

/// `text`, kept for the life of the process: the same characters give the same storage. Row text
/// comes from a bounded set (a model's op and tensor names), so the pool stays small.
inline Text intern(std::string_view text) {
    static std::mutex lock;
    static std::unordered_set<std::string> pool;  // node-based: a stored string never moves
    const std::lock_guard<std::mutex> hold(lock);
    return *pool.emplace(text).first;
}

/// A row's text as its builder gives it: a literal is used in place, made text is interned. (A
/// pointer into a temporary string would dangle: pass the string itself.)
struct Label {
    Text text;
    Label(const char* literal) : text(literal) {}           // NOLINT: implicit by design
    Label(const std::string& made) : text(intern(made)) {}  // NOLINT
    operator Text() const { return text; }                  // NOLINT
};

}  // namespace memcalc
