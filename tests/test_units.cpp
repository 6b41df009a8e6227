#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>

#include "memcalc/units.hpp"

using memcalc::Count;

TEST_CASE("Count adds and multiplies exactly", "[units]") {
    CHECK((Count(34) * 4096 * 4096 + Count(5) * 32 * 4096 * 4096).value() == 3254779904ULL);
    CHECK((Count(16) * 6738415616ULL).value() == 107814649856ULL);
}

TEST_CASE("Count refuses to wrap around", "[units]") {
    const Count max = std::numeric_limits<std::uint64_t>::max();
    CHECK_THROWS_AS(max + 1, memcalc::overflow_error);
    CHECK_THROWS_AS(Count(1ULL << 32) * (1ULL << 32), memcalc::overflow_error);
    CHECK((Count(1ULL << 31) * (1ULL << 32)).value() == (1ULL << 63));
    CHECK((max + 0) == max);
    CHECK((Count(0) * max).value() == 0);
}

TEST_CASE("GB is 10^9 bytes and GiB 2^30", "[units]") {
    CHECK(memcalc::to_unit(107814649856ULL, memcalc::Unit::gb) == Approx(107.814649856));
    CHECK(memcalc::to_unit(1ULL << 30, memcalc::Unit::gib) == 1.0);
    CHECK(std::string(memcalc::unit_name(memcalc::Unit::gib)) == "GiB");
}
