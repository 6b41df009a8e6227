#pragma once
/// A layer's tape as rows a report shows (`--ops`): each event with its op, its tensor's bytes and
/// the layer's live bytes after it, on one rank of a parallel layout.
#include <cstdint>
#include <vector>

#include "memcalc/parallel.hpp"
#include "memcalc/split_bytes.hpp"
#include "memcalc/tape/liveness.hpp"
#include "memcalc/tape/tape.hpp"

namespace memcalc::tape {

struct OpRow {
    Pass pass;
    Text op;
    EventKind event;
    Text tensor;
    Count bytes;  ///< the tensor's, on the rank
    Count live;   ///< the layer's tensors live after the event, on the rank
};

/// `tape`'s events on one rank of `p` (`vocab`: the model's, for vocabulary-parallel tensors).
inline std::vector<OpRow> op_rows(const Tape& tape, const Parallelism& p, std::uint64_t vocab) {
    const std::vector<SplitBytes> live = live_after_each(tape);
    std::vector<OpRow> out;
    out.reserve(tape.events.size());
    for (std::size_t i = 0; i < tape.events.size(); ++i) {
        const Event& e = tape.events[i];
        const Tensor& t = tape.tensors[e.tensor];
        out.push_back({e.pass, e.op, e.kind, t.name, rank_share(t.bytes, t.split, p, vocab),
                       live[i].on_rank(p, vocab)});
    }
    return out;
}

}  // namespace memcalc::tape
