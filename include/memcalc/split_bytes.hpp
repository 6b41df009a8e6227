#pragma once
/// Bytes of activations summed by how they divide across ranks, so that one sum serves every
/// parallel layout: a rank's share is a few divisions (plan's hot path).
#include "memcalc/activations.hpp"
#include "memcalc/error.hpp"
#include "memcalc/parallel.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

/// Bytes of saved tensors by how they divide across tensor-parallel ranks.
struct SplitBytes {
    Count tensor, sequence, replicated, vocab, expert_tensor;

    template <class Tensor>  // a SavedTensor or a Workspace
    void add(const Tensor& r) {
        add(r.split, r.bytes);
    }
    friend bool operator==(const SplitBytes& a, const SplitBytes& b) {
        return a.tensor == b.tensor && a.sequence == b.sequence && a.replicated == b.replicated &&
               a.vocab == b.vocab && a.expert_tensor == b.expert_tensor;
    }
    friend bool operator!=(const SplitBytes& a, const SplitBytes& b) { return !(a == b); }
    /// Every split's bytes together (a table already on one rank).
    Count total() const { return tensor + sequence + replicated + vocab + expert_tensor; }
    bool any() const {
        return (tensor + sequence + replicated + vocab + expert_tensor).value() > 0;
    }
    void add(ActivationSplit split, Count bytes) {
        switch (split) {
            case ActivationSplit::tensor: tensor += bytes; break;
            case ActivationSplit::expert_tensor: expert_tensor += bytes; break;
            case ActivationSplit::sequence: sequence += bytes; break;
            case ActivationSplit::replicated: replicated += bytes; break;
            case ActivationSplit::vocab: vocab += bytes; break;
        }
    }
    /// Takes off bytes added before (a tensor freed): never below zero.
    void remove(ActivationSplit split, Count bytes) {
        Count& from = split == ActivationSplit::tensor          ? tensor
                      : split == ActivationSplit::expert_tensor ? expert_tensor
                      : split == ActivationSplit::sequence      ? sequence
                      : split == ActivationSplit::replicated    ? replicated
                                                                : vocab;
        if (bytes > from) throw error("internal: more bytes freed than were live");
        from = Count(from.value() - bytes.value());
    }
    /// These bytes less `part` of them, split by split.
    SplitBytes minus(const SplitBytes& part) const {
        SplitBytes out = *this;
        out.remove(ActivationSplit::tensor, part.tensor);
        out.remove(ActivationSplit::expert_tensor, part.expert_tensor);
        out.remove(ActivationSplit::sequence, part.sequence);
        out.remove(ActivationSplit::replicated, part.replicated);
        out.remove(ActivationSplit::vocab, part.vocab);
        return out;
    }
    SplitBytes& operator+=(const SplitBytes& o) {
        tensor += o.tensor, sequence += o.sequence, replicated += o.replicated;
        vocab += o.vocab, expert_tensor += o.expert_tensor;
        return *this;
    }
    /// One rank's share, by the rule each row follows (rank_share; exact for valid layouts).
    Count on_rank(const Parallelism& p, std::uint64_t V) const {
        return rank_share(tensor, ActivationSplit::tensor, p, V) +
               rank_share(sequence, ActivationSplit::sequence, p, V) +
               rank_share(replicated, ActivationSplit::replicated, p, V) +
               rank_share(vocab, ActivationSplit::vocab, p, V) +
               rank_share(expert_tensor, ActivationSplit::expert_tensor, p, V);
    }
};

}  // namespace memcalc
