// What the subcommands share: checking their options and loading the model.
#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <vector>

#include "commands.hpp"
#include "recipe_file.hpp"
#include "suggest.hpp"

namespace memcalc::cli {

void check_run_options(const Request& q) {
    if (q.preset.empty() + q.model_file.empty() + q.config.empty() != 2)
        throw usage_error("give one model: --preset NAME (see 'memcalc presets'), --model-file PATH or --config PATH");
    if (find_recipe(q.recipe) == nullptr) {
        std::vector<std::string> names;
        for (const auto& r : recipes) names.emplace_back(r.name);
        throw usage_error(fmt::format("unknown --recipe '{}'{}; 'memcalc recipes' lists them", q.recipe,
                                      did_you_mean(q.recipe, names)));
    }
    const std::vector<Attention> attentions = parse_attention(q.attention);
    if (q.activations == "korthikanti" &&
        std::find(attentions.begin(), attentions.end(), Attention::flash) != attentions.end())
        throw usage_error("--attention flash needs --activations architecture: Korthikanti's formula describes eager "
                          "attention");
}

/// `text` with its control characters written as \xNN, so a model's name can reach a terminal, a CSV
/// row or an SVG without escape sequences, forged lines or ill-formed XML.
namespace {
std::string printable(const std::string& text) {
    std::string out;
    for (unsigned char c : text)
        out += c < 0x20 || c == 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, static_cast<char>(c));
    return out;
}
}  // namespace

ModelFile load_model(const Request& q) {
    ModelFile m = !q.preset.empty()       ? load_preset(q.preset)
                  : !q.model_file.empty() ? load_model_file(q.model_file)
                                          : load_hf_config(q.config);
    m.architecture.name = printable(m.architecture.name);
    return m;
}

ActivationModel activation_model(const Request& q) {
    return q.activations == "architecture" ? ActivationModel::architecture : ActivationModel::korthikanti;
}

Settings settings_from(const Request& q) {
    Settings settings;
    // check_run_options has named a wrong built-in one already
    settings.recipe = q.recipe_file.empty() ? builtin_recipe(q.recipe) : load_recipe_file(q.recipe_file);
    settings.activations = activation_model(q);
    settings.framework.platform = parse_platform(q);
    settings.framework.optimizer = parse_optimizer_impl(q.optimizer_impl);
    settings.framework.grad_buffer = parse_grad_buffer(q.grad_buffer);
    return settings;
}

Attention single_attention(const Request& q, const char* command) {
    const auto attentions = parse_attention(q.attention);
    if (attentions.size() != 1) throw usage_error(fmt::format("{} takes one --attention", command));
    return attentions.front();
}

}  // namespace memcalc::cli
