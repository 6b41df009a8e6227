#include "gpu_file.hpp"

#include <fmt/format.h>

#include "json_reader.hpp"
#include "model_file.hpp"

namespace memcalc::cli {

std::string gib_text(Count memory) { return fmt::format("{:.2f}", static_cast<double>(memory.value()) / (1ULL << 30)); }

Gpu parse_gpu_json(std::string_view text, const std::string& origin) {
    const nlohmann::json document = parse_json(text, origin);
    // memory_gib, which the listing shows beside the bytes, is accepted and checked against them.
    expect_object(document, origin, "a GPU", {"name", "description", "source", "memory_bytes", "memory_gib"});
    const JsonReader in(document, origin);
    if (!in.has("name")) in.fail("missing key 'name'");
    Gpu g{intern(in.text_or("name", "")), intern(in.text_or("description", "")), intern(in.text_or("source", "")),
          in.positive("memory_bytes")};
    if (g.name.empty()) in.fail("name must not be empty");
    const std::string gib = gib_text(g.memory);
    if (in.has("memory_gib") && in.text_or("memory_gib", "") != gib)
        in.fail("memory_gib is " + document.at("memory_gib").dump() + ", but memory_bytes makes it \"" + gib + "\"");
    return g;
}

Gpu load_gpu_file(const std::string& path) { return parse_gpu_json(read_text_file(path, "GPU file"), path); }

}  // namespace memcalc::cli
