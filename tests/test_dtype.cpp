// Storage types: names from the row, never from a byte count; exact bytes for sub-byte and
// block-scaled storage.
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "memcalc/dtype.hpp"
#include "memcalc/recipe.hpp"

using namespace memcalc;

TEST_CASE("every dtype has its own name, whatever its width", "[dtype]") {
    std::set<std::string> names;
    for (const auto& row : dtype_rows) names.insert(row.name);
    CHECK(names.size() == dtype_rows.size());
    CHECK(std::string(dtype_name(DType::fp16)) == "fp16");  // 2 bytes, as bf16 is
    CHECK(std::string(dtype_name(DType::bf16)) == "bf16");
    CHECK(std::string(dtype_name(DType::fp8_e4m3)) != dtype_name(DType::int8));  // 1 byte each
    CHECK(bytes_per_element(DType::fp16) == 2);
    CHECK(bytes_per_element(DType::nf4) == 0);  // never computed in, only stored
}

TEST_CASE("storage bytes are exact: packed values rounded up to a byte, plus one scale per block",
          "[dtype]") {
    using Row = std::tuple<Storage, std::uint64_t, std::uint64_t>;  // storage, elements, bytes
    auto [storage, elements, bytes] = GENERATE(table<Storage, std::uint64_t, std::uint64_t>({
        Row{{DType::bf16}, 1000, 2000}, Row{{DType::fp32}, 7, 28},
        Row{{DType::nf4}, 3, 2},  // 12 bits: two bytes
        Row{{DType::nf4}, 4096, 2048},
        Row{{DType::nf4, 64, DType::fp32}, 1000, 500 + 16 * 4},  // QLoRA's blocks of 64, 16 of them
        Row{{DType::int8, 2048, DType::fp32}, 4096, 4096 + 2 * 4},  // bitsandbytes' 8-bit state
        Row{{DType::int8, 2048, DType::fp32},
            4097,
            4097 + 3 * 4},  // a partial last block has its scale too
        Row{{DType::int4}, (1ULL << 62) + 1, (1ULL << 61) + 1},  // no overflow on the way
    }));
    CAPTURE(dtype_name(storage.dtype), storage.block, elements);
    CHECK(storage.bytes(elements).value() == bytes);
}

TEST_CASE("a recipe's byte counts follow from its dtypes and its optimiser's slots",
          "[dtype][recipe]") {
    const Recipe& mixed = *find_recipe("mixed-adam");
    CHECK(mixed.weight_bytes() == 2);
    CHECK(mixed.master_bytes() == 4);
    CHECK(mixed.optimizer_bytes() == 8);  // m and v, fp32
    CHECK(mixed.step_temporary_bytes() == 4);
    CHECK(std::string(dtype_name(mixed.activations)) == "bf16");
    const Recipe& sgd = *find_recipe("fp32-sgd");
    CHECK(!sgd.master);
    CHECK(sgd.optimizer_bytes() == 4);
    CHECK(sgd.step_temporary_bytes() == 0);  // momentum updates in place
    CHECK(sgd.bytes_per_parameter() == 12);
    // model.to(bf16) with AdamW: 8 bytes a parameter, the nearest mixed recipe counts 16.
    const Recipe& bf16 = *find_recipe("bf16-adam");
    CHECK(bf16.bytes_per_parameter() == 8);
    CHECK(bf16.zero_k() == 4);
    CHECK(bf16.step_temporary_bytes() == 2);
    const Recipe& lion = *find_recipe("lion");
    CHECK(lion.optimizer_bytes() == 4);
    CHECK(lion.step_temporary_bytes() ==
          4);  // the interpolation whose sign is the update, fp32 beside the master
    CHECK(lion.bytes_per_parameter() == 12);
}
