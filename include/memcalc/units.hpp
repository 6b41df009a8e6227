#pragma once
/// Exact integer arithmetic for element and byte counts, and GB/GiB conversion.
#include <cstdint>
#include <limits>
#include <string>

#include "memcalc/error.hpp"

namespace memcalc {

/// A non-negative count (elements, bytes, parameters) whose + and * throw on 64-bit overflow,
/// so that formulas read like the paper and never wrap around to a small wrong number.
class Count {
public:
    constexpr Count() = default;
    constexpr Count(std::uint64_t value)
        : value_(value) {}  // NOLINT: implicit so literals read naturally

    constexpr std::uint64_t value() const { return value_; }

    // The compilers' overflow builtins where there are (a multiply's check is then a flag, not a
    // division).
    friend Count operator+(Count x, Count y) {
        std::uint64_t sum;
#if defined(__GNUC__) || defined(__clang__)
        if (__builtin_add_overflow(x.value_, y.value_, &sum)) overflow();
#else
        if (x.value_ > std::numeric_limits<std::uint64_t>::max() - y.value_) overflow();
        sum = x.value_ + y.value_;
#endif
        return Count(sum);
    }
    friend Count operator*(Count x, Count y) {
        std::uint64_t product;
#if defined(__GNUC__) || defined(__clang__)
        if (__builtin_mul_overflow(x.value_, y.value_, &product)) overflow();
#else
        if (x.value_ != 0 && y.value_ > std::numeric_limits<std::uint64_t>::max() / x.value_)
            overflow();
        product = x.value_ * y.value_;
#endif
        return Count(product);
    }
    Count& operator+=(Count y) { return *this = *this + y; }
    Count& operator*=(Count y) { return *this = *this * y; }

    friend constexpr bool operator==(Count x, Count y) { return x.value_ == y.value_; }
    friend constexpr bool operator!=(Count x, Count y) { return x.value_ != y.value_; }
    friend constexpr bool operator<(Count x, Count y) { return x.value_ < y.value_; }
    friend constexpr bool operator>(Count x, Count y) { return x.value_ > y.value_; }
    friend constexpr bool operator<=(Count x, Count y) { return x.value_ <= y.value_; }
    friend constexpr bool operator>=(Count x, Count y) { return x.value_ >= y.value_; }

private:
    [[noreturn]] static void overflow() {
        throw overflow_error("a byte or element count overflows 64 bits");
    }
    std::uint64_t value_ = 0;
};

enum class Unit { gb, gib };

inline constexpr double bytes_per_gb = 1e9;            ///< the chapter's unit
inline constexpr double bytes_per_gib = 1073741824.0;  ///< 2^30

inline double to_unit(Count bytes, Unit unit) {
    return static_cast<double>(bytes.value()) / (unit == Unit::gb ? bytes_per_gb : bytes_per_gib);
}

inline const char* unit_name(Unit unit) { return unit == Unit::gb ? "GB" : "GiB"; }

}  // namespace memcalc
