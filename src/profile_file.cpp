#include "profile_file.hpp"

#include <map>
#include <vector>

#include "json_reader.hpp"
#include "model_file.hpp"

namespace memcalc::cli {

FrameworkProfile parse_profile_json(std::string_view text, const std::string& origin) {
    const nlohmann::json document = parse_json(text, origin);
    std::vector<std::string> keys = {"name", "description", "source"};
    for_each_switch([&](const auto& row) { keys.emplace_back(row.key); });
    expect_object(document, origin, "a framework profile", keys);
    const JsonReader in(document, origin);
    if (!in.has("name")) in.fail("missing key 'name'");
    const Framework base = find_profile(default_profile)->framework;
    FrameworkProfile p{intern(in.shown_text_or("name", "")),
                       intern(in.shown_text_or("description", "")),
                       intern(in.shown_text_or("source", "")), base};
    if (p.name.empty()) in.fail("name must not be empty");
    Framework& f = p.framework;
    for_each_switch([&](const auto& row) {
        std::map<std::string, std::decay_t<decltype(row.values[0])>> choices;
        for (auto v : row.values) choices.emplace(row.name(v), v);
        f.*row.member = in.choice_or(std::string(row.key).c_str(), choices, base.*row.member);
    });
    return p;
}

FrameworkProfile load_profile_file(const std::string& path) {
    return parse_profile_json(read_text_file(path, "profile file"), path);
}

}  // namespace memcalc::cli
