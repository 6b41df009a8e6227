#pragma once
/// One layer's step as PyTorch runs it: an ordered list of events on tensors, each caused by an
/// op. A tensor is allocated, saved for backward, freed, or made again by a recomputation; an op
/// runs while its temporaries are live. Every figure of a layer (what it keeps, what its backward
/// rebuilds, what each op holds while it runs) is one sweep over this list (liveness.hpp).
#include <cstdint>
#include <vector>

#include "memcalc/activations.hpp"
#include "memcalc/text.hpp"
#include "memcalc/units.hpp"

namespace memcalc::tape {

enum class Pass : std::uint8_t { forward, backward };

inline const char* pass_name(Pass p) { return p == Pass::forward ? "forward" : "backward"; }

enum class EventKind : std::uint8_t {
    alloc,    ///< made by the op; live until freed, not kept for backward
    save,     ///< made by the op and saved for backward: the layer keeps it to its backward step
    free,     ///< released: its last reader has run (or its checkpoint discarded it)
    rebuild,  ///< made again by the backward's recomputation, for the backward of its region
    run,      ///< the op runs, holding its temporaries (allocated just before): a measured moment
};

inline const char* event_name(EventKind k) {
    switch (k) {
        case EventKind::alloc: return "alloc";
        case EventKind::save: return "save";
        case EventKind::free: return "free";
        case EventKind::rebuild: return "rebuild";
        case EventKind::run: return "run";
    }
    return "?";
}

/// What a tensor is to the step.
enum class Role : std::uint8_t {
    activation,  ///< an op's output or saved input
    workspace,   ///< a temporary of one op
    stream,      ///< the residual stream, held by the layer's caller
    state,       ///< not a tensor of the model: a checkpoint's RNG state
};

/// Which of a step's counts a tensor belongs to, declared when it is made: saved by the forward
/// pass (both steps count it), rebuilt in a region (that region's backward counts it), or neither.
/// A tape's saves and rebuilds must agree with it (tests/test_tape.cpp).
enum class Counted : std::uint8_t { none, saved, rebuilt_0, rebuilt_1 };

inline Counted rebuilt_in(std::uint8_t region) {
    return region == 0 ? Counted::rebuilt_0 : Counted::rebuilt_1;
}

struct Tensor {
    Text name;
    Text symbol;  ///< its element count in the paper's letters ("sbh"); empty for a formula
    ActivationSplit split;
    Count bytes;
    Role role;
    Counted counted;
};

using TensorId = std::uint32_t;

struct Event {
    EventKind kind;
    Pass pass;
    /// The recomputation region: selective recomputation rebuilds a layer's halves apart (0 the
    /// attention half, 1 the MLP half, whose backward runs first); one region otherwise.
    std::uint8_t region;
    Text op;
    TensorId tensor;
    /// For `run`: the index of the op's entry in the source table (its Workspace), else unused.
    std::uint32_t source;
};

/// The events of one layer under one recomputation mode, in program order.
struct Tape {
    std::vector<Tensor> tensors;
    std::vector<Event> events;
};

/// A sink that keeps every tensor and event: a Tape to show or test. (liveness.hpp's Sweeper is
/// the other: it keeps only the sums.)
class Recorder {
public:
    TensorId tensor(const Tensor& t) {
        tape.tensors.push_back(t);
        return TensorId(tape.tensors.size() - 1);
    }
    void event(const Event& e) { tape.events.push_back(e); }

    Tape tape;
};

/// The only way to write a tape: each call sends one event to `Sink`; nothing is edited once
/// written.
template <class Sink>
class Builder {
public:
    explicit Builder(Sink& sink) : sink_(sink) {}

    TensorId tensor(Text name, Text symbol, ActivationSplit split, Count bytes, Role role,
                    Counted counted = Counted::none) {
        return sink_.tensor({name, symbol, split, bytes, role, counted});
    }
    /// The pass and region events are written in from now on.
    void at(Pass pass, std::uint8_t region = 0) { pass_ = pass, region_ = region; }

    void alloc(Text op, TensorId t) { emit(EventKind::alloc, op, t); }
    void save(Text op, TensorId t) { emit(EventKind::save, op, t); }
    void free(Text op, TensorId t) { emit(EventKind::free, op, t); }
    void rebuild(Text op, TensorId t) { emit(EventKind::rebuild, op, t); }
    void run(Text op, TensorId workspace, std::uint32_t source) {
        emit(EventKind::run, op, workspace, source);
    }
    /// A temporary of `op`: allocated, the op runs, freed.
    void work(Text op, TensorId workspace, std::uint32_t source) {
        alloc(op, workspace), run(op, workspace, source), free(op, workspace);
    }

private:
    void emit(EventKind kind, Text op, TensorId t, std::uint32_t source = 0) {
        sink_.event({kind, pass_, region_, op, t, source});
    }

    Sink& sink_;
    Pass pass_ = Pass::forward;
    std::uint8_t region_ = 0;
};

}  // namespace memcalc::tape
