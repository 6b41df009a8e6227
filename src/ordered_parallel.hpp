#pragma once
// Work made on worker threads and taken in order on the calling thread, as a loop would take it.
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "memcalc/error.hpp"

namespace memcalc::cli {

/// Worker threads for work that splits: MEMCALC_THREADS where set (1 to 256), else the machine's
/// cores, at most 8; one in the browser's build, which has no threads. Throws memcalc::error naming
/// a value that is no such count.
inline unsigned worker_threads() {
#if defined(__EMSCRIPTEN__)
    return 1;
#else
    if (const char* given = std::getenv("MEMCALC_THREADS")) {
        const std::string text = given;
        const bool digits = !text.empty() && text.size() <= 3 &&
                            text.find_first_not_of("0123456789") == std::string::npos;
        const unsigned long n = digits ? std::stoul(text) : 0;
        if (n < 1 || n > 256)
            throw error("MEMCALC_THREADS must be a count of threads from 1 to 256 (got '" + text +
                        "')");
        return unsigned(n);
    }
    const unsigned cores = std::thread::hardware_concurrency();
    return cores == 0 ? 1 : cores < 8 ? cores : 8;
#endif
}

namespace ordered_work {
/// What ordered_parallel's workers hand its taker: up to `window` results, by index modulo the
/// window, each claimed in order and taken in order.
template <class Result>
class OrderedSlots {
public:
    struct Slot {
        std::optional<Result> result;
        std::exception_ptr error;
        bool ready = false;
    };
    OrderedSlots(std::size_t count, std::size_t window) : count_(count), slots_(window) {}

    /// The next index to make, once the taker has room for it; none when all are claimed or the
    /// work is stopped.
    std::optional<std::size_t> claim() {
        std::unique_lock<std::mutex> hold(lock_);
        changed_.wait(
            hold, [&] { return stopped_ || next_ >= count_ || next_ < taken_ + slots_.size(); });
        if (stopped_ || next_ >= count_) return std::nullopt;
        return next_++;
    }
    void put(std::size_t i, Slot made) {
        {
            const std::lock_guard<std::mutex> hold(lock_);
            made.ready = true;
            slots_[i % slots_.size()] = std::move(made);
        }
        changed_.notify_all();
    }
    /// Index i's slot, once it is made.
    Slot take(std::size_t i) {
        Slot slot;
        {
            std::unique_lock<std::mutex> hold(lock_);
            Slot& at = slots_[i % slots_.size()];
            changed_.wait(hold, [&] { return at.ready; });
            slot = std::move(at);
            at = Slot{};
            ++taken_;
        }
        changed_.notify_all();
        return slot;
    }
    void stop() {
        {
            const std::lock_guard<std::mutex> hold(lock_);
            stopped_ = true;
        }
        changed_.notify_all();
    }

private:
    std::size_t count_, next_ = 0, taken_ = 0;
    bool stopped_ = false;
    std::vector<Slot> slots_;
    std::mutex lock_;
    std::condition_variable changed_;
};

/// Threads that are stopped and joined however their owner's scope ends.
template <class Slots>
struct JoinedThreads {
    Slots& slots;
    std::vector<std::thread> threads;
    ~JoinedThreads() {
        slots.stop();
        for (std::thread& t : threads) t.join();
    }
};
}  // namespace ordered_work

/// Makes `make(i, worker)` for every i below `count` on up to `threads` threads (`worker`: the
/// thread's index, for state of its own) and hands each result to `take(i, result)` on the calling
/// thread in order of i, at most two a thread waiting, so memory stays flat in `count`. The first
/// exception in order of i is rethrown where its result would have been taken, the work after it
/// abandoned: what a loop of make and take would have done. One thread: that loop.
template <class Result, class Make, class Take>
void ordered_parallel(std::size_t count, unsigned threads, Make make, Take take) {
    const auto in_turn = [&] {
        for (std::size_t i = 0; i < count; ++i) take(i, make(i, 0u));
    };
    if (threads > count) threads = static_cast<unsigned>(count);
    if (threads <= 1) return in_turn();
    using Slots = ordered_work::OrderedSlots<Result>;
    Slots slots(count, 2 * std::size_t(threads));
    const auto work = [&](unsigned worker) {
        while (const std::optional<std::size_t> i = slots.claim()) {
            typename Slots::Slot made;
            try {
                made.result.emplace(make(*i, worker));
            } catch (...) {
                made.error = std::current_exception();
            }
            slots.put(*i, std::move(made));
        }
    };
    ordered_work::JoinedThreads<Slots> pool{slots, {}};
    try {
        for (unsigned w = 0; w < threads; ++w) pool.threads.emplace_back(work, w);
    } catch (const std::system_error&) {  // no more threads: those made do the work
        if (pool.threads.empty()) return in_turn();
    }
    for (std::size_t i = 0; i < count; ++i) {
        typename Slots::Slot slot = slots.take(i);
        if (slot.error) std::rethrow_exception(slot.error);
        take(i, std::move(*slot.result));
    }
}

}  // namespace memcalc::cli
