// The program's command line as the man page and the completions see it (program_docs.hpp): walked
// from the CLI::App that --help builds, with each option's values from the tables that read them.
#include "program_docs.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <string_view>

#include "command_line.hpp"
#include "command_table.hpp"
#include "commands.hpp"
#include "memcalc/memcalc.hpp"
#include "model_file.hpp"

namespace memcalc::cli {
namespace {

template <class Rows>
Words names_of(const Rows& rows) {
    Words names;
    for (const auto& row : rows) names.emplace_back(row.name);
    return names;
}

Words recompute_module_names() {
    Words names;
    for (Module m : recomputable_modules) names.emplace_back(module_name(m));
    return names;
}

/// peft's all-linear, each linear a layer's code names, and the fused linears' names.
Words lora_target_names() {
    Words names = {"all-linear"};
    for (const LinearRow& row : linear_rows)
        if (row.tuned && *row.tensor != '\0') names.emplace_back(row.tensor);
    for (const auto& fused : detail::fused_linears)
        for (const char* name : fused.names)
            if (name != nullptr) names.emplace_back(name);
    return names;
}

/// Every value some engine version takes for `option` (engine_choices' rows), each once.
Words engine_choice_words(std::string_view option) {
    Words words;
    for (const EngineChoice& row : engine_choices)
        for (std::string_view value : engine_values(row))
            if (row.option == option &&
                std::find(words.begin(), words.end(), std::string(value)) == words.end())
                words.emplace_back(value);
    return words;
}

/// The values of an option that takes one of a known set: a row per option.
struct ValuesRow {
    const char* option;
    Words (*values)();
};

const ValuesRow values_rows[] = {
    {"--preset", [] { return preset_names(); }},
    {"--recipe", [] { return names_of(recipes); }},
    {"--profile", [] { return names_of(framework_profiles); }},
    {"--gpu", [] { return names_of(gpus); }},
    {"--train", [] { return names_of(training_rows); }},
    {"--lora-variant", [] { return names_of(lora_variant_rows); }},
    {"--qlora-quantizer", [] { return names_of(quantizer_rows); }},
    {"--weights", [] { return names_of(weight_formats); }},
    {"--schedule", [] { return names_of(schedule_rows); }},
    {"--recompute-modules", recompute_module_names},
    {"--lora-targets", lora_target_names},
    // The sets src/arguments.cpp and src/command_serve.cpp read without a table of the core's.
    {"--recompute",
     [] {
         return Words{"none", "selective", "full", "op", "all"};
     }},
    {"--attention",
     [] {
         return Words{"eager", "flash", "sdpa"};
     }},
    {"--offload",
     [] {
         return Words{"none",
                      "optimizer",
                      "parameters",
                      "activations",
                      "optimizer+activations",
                      "parameters+activations"};
     }},
    {"--frozen",
     [] { return Words{"embeddings", "attention", "mlp", "router", "norms", "head", "all"}; }},
    {"--lora-dtype",
     [] {
         return Words{"fp32", "bf16", "fp16"};
     }},
    {"--kv-dtype",
     [] {
         return Words{"bf16", "fp16", "fp8", "fp8-e5m2", "fp32"};
     }},
    {"--kv-cache-dtype", [] { return engine_choice_words("--kv-cache-dtype"); }},
    {"--zero",
     [] {
         return Words{"0", "1", "2", "3"};
     }},
};

/// The values of an option named `option`: its row's, a framework switch's or program fact's, or
/// its CLI::IsMember check's (`check`: "{table,json,csv}"); none if it takes any value.
Words choices_of(const std::string& option, const std::string& check) {
    for (const ValuesRow& row : values_rows)
        if (option == row.option) return row.values();
    Words choices;
    const auto switch_values = [&](const auto& row) {
        if (row.option() == option)
            for (const auto& v : row.values) choices.emplace_back(row.name(v));
    };
    for_each_switch(switch_values);
    for_each_program_fact(switch_values);
    if (choices.empty() && check.size() > 2 && check.front() == '{' && check.back() == '}')
        for (std::size_t from = 1; from < check.size();) {
            const std::size_t end = std::min(check.find(',', from), check.size() - 1);
            choices.push_back(check.substr(from, end - from));
            from = end + 1;
        }
    return choices;
}

/// --help's text on one line: its line breaks are for the terminal ("micro-\nbatch" is one word).
std::string one_line(const std::string& text) {
    std::string out;
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '\n') {
            out += text[i];
            continue;
        }
        while (i + 1 < text.size() && text[i + 1] == ' ') ++i;
        if (out.empty() || out.back() != '-') out += ' ';
    }
    return out;
}

OptionDoc option_doc(const CLI::Option& option) {
    OptionDoc doc;
    for (const std::string& s : option.get_snames()) doc.names.push_back("-" + s);
    for (const std::string& l : option.get_lnames()) doc.names.push_back("--" + l);
    doc.help = one_line(option.get_description());
    doc.group = option.get_group();
    if (option.get_type_size() == 0) return doc;      // a flag
    const std::string type = option.get_type_name();  // "NAME", "TEXT:{table,json,csv}"
    const std::size_t colon = std::min(type.find(':'), type.size());
    doc.value = type.substr(0, colon);
    doc.choices = choices_of(doc.names.back(), type.substr(std::min(colon + 1, type.size())));
    for (const char* path : {"PATH", "FILE", "DIR"})
        doc.file = doc.file || doc.value.find(path) != std::string::npos;
    doc.list = doc.value.find("[,") != std::string::npos;
    return doc;
}

CommandDoc command_doc(const CLI::App& app, const std::string& name) {
    CommandDoc doc{name, app.get_description(), app.get_footer(), {}};
    for (const CLI::Option* option : app.get_options())
        if (!option->get_group().empty()) doc.options.push_back(option_doc(*option));
    return doc;
}

}  // namespace

std::vector<CommandDoc> program_commands() {
    std::vector<CommandDoc> commands;
    visit_program([&](const CLI::App& app) {
        commands.push_back(command_doc(app, ""));
        for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
            commands.push_back(command_doc(*sub, sub->get_name()));
    });
    return commands;
}

}  // namespace memcalc::cli
