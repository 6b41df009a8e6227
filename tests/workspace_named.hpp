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

/// What `holder` keeps alive beside `w` (one of `layer`'s own) under `mode`.
inline std::uint64_t beside(const memcalc::LayerActivations& layer, const memcalc::Workspace& w,
                            memcalc::Recompute mode,
                            memcalc::Holder holder = memcalc::Holder::caller) {
    return layer.beside_bytes(std::size_t(&w - layer.work.data()), mode, holder).value();
}
/// The first linear whose weight's gradient exists while `w` (one of `layer`'s own) runs.
inline memcalc::Linear gradients_from(const memcalc::LayerActivations& layer,
                                      const memcalc::Workspace& w) {
    return layer.gradients_by_op()[std::size_t(&w - layer.work.data())];
}
/// The residual stream beside `w` in every mode: in the MLP half the attention half's sum.
inline std::uint64_t stream_other(const memcalc::LayerActivations& layer,
                                  const memcalc::Workspace& w) {
    return beside(layer, w, memcalc::Recompute::full);
}
/// The layer's input beside `w`, which only a layer that is not checkpointed holds there.
inline std::uint64_t stream_input(const memcalc::LayerActivations& layer,
                                  const memcalc::Workspace& w) {
    return beside(layer, w, memcalc::Recompute::none) - stream_other(layer, w);
}
/// What `layer`'s checkpoint holds while it reruns the forward: the gradients made before.
inline std::uint64_t rerun_bytes(const memcalc::LayerActivations& layer) {
    std::uint64_t held = 0;
    for (const memcalc::CheckpointTensor& t : layer.checkpoint_tensors)
        if (t.held == memcalc::CheckpointHeld::rerun) held += t.bytes.value();
    return held;
}
/// Whether `w` runs at the layer's last op, after its modules have returned.
inline bool at_layer_end(const memcalc::LayerActivations& layer, const memcalc::Workspace& w) {
    bool ended = false;
    for (const memcalc::ProgramStep& step : layer.program) {
        if (step.kind == memcalc::StepKind::layer_end) ended = true;
        if (step.kind == memcalc::StepKind::op && &layer.work[step.index] == &w) return ended;
    }
    FAIL("workspace " << w.op << " is not in its layer's program");
    return false;
}

}  // namespace fixtures
