#pragma once
// A layer's workspace by its op's name, for tests that check one by hand.
#include <catch2/catch.hpp>
#include <string>

#include "memcalc/activations.hpp"

namespace fixtures {

inline const memcalc::Workspace& workspace_named(const memcalc::LayerActivations& layer,
                                                 const std::string& op) {
    for (const auto& w : layer.work)
        if (w.op == op) return w;
    FAIL("no workspace " << op);
    return layer.work.front();
}

}  // namespace fixtures
