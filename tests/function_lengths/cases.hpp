// Fixtures for scripts/function-lengths.py (ctest function_lengths_are_read): each `// expect:
// NAME LINES` comment names the function that starts on the next line and the length the script
// must print for it; the script must print no other function. Compiled by nothing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fixture {

struct Set {
    int bits = 0;
};

/// A function with a lambda inside: the lambda's lines count toward it.
// expect: with_lambda 8
inline int with_lambda(int a, int b) {
    const auto twice = [&](int x) {
        const int y = x * 2;
        return y;
    };
    const auto plus = [b](int x) { return x + b; };
    return twice(a) + plus(a);
}

/// A default argument in braces, the parameter list's own (architecture_layer's: it was read as a
/// function of 4 lines closing at the default's `}`).
// expect: with_default 6
inline std::uint64_t with_default(std::uint64_t seq, std::uint64_t micro_batch, Set set = {},
                                  const std::vector<int>& sizes = {1, 2}) {
    const auto sum = [&] { return seq * micro_batch; };
    if (sizes.empty()) return sum();
    return sum() + std::uint64_t(set.bits);
}

/// Braces inside parentheses in a call of the header (a braced temporary).
// expect: with_temporary 1
inline int with_temporary(std::vector<int> v = std::vector<int>{1, 2, 3}) { return int(v.size()); }

/// A lambda assigned at namespace scope, with parameters.
// expect: namespace_lambda 4
inline const auto namespace_lambda = [](int a, int b) {
    const int sum = a + b;
    return sum * 2;
};

/// A lambda assigned at namespace scope without a parameter list.
// expect: bare_lambda 4
inline const auto bare_lambda = [] {
    const std::string text = "a { brace in a string, and one in a character: '{'";
    return text + '}';
};

/// Data in braces is no function.
inline const std::vector<int> table{1, 2, 3};
inline const int sums[2] = {1, 2};

/// A class with member initialisers in braces, inline member functions, a default member
/// initialiser and a nested struct.
template <class T>
class Holder {
public:
    // expect: Holder 8
    Holder(T value, const std::string& name, Set set = {})
        : value_{value},
          name_{name + "{"},
          sizes_(std::vector<int>{1, 2, int(name.size()), int(name.size()) * 2}),
          set_{set} {
        if (name_.empty()) value_ = T{};
        sizes_.push_back(int(set_.bits));
    }

    // expect: value 1
    T value() const { return value_; }

    // expect: describe 7
    std::string describe() const {
        std::string out = name_;
        for (int size : sizes_) {
            out += std::to_string(size);
        }
        return out;
    }

    // expect: operator== 3
    bool operator==(const Holder& other) const {
        return value_ == other.value_ && name_ == other.name_;
    }

private:
    struct Part {
        int width{0};
    };
    T value_{};
    std::string name_;
    std::vector<int> sizes_{};
    Set set_;
    Part part_{};
};

/// A function template, its `template` line counted.
// expect: largest 8
template <class T>
T largest(const std::vector<T>& values) {
    T best{};
    for (const T& v : values) {
        if (v > best) best = v;
    }
    return best;
}

}  // namespace fixture
