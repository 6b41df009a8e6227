#pragma once
/// PyTorch's CUDA caching allocator as a pure simulator: an ordered sequence of allocations and
/// frees in, the allocated and reserved bytes (now and at their peaks) and the segments out.
///
/// The rules are those of c10/cuda/CUDACachingAllocator.cpp at pytorch/pytorch commit
/// 001074d25084fdb87a799823e395a50f5ec044d3 (DeviceCachingAllocator: malloc, get_free_block,
/// should_split, get_allocation_size, alloc_block, alloc_found_block, free_block,
/// try_merge_blocks, release_available_cached_blocks, release_cached_blocks,
/// garbage_collect_cached_blocks, and for expandable segments find_expandable_block, map_block,
/// try_allocate_expandable_block, unmap_block). What is left out: CUDA graph pools, cross-stream
/// uses (record_stream's deferred frees), roundup_power2_divisions, free-memory callbacks, and
/// real device addresses (segments get increasing addresses, which only break ties between free
/// blocks of equal size).
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "memcalc/error.hpp"

namespace memcalc {

namespace allocator_rules {
// The allocator's constants, as CUDACachingAllocator.cpp names them.
inline constexpr std::uint64_t kMinBlockSize = 512;           // every size rounds up to this
inline constexpr std::uint64_t kSmallSize = 1048576;          // largest small-pool request
inline constexpr std::uint64_t kSmallBuffer = 2097152;        // small-pool segment
inline constexpr std::uint64_t kMinLargeAlloc = 10485760;     // below it, a kLargeBuffer segment
inline constexpr std::uint64_t kLargeBuffer = 20971520;       // shared segment for 1-10 MiB
inline constexpr std::uint64_t kRoundLarge = 2097152;         // larger segments round to this
inline constexpr std::uint64_t kLargestRequest = 1ULL << 56;  // beyond any device

/// round_size without roundup_power2_divisions: a multiple of 512 bytes, at least 512.
inline std::uint64_t round_size(std::uint64_t bytes) {
    if (bytes < kMinBlockSize) return kMinBlockSize;
    return kMinBlockSize * ((bytes + kMinBlockSize - 1) / kMinBlockSize);
}
/// get_pool: requests up to 1 MiB (after rounding) come from the small pool.
inline bool is_small(std::uint64_t rounded) { return rounded <= kSmallSize; }
/// get_allocation_size: the cudaMalloc made when no cached block fits.
inline std::uint64_t allocation_size(std::uint64_t rounded) {
    if (rounded <= kSmallSize) return kSmallBuffer;
    if (rounded < kMinLargeAlloc) return kLargeBuffer;
    return kRoundLarge * ((rounded + kRoundLarge - 1) / kRoundLarge);
}
/// An expandable segment maps pages of 2 MiB in the small pool and 20 MiB in the large one.
inline std::uint64_t page_size(bool small) { return small ? kSmallBuffer : kLargeBuffer; }
}  // namespace allocator_rules

enum class AllocatorMode { caching, expandable };

/// The allocator's settings (PYTORCH_CUDA_ALLOC_CONF) and the memory it may reserve.
struct AllocatorConfig {
    AllocatorMode mode = AllocatorMode::caching;
    /// max_split_size_mb in bytes; the default means no limit.
    std::uint64_t max_split_size = std::numeric_limits<std::uint64_t>::max();
    /// Bytes the allocator can reserve before cudaMalloc fails; the default means no limit.
    std::uint64_t capacity = std::numeric_limits<std::uint64_t>::max();
    /// garbage_collection_threshold; PyTorch applies it only under a memory fraction, which here
    /// is a finite capacity.
    double garbage_collection_threshold = 0.0;
};

enum class AllocatorEventKind { alloc, free };

/// One event of the sequence: `alloc id bytes [stream]` or `free id`.
struct AllocatorEvent {
    AllocatorEventKind kind = AllocatorEventKind::alloc;
    std::uint64_t id = 0;
    std::uint64_t bytes = 0;
    std::uint32_t stream = 0;
};

inline AllocatorEvent alloc_event(std::uint64_t id, std::uint64_t bytes, std::uint32_t stream = 0) {
    return {AllocatorEventKind::alloc, id, bytes, stream};
}
inline AllocatorEvent free_event(std::uint64_t id) { return {AllocatorEventKind::free, id, 0, 0}; }

/// One segment (a cudaMalloc, or an expandable segment's mapped pages) as it stands.
struct AllocatorSegment {
    std::uint64_t bytes = 0;            // reserved: the cudaMalloc's size, or the mapped pages
    std::uint64_t allocated_bytes = 0;  // in blocks handed out
    std::uint64_t largest_free_block = 0;
    std::size_t allocated_blocks = 0;
    std::size_t free_blocks = 0;
    bool small_pool = false;
    bool expandable = false;
    std::uint32_t stream = 0;
};

/// The device-wide counters, as torch.cuda.memory_stats() names them.
struct AllocatorStats {
    std::uint64_t requested_bytes = 0;  // the live requests as asked, before rounding
    std::uint64_t allocated_bytes = 0;  // the live blocks' sizes: rounded, and unsplit remainders
    std::uint64_t peak_allocated_bytes = 0;
    std::uint64_t reserved_bytes = 0;
    std::uint64_t peak_reserved_bytes = 0;
    std::size_t segments = 0;
    std::size_t peak_segments = 0;
    std::size_t device_allocs = 0;  // num_device_alloc: cudaMalloc calls and page mappings
    std::size_t device_frees = 0;   // num_device_free: cudaFree calls and page unmappings
    std::size_t alloc_retries = 0;  // num_alloc_retries: cudaMalloc retried after freeing cache
};

/// What simulate() returns: the counters, where the peaks were, and the segments at the peak.
struct AllocatorResult {
    AllocatorStats stats;
    std::size_t peak_allocated_event = 0;  // index of the event that set each peak
    std::size_t peak_reserved_event = 0;
    std::vector<AllocatorSegment> segments_at_peak_reserved;
    bool out_of_memory = false;  // an allocation failed even after freeing the cache
    std::size_t out_of_memory_event = 0;
    std::uint64_t out_of_memory_bytes = 0;
};

/// The simulator. One event at a time: alloc() and free(); stats() and segments() at any point.
class CachingAllocatorSimulator {
public:
    explicit CachingAllocatorSimulator(AllocatorConfig config = {}) : config_(config) {
        address_space_ = config_.capacity == std::numeric_limits<std::uint64_t>::max()
                             ? (1ULL << 50)
                             : config_.capacity + config_.capacity / 8;
        const std::uint64_t page = allocator_rules::kLargeBuffer;
        address_space_ = (address_space_ + page - 1) / page * page;
    }

    /// Allocates `bytes` for tensor `id` on `stream`; false when the device is out of memory
    /// (PyTorch's OutOfMemoryError), leaving the state as the failed attempt left it.
    bool alloc(std::uint64_t id, std::uint64_t bytes, std::uint32_t stream = 0) {
        if (live_.contains(id)) {
            throw error("allocator: id " + std::to_string(id) + " is allocated twice");
        }
        if (bytes > allocator_rules::kLargestRequest) {
            throw error("allocator: bytes " + std::to_string(bytes) + " of id " +
                        std::to_string(id) + " is beyond any device");
        }
        if (bytes == 0) {  // PyTorch hands out a null pointer and allocates nothing
            live_.add(id, Live{kNone, 0});
            return true;
        }
        const int block = malloc(allocator_rules::round_size(bytes), stream);
        if (block == kNone) return false;
        live_.add(id, Live{block, bytes});
        stats_.requested_bytes += bytes;
        return true;
    }

    /// Frees tensor `id`'s block into the cache (merging it with free neighbours).
    void free(std::uint64_t id) {
        const std::optional<Live> live = live_.take(id);
        if (!live) {
            throw error("allocator: id " + std::to_string(id) + " is freed but not allocated");
        }
        const int block = live->block;
        stats_.requested_bytes -= live->bytes;
        if (block == kNone) return;
        blocks_[block].allocated = false;
        stats_.allocated_bytes -= blocks_[block].size;
        free_block(block);
    }

    /// torch.cuda.empty_cache(): every unsplit cached block back to the device.
    void empty_cache() { release_cached_blocks(); }

    const AllocatorStats& stats() const { return stats_; }
    std::size_t live_allocations() const { return live_.size(); }

    /// The segments as they stand, in address order.
    std::vector<AllocatorSegment> segments() const {
        std::vector<AllocatorSegment> out(segments_.size());
        for (std::size_t s = 0; s < segments_.size(); ++s) {
            out[s].small_pool = segments_[s].small;
            out[s].expandable = segments_[s].expandable;
            out[s].stream = segments_[s].stream;
            out[s].bytes = segments_[s].mapped;
        }
        for (const Block& b : blocks_) {
            if (!b.in_use || !b.mapped) continue;
            AllocatorSegment& seg = out[b.segment];
            if (b.allocated) {
                seg.allocated_bytes += b.size;
                ++seg.allocated_blocks;
            } else {
                seg.largest_free_block = std::max(seg.largest_free_block, b.size);
                ++seg.free_blocks;
            }
        }
        std::vector<AllocatorSegment> live;
        for (std::size_t s = 0; s < segments_.size(); ++s) {
            if (segments_[s].live) live.push_back(out[s]);
        }
        return live;
    }

private:
    static constexpr int kNone = -1;

    struct Block {
        std::uint64_t address = 0;
        std::uint64_t size = 0;
        std::uint64_t gc_base = 0;  // the pool's get_free_block count when it was cached
        int prev = kNone;
        int next = kNone;
        std::size_t segment = 0;
        std::uint32_t stream = 0;
        bool small = false;
        bool allocated = false;
        bool mapped = true;
        bool in_use = true;
    };
    struct Segment {
        std::uint64_t base = 0;
        std::uint64_t mapped = 0;  // reserved bytes of this segment
        std::uint32_t stream = 0;
        bool small = false;
        bool expandable = false;
        bool live = true;
    };
    // Free blocks by (stream, size, address), as BlockComparatorSize orders them.
    using SizeKey = std::tuple<std::uint32_t, std::uint64_t, std::uint64_t, int>;
    // Unmapped ranges of expandable segments by (stream, address): BlockComparatorAddress.
    using AddressKey = std::tuple<std::uint32_t, std::uint64_t, int>;
    struct Pool {
        std::set<SizeKey> blocks;
        std::set<AddressKey> unmapped;
        std::uint64_t get_free_block_calls = 0;
    };

    AllocatorConfig config_;
    std::uint64_t address_space_ = 0;
    std::uint64_t next_address_ = 0;
    std::vector<Block> blocks_;
    std::vector<int> spare_blocks_;
    std::vector<Segment> segments_;
    Pool small_pool_;
    Pool large_pool_;
    struct Live {
        int block = kNone;
        std::uint64_t bytes = 0;
        bool present = false;
    };
    /// The live tensors by id: a vector where ids are small, as a step's writer numbers them from
    /// 1 (no hashing, no node to allocate), a map beyond.
    class LiveTensors {
    public:
        bool contains(std::uint64_t id) const {
            if (id >= dense_ids) return sparse_.count(id) != 0;
            return id < dense_.size() && dense_[id].present;
        }
        void add(std::uint64_t id, Live live) {
            live.present = true;
            ++size_;
            if (id >= dense_ids) {
                sparse_.emplace(id, live);
                return;
            }
            if (id >= dense_.size())  // doubling, never past dense_ids: the map holds those
                dense_.resize(
                    std::min(dense_ids, std::max<std::uint64_t>(id + 1, 2 * dense_.size())));
            dense_[id] = live;
        }
        /// Removes tensor `id`, returning it; none if it is not live.
        std::optional<Live> take(std::uint64_t id) {
            std::optional<Live> out;
            if (id < dense_.size() && dense_[id].present) {
                out = dense_[id];
                dense_[id].present = false;
            } else if (const auto it = sparse_.find(id); it != sparse_.end()) {
                out = it->second;
                sparse_.erase(it);
            }
            if (out) --size_;
            return out;
        }
        std::size_t size() const { return size_; }

    private:
        static constexpr std::uint64_t dense_ids = 1ULL << 20;
        std::vector<Live> dense_;
        std::unordered_map<std::uint64_t, Live> sparse_;
        std::size_t size_ = 0;
    };
    LiveTensors live_;
    AllocatorStats stats_;

    bool expandable() const { return config_.mode == AllocatorMode::expandable; }
    bool gc_active() const {
        return config_.garbage_collection_threshold > 0.0 &&
               config_.capacity != std::numeric_limits<std::uint64_t>::max();
    }
    Pool& pool_of(const Block& b) { return b.small ? small_pool_ : large_pool_; }
    static SizeKey size_key(const Block& b, int index) {
        return {b.stream, b.size, b.address, index};
    }

    int new_block(const Block& value) {
        if (spare_blocks_.empty()) {
            blocks_.push_back(value);
            return static_cast<int>(blocks_.size() - 1);
        }
        const int index = spare_blocks_.back();
        spare_blocks_.pop_back();
        blocks_[index] = value;
        return index;
    }
    void delete_block(int index) {
        blocks_[index].in_use = false;
        spare_blocks_.push_back(index);
    }
    /// insert_into_blocks: caches a free block and stamps its age for garbage collection.
    void insert_free(int index) {
        Block& b = blocks_[index];
        b.gc_base = pool_of(b).get_free_block_calls;
        pool_of(b).blocks.insert(size_key(b, index));
    }
    void erase_free(int index) {
        pool_of(blocks_[index]).blocks.erase(size_key(blocks_[index], index));
    }

    void add_reserved(std::uint64_t bytes) {
        stats_.reserved_bytes += bytes;
        stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    }
    void count_segment(int delta) {
        stats_.segments = static_cast<std::size_t>(static_cast<long long>(stats_.segments) + delta);
        stats_.peak_segments = std::max(stats_.peak_segments, stats_.segments);
    }
    bool fits_device(std::uint64_t bytes) const {
        return stats_.reserved_bytes <= config_.capacity &&
               bytes <= config_.capacity - stats_.reserved_bytes;
    }

    /// DeviceCachingAllocator::malloc: the cache, then cudaMalloc, then free cache and retry.
    int malloc(std::uint64_t size, std::uint32_t stream) {
        const bool small = allocator_rules::is_small(size);
        int block = get_free_block(size, stream, small);
        if (block == kNone) {
            if (gc_active()) garbage_collect_cached_blocks();
            block = alloc_block(size, stream, small);
            if (block == kNone && release_available_cached_blocks(size, stream, small)) {
                block = alloc_block(size, stream, small);
            }
            if (block == kNone) {
                release_cached_blocks();
                ++stats_.alloc_retries;
                block = alloc_block(size, stream, small);
            }
            if (block == kNone) return kNone;
        }
        return alloc_found_block(block, size);
    }

    /// get_free_block: the smallest cached block of the pool and stream that holds `size`.
    int get_free_block(std::uint64_t size, std::uint32_t stream, bool small) {
        Pool& pool = small ? small_pool_ : large_pool_;
        if (gc_active()) ++pool.get_free_block_calls;
        auto it = pool.blocks.lower_bound(SizeKey{stream, size, 0, kNone});
        if (it == pool.blocks.end() || std::get<0>(*it) != stream) return kNone;
        if (expandable()) {
            // The block before the unmapped tail can grow: best fit counts what it can grow to.
            auto next = std::next(it);
            while (next != pool.blocks.end() && std::get<0>(*next) == stream &&
                   expandable_size(std::get<3>(*next)) < expandable_size(std::get<3>(*it))) {
                it = next++;
            }
        }
        const std::uint64_t found = std::get<1>(*it);
        const std::uint64_t max_split = config_.max_split_size;
        if (size < max_split && found >= max_split) return kNone;  // no oversize block for it
        if (size >= max_split && found >= size + allocator_rules::kLargeBuffer) return kNone;
        const int index = std::get<3>(*it);
        pool.blocks.erase(it);
        return index;
    }
    std::uint64_t expandable_size(int index) const {
        const Block& b = blocks_[index];
        const bool grows = b.next != kNone && !blocks_[b.next].mapped;
        return b.size + (grows ? blocks_[b.next].size : 0);
    }

    /// should_split: keep the remainder as a free block?
    bool should_split(const Block& block, std::uint64_t size) const {
        const std::uint64_t remaining = block.size - size;
        if (block.small || expandable()) return remaining >= allocator_rules::kMinBlockSize;
        return size < config_.max_split_size && remaining > allocator_rules::kSmallSize;
    }

    /// alloc_found_block: split off the remainder when should_split says so; hand it out.
    int alloc_found_block(int index, std::uint64_t size) {
        if (should_split(blocks_[index], size)) {
            Block front = blocks_[index];
            front.size = size;
            front.next = index;
            const int block = new_block(front);
            Block& rest = blocks_[index];
            if (rest.prev != kNone) blocks_[rest.prev].next = block;
            rest.prev = block;
            rest.address += size;
            rest.size -= size;
            insert_free(index);
            index = block;
        }
        blocks_[index].allocated = true;
        stats_.allocated_bytes += blocks_[index].size;
        stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
        return index;
    }

    /// alloc_block: a new segment (cudaMalloc), or more pages of an expandable segment.
    int alloc_block(std::uint64_t size, std::uint32_t stream, bool small) {
        if (expandable()) return try_allocate_expandable_block(size, stream, small);
        const std::uint64_t bytes = allocator_rules::allocation_size(size);
        if (!fits_device(bytes)) return kNone;
        add_reserved(bytes);
        ++stats_.device_allocs;
        return new_segment(bytes, stream, small, false);
    }

    /// A segment of `bytes` of address space, one block over all of it: mapped (cudaMalloc's), or
    /// an expandable segment's unmapped range.
    int new_segment(std::uint64_t bytes, std::uint32_t stream, bool small, bool expandable) {
        Segment segment;
        segment.base = next_address_;
        segment.mapped = expandable ? 0 : bytes;
        segment.stream = stream;
        segment.small = small;
        segment.expandable = expandable;
        next_address_ += bytes;
        segments_.push_back(segment);
        count_segment(+1);
        Block block;
        block.address = segment.base;
        block.size = bytes;
        block.segment = segments_.size() - 1;
        block.stream = stream;
        block.small = small;
        block.mapped = !expandable;
        return new_block(block);
    }

    /// free_block: merge with free neighbours of the same segment, then cache.
    void free_block(int index) {
        try_merge_blocks(index, blocks_[index].prev);
        try_merge_blocks(index, blocks_[index].next);
        insert_free(index);
    }

    /// try_merge_blocks: `dst` (out of the pool) absorbs its neighbour `src` if `src` is free and
    /// mapped as `dst` is.
    void try_merge_blocks(int dst, int src) {
        if (src == kNone) return;
        Block& s = blocks_[src];
        Block& d = blocks_[dst];
        if (s.allocated || s.mapped != d.mapped) return;
        if (s.mapped) {
            erase_free(src);
        } else {
            pool_of(s).unmapped.erase(AddressKey{s.stream, s.address, src});
        }
        if (d.prev == src) {
            d.address = s.address;
            d.prev = s.prev;
            if (d.prev != kNone) blocks_[d.prev].next = dst;
        } else {
            d.next = s.next;
            if (d.next != kNone) blocks_[d.next].prev = dst;
        }
        d.size += s.size;
        delete_block(src);
    }

    /// release_block: cudaFree of an unsplit cached block's whole segment.
    void release_block(int index) {
        Block& b = blocks_[index];
        erase_free(index);
        segments_[b.segment].live = false;
        stats_.reserved_bytes -= b.size;
        count_segment(-1);
        ++stats_.device_frees;
        delete_block(index);
    }

    /// release_available_cached_blocks: under max_split_size, free oversize cached blocks, the
    /// smallest that covers the request or else the largest ones until their sum does.
    bool release_available_cached_blocks(std::uint64_t size, std::uint32_t stream, bool small) {
        const std::uint64_t max_split = config_.max_split_size;
        if (max_split == std::numeric_limits<std::uint64_t>::max() || expandable()) return false;
        Pool& pool = small ? small_pool_ : large_pool_;
        const std::uint64_t key = std::max(size, max_split);
        auto it = pool.blocks.lower_bound(SizeKey{stream, key, 0, kNone});
        if (it != pool.blocks.end() && std::get<0>(*it) == stream) {
            if (!unsplit(std::get<3>(*it))) return false;  // PyTorch assumes it never is
            release_block(std::get<3>(*it));
            return true;
        }
        std::vector<int> oversize;
        std::uint64_t released = 0;
        while (it != pool.blocks.begin() && released < key) {
            --it;
            if (std::get<0>(*it) != stream || std::get<1>(*it) < max_split) break;
            if (!unsplit(std::get<3>(*it))) continue;
            oversize.push_back(std::get<3>(*it));
            released += std::get<1>(*it);
        }
        for (int index : oversize) release_block(index);
        return released >= key;
    }
    bool unsplit(int index) const {
        return blocks_[index].prev == kNone && blocks_[index].next == kNone;
    }

    /// release_cached_blocks: every unsplit cached block freed, every whole free page unmapped.
    void release_cached_blocks() {
        for (Pool* pool : {&large_pool_, &small_pool_}) {
            std::vector<int> cached;
            for (const SizeKey& key : pool->blocks) cached.push_back(std::get<3>(key));
            for (int index : cached) {
                if (segments_[blocks_[index].segment].expandable) {
                    unmap_block(index);
                } else if (unsplit(index)) {
                    release_block(index);
                }
            }
        }
    }

    /// garbage_collect_cached_blocks: above threshold x capacity, free unsplit large cached
    /// blocks whose age (get_free_block calls since cached) is at least the average age.
    void garbage_collect_cached_blocks() {
        const auto threshold = static_cast<std::uint64_t>(config_.garbage_collection_threshold *
                                                          static_cast<double>(config_.capacity));
        if (stats_.reserved_bytes <= threshold) return;
        const std::uint64_t target = stats_.reserved_bytes - threshold;
        std::uint64_t reclaimed = 0;
        bool freed = true;
        while (reclaimed < target && freed) {
            std::vector<int> freeable;
            double total_age = 0.0;
            for (const SizeKey& key : large_pool_.blocks) {
                const int index = std::get<3>(key);
                if (!unsplit(index) || segments_[blocks_[index].segment].expandable) continue;
                freeable.push_back(index);
                total_age += static_cast<double>(age(index));
            }
            if (freeable.empty()) return;
            const double average = total_age / static_cast<double>(freeable.size());
            freed = false;
            for (int index : freeable) {
                if (static_cast<double>(age(index)) < average) continue;
                reclaimed += blocks_[index].size;
                release_block(index);
                freed = true;
            }
        }
    }
    std::uint64_t age(int index) const {
        const Block& b = blocks_[index];
        const Pool& pool = b.small ? small_pool_ : large_pool_;
        return pool.get_free_block_calls - b.gc_base;
    }

    // Expandable segments (Note [Expandable Segments]).

    /// try_allocate_expandable_block: map pages at the lowest address with room for `size`.
    int try_allocate_expandable_block(std::uint64_t size, std::uint32_t stream, bool small) {
        int candidate = find_expandable_block(size, stream, small);
        if (!blocks_[candidate].mapped &&
            !map_block(candidate, std::min(blocks_[candidate].size, size))) {
            return kNone;
        }
        while (blocks_[candidate].size < size) {
            const int next = blocks_[candidate].next;
            const std::uint64_t remaining = size - blocks_[candidate].size;
            if (!map_block(next, std::min(remaining, blocks_[next].size))) return kNone;
            candidate = next;  // it absorbed the free block before it
        }
        erase_free(candidate);
        return candidate;
    }

    /// find_expandable_block: the lowest unmapped range of the stream's segment (with the free
    /// block before it) that has room; else a new segment's whole address space.
    int find_expandable_block(std::uint64_t size, std::uint32_t stream, bool small) {
        Pool& pool = small ? small_pool_ : large_pool_;
        for (auto it = pool.unmapped.lower_bound(AddressKey{stream, 0, kNone});
             it != pool.unmapped.end() && std::get<0>(*it) == stream; ++it) {
            int c = std::get<2>(*it);
            const int prev = blocks_[c].prev;
            if (prev != kNone && !blocks_[prev].allocated) c = prev;
            std::uint64_t room = 0;
            for (int b = c; room < size && b != kNone && !blocks_[b].allocated;
                 b = blocks_[b].next) {
                room += blocks_[b].size;
            }
            if (room >= size) return c;
        }
        const int index = new_segment(address_space_, stream, small, true);
        pool.unmapped.insert(AddressKey{stream, blocks_[index].address, index});
        return index;
    }

    /// map_block: map whole pages from the start of an unmapped range to cover `size`; the
    /// rest stays unmapped; the mapped part merges with free neighbours and is cached.
    bool map_block(int index, std::uint64_t size) {
        const std::uint64_t page = allocator_rules::page_size(blocks_[index].small);
        const std::uint64_t bytes = (size + page - 1) / page * page;
        if (!fits_device(bytes)) return false;
        Block& b = blocks_[index];
        pool_of(b).unmapped.erase(AddressKey{b.stream, b.address, index});
        b.mapped = true;
        if (bytes < b.size) {
            Block rest = b;
            rest.address += bytes;
            rest.size -= bytes;
            rest.mapped = false;
            rest.prev = index;
            const int r = new_block(rest);
            Block& mapped = blocks_[index];
            if (mapped.next != kNone) blocks_[mapped.next].prev = r;
            mapped.next = r;
            mapped.size = bytes;
            pool_of(mapped).unmapped.insert(AddressKey{rest.stream, rest.address, r});
        }
        try_merge_blocks(index, blocks_[index].prev);
        try_merge_blocks(index, blocks_[index].next);
        insert_free(index);
        segments_[blocks_[index].segment].mapped += bytes;
        add_reserved(bytes);
        ++stats_.device_allocs;
        return true;
    }

    /// unmap_block: unmap the whole pages inside a free block; the ends stay mapped and free. A
    /// segment left with nothing mapped is released.
    void unmap_block(int index) {
        const Block b = blocks_[index];
        const Segment& segment = segments_[b.segment];
        const std::uint64_t page = allocator_rules::page_size(b.small);
        const std::uint64_t begin = (b.address - segment.base + page - 1) / page * page;
        const std::uint64_t end = (b.address + b.size - segment.base) / page * page;
        if (begin >= end) return;
        erase_free(index);
        const std::uint64_t before = segment.base + begin - b.address;
        const std::uint64_t after = b.address + b.size - (segment.base + end);
        if (before > 0) splice_free(index, b.address, before, true);
        if (after > 0) splice_free(index, segment.base + end, after, false);
        Block& u = blocks_[index];
        u.address = segment.base + begin;
        u.size = end - begin;
        u.mapped = false;
        try_merge_blocks(index, u.prev);
        try_merge_blocks(index, blocks_[index].next);
        const Block& merged = blocks_[index];
        pool_of(merged).unmapped.insert(AddressKey{merged.stream, merged.address, index});
        segments_[merged.segment].mapped -= end - begin;
        stats_.reserved_bytes -= end - begin;
        ++stats_.device_frees;
        if (merged.prev == kNone && merged.next == kNone) release_expandable_segment(index);
    }
    /// A free mapped block of `size` at `address` just before (or after) block `index`.
    void splice_free(int index, std::uint64_t address, std::uint64_t size, bool before) {
        Block piece = blocks_[index];
        piece.address = address;
        piece.size = size;
        piece.prev = before ? blocks_[index].prev : index;
        piece.next = before ? index : blocks_[index].next;
        const int p = new_block(piece);
        if (before) {
            if (piece.prev != kNone) blocks_[piece.prev].next = p;
            blocks_[index].prev = p;
        } else {
            if (piece.next != kNone) blocks_[piece.next].prev = p;
            blocks_[index].next = p;
        }
        insert_free(p);
    }
    void release_expandable_segment(int index) {
        const Block& b = blocks_[index];
        pool_of(b).unmapped.erase(AddressKey{b.stream, b.address, index});
        segments_[b.segment].live = false;
        count_segment(-1);
        delete_block(index);
    }
};

/// Runs the whole sequence; stops at an allocation that fails even after freeing the cache.
inline AllocatorResult simulate_allocator(const std::vector<AllocatorEvent>& events,
                                          const AllocatorConfig& config = {}) {
    AllocatorResult result;
    CachingAllocatorSimulator sim(config);
    std::uint64_t peak_allocated = 0;
    std::uint64_t peak_reserved = 0;
    for (std::size_t i = 0; i < events.size(); ++i) {
        const AllocatorEvent& e = events[i];
        if (e.kind == AllocatorEventKind::free) {
            sim.free(e.id);
        } else if (!sim.alloc(e.id, e.bytes, e.stream)) {
            result.out_of_memory = true;
            result.out_of_memory_event = i;
            result.out_of_memory_bytes = e.bytes;
            break;
        }
        if (sim.stats().peak_allocated_bytes > peak_allocated) result.peak_allocated_event = i;
        if (sim.stats().peak_reserved_bytes > peak_reserved) result.peak_reserved_event = i;
        peak_allocated = sim.stats().peak_allocated_bytes;
        peak_reserved = sim.stats().peak_reserved_bytes;
    }
    result.stats = sim.stats();
    if (peak_reserved == 0) return result;
    // Replay up to the event that set the reserved peak, to list the segments then.
    CachingAllocatorSimulator replay(config);
    for (std::size_t i = 0; i <= result.peak_reserved_event; ++i) {
        const AllocatorEvent& e = events[i];
        if (e.kind == AllocatorEventKind::free) {
            replay.free(e.id);
        } else {
            replay.alloc(e.id, e.bytes, e.stream);
        }
    }
    result.segments_at_peak_reserved = replay.segments();
    return result;
}

}  // namespace memcalc
