#include "profile_file.hpp"

#include <map>
#include <vector>

#include "json_reader.hpp"
#include "model_file.hpp"

namespace memcalc::cli {

namespace {

/// Each choice by the name the listing prints.
template <typename Enum>
std::map<std::string, Enum> named(std::initializer_list<Enum> values, const char* (*name)(Enum)) {
    std::map<std::string, Enum> choices;
    for (Enum v : values) choices.emplace(name(v), v);
    return choices;
}

}  // namespace

FrameworkProfile parse_profile_json(std::string_view text, const std::string& origin) {
    const nlohmann::json document = parse_json(text, origin);
    expect_object(document, origin, "a framework profile",
                  {"name", "description", "source", "platform", "attention", "optimizer_impl", "grad_buffer"});
    const JsonReader in(document, origin);
    if (!in.has("name")) in.fail("missing key 'name'");
    const Framework base = find_profile(default_profile)->framework;
    FrameworkProfile p{intern(in.text_or("name", "")), intern(in.text_or("description", "")),
                       intern(in.text_or("source", "")), base};
    if (p.name.empty()) in.fail("name must not be empty");
    Framework& f = p.framework;
    f.platform = in.choice_or("platform", named({Platform::cuda, Platform::cpu}, platform_name), base.platform);
    f.attention = in.choice_or("attention", named({Attention::eager, Attention::flash}, attention_name), base.attention);
    f.optimizer = in.choice_or(
        "optimizer_impl", named({OptimizerImpl::fused, OptimizerImpl::foreach, OptimizerImpl::for_loop}, optimizer_impl_name),
        base.optimizer);
    f.grad_buffer = in.choice_or("grad_buffer", named({GradBuffer::lazy, GradBuffer::persistent}, grad_buffer_name),
                                 base.grad_buffer);
    return p;
}

FrameworkProfile load_profile_file(const std::string& path) {
    return parse_profile_json(read_text_file(path, "profile file"), path);
}

}  // namespace memcalc::cli
