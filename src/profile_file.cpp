#include "profile_file.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "json_reader.hpp"
#include "memcalc/program_facts.hpp"
#include "model_file.hpp"

namespace memcalc::cli {

namespace {

/// "repeat_kv=true, ...": each a program fact's key and one of its values.
std::vector<std::pair<Text, Text>> read_program_fact_list(const std::string& text,
                                                          const JsonReader& in) {
    std::vector<std::pair<Text, Text>> facts;
    std::size_t start = 0;
    while (start < text.size()) {
        const std::size_t comma = std::min(text.find(',', start), text.size());
        std::string item = text.substr(start, comma - start);
        item.erase(0, item.find_first_not_of(' '));
        item.erase(item.find_last_not_of(' ') + 1);
        start = comma + 1;
        const std::size_t equals = item.find('=');
        bool known = false;
        for_each_program_fact([&](const auto& row) {
            if (equals == std::string::npos || item.substr(0, equals) != row.key) return;
            known = row.find(item.substr(equals + 1)) != nullptr;
        });
        if (!known)
            in.fail("program_facts must be KEY=VALUE items of 'memcalc program-facts' (got '" +
                    item + "')");
        facts.emplace_back(intern(item.substr(0, equals)), intern(item.substr(equals + 1)));
    }
    return facts;
}

}  // namespace

FrameworkProfile parse_profile_json(std::string_view text, const std::string& origin) {
    const nlohmann::json document = parse_json(text, origin);
    std::vector<std::string> keys = {"name",
                                     "description",
                                     "source",
                                     "program_facts",
                                     "loss_chunks",
                                     "loss_chunk_tokens",
                                     "cublas_workspace_config"};
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
    f.loss_chunks = in.positive_or("loss_chunks", base.loss_chunks);
    if (in.has("loss_chunk_tokens"))
        f.loss_chunk_tokens = in.positive_or("loss_chunk_tokens", base.loss_chunk_tokens);
    if (in.has("cublas_workspace_config")) {
        const std::string config = in.text_or("cublas_workspace_config", "");
        f.cublas_workspace = cublas_workspace_config_bytes(config);
        if (!f.cublas_workspace)
            in.fail("cublas_workspace_config '" + config + "' is not ':SIZE:COUNT' pairs");
    }
    p.program = read_program_fact_list(in.shown_text_or("program_facts", ""), in);
    return p;
}

FrameworkProfile load_profile_file(const std::string& path) {
    return parse_profile_json(read_text_file(path, "profile file"), path);
}

}  // namespace memcalc::cli
