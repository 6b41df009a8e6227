// memcalc's command line: its options, parsing, the dispatch to a subcommand (commands.hpp), and the
// output. Every error is caught here once and printed as one line on stderr. src/main.cpp only calls it, so
// a fuzz target can run the whole program in process (fuzz/fuzz_command_line.cpp).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "arguments.hpp"
#include "command_line.hpp"
#include "commands.hpp"
#include "memcalc/compare.hpp"
#include "memcalc/memcalc.hpp"
#include "output_file.hpp"
#include "printable.hpp"

namespace {

using namespace memcalc;
using namespace memcalc::cli;

constexpr int exit_input_error = 1;
constexpr int exit_usage_error = 2;

const char* const examples = R"(Examples:
  memcalc --preset llama-7b --seq 4096 --recompute selective
  memcalc --preset llama-7b --seq 4096 --recompute full --timeline
  memcalc --preset llama-7b --seq 4096 --format json
  memcalc --preset llama-2-70b --seq 1024,2048,4096 --recompute all --format csv
  memcalc --model-file my-model.json --seq 2048 --micro-batch 4 --units gib
  memcalc --config Llama-2-7b-hf/config.json --seq 4096 --recompute full
  memcalc --config Llama-2-7b-hf --seq 4096
  memcalc --preset llama-3-8b --seq 8192 --activations architecture --attention flash --per-layer
  memcalc --preset llama-2-70b --seq 4096 --tp 8 --sp --pp 4 --dp 2 --zero 1 --global-batch 128 --recompute selective
  memcalc --preset llama-7b --seq 4096 --recompute selective --microbatches 4 --grad-buffer persistent
  memcalc --preset llama-3.1-405b --seq 8192 --tp 8 --pp 16 --dp 8 --zero 1 --first-stage-layers 7 --last-stage-layers 7
  memcalc --preset llama-7b --seq 4096 --activations architecture --profile megatron --recipe mixed-adam-fp32-grads
  memcalc --preset llama-3-8b --seq 2048 --train qlora --lora-rank 16 --lora-targets all-linear --recompute full
  memcalc --preset llama-7b --seq 2048 --train lora --lora-rank 8 --lora-targets q_proj,v_proj
  memcalc --preset llama-7b --seq 2048 --train frozen --frozen embeddings,attention
  memcalc fit --preset llama-3-70b --train qlora --lora-targets all-linear --recompute full --device-memory 48GB
  memcalc serve --preset llama-3-70b --context 32768 --batch 8 --tp 8 --gpu h100-sxm
  memcalc presets
  memcalc recipes
  memcalc profiles
  memcalc gpus
  memcalc activation-functions

Exit status: 0 on success, 1 for a bad model (preset, model file, sizes that overflow),
2 for a bad command line. Errors are one line on stderr; nothing is printed on stdout then.)";

/// The groups of options every estimating command takes, a struct each: `add` registers them on a
/// CLI::App, or only their names on a NameRecorder (so the estimate builds a group only when it is used).
struct ModelChoice {  // which model
    template <class App>
    static void add(App& app, Request& q) {
        auto* preset = app.add_option("--preset", q.preset, "A built-in model: see 'memcalc presets'")
            ->type_name("NAME");
        auto* model_file =
            app.add_option("--model-file", q.model_file, "A model described in JSON (keys as in presets/*.json)")->excludes(preset)
            ->type_name("PATH");
        app.add_option("--config", q.config,
                       "A HuggingFace config.json (model_type llama, mistral, mixtral, qwen2, gemma, gemma2, phi3,\n"
                       "gpt2, opt, falcon, bloom, gpt_neox or phi)"
                       ", or a downloaded model folder holding one: its\nmodel.safetensors.index.json or safetensors "
                       "headers are then checked against memcalc's count")
            ->excludes(preset)
            ->excludes(model_file)
            ->type_name("PATH|DIR");
    }
};

struct RunSizes {  // the sequence, the micro-batch, the recomputation
    template <class App>
    static void add(App& app, Request& q) {
        app.add_option("--seq", q.seq, "Sequence length s, or a comma list to sweep (default: the model's max_positions)")
            ->type_name("S[,S...]");
        app.add_option("-b,--micro-batch", q.micro_batch, "Sequences per step per device b, or a comma list (default: 1)")
            ->type_name("B[,B...]");
        app.add_option("--recompute", q.recompute,
                       "Activation recomputation: none, selective, full, op (torchtitan's per-op policy, with\n"
                       "--activations architecture), a comma list, or all (none,selective,full; default: none)")
            ->type_name("MODE[,MODE...]");
        app.add_option("--recompute-modules", q.recompute_modules,
                       "With --recompute selective: what it checkpoints, Megatron-LM's recompute_modules\n"
                       "(core_attn, mlp, moe_act, layernorm, moe, shared_experts, mla_up_proj; default: core_attn)")
            ->type_name("MODULE[,MODULE...]");
        app.add_option("--recompute-layers", q.recompute_layers,
                       "With --recompute full: recompute only the first N layers of each pipeline stage (each\n"
                       "model chunk with --vpp), the others keeping every activation, as Megatron-LM's\n"
                       "--recompute-method block --recompute-num-layers N (default: every layer)")
            ->type_name("N");
    }
};

struct TrainingChoice {
    template <class App>
    static void add(App& app, Request& q) {
        app.add_option("--train", q.train,
                       "What trains: full (default), frozen (all but --frozen PARTS), lora (low-rank adapters\n"
                       "beside a frozen base, as peft's LoRA), qlora (the same over 4-bit NF4 base linears,\n"
                       "bitsandbytes' double quantisation). Not full: --activations architecture by default")
            ->type_name("MODE");
        app.add_option("--frozen", q.frozen,
                       "Parts that keep their weights alone (no gradient, master copy or optimiser state):\n"
                       "embeddings, attention, mlp, router, norms, head, all, or tensor names (q_proj, ...)")
            ->type_name("PART[,PART...]");
        app.add_option("--lora-rank", q.lora_rank, "LoRA's rank r (default: 8, peft's)")->type_name("R");
        app.add_option("--lora-targets", q.lora_targets,
                       "The linears LoRA adapts, by name as peft matches them, or all-linear (every layer's;\n"
                       "default: q_proj,v_proj, peft's for LLaMA)")
            ->type_name("NAME[,NAME...]");
        app.add_option("--lora-dropout", q.lora_dropout,
                       "lora_dropout: above 0 each adapter keeps its dropped-out input and mask (default: 0.05;\n"
                       "peft's 0 keeps neither)")
            ->type_name("P");
        app.add_option("--lora-dtype", q.lora_dtype,
                       "The adapters' dtype: fp32 (default: peft's autocast_adapter_dtype beside a 16-bit model;\n"
                       "each adapter then casts its input to fp32) or bf16/fp16 (the model's own)")
            ->type_name("DTYPE");
        app.add_option("--lora-variant", q.lora_variant,
                       "lora (default) or dora (peft's use_dora): a trained magnitude vector per adapted linear,\n"
                       "the norm of W + B A made in each forward, and the base output kept beside the adapter's\n"
                       "(kept tensors measured; the norm's and backward's workspaces assumed, leaning high)")
            ->type_name("VARIANT");
    }
};

struct RecipeChoice {
    template <class App>
    static void add(App& app, Request& q) {
        auto* recipe = app.add_option("--recipe", q.recipe, "Bytes per parameter: see 'memcalc recipes' (default: mixed-adam)")
            ->type_name("NAME");
        app.add_option("--recipe-file", q.recipe_file,
                       "A recipe of your own in JSON: name, weights, gradients, master, activations (dtypes) and\n"
                       "optimizer, as 'memcalc recipes --format json' prints each built-in one")
            ->excludes(recipe)
            ->type_name("PATH");
    }
};

struct ActivationChoice {
    template <class App>
    static void add(App& app, Request& q) {
        app.add_option("--activations", q.activations,
                       "Per-layer activations: korthikanti (the chapter's formula, default) or architecture\n"
                       "(the tensors PyTorch keeps for this architecture, op by op; the default with --train)")
            ->check(CLI::IsMember({"korthikanti", "architecture"}));
        app.add_option("--attention", q.attention,
                       "eager (default: the s x s scores are stored), flash (a fused kernel keeps a log-sum-exp\n"
                       "per row instead; needs --activations architecture), or a comma list")
            ->type_name("KIND[,KIND...]");
    }
};

struct OutputChoice {  // units, format, file
    template <class App>
    static void add(App& app, Request& q) {
        const std::vector<std::string> formats = {"table", "json", "csv"};
        app.add_option("--units", q.units, "gb (10^9 bytes, the default) or gib (2^30)")
            ->check(CLI::IsMember({"gb", "gib"}, CLI::ignore_case))
            ->transform(CLI::detail::to_lower);
        app.add_option("--format", q.format, "table (default), json or csv")->check(CLI::IsMember(formats));
        app.add_option("--output", q.output,
                       "Write the result to this file instead of stdout, atomically: a failed run leaves no file")
            ->type_name("FILE");
    }
};

/// The model and the run: what every command that estimates takes.
template <class App>  // a CLI::App, or a NameRecorder
void add_model_options(App& app, Request& q) {
    ModelChoice::add(app, q);
    RunSizes::add(app, q);
    RecipeChoice::add(app, q);
    TrainingChoice::add(app, q);
    ActivationChoice::add(app, q);
    OutputChoice::add(app, q);
}

/// The framework's side of the model: its kernels and its optimiser step.
struct FrameworkChoice {
    template <class App>  // a CLI::App, or a NameRecorder
    static void add(App& app, Request& q) {
        auto* profile = app.add_option("--profile", q.profile,
                       "The training framework: see 'memcalc profiles' (default: default, the chapter's).\n"
                       "It sets --attention, --platform, --optimizer-impl, --grad-buffer, --loss and --logits;\n"
                       "each given overrides it")
            ->type_name("NAME");
        app.add_option("--profile-file", q.profile_file,
                       "A profile of your own in JSON: name, platform, attention, optimizer_impl, grad_buffer,\n"
                       "loss and logits, as 'memcalc profiles --format json' prints each built-in one (a key\n"
                       "left out: default's)")
            ->excludes(profile)
            ->type_name("PATH");
        for_each_switch([&](const auto& row) {
            if (row.help.empty()) return;  // --attention: a comma list, with the activation options
            const std::string key(row.key);
            app.template add_option_function<std::string>(
                   row.option(), [&q, key](const std::string& text) { q.framework[key] = text; }, std::string(row.help))
                ->type_name("KIND");
        });
    }
};

/// The device: its memory given (--device-memory), or a GPU's by name or file.
template <class App>  // a CLI::App, or a NameRecorder
void add_device_options(App& app, Request& q, const char* memory_help) {
    auto* memory = app.add_option("--device-memory", q.device_memory, memory_help)->type_name("SIZE");
    auto* gpu = app.add_option("--gpu", q.gpu, "A GPU's memory as its driver reports it: see 'memcalc gpus' (h100-sxm, ...)")
                    ->excludes(memory)
                    ->type_name("NAME");
    app.add_option("--gpu-file", q.gpu_file,
                   "A GPU of your own in JSON: name and memory_bytes, as 'memcalc gpus --format json' prints;\n"
                   "its speeds (peak_bf16_flops, intra_node_bytes_per_second, ...) optional, for plan's times")
        ->excludes(memory)
        ->excludes(gpu)
        ->type_name("PATH");
}

/// --host-memory: what offload may fill of each device's host memory, checked where given.
template <class App>  // a CLI::App, or a NameRecorder
auto* add_host_memory_option(App& app, Request& q) {
    return app.add_option("--host-memory", q.host_memory,
                          "Host memory each device may fill with what --offload moves there: its node's memory over\n"
                          "its GPUs (a DGX H100: 2TB / 8 = 250GB). Checked where given; without it, not")
        ->type_name("SIZE");
}

/// Options a subcommand takes one value of, where the estimate takes a comma list: said so in --help.
void single_valued(CLI::App& app, std::initializer_list<const char*> names) {
    for (const char* name : names) {
        CLI::Option* option = app.get_option(name);
        option->type_name(option->get_type_name().substr(0, option->get_type_name().find('[')));
        std::string text = option->get_description();
        for (const char* list : {", or a comma list to sweep", ", or a comma list", " or a comma list"}) {
            const auto at = text.find(list);
            if (at != std::string::npos) text.erase(at, std::string(list).size());
        }
        option->description(text + " (one value)");
    }
}

/// Uneven pipeline stages, for estimate, fit and plan.
template <class App>  // a CLI::App, or a NameRecorder
void add_stage_options(App& app, Request& q, const char* group) {
    app.add_option("--first-stage-layers", q.first_stage_layers,
                   "Layers of the first pipeline stage, when it differs (Megatron-LM's\n"
                   "decoder-first-pipeline-num-layers); the other stages split the rest evenly")
        ->group(group)
        ->type_name("N");
    app.add_option("--last-stage-layers", q.last_stage_layers,
                   "Layers of the last pipeline stage, when it differs (decoder-last-pipeline-num-layers)")
        ->group(group)
        ->type_name("N");
}

/// How the step is spread over devices.
struct ParallelChoice {
    template <class App>  // a CLI::App, or a NameRecorder
    static void add(App& app, Request& q) {
        const char* parallel_group = "Parallelism (per-device memory)";
        app.add_option("--dp", q.dp, "Data-parallel replicas (default 1); --dp, --tp, --pp and --zero take comma lists")
            ->group(parallel_group)
            ->type_name("N[,N...]");
        app.add_option("--zero", q.zero,
                       "ZeRO stage: 0 none, 1 optimiser state, 2 + gradients, 3 + weights (FSDP full sharding)")
            ->group(parallel_group)
            ->type_name("STAGE[,STAGE...]");
        app.add_option("--shard-group", q.shard_group, "Hybrid sharding: shard within groups of this many dp ranks")
            ->group(parallel_group)
            ->type_name("M");
        app.add_option("--tp", q.tp, "Tensor-parallel ranks (Megatron-LM column/row splits)")->group(parallel_group)
            ->type_name("N[,N...]");
        app.add_flag("--sp", q.sp, "Sequence parallelism with --tp: norms, dropout and linear inputs split too")
            ->group(parallel_group);
        app.add_option("--pp", q.pp, "Pipeline stages (schedule: see --schedule)")->group(parallel_group)
            ->type_name("N[,N...]");
        app.add_option("--vpp", q.vpp, "Virtual stages per pipeline rank (interleaved 1F1B)")->group(parallel_group)
            ->type_name("V");
        app.add_option("--schedule", q.schedule,
                       "Pipeline schedule (default 1f1b; interleaved when --vpp > 1): 1f1b, interleaved (--vpp\n"
                       "chunks per rank), zb-h1 (W deferred: every stage holds pp micro-batches), zb-v (2 chunks\n"
                       "per rank in a V, 2 pp chunks in flight on every rank), dualpipe (each rank holds stages k and\n"
                       "pp-1-k: twice the weights, gradients and optimiser state; pp + 1 stages' activations;\n"
                       "needs an even pp). zb-v and dualpipe need micro-batches >= 2 pp (dualpipe: even). A\n"
                       "micro-batch counts as live until its deferred weight-gradient pass (W) ends, as the papers\n"
                       "count, and as what W reads (the linears' inputs and their outputs' gradients) where that is\n"
                       "more, as under recomputation: leaning high (README)")
            ->group(parallel_group)
            ->type_name("NAME");
        add_stage_options(app, q, parallel_group);
        app.add_option("--cp", q.cp, "Context-parallel ranks: the sequence split across them")->group(parallel_group)
            ->type_name("N");
        app.add_option("--ep", q.ep, "Expert-parallel ranks for mixture-of-experts models (divides --dp)")
            ->group(parallel_group)
            ->type_name("N");
        app.add_option("--etp", q.etp, "Expert tensor-parallel ranks: the experts' weights and hidden activations\n"
                                       "split over them instead of --tp (Megatron-LM's; default: --tp)")
            ->group(parallel_group)
            ->type_name("N");
        app.add_option("--microbatches", q.microbatches,
                       "Micro-batches per step (gradient accumulation; default: --pp, which fills the pipeline);\n"
                       "from the second on, the gradients of the first are held (see --grad-buffer)")
            ->group(parallel_group)
            ->type_name("M");
        app.add_option("--global-batch", q.global_batch, "Sequences per step: sets --microbatches = G / (micro-batch x dp)")
            ->group(parallel_group)
            ->type_name("G");
        app.add_option("--offload", q.offload,
                       "ZeRO-Offload, as DeepSpeed runs it: none (default), optimizer (needs --zero 1-3: the master\n"
                       "copy, the optimiser state and an fp32 copy of the gradient shard in host memory, where the\n"
                       "CPU steps them; with --zero 2 or 3 the device keeps only the gradient bucket in flight), or\n"
                       "parameters (that and the weights; needs --zero 3). Or activations: each layer's saved\n"
                       "tensors (its checkpoint under --recompute full) go to host memory after its forward and\n"
                       "come back for its backward, the device keeping the layer computing and the one in transit\n"
                       "(the other micro-batches in flight: one layer each); alone or joined with '+', e.g.\n"
                       "optimizer+activations. The host figure counts what was moved (see --host-memory)")
            ->group(parallel_group)
            ->type_name("MODE");
        add_host_memory_option(app, q)->group(parallel_group);
        app.add_option("--gpus-per-node", q.gpus_per_node, "GPUs per node, for --compare deepspeed (default 8)")
            ->group(parallel_group)
            ->type_name("N");
    }
};

/// What the estimate's report also shows or writes.
struct ReportChoice {
    template <class App>  // a CLI::App, or a NameRecorder
    static void add(App& app, Request& q) {
        app.add_option("--compare", q.compare,
                       fmt::format("Also show what another tool gives for this configuration: megatron (Megatron-LM's\n"
                                   "theoretical memory formula, as on its {}) or deepspeed\n"
                                   "(its ZeRO-2/3 model-state estimators, as on its {})",
                                   megatron_follows, deepspeed_follows))
            ->check(CLI::IsMember({"megatron", "deepspeed"}));
        app.add_option("--plot", q.plot,
                       "Also draw an SVG: the timeline as stacked areas by category, or for a sweep the peak\n"
                       "against the swept size, one line per recomputation mode")
            ->type_name("FILE.svg");
        app.add_option("--sweep-limit", q.sweep_limit,
                       "Most configurations a sweep's lists may make (default 1,000,000)")
            ->type_name("N");
        add_device_options(app, q, "A device's memory (80GB, 24GiB): drawn in plots, checked in the report");
        app.add_flag("--timeline", q.timeline, "Show every step of the timeline, not only the first and last of each phase");
        app.add_flag("--per-layer", q.per_layer, "Show only the per-layer activation table (op by op)");
        app.add_flag("--ops", q.ops,
                     "Also show one layer's op tape: each event (alloc, save, free, rebuild, run) with\n"
                     "its op, tensor, bytes and the layer's live bytes after it, on one rank");
    }
};

/// Stands in for a CLI::App to learn, at no cost, the names a group of options would register: each
/// option records its names, every call chained to it does nothing.
class NameRecorder {
public:
    struct Chain {
        template <class... A> Chain* type_name(A&&...) { return this; }
        template <class... A> Chain* excludes(A&&...) { return this; }
        template <class... A> Chain* check(A&&...) { return this; }
        template <class... A> Chain* transform(A&&...) { return this; }
        template <class... A> Chain* group(A&&...) { return this; }
    };
    template <class... A>
    Chain* add_option(const std::string& names, A&&...) { return record(names); }
    template <class... A>
    Chain* add_flag(const std::string& names, A&&...) { return record(names); }
    template <class T, class... A>
    Chain* add_option_function(const std::string& names, A&&...) { return record(names); }

    /// Whether `tokens` (the command line's option names) name any of them.
    bool named_in(const std::vector<std::string>& tokens) const {
        for (const auto& t : tokens)
            if (knows(t)) return true;
        return false;
    }
    bool knows(const std::string& token) const { return std::find(names_.begin(), names_.end(), token) != names_.end(); }

private:
    Chain* record(const std::string& names) {
        for (std::size_t start = 0; start <= names.size();) {
            const std::size_t comma = std::min(names.find(',', start), names.size());
            names_.push_back(names.substr(start, comma - start));
            start = comma + 1;
        }
        return &chain_;
    }
    std::vector<std::string> names_;  // "-b", "--micro-batch"
    Chain chain_;
};

/// The option names a command line gives: each "-x" or "--name" token, up to an "=".
std::vector<std::string> option_tokens(int argc, const char* const* argv);

/// Registers each of `Groups` (in order, so --help reads the same) only when the command line names
/// one of its options, asks for help, or names an option none of them knows (which CLI11 then reports
/// as it always has): CLI11 checks each new option's names against every earlier one's, so building
/// the whole tree was most of a run's start-up.
/// Returns whether every group was built (help, or an option none of them knows).
template <class... Groups>
bool add_groups_used(CLI::App& app, Request& q, int argc, const char* const* argv) {
    const std::vector<std::string> tokens = option_tokens(argc, argv);
    std::array<NameRecorder, sizeof...(Groups)> names;
    {
        Request unused;
        std::size_t i = 0;
        (Groups::add(names[i++], unused), ...);
    }
    bool every_group = false;
    for (const auto& t : tokens) {
        const bool known = t == "--version" ||
                           std::any_of(names.begin(), names.end(), [&](const NameRecorder& n) { return n.knows(t); });
        every_group = every_group || t == "-h" || t == "--help" || !known;
    }
    std::size_t i = 0;
    ((every_group || names[i].named_in(tokens) ? Groups::add(app, q) : void(), ++i), ...);
    return every_group;
}
std::vector<std::string> option_tokens(int argc, const char* const* argv) {
    std::vector<std::string> tokens;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg.size() > 1 && arg[0] == '-') tokens.emplace_back(arg.substr(0, arg.find('=')));
    }
    return tokens;
}

}  // namespace

int memcalc::cli::run_command_line(int argc, const char* const* argv) { return run_command_line(argc, argv, std::cout, std::cerr); }

int memcalc::cli::run_command_line(int argc, const char* const* argv, std::ostream& out_stream, std::ostream& err_stream) {
    forget_inputs();  // the files an earlier run in this process read are no concern of this one
    CLI::App app{"memcalc: how much device memory one training step of a transformer language model takes,\n"
                 "from the architecture alone, exactly: parameters, training state, saved activations,\n"
                 "and the peak over the step's timeline.",
                 "memcalc"};
    app.set_version_flag("--version", std::string("memcalc ") + memcalc::version);
    app.footer(examples);
    app.require_subcommand(0, 1);

    Request q;
    const std::vector<std::string> formats = {"table", "json", "csv"};
    const bool every_group = add_groups_used<ModelChoice, RunSizes, RecipeChoice, TrainingChoice, ActivationChoice, OutputChoice,
                                             FrameworkChoice, ParallelChoice, ReportChoice>(app, q, argc, argv);
    // A subcommand, and its options, only when the command line names it (or everything is built).
    const auto mentions = [&](const char* name) {
        if (every_group) return true;
        for (int i = 1; i < argc; ++i)
            if (std::string(argv[i]) == name) return true;
        return false;
    };

    Request fit_q;
    fit_q.recompute = "all";
    CLI::App* fit = nullptr;
    if (mentions("fit")) {
        fit = app.add_subcommand("fit", "The longest sequence (or largest micro-batch) that fits in a device's memory");
        add_model_options(*fit, fit_q);
        FrameworkChoice::add(*fit, fit_q);
        ParallelChoice::add(*fit, fit_q);
        single_valued(*fit, {"--seq", "--micro-batch", "--attention", "--dp", "--tp", "--pp", "--zero"});
        fit->get_option("--recompute")->description("Recomputation modes to answer for, a comma list (default: all three)");
        fit->get_option("--dp")->description("Data-parallel replicas (default 1)");
        add_device_options(*fit, fit_q, "The device's memory: 80GB, 141GB, 24GiB, ... (or --gpu)");
        fit->add_option("--reserve", fit_q.reserve,
                        "Memory the model does not see: the framework's context and fragmentation (default 2GiB)")
            ->type_name("SIZE");
        fit->add_option("--multiple-of", fit_q.multiple_of, "Search only multiples of this size (default 1)")
            ->type_name("N");
        fit->footer(R"(Searches the sequence length at --micro-batch (default 1), or, when --seq is given, the
micro-batch at that sequence; for each --recompute mode (default: all three). The peak never falls
as either grows, so the search doubles, then bisects, and reports the largest size that fits, its
peak and headroom, and the next size up, which does not. With --seq and --global-batch it tries each
micro-batch that divides the global batch per replica, with the micro-batches per step that implies
(fewer, larger ones can fit where more, smaller ones hold gradients that do not).

Examples:
  memcalc fit --preset llama-7b --device-memory 80GB --recompute selective
  memcalc fit --preset llama-7b --gpu h100-sxm --recompute selective
  memcalc fit --preset llama-3-8b --device-memory 80GB --seq 8192 --activations architecture --attention flash
  memcalc fit --preset llama-2-70b --device-memory 80GB --tp 8 --sp --dp 8 --zero 1 --multiple-of 1024)");
    }

    Request plan_q;
    plan_q.recompute = plan_q.micro_batch = "";  // not given: the search tries every one
    CLI::App* plan = nullptr;
    if (mentions("plan")) {
        plan = app.add_subcommand("plan", "The layouts of a cluster that fit, ranked by estimated step time; or the fewest GPUs");
        add_model_options(*plan, plan_q);
        FrameworkChoice::add(*plan, plan_q);
        single_valued(*plan, {"--seq", "--attention"});
        plan->get_option("--recompute")->description("Recomputation modes to try, a comma list (default: all three)");
        plan->get_option("--micro-batch")->description("Micro-batches to try, a comma list (default: every one that divides\n"
                                                       "the global batch per replica)");
        plan->add_option("--gpus", plan_q.gpus,
                         "Devices in the cluster (default: the fewest on which a layout fits, in whole nodes\n"
                         "of --gpu's node size, else any count)")
            ->type_name("N");
        add_device_options(*plan, plan_q, "Each device's memory: 80GB, 141GB, ... (or --gpu, which also times the step)");
        plan->add_option("--global-batch", plan_q.global_batch, "Sequences per step (required)")
            ->type_name("G");
        plan->add_option("--reserve", plan_q.reserve, "Memory the model does not see (default 2GiB)")
            ->type_name("SIZE");
        plan->add_option("--top", plan_q.top, "How many layouts to show (default 10)")
            ->type_name("K");
        plan->add_option("--max-tp", plan_q.max_tp, "Largest tensor-parallel degree to try, e.g. the GPUs of a node")
            ->type_name("N");
        plan->add_option("--search-limit", plan_q.search_limit,
                         "Most pipeline stages the search may measure, counted before it\n"
                         "starts (default 20,000,000: a minute or so); each layout measures\n"
                         "the stages that may hold its peak")
            ->type_name("N");
        const char* pinned = "Pinned (each given restricts the search to it; a comma list to several)";
        for (auto [option, value, what] : {std::tuple{"--dp", &plan_q.dp, "Data-parallel degrees"},
                                           std::tuple{"--tp", &plan_q.tp, "Tensor-parallel degrees"},
                                           std::tuple{"--pp", &plan_q.pp, "Pipeline stages"},
                                           std::tuple{"--cp", &plan_q.cp, "Context-parallel degrees"},
                                           std::tuple{"--ep", &plan_q.ep, "Expert-parallel degrees"},
                                           std::tuple{"--vpp", &plan_q.vpp, "Virtual stages per pipeline rank (interleaved 1F1B)"}})
            plan->add_option(option, *value, std::string(what) + " to try")->group(pinned)->type_name("N[,N...]");
        plan->add_option("--zero", plan_q.zero, "ZeRO stages to try (0-3)")->group(pinned)->type_name("STAGE[,STAGE...]");
        plan->add_option("--schedule", plan_q.schedule,
                         "Pipeline schedules to try: 1f1b, interleaved, zb-h1, zb-v, dualpipe, or all (default:\n"
                         "1f1b,interleaved, which every pipeline framework runs; the others need their own runtimes\n"
                         "and their bubbles are their papers' ideal figures)")
            ->group(pinned)
            ->type_name("NAME[,NAME...]");
        // Offload is searched only when asked for: its host memory is checked only against --host-memory, and the
        // CPU optimiser step's time rests on an assumed host bandwidth, so one that fits only by offloading is not offered unasked.
        plan->add_option("--offload", plan_q.offload,
                         "Offload alternatives to try: none (default), optimizer (with ZeRO 1-3), parameters (with\n"
                         "ZeRO 3), activations (activation offload, as a single estimate's), or one joined with\n"
                         "activations by '+'; e.g. --offload none,optimizer,activations,optimizer+activations")
            ->group(pinned)
            ->type_name("MODE[,MODE...]");
        add_host_memory_option(*plan, plan_q)->group(pinned);
        plan->add_flag("--sp", plan_q.sp, "Only layouts with sequence parallelism")->group(pinned);
        add_stage_options(*plan, plan_q, "Options");
        plan->footer(R"(Enumerates every valid layout: data, tensor, pipeline (1F1B, and interleaved 1F1B with
each vpp that splits a rank's layers evenly, when the micro-batches are a multiple of pp), context and
expert (for mixture-of-experts models) degrees whose product is --gpus, ZeRO stage 0-3, with
--offload the offload alternatives it lists (optimizer with ZeRO 1-3; parameters with ZeRO 3;
activations, alone or as optimizer+activations or parameters+activations, as a single estimate's
--offload; not searched unless asked for, since their host memory is checked only with --host-memory
and the CPU optimiser's time is an assumption's), sequence parallelism on or off, every micro-batch that divides the global batch per replica, and each
recomputation mode; where full recomputation fits and none does not, also the fewest layers per stage
(per model chunk with vpp) whose full recomputation fits, the rest keeping their activations (Megatron-LM's
--recompute-num-layers, block method; a binary search, as the peak falls with each layer recomputed;
--recompute-layers N pins it, and full recomputation with it); with --schedule, the pipeline schedules it
lists (zb-h1, zb-v, dualpipe where their rules allow). --dp, --tp, --pp, --vpp, --schedule, --cp, --ep,
--zero, --offload, --sp, --recompute and -b, given, restrict the search to them.
Without --gpus it tries 1, 2, 3, ... devices (with --gpu: 1, 2, 3, ... of its nodes) up to 16,384
and answers with the first count on which some layout fits.
The search is counted before it starts: one that would measure more pipeline stages than
--search-limit (default 20,000,000; each layout measures the stages that may hold its peak; without
--gpus, every count's layouts) is refused, naming its size.
It keeps those whose most loaded device fits in --device-memory less --reserve and ranks them by
  1. the estimated step time, with --gpu or a --gpu-file that gives the figures (an estimate, not a
     simulation): compute = the step's FLOPs, recomputation included / (GPUs x peak dense bf16
     FLOP/s x 0.4, an assumed model-FLOPs utilisation); plus the schedule's bubble, with F, B and W
     one chunk's forward, full backward and weight-gradient times from the FLOPs (W = F, B = the rest
     of the chunk, recomputation included): 1F1B and interleaved (P-1)(F+B), i.e. (pp - 1) / (micro-
     batches x vpp) of the compute; ZB-H1 (P-1)(F+B-2W); ZB-V 0 (its paper's figure for F = B-W = W,
     applied under recomputation too: optimistic there); DualPipe (P/2-1)(F&B+B-3W) with F&B = F+B; plus every byte a device sends, at its group's bandwidth, none of it
     overlapped: the data-parallel gradient all-reduce, 2 x gradient bytes x (dp - 1) / dp (ZeRO-3:
     also its weight gathers), tensor-parallel all-reduces, context-parallel key/value rings and
     pipeline sends; a group runs at the GPU's intra-node bandwidth when it fits in a node (ranks in
     the order tp, cp, dp, pp), else at its per-GPU network bandwidth; plus offload's host transfers
     at the GPU's host-link (PCIe) bandwidth, none of them overlapped either: optimizer offload moves
     the device's gradient shard to the host and the updated weight shard back each step, parameter
     offload the gradient shard down and the weight shard up for each micro-batch's forward and
     backward, activation offload each micro-batch's kept activations down and back up (from the
     stage that offloads the most; frameworks overlap these copies with compute on a stream of their
     own, so this time leans slow). A GPU without a host-link figure gives such layouts no time. The
     host's optimiser step (ZeRO-Offload's CPUAdam) reads and writes the master copy and the state,
     reads the fp32 gradient shard and writes the weights, at an assumed 20 GB/s of host memory per
     GPU (DeepSpeed's own measurement gives at least 19), not overlapped. Tokens per second per GPU
     are shown beside it;
  2. then wasted compute: recomputation's extra FLOPs plus the pipeline bubble (1F1B: (P-1)/(vM+P-1)),
     as fractions of the step;
  3. then the bytes each device sends per step (host transfers included);
  4. then the peak.
Where pp does not divide the layers, the first and last stages take fewer than the others (Llama 3
405B's 126 layers on 16 stages: 7, 14 x 8, 7; DeepSeek-V3's 61: 2, 14 x 4, 3), unless --first-stage-layers or
--last-stage-layers say otherwise. Every micro-batch after the first holds the gradients of the
step so far (see --grad-buffer). Only the best --top layouts are kept, so memory does not grow with
the cluster.

Examples:
  memcalc plan --preset llama-2-70b --gpus 64 --device-memory 80GB --seq 4096 --global-batch 512
  memcalc plan --preset llama-3-70b --gpu h100-sxm --seq 8192 --global-batch 512 --tp 8)");
    }

    Request serve_q;
    serve_q.reserve = "";  // given, it needs a device: see run_serve
    CLI::App* serve = nullptr;
    if (mentions("serve")) {
        serve = app.add_subcommand("serve", "Serving memory: the weights in a storage format, the KV cache, prefill");
        ModelChoice::add(*serve, serve_q);
        OutputChoice::add(*serve, serve_q);
        serve->add_option("--context", serve_q.context, "Tokens of each sequence, prompt and output (required)")
            ->type_name("N");
        serve->add_option("--batch", serve_q.batch, "Sequences served at once (default 1)")->type_name("B");
        serve->add_option("--weights", serve_q.weights,
                          "How the linear layers are stored: bf16 (default), fp8 (a scale per matrix), int8 (a\n"
                          "scale per output channel), int4 (AWQ/GPTQ: a scale and a zero point per 128 inputs)")
            ->type_name("FORMAT");
        serve->add_option("--kv-dtype", serve_q.kv_dtype, "The KV cache's dtype: bf16 (default), fp16, fp8, fp8-e5m2, fp32")
            ->type_name("DTYPE");
        serve->add_option("--tp", serve_q.tp, "Tensor-parallel ranks: heads, MLP columns and vocabulary split (default 1)")
            ->type_name("N");
        serve->add_option("--block-size", serve_q.block_size, "Tokens per KV-cache block, each sequence rounded up (default 16)")
            ->type_name("N");
        serve->add_option("--prefill-chunk", serve_q.prefill_chunk,
                          "Most tokens one forward takes (chunked prefill; default 8192)")
            ->type_name("N");
        add_device_options(*serve, serve_q, "The device's memory: with it, the KV cache capacity and the largest batch");
        serve->add_option("--reserve", serve_q.reserve, "Memory the engine keeps for itself (default 2GiB)")
            ->type_name("SIZE");
        serve->footer(R"(Per tensor-parallel rank: the weights (linear layers in --weights' format; embeddings, norms,
routers and the head in bf16), the KV cache (k and v of every layer's key/value heads for each
token, each sequence rounded up to whole blocks; with fewer key/value heads than ranks each rank
keeps a whole head), and the activations of one forward of a prefill chunk (the residual stream,
the larger of attention's q, k, v and output and the MLP's hidden tensors, and the last tokens'
logits). With --device-memory or --gpu: whether it fits, the KV cache capacity in tokens beside the
weights and activations, and the largest batch at --context.

Examples:
  memcalc serve --preset llama-3-8b --context 8192 --batch 16
  memcalc serve --preset llama-3-70b --context 32768 --batch 8 --tp 8 --gpu h100-sxm
  memcalc serve --preset llama-3-70b --context 8192 --weights int4 --kv-dtype fp8 --device-memory 48GB --format json)");
    }

    // The catalogues: each a subcommand with only --format, made when the command line names it.
    std::string list_format = "table";
    const auto catalogue = [&](const char* name, const char* help) -> CLI::App* {
        if (!mentions(name)) return nullptr;
        CLI::App* command = app.add_subcommand(name, help);
        command->add_option("--format", list_format, "table (default), json or csv")->check(CLI::IsMember(formats));
        return command;
    };
    CLI::App* presets = catalogue("presets", "List the built-in models with their parameter counts");
    CLI::App* recipes_cmd = catalogue("recipes", "List the training recipes (bytes per parameter)");
    CLI::App* profiles_cmd = catalogue("profiles", "List the framework profiles (what --profile sets)");
    CLI::App* gpus_cmd = catalogue("gpus", "List the GPUs --gpu names, with their memory as the driver reports it");
    CLI::App* functions_cmd = catalogue("activation-functions",
                                        "List the MLP's activation functions: the code each runs, what autograd keeps");
    const auto parsed = [](const CLI::App* command) { return command != nullptr && command->parsed(); };

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e, out_stream, err_stream);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e, out_stream, err_stream);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e, out_stream, err_stream);
    } catch (const CLI::ParseError& e) {
        err_stream << "memcalc: " << printable(e.what()) << " (see memcalc --help)\n";
        return exit_usage_error;
    }

    try {
        // An empty value ("--seq ''") is a mistake, not the option's absence.
        for (const CLI::App* command : {&app, fit, plan, serve, presets, recipes_cmd, profiles_cmd, gpus_cmd, functions_cmd}) {
            if (command == nullptr) continue;
            for (const CLI::Option* option : command->get_options())
                if (option->count() > 0 && option->get_type_size() != 0)
                    for (const std::string& value : option->results())
                        if (value.empty()) throw usage_error(fmt::format("{} needs a value (got '')", option->get_name()));
        }
        // Options of the estimate given before a subcommand would be silently ignored: refuse them.
        for (const CLI::App* sub : {fit, plan, serve, presets, recipes_cmd, profiles_cmd, gpus_cmd, functions_cmd}) {
            if (!parsed(sub)) continue;
            for (const CLI::Option* option : app.get_options())
                if (option->count() > 0)
                    throw usage_error(fmt::format("{} comes before '{}', which does not see it: put it after the subcommand",
                                                  option->get_name(), sub->get_name()));
        }
        // The whole output is built before any of it is printed, so a failure prints nothing on stdout
        // and writes no file.
        std::vector<PendingFile> files;
        const Request& used = parsed(fit) ? fit_q : parsed(plan) ? plan_q : parsed(serve) ? serve_q : q;
        Spool out;
        if (parsed(presets)) out.append(run_presets(list_format));
        else if (parsed(recipes_cmd)) out.append(run_recipes(list_format));
        else if (parsed(profiles_cmd)) out.append(run_profiles(list_format));
        else if (parsed(gpus_cmd)) out.append(run_gpus(list_format));
        else if (parsed(functions_cmd)) out.append(run_activation_functions(list_format));
        else if (parsed(fit)) out.append(run_fit(fit_q));
        else if (parsed(plan)) out.append(run_plan(plan_q));
        else if (parsed(serve)) out.append(run_serve(serve_q));
        else run_estimate(q, out, files);
        if (used.output.empty()) files.push_back({"", "-", "", &out});  // the report, on stdout
        else files.push_back({"--output", used.output, "", &out});
        const PendingFile* printed = write_files(files);  // the one for stdout, if any
        if (printed == nullptr) return 0;
        const bool read = printed->each_chunk([&out_stream](std::string_view chunk) {
            out_stream.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
        });
        out_stream.flush();
        if (!read) throw error("cannot read back the spooled output");
        if (!out_stream) {
            err_stream << "memcalc: cannot write to standard output: " << std::strerror(errno) << "\n";
            return exit_input_error;
        }
        return 0;
    } catch (const usage_error& e) {  // messages quote the user's values: printed escaped
        err_stream << "memcalc: " << printable(e.what()) << "\n";
        return exit_usage_error;
    } catch (const memcalc::error& e) {
        err_stream << "memcalc: " << printable(e.what()) << "\n";
        return exit_input_error;
    } catch (const std::exception& e) {
        err_stream << "memcalc: internal error: " << printable(e.what()) << "\n";
        return exit_input_error;
    }
}
