#pragma once
// A timeline's step by its name ("backward 3", "loss of micro-batch 2"); the test fails when there
// is none.
#include <catch2/catch.hpp>

#include <string>

#include "memcalc/estimate.hpp"

namespace fixtures {

inline const memcalc::Step& step_named(const memcalc::RankReport& rank, const std::string& name) {
    for (const auto& s : rank.timeline())
        if (s.name() == name) return s;
    FAIL("no step " << name);
    return rank.timeline().front();
}

/// Of the busiest rank.
inline const memcalc::Step& step_named(const memcalc::Report& r, const std::string& name) {
    return step_named(r.busiest(), name);
}

}  // namespace fixtures
