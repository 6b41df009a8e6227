#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <vector>

#include "memcalc/allocator.hpp"

// Each expected figure follows from CUDACachingAllocator.cpp's rules by hand (see allocator.hpp):
// the segment a request gets, whether the remainder is split off, which cached block is reused.

namespace allocator_tests {

using memcalc::alloc_event;
using memcalc::AllocatorConfig;
using memcalc::AllocatorMode;
using memcalc::CachingAllocatorSimulator;
using memcalc::free_event;
namespace rules = memcalc::allocator_rules;

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * 1024;

AllocatorConfig expandable_config() {
    AllocatorConfig config;
    config.mode = AllocatorMode::expandable;
    return config;
}

/// Sums of the segments' figures must be the device-wide ones.
void check_segments_add_up(const CachingAllocatorSimulator& sim) {
    std::uint64_t reserved = 0;
    std::uint64_t allocated = 0;
    for (const auto& segment : sim.segments()) {
        reserved += segment.bytes;
        allocated += segment.allocated_bytes;
    }
    CHECK(reserved == sim.stats().reserved_bytes);
    CHECK(allocated == sim.stats().allocated_bytes);
}

}  // namespace allocator_tests

using namespace allocator_tests;

TEST_CASE("Allocator: sizes round to 512 B and pools pick their segment size", "[allocator]") {
    // clang-format off
    auto row = GENERATE(table<std::uint64_t, std::uint64_t, std::uint64_t>({
        // request     block (rounded)  segment (cudaMalloc)
        {1,            512,             2 * MiB},   // small pool: kSmallBuffer
        {1 * KiB,      1 * KiB,         2 * MiB},
        {1000,         1 * KiB,         2 * MiB},
        {1 * MiB,      1 * MiB,         2 * MiB},   // 1 MiB is still small
        {1 * MiB + 1,  1 * MiB + 512,   20 * MiB},  // large pool under 10 MiB: kLargeBuffer
        {3 * MiB,      3 * MiB,         20 * MiB},
        {10 * MiB,     10 * MiB,        10 * MiB},  // from 10 MiB: rounded up to 2 MiB
        {11 * MiB,     11 * MiB,        12 * MiB},
        {19 * MiB + 1, 19 * MiB + 512,  20 * MiB},
    }));
    // clang-format on
    const auto [request, block, segment] = row;
    CAPTURE(request);
    CHECK(rules::round_size(request) == block);
    CHECK(rules::allocation_size(rules::round_size(request)) == segment);
    CachingAllocatorSimulator sim;
    REQUIRE(sim.alloc(1, request));
    CHECK(sim.stats().reserved_bytes == segment);
    CHECK(sim.stats().segments == 1);
    CHECK(sim.stats().requested_bytes == request);
    CHECK(sim.stats().allocated_bytes >= block);
    check_segments_add_up(sim);
}

TEST_CASE("Allocator: a split remainder serves the next request of the pool", "[allocator]") {
    CachingAllocatorSimulator sim;
    REQUIRE(sim.alloc(1, 3 * MiB));  // a 20 MiB segment: 3 MiB handed out, 17 MiB cached
    REQUIRE(sim.alloc(2, 3 * MiB));  // from the 17 MiB remainder
    CHECK(sim.stats().segments == 1);
    CHECK(sim.stats().reserved_bytes == 20 * MiB);
    CHECK(sim.stats().allocated_bytes == 6 * MiB);
    REQUIRE(sim.alloc(3, 100 * KiB));  // small requests never use the large pool
    CHECK(sim.stats().segments == 2);
    CHECK(sim.stats().reserved_bytes == 22 * MiB);
    REQUIRE(sim.alloc(4, 3 * MiB, 1));  // nor another stream's blocks
    CHECK(sim.stats().segments == 3);
    CHECK(sim.stats().reserved_bytes == 42 * MiB);
    check_segments_add_up(sim);
}

TEST_CASE("Allocator: a freed block is reused by a smaller request", "[allocator]") {
    CachingAllocatorSimulator sim;
    REQUIRE(sim.alloc(1, 11 * MiB));  // 12 MiB segment, 1 MiB remainder not split (> 1 MiB rule)
    CHECK(sim.stats().allocated_bytes == 12 * MiB);
    sim.free(1);
    CHECK(sim.stats().allocated_bytes == 0);
    CHECK(sim.stats().reserved_bytes == 12 * MiB);  // cached, not returned
    REQUIRE(sim.alloc(2, 9 * MiB));                 // best fit: the 12 MiB block, 3 MiB split off
    CHECK(sim.stats().segments == 1);
    CHECK(sim.stats().reserved_bytes == 12 * MiB);
    CHECK(sim.stats().allocated_bytes == 9 * MiB);
    CHECK(sim.stats().device_allocs == 1);
}

TEST_CASE("Allocator: best fit takes the smallest cached block that holds the request",
          "[allocator]") {
    CachingAllocatorSimulator sim;
    REQUIRE(sim.alloc(1, 16 * MiB));
    REQUIRE(sim.alloc(2, 12 * MiB));
    sim.free(1);
    sim.free(2);
    REQUIRE(sim.alloc(3, 11 * MiB));  // the 12 MiB block, not the 16 MiB one
    const auto segments = sim.segments();
    REQUIRE(segments.size() == 2);
    CHECK(segments[0].allocated_bytes == 0);
    CHECK(segments[1].allocated_bytes == 12 * MiB);
}

TEST_CASE("Allocator: free neighbours merge within a segment, not across", "[allocator]") {
    // A 20 MiB segment split into A (2 MiB), B (4 MiB) and 14 MiB free.
    CachingAllocatorSimulator sim;
    REQUIRE(sim.alloc(1, 2 * MiB));
    REQUIRE(sim.alloc(2, 4 * MiB));
    SECTION("a live block between free pieces: 16 MiB free, but no 15 MiB block") {
        sim.free(1);
        REQUIRE(sim.alloc(3, 15 * MiB));  // a new 16 MiB segment
        CHECK(sim.stats().segments == 2);
        CHECK(sim.stats().reserved_bytes == 36 * MiB);
        CHECK(sim.segments()[0].largest_free_block == 14 * MiB);
    }
    SECTION("all freed: the pieces merge back into 20 MiB, which serves 15 MiB") {
        sim.free(1);
        sim.free(2);
        CHECK(sim.segments()[0].largest_free_block == 20 * MiB);
        REQUIRE(sim.alloc(3, 15 * MiB));
        CHECK(sim.stats().segments == 1);
        CHECK(sim.stats().reserved_bytes == 20 * MiB);
    }
    SECTION("two free segments of 12 MiB do not make one of 24") {
        CachingAllocatorSimulator two;
        REQUIRE(two.alloc(1, 12 * MiB));
        REQUIRE(two.alloc(2, 12 * MiB));
        two.free(1);
        two.free(2);
        REQUIRE(two.alloc(3, 13 * MiB));
        CHECK(two.stats().segments == 3);
        CHECK(two.stats().reserved_bytes == 38 * MiB);
    }
}

TEST_CASE("Allocator: max_split_size keeps large blocks whole", "[allocator]") {
    AllocatorConfig config;
    config.max_split_size = 8 * MiB;
    SECTION("a request under it gets no oversize cached block") {
        CachingAllocatorSimulator sim(config);
        REQUIRE(sim.alloc(1, 12 * MiB));
        sim.free(1);
        REQUIRE(sim.alloc(2, 4 * MiB));  // the cached 12 MiB block is oversize: new 20 MiB
        CHECK(sim.stats().segments == 2);
        CHECK(sim.stats().reserved_bytes == 32 * MiB);
        CachingAllocatorSimulator unlimited;
        REQUIRE(unlimited.alloc(1, 12 * MiB));
        unlimited.free(1);
        REQUIRE(unlimited.alloc(2, 4 * MiB));
        CHECK(unlimited.stats().reserved_bytes == 12 * MiB);
    }
    SECTION("a request over it takes a cached block less than 20 MiB larger, unsplit") {
        CachingAllocatorSimulator sim(config);
        REQUIRE(sim.alloc(1, 12 * MiB));
        sim.free(1);
        REQUIRE(sim.alloc(2, 9 * MiB));
        CHECK(sim.stats().segments == 1);
        CHECK(sim.stats().allocated_bytes == 12 * MiB);  // not split: 9 MiB >= max_split_size
    }
    SECTION("a 20 MiB segment for 9 MiB is handed out whole") {
        CachingAllocatorSimulator sim(config);
        REQUIRE(sim.alloc(1, 9 * MiB));
        CHECK(sim.stats().allocated_bytes == 20 * MiB);
        REQUIRE(sim.alloc(2, 2 * MiB));  // nothing left to share
        CHECK(sim.stats().segments == 2);
    }
}

TEST_CASE("Allocator: a cudaMalloc over capacity frees the cache and retries", "[allocator]") {
    AllocatorConfig config;
    config.capacity = 40 * MiB;
    CachingAllocatorSimulator sim(config);
    REQUIRE(sim.alloc(1, 12 * MiB));
    REQUIRE(sim.alloc(2, 12 * MiB));
    sim.free(1);
    sim.free(2);
    CHECK(sim.stats().reserved_bytes == 24 * MiB);
    REQUIRE(sim.alloc(3, 30 * MiB));  // 24 + 30 > 40: both cached segments released first
    CHECK(sim.stats().alloc_retries == 1);
    CHECK(sim.stats().device_frees == 2);
    CHECK(sim.stats().segments == 1);
    CHECK(sim.stats().reserved_bytes == 30 * MiB);
    CHECK(sim.stats().peak_reserved_bytes == 30 * MiB);
    CHECK_FALSE(sim.alloc(4, 12 * MiB));  // 30 live + 12 > 40, nothing cached: out of memory
    const auto result = memcalc::simulate_allocator(
        {alloc_event(1, 30 * MiB), alloc_event(2, 12 * MiB), free_event(1)}, config);
    CHECK(result.out_of_memory);
    CHECK(result.out_of_memory_event == 1);
    CHECK(result.out_of_memory_bytes == 12 * MiB);
}

TEST_CASE("Allocator: max_split_size frees only enough oversize blocks", "[allocator]") {
    AllocatorConfig config;
    config.capacity = 80 * MiB;
    config.max_split_size = 8 * MiB;
    CachingAllocatorSimulator sim(config);
    REQUIRE(sim.alloc(1, 12 * MiB));
    REQUIRE(sim.alloc(2, 50 * MiB));
    REQUIRE(sim.alloc(3, 100 * KiB));  // small pool: 2 MiB
    sim.free(1);
    sim.free(2);
    sim.free(3);
    // 24 MiB: the 50 MiB block is 20 MiB too large to reuse, and 64 + 24 > 80. The smallest
    // oversize block that covers 24 MiB (the 50) is freed, the 12 MiB one stays, no full retry.
    REQUIRE(sim.alloc(4, 24 * MiB));
    CHECK(sim.stats().alloc_retries == 0);
    CHECK(sim.stats().device_frees == 1);
    CHECK(sim.stats().reserved_bytes == 38 * MiB);
}

TEST_CASE("Allocator: garbage collection frees old cached blocks above the threshold",
          "[allocator]") {
    // 30 and 24 MiB cached, then 40 MiB asked for, under a threshold (0: none).
    const auto run = [](double threshold) {
        AllocatorConfig config;
        config.capacity = 100 * MiB;
        config.garbage_collection_threshold = threshold;
        CachingAllocatorSimulator sim(config);
        REQUIRE(sim.alloc(1, 30 * MiB));
        REQUIRE(sim.alloc(2, 24 * MiB));
        sim.free(1);
        sim.free(2);
        REQUIRE(sim.alloc(3, 40 * MiB));
        return sim.stats();
    };
    const auto collected = run(0.5);  // 54 > 50 reserved: both cached blocks are as old, freed
    CHECK(collected.reserved_bytes == 40 * MiB);
    CHECK(collected.alloc_retries == 0);
    CHECK(run(0.0).reserved_bytes == 94 * MiB);
}

TEST_CASE("Allocator: expandable segments grow one segment per stream and pool by pages",
          "[allocator]") {
    CachingAllocatorSimulator sim(expandable_config());
    REQUIRE(sim.alloc(1, 1 * KiB));  // small pool: one 2 MiB page
    CHECK(sim.stats().reserved_bytes == 2 * MiB);
    REQUIRE(sim.alloc(2, 3 * MiB));  // large pool: one 20 MiB page
    CHECK(sim.stats().reserved_bytes == 22 * MiB);
    REQUIRE(sim.alloc(3, 30 * MiB));  // 17 MiB free at the end + one more page, same segment
    CHECK(sim.stats().reserved_bytes == 42 * MiB);
    CHECK(sim.stats().segments == 2);
    CHECK(sim.stats().allocated_bytes == 1 * KiB + 33 * MiB);  // remainders split at 512 B
    REQUIRE(sim.alloc(4, 3 * MiB, 1));                         // another stream: its own segment
    CHECK(sim.stats().segments == 3);
    for (const auto& segment : sim.segments()) {
        CHECK(segment.bytes % rules::page_size(segment.small_pool) == 0);
        CHECK(segment.expandable);
    }
    check_segments_add_up(sim);
}

TEST_CASE("Allocator: expandable segments unmap free pages only when memory runs out",
          "[allocator]") {
    AllocatorConfig config = expandable_config();
    config.capacity = 100 * MiB;
    CachingAllocatorSimulator sim(config);
    REQUIRE(sim.alloc(1, 50 * MiB));  // three 20 MiB pages
    REQUIRE(sim.alloc(2, 5 * MiB));   // in the 10 MiB left of the third
    sim.free(1);
    CHECK(sim.stats().reserved_bytes == 60 * MiB);  // freeing keeps the pages
    // 70 MiB: 50 MiB free before the live 5 MiB is too little; after it, 5 MiB free and four
    // more pages: 60 + 80 > 100. So the two whole free pages (0-40 MiB) are unmapped, and the
    // four pages mapped after the live block: 20 + 80.
    REQUIRE(sim.alloc(3, 70 * MiB));
    CHECK(sim.stats().alloc_retries == 1);
    CHECK(sim.stats().device_frees == 1);
    CHECK(sim.stats().reserved_bytes == 100 * MiB);
    CHECK(sim.stats().allocated_bytes == 75 * MiB);
    check_segments_add_up(sim);
}

TEST_CASE("Allocator: expandable reserves no more than caching where sizes keep changing",
          "[allocator]") {
    // Note [Expandable Segments]: a batch that grows by one makes every tensor slightly larger.
    std::vector<memcalc::AllocatorEvent> growing;
    std::vector<memcalc::AllocatorEvent> batches;
    std::uint64_t id = 0;
    for (std::uint64_t step = 1; step <= 8; ++step) {
        growing.push_back(alloc_event(++id, (10 + step) * MiB + 7 * KiB));
        growing.push_back(free_event(id));
        const std::uint64_t first = id + 1;
        for (std::uint64_t layer = 0; layer < 6; ++layer) {
            batches.push_back(alloc_event(++id, (8 + step) * 3 * MiB));
            batches.push_back(alloc_event(++id, (8 + step) * 512 * KiB));
        }
        for (std::uint64_t t = first; t <= id; ++t) batches.push_back(free_event(t));
    }
    for (const auto& events : {growing, batches}) {
        const auto caching = memcalc::simulate_allocator(events);
        const auto expandable = memcalc::simulate_allocator(events, expandable_config());
        CHECK(caching.stats.peak_allocated_bytes >= expandable.stats.peak_allocated_bytes);
        CHECK(expandable.stats.peak_reserved_bytes <= caching.stats.peak_reserved_bytes);
        CHECK(expandable.stats.peak_reserved_bytes >= expandable.stats.peak_allocated_bytes);
        CHECK(expandable.stats.peak_segments <= 2);
        CHECK(caching.stats.peak_segments > 2);
    }
}

TEST_CASE("Allocator: the segments at the reserved peak explain it", "[allocator]") {
    const auto result = memcalc::simulate_allocator({
        alloc_event(1, 3 * MiB),   // 0: 20 MiB segment, 17 MiB of it cached
        alloc_event(2, 100),       // 1: 2 MiB small segment
        alloc_event(3, 18 * MiB),  // 2: too large for the 17: an 18 MiB segment, 40 MiB reserved
        free_event(3),             // 3
        free_event(1),             // 4
        alloc_event(4, 19 * MiB),  // 5: the free 20 MiB block, whole (1 MiB is not split off)
        alloc_event(5, 2 * MiB),   // 6: from the free 18 MiB one: the allocated peak
    });
    CHECK(result.stats.peak_reserved_bytes == 40 * MiB);
    CHECK(result.stats.reserved_bytes == 40 * MiB);
    CHECK(result.peak_reserved_event == 2);
    CHECK(result.stats.peak_allocated_bytes == 22 * MiB + 512);
    CHECK(result.peak_allocated_event == 6);
    REQUIRE(result.segments_at_peak_reserved.size() == 3);
    std::uint64_t total = 0;
    for (const auto& segment : result.segments_at_peak_reserved) total += segment.bytes;
    CHECK(total == result.stats.peak_reserved_bytes);
    CHECK(result.segments_at_peak_reserved[1].small_pool);
}

TEST_CASE("Allocator: ids allocated twice or freed unallocated are refused", "[allocator]") {
    CachingAllocatorSimulator sim;
    REQUIRE(sim.alloc(7, 0));  // zero bytes: PyTorch allocates nothing
    CHECK(sim.stats().reserved_bytes == 0);
    CHECK_THROWS_WITH(sim.alloc(7, 10), Catch::Contains("id 7"));
    sim.free(7);
    CHECK_THROWS_WITH(sim.free(7), Catch::Contains("id 7"));
    CHECK_THROWS_WITH(sim.alloc(8, 1ULL << 60), Catch::Contains("bytes"));
    // Small ids and large ones are kept apart (a vector, a map): every id is refused alike, on
    // either side of the boundary and after the small ones' storage has grown past it.
    for (std::uint64_t id : {600'000ULL, 700'000ULL, 1'100'000ULL, 1ULL << 40}) {
        CAPTURE(id);
        REQUIRE(sim.alloc(id, 512));
        CHECK_THROWS_WITH(sim.alloc(id, 512), Catch::Contains("allocated twice"));
    }
    CHECK(sim.live_allocations() == 4);
    for (std::uint64_t id : {1ULL << 40, 1'100'000ULL, 700'000ULL, 600'000ULL}) sim.free(id);
    CHECK(sim.live_allocations() == 0);
    CHECK_THROWS_WITH(sim.free(1'100'000), Catch::Contains("freed but not allocated"));
}

TEST_CASE("Allocator: random sequences keep the counters consistent", "[allocator]") {
    const auto mode = GENERATE(AllocatorMode::caching, AllocatorMode::expandable);
    const auto seed = GENERATE(1u, 2u, 3u, 4u);
    CAPTURE(static_cast<int>(mode), seed);
    std::mt19937_64 random(seed);
    AllocatorConfig config;
    config.mode = mode;
    if (seed % 2 == 0) config.capacity = 400 * MiB;
    if (seed == 4) config.max_split_size = 16 * MiB;
    CachingAllocatorSimulator sim(config);
    std::vector<std::pair<std::uint64_t, std::uint64_t>> live;  // id, bytes
    std::uint64_t next_id = 0;
    for (int event = 0; event < 3000; ++event) {
        if (!live.empty() && random() % 2 == 0) {
            const std::size_t pick = random() % live.size();
            sim.free(live[pick].first);
            live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
        } else {
            const int scale = static_cast<int>(random() % 3);
            const std::uint64_t bytes = random() % (scale == 0 ? 2 * MiB : 40 * MiB) + 1;
            if (sim.alloc(++next_id, bytes, static_cast<std::uint32_t>(random() % 2))) {
                live.emplace_back(next_id, bytes);
            }
        }
        std::uint64_t requested = 0;
        std::uint64_t rounded = 0;
        for (const auto& [id, bytes] : live) {
            requested += bytes;
            rounded += rules::round_size(bytes);
        }
        const auto& stats = sim.stats();
        REQUIRE(stats.requested_bytes == requested);
        REQUIRE(stats.allocated_bytes >= rounded);
        REQUIRE(stats.reserved_bytes >= stats.allocated_bytes);
        REQUIRE(stats.reserved_bytes <= config.capacity);
        REQUIRE(stats.peak_reserved_bytes >= stats.peak_allocated_bytes);
        if (event % 100 == 0) check_segments_add_up(sim);
    }
    for (const auto& [id, bytes] : live) sim.free(id);
    CHECK(sim.stats().allocated_bytes == 0);
    sim.empty_cache();
    CHECK(sim.stats().reserved_bytes == 0);
    CHECK(sim.stats().segments == 0);
}
