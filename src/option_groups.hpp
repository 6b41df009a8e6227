#pragma once
// The groups of options the commands compose (arguments.hpp's structs), registered in --help's
// order: `add_group` registers a group on a CLI::App, or only its names on a NameRecorder (so the
// estimate builds a group only when the command line uses it: add_groups_used).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "commands.hpp"
#include "model_file.hpp"
#include "memcalc/compare.hpp"
#include "memcalc/memcalc.hpp"

namespace memcalc::cli {

/// --config's help: every model_type the reader knows (its table's), wrapped as the rest is.
inline std::string config_help() {
    std::string text, line = "A HuggingFace config.json (model_type";
    const std::vector<std::string> types = supported_model_types();
    for (std::size_t i = 0; i < types.size(); ++i) {
        const std::string word = types[i] + (i + 2 < types.size()   ? ","
                                             : i + 1 < types.size() ? " or"
                                                                    : "),");
        if (line.size() + 1 + word.size() > 90) text += line + "\n", line.clear();
        line += (line.empty() ? "" : " ") + word;
    }
    return text + line +
           " or a downloaded model folder\nholding one: its model.safetensors.index.json or "
           "safetensors headers are then checked\nagainst memcalc's count";
}

/// Which model.
template <class App>  // a CLI::App, or a NameRecorder
void add_group(App& app, ModelOptions& q) {
    auto* preset = app.add_option("--preset", q.preset, "A built-in model: see 'memcalc presets'")
                       ->type_name("NAME");
    auto* model_file = app.add_option("--model-file", q.model_file,
                                      "A model described in JSON (keys as in presets/*.json)")
                           ->excludes(preset)
                           ->type_name("PATH");
    app.add_option("--config", q.config, config_help())
        ->excludes(preset)
        ->excludes(model_file)
        ->type_name("PATH|DIR");
    // How the model's code is written: each overrides the model's (see 'memcalc program-facts').
    for_each_program_fact([&](const auto& row) {
        const std::string key(row.key);
        app.template add_option_function<std::string>(
               row.option(), [&q, key](const std::string& text) { q.program[key] = text; },
               std::string(row.help) + "\n(model-file key " + key + ")")
            ->type_name(row.values.size() == 2 && row.find("true") ? "BOOL" : "KIND");
    });
    app.add_option("--expert-imbalance", q.expert_imbalance,
                   "A mixture-of-experts model's busiest expert: its routed token-slots over the\n"
                   "even share s b k / E, every expert counted at it (default 1: an even load,\n"
                   "memcalc's assumption). A capacity factor with padding (Megatron-LM's\n"
                   "--moe-expert-capacity-factor) is it exactly; it bounds an uneven dropless\n"
                   "router from above (model-file key expert_imbalance)")
        ->type_name("F");
    app.add_option("--mtp-layers", q.mtp_layers,
                   "Multi-token prediction's modules after the last layer, on the last pipeline\n"
                   "stage (DeepSeek-V3's 1; Megatron-LM's --mtp-num-layers): each a layer of the\n"
                   "last kind with its norms and eh_proj, and the head and loss again (default 0;\n"
                   "model-file key mtp_layers)")
        ->type_name("N");
}

/// The sequence, the micro-batch, the recomputation.
template <class App>
void add_group(App& app, StepOptions& q) {
    app.add_option("--seq", q.seq,
                   "Sequence length s, or a comma list to sweep (default: the model's "
                   "max_positions)")
        ->type_name("S[,S...]");
    app.add_option("-b,--micro-batch", q.micro_batch,
                   "Sequences per step per device b, or a comma list (default: 1)")
        ->type_name("B[,B...]");
    app.add_option("--recompute", q.recompute,
                   "Activation recomputation: none, selective, full, op (torchtitan's per-op "
                   "policy, with\n--activations architecture), a comma list, or all "
                   "(none,selective,full; default: none)")
        ->type_name("MODE[,MODE...]");
    app.add_option("--recompute-modules", q.recompute_modules,
                   "With --recompute selective: what it checkpoints, Megatron-LM's "
                   "recompute_modules\n(core_attn, mlp, moe_act, layernorm, moe, shared_experts, "
                   "mla_up_proj; default: core_attn)")
        ->type_name("MODULE[,MODULE...]");
    app.add_option("--recompute-layers", q.recompute_layers,
                   "With --recompute full: recompute only the first N layers of each pipeline "
                   "stage (each\nmodel chunk with --vpp), the others keeping every activation, "
                   "as Megatron-LM's\n--recompute-method block --recompute-num-layers N; "
                   "all: every layer (the\ndefault; plan then searches no fewer, as for a "
                   "program that checkpoints each layer)")
        ->type_name("N|all");
    app.add_option("--images", q.images,
                   "Images in each micro-batch, through the model's vision tower (with\n"
                   "--image-size, but for a tower of one size: Gemma 3's; --seq counts every\n"
                   "token, the images' among them)")
        ->type_name("N");
    app.add_option("--image-size", q.image_size,
                   "Each image's size in pixels, as the processor resizes it: each side to the\n"
                   "nearest multiple of patch x merge (Gemma 3's: its image_size square)")
        ->type_name("WxH");
}

/// LLaMA-Adapter's prompt (--train adapter).
template <class App>
void add_prompt_options(App& app, TrainingOptions& q) {
    app.add_option("--adapter-prompt-tokens", q.prompt_tokens,
                   "--train adapter (or v2): the learned prompt's tokens in each adapted layer "
                   "(default:\n10, lit-gpt's adapter_prompt_length)")
        ->type_name("N");
    app.add_option("--adapter-start-layer", q.prompt_start,
                   "--train adapter (or v2): the first layer with a prompt, from 0 (default: 2,\n"
                   "lit-gpt's adapter_start_layer)")
        ->type_name("N");
}

/// Fine-tuning: what trains.
template <class App>
void add_group(App& app, TrainingOptions& q) {
    app.add_option("--train", q.train,
                   "What trains: full (default), frozen (all but --frozen PARTS), lora (low-rank "
                   "adapters\nbeside a frozen base, as peft's LoRA), qlora (the same over 4-bit "
                   "NF4 base linears,\nbitsandbytes' double quantisation), adapter (LLaMA-Adapter: "
                   "a gated prompt per layer,\nlit-gpt's adapter.py), adapter-v2 (that, a trained "
                   "scale and bias on every linear,\nthe norms trained: adapter_v2.py); qadapter, "
                   "qadapter-v2 over a 4-bit base. Not full:\n--activations architecture by "
                   "default")
        ->type_name("MODE");
    app.add_option("--frozen", q.frozen,
                   "Parts that keep their weights alone (no gradient, master copy or optimiser "
                   "state):\nembeddings, attention, mlp, router, norms, head, vision, all, or "
                   "tensor names (q_proj, ...)")
        ->type_name("PART[,PART...]");
    app.add_option("--lora-rank", q.lora_rank, "LoRA's rank r (default: 8, peft's)")
        ->type_name("R");
    app.add_option("--lora-targets", q.lora_targets,
                   "The linears LoRA adapts, by name as peft matches them, or all-linear (every "
                   "layer's;\ndefault: q_proj,v_proj, peft's for LLaMA)")
        ->type_name("NAME[,NAME...]");
    app.add_option("--lora-dropout", q.lora_dropout,
                   "lora_dropout: above 0 each adapter keeps its dropped-out input and mask "
                   "(default: 0.05;\npeft's 0 keeps neither)")
        ->type_name("P");
    app.add_option("--lora-dtype", q.lora_dtype,
                   "The adapters' dtype: fp32 (default: peft's autocast_adapter_dtype beside a "
                   "16-bit model;\neach adapter then casts its input to fp32) or bf16/fp16 (the "
                   "model's own)")
        ->type_name("DTYPE");
    app.add_option("--lora-variant", q.lora_variant,
                   "lora (default) or dora (peft's use_dora): a trained magnitude vector per "
                   "adapted linear,\nthe norm of W + B A made in each forward, and the base "
                   "output kept beside the adapter's\n(kept tensors measured; the norm's and "
                   "backward's workspaces assumed, leaning high), or merged (lit-gpt's "
                   "LoRAQKVLinear,\nloralib's MergedLinear): on a fused linear one adapter for "
                   "the parts targeted\n(--lora-targets q_proj,v_proj of a fused q/k/v), its "
                   "output zero-padded into the fused one")
        ->type_name("VARIANT");
    app.add_option("--qlora-quantizer", q.quantizer,
                   "Who makes QLoRA's 4-bit base: transformers (default: BitsAndBytesConfig, "
                   "every linear but\nthe head) or lightning (Fabric's BitsandbytesPrecision, "
                   "lit-gpt's and LitGPT's: the head too,\neach weight quantised from fp16, so "
                   "dequantised to fp16 and cast to the compute dtype)")
        ->type_name("NAME");
    app.add_option("--qlora-double-quant", q.double_quant,
                   "true (default: bnb_4bit_use_double_quant, bnb.nf4-dq) quantises the absmax "
                   "scales to int8;\nfalse keeps one fp32 absmax per 64 values (bnb.nf4)")
        ->type_name("BOOL");
    app.add_option("--bitsandbytes-version", q.bitsandbytes_version,
                   "The bitsandbytes release: before 0.43.2 each 4-bit linear keeps its input "
                   "for backward,\nheld by autograd's graph until the loop drops its loss; before "
                   "0.43.0 it is quantised\nfrom fp16 (default: 0.43.2 and later)")
        ->type_name("VERSION");
    add_prompt_options(app, q);
}

/// The recipe.
template <class App>
void add_group(App& app, RecipeOptions& q) {
    auto* recipe = app.add_option("--recipe", q.recipe,
                                  "Bytes per parameter: see 'memcalc recipes' (default: "
                                  "mixed-adam)")
                       ->type_name("NAME");
    app.add_option("--recipe-file", q.recipe_file,
                   "A recipe of your own in JSON: name, weights, gradients, master, activations "
                   "(dtypes) and\noptimizer, as 'memcalc recipes --format json' prints each "
                   "built-in one")
        ->excludes(recipe)
        ->type_name("PATH");
}

/// The activation model and the attention kernels.
template <class App>
void add_group(App& app, ActivationOptions& q) {
    app.add_option("--activations", q.activations,
                   "Per-layer activations: korthikanti (the chapter's formula, default) or "
                   "architecture\n(the tensors PyTorch keeps for this architecture, op by op; "
                   "the default where a setting\nor the model needs it: --train, flash "
                   "attention, autocast, MoE)")
        ->check(CLI::IsMember({"korthikanti", "architecture"}));
    app.add_option("--attention", q.attention,
                   "eager (default: the s x s scores are stored), flash or sdpa (a fused kernel "
                   "keeps a\nlog-sum-exp per row instead: flash-attn's, or PyTorch's "
                   "scaled_dot_product_attention,\nwhose caller may repeat k and v: "
                   "--repeat-kv), or a comma list")
        ->type_name("KIND[,KIND...]");
}

/// Units, format, file.
template <class App>
void add_group(App& app, OutputOptions& q) {
    const std::vector<std::string> formats = {"table", "json", "csv"};
    app.add_option("--units", q.units, "gb (10^9 bytes, the default) or gib (2^30)")
        ->check(CLI::IsMember({"gb", "gib"}, CLI::ignore_case))
        ->transform(CLI::detail::to_lower);
    app.add_option("--format", q.format, "table (default), json or csv")
        ->check(CLI::IsMember(formats));
    app.add_option("--output", q.file,
                   "Write the result to this file instead of stdout, atomically: a failed run "
                   "leaves no file")
        ->type_name("FILE");
}

/// The framework's side of the model: its kernels and its optimiser step.
template <class App>
void add_group(App& app, FrameworkOptions& q) {
    auto* profile = app.add_option("--profile", q.profile,
                                   "The training framework: see 'memcalc profiles' (default: "
                                   "default, the chapter's).\nIt sets --attention, --platform, "
                                   "--optimizer-impl, --grad-buffer, --loss and --logits;\neach "
                                   "given overrides it")
                        ->type_name("NAME");
    app.add_option("--profile-file", q.profile_file,
                   "A profile of your own in JSON: name, platform, attention, optimizer_impl, "
                   "grad_buffer,\nloss and logits, as 'memcalc profiles --format json' prints "
                   "each built-in one (a key\nleft out: default's)")
        ->excludes(profile)
        ->type_name("PATH");
    for_each_switch([&](const auto& row) {
        if (row.help.empty()) return;  // --attention: a comma list, with the activation options
        const std::string key(row.key);
        app.template add_option_function<std::string>(
               row.option(), [&q, key](const std::string& text) { q.framework[key] = text; },
               std::string(row.help))
            ->type_name("KIND");
    });
    app.add_option("--loss-chunks", q.loss_chunks,
                   "With --loss chunked or chunked-compiled: the chunks the tokens are split\n"
                   "into (torchtune's num_output_chunks; default 8)")
        ->type_name("N");
    app.add_option("--loss-chunk-tokens", q.loss_chunk_tokens,
                   "With a chunked --loss: chunks of N tokens of each sequence instead, the last\n"
                   "one shorter (lit-gpt's lm_head_chunk_size: 128)")
        ->type_name("N");
    app.add_option(
           "--cublas-workspace-config", q.cublas_workspace_config,
           "The program's CUBLAS_WORKSPACE_CONFIG, which sizes PyTorch's cuBLAS workspaces\n"
           "(':4096:8', Megatron-LM's tests': 32 MiB each); unset: the GPU's default")
        ->type_name("SPEC");
}

/// The device: its memory given (--device-memory), or a GPU's by name or file, a margin, and the
/// caching allocator's settings.
template <class App>
void add_device_options(App& app, DeviceOptions& q, const char* memory_help) {
    auto* memory =
        app.add_option("--device-memory", q.device_memory, memory_help)->type_name("SIZE");
    auto* gpu = app.add_option("--gpu", q.gpu,
                               "A GPU's memory as its driver reports it: see 'memcalc gpus' "
                               "(h100-sxm, ...)")
                    ->excludes(memory)
                    ->type_name("NAME");
    app.add_option("--gpu-file", q.gpu_file,
                   "A GPU of your own in JSON: name and memory_bytes, as 'memcalc gpus --format "
                   "json' prints;\nits speeds (peak_bf16_flops, intra_node_bytes_per_second, ...) "
                   "optional, for plan's times")
        ->excludes(memory)
        ->excludes(gpu)
        ->type_name("PATH");
    app.add_option("--reserve", q.reserve,
                   "A margin kept out of the device's memory beyond what memcalc models (the "
                   "context,\nworkspaces, communicators, CUDA graphs and fragmentation are): "
                   "default 0")
        ->type_name("SIZE");
    app.add_option("--allocator", q.allocator,
                   "PyTorch's CUDA allocator: caching (the default) or expandable "
                   "(expandable_segments:True)")
        ->type_name("KIND");
    app.add_option("--max-split-size", q.max_split_size,
                   "The allocator's max_split_size_mb as a size (256MiB): larger cached blocks "
                   "are not split")
        ->type_name("SIZE");
}

/// --host-memory: what offload may fill of each device's host memory, checked where given.
template <class App>
auto* add_host_memory_option(App& app, ParallelOptions& q) {
    return app
        .add_option("--host-memory", q.host_memory,
                    "Host memory each device may fill with what --offload moves there: its node's "
                    "memory over\nits GPUs (a DGX H100: 2TB / 8 = 250GB). Checked where given; "
                    "without it, not")
        ->type_name("SIZE");
}

/// Uneven pipeline stages, for estimate, fit and plan.
template <class App>
void add_stage_options(App& app, ParallelOptions& q, const char* group) {
    app.add_option("--first-stage-layers", q.first_stage_layers,
                   "Layers of the first pipeline stage, when it differs (Megatron-LM's\n"
                   "decoder-first-pipeline-num-layers); the other stages split the rest evenly.\n"
                   "Interleaved: the first rank's, in vpp equal chunks; DualPipe and ZB-V: the\n"
                   "model's first chunk. Where pp does not divide the layers and neither is\n"
                   "given, the first and last stages take fewer (an assumption the estimate "
                   "notes)")
        ->group(group)
        ->type_name("N");
    app.add_option("--last-stage-layers", q.last_stage_layers,
                   "Layers of the last pipeline stage, when it differs "
                   "(decoder-last-pipeline-num-layers)")
        ->group(group)
        ->type_name("N");
}

inline constexpr const char* parallel_group = "Parallelism (per-device memory)";

/// The degrees, ZeRO and the pipeline schedule: the first half of the parallelism group.
template <class App>
void add_parallel_degrees(App& app, ParallelOptions& q) {
    app.add_option("--dp", q.dp,
                   "Data-parallel replicas (default 1); --dp, --tp, --pp and --zero take comma "
                   "lists")
        ->group(parallel_group)
        ->type_name("N[,N...]");
    app.add_option("--zero", q.zero,
                   "ZeRO stage: 0 none, 1 optimiser state, 2 + gradients, 3 + weights (FSDP full "
                   "sharding)")
        ->group(parallel_group)
        ->type_name("STAGE[,STAGE...]");
    app.add_option("--shard-group", q.shard_group,
                   "Hybrid sharding: shard within groups of this many dp ranks")
        ->group(parallel_group)
        ->type_name("M");
    app.add_option("--tp", q.tp, "Tensor-parallel ranks (Megatron-LM column/row splits)")
        ->group(parallel_group)
        ->type_name("N[,N...]");
    app.add_flag("--sp", q.sp,
                 "Sequence parallelism with --tp: norms, dropout and linear inputs split too")
        ->group(parallel_group);
    app.add_option("--pp", q.pp, "Pipeline stages (schedule: see --schedule)")
        ->group(parallel_group)
        ->type_name("N[,N...]");
    app.add_option("--vpp", q.vpp, "Virtual stages per pipeline rank (interleaved 1F1B)")
        ->group(parallel_group)
        ->type_name("V");
    app.add_option("--schedule", q.schedule,
                   "Pipeline schedule (default 1f1b; interleaved when --vpp > 1): 1f1b, "
                   "interleaved (--vpp\nchunks per rank), zb-h1 (W deferred: every stage holds "
                   "pp micro-batches), zb-v (2 chunks\nper rank in a V, 2 pp chunks in flight on "
                   "every rank), dualpipe (each rank holds stages k and\npp-1-k: twice the "
                   "weights, gradients and optimiser state; pp + 1 stages' activations;\nneeds "
                   "an even pp). zb-v and dualpipe need micro-batches >= 2 pp (dualpipe: even). "
                   "A\nmicro-batch counts as live until its deferred weight-gradient pass (W) "
                   "ends, as the papers\ncount, and as what W reads (the linears' inputs and "
                   "their outputs' gradients) where that is\nmore, as under recomputation: "
                   "leaning high (README)")
        ->group(parallel_group)
        ->type_name("NAME");
}

/// Uneven stages, context and expert ranks, the batch and offload: the parallelism group's rest.
template <class App>
void add_parallel_rest(App& app, ParallelOptions& q) {
    add_stage_options(app, q, parallel_group);
    app.add_option("--cp", q.cp, "Context-parallel ranks: the sequence split across them")
        ->group(parallel_group)
        ->type_name("N");
    app.add_option("--ep", q.ep,
                   "Expert-parallel ranks for mixture-of-experts models (divides --dp)")
        ->group(parallel_group)
        ->type_name("N");
    app.add_option("--etp", q.etp,
                   "Expert tensor-parallel ranks: the experts' weights and hidden activations\n"
                   "split over them instead of --tp (Megatron-LM's; default: --tp)")
        ->group(parallel_group)
        ->type_name("N");
    app.add_option("--microbatches", q.microbatches,
                   "Micro-batches per step (gradient accumulation; default: --pp, which fills "
                   "the pipeline);\nfrom the second on, the gradients of the first are held "
                   "(see --grad-buffer)")
        ->group(parallel_group)
        ->type_name("M");
    app.add_option("--global-batch", q.global_batch,
                   "Sequences per step: sets --microbatches = G / (micro-batch x dp)")
        ->group(parallel_group)
        ->type_name("G");
    app.add_option("--offload", q.offload,
                   "ZeRO-Offload, as DeepSpeed runs it: none (default), optimizer (needs --zero "
                   "1-3: the master\ncopy, the optimiser state and an fp32 copy of the gradient "
                   "shard in host memory, where the\nCPU steps them; with --zero 2 or 3 the "
                   "device keeps only the gradient bucket in flight), or\nparameters (that and "
                   "the weights; needs --zero 3). Or activations: each layer's saved\ntensors "
                   "(its checkpoint under --recompute full) go to host memory after its forward "
                   "and\ncome back for its backward, the device keeping the layer computing and "
                   "the one in transit\n(the other micro-batches in flight: one layer each); "
                   "alone or joined with '+', e.g.\noptimizer+activations. The host figure "
                   "counts what was moved (see --host-memory)")
        ->group(parallel_group)
        ->type_name("MODE");
    add_host_memory_option(app, q)->group(parallel_group);
    app.add_option("--loading", q.loading,
                   "How the model is loaded before the first step: to-device (the default "
                   "unsharded),\nhost-then-move, fsdp1 (the default with --zero 3), fsdp1-rank0, "
                   "fsdp2-on-device or\nfsdp2-meta (docs/training-memory.md, Loading)")
        ->group(parallel_group)
        ->type_name("METHOD");
    app.add_option("--gpus-per-node", q.gpus_per_node,
                   "GPUs per node, for --compare deepspeed and loading's host memory (default 8)")
        ->group(parallel_group)
        ->type_name("N");
}

/// How the step is spread over devices.
template <class App>
void add_group(App& app, ParallelOptions& q) {
    add_parallel_degrees(app, q);
    add_parallel_rest(app, q);
}

/// What the estimate's report also shows or writes.
template <class App>
void add_group(App& app, ReportOptions& q) {
    app.add_option("--compare", q.compare,
                   fmt::format("Also show what another tool gives for this configuration: "
                               "megatron (Megatron-LM's\ntheoretical memory formula, as on its "
                               "{}) or deepspeed\n(its ZeRO-2/3 model-state estimators, as on "
                               "its {})",
                               megatron_follows, deepspeed_follows))
        ->check(CLI::IsMember({"megatron", "deepspeed"}));
    app.add_option("--plot", q.plot,
                   "Also draw an SVG: the timeline as stacked areas by category, or for a sweep "
                   "the peak\nagainst the swept size, one line per recomputation mode")
        ->type_name("FILE.svg");
    app.add_option("--sweep-limit", q.sweep_limit,
                   "Most configurations a sweep's lists may make (default 1,000,000)")
        ->type_name("N");
    add_device_options(app, q.device,
                       "A device's memory (80GB, 24GiB): drawn in plots, checked in the report");
    app.add_flag("--timeline", q.timeline,
                 "Show every step of the timeline, not only the first and last of each phase");
    app.add_flag("--per-layer", q.per_layer, "Show only the per-layer activation table (op by op)");
    app.add_flag("--ops", q.ops,
                 "Also show one layer's op tape: each event (alloc, save, free, rebuild, run) "
                 "with\nits op, tensor, bytes and the layer's live bytes after it, on one rank");
}

/// The model and the run: the groups every command that estimates a training step takes.
template <class App>
void add_training_step_groups(App& app, TrainingStepOptions& q) {
    add_group(app, q.model);
    add_group(app, q.step);
    add_group(app, q.recipe);
    add_group(app, q.training);
    add_group(app, q.activation);
    add_group(app, q.output);
    add_group(app, q.framework);
}

/// Stands in for a CLI::App to learn, at no cost, the names a group of options would register:
/// each option records its names, every call chained to it does nothing.
class NameRecorder {
public:
    struct Chain {
        template <class... A>
        Chain* type_name(A&&...) {
            return this;
        }
        template <class... A>
        Chain* excludes(A&&...) {
            return this;
        }
        template <class... A>
        Chain* check(A&&...) {
            return this;
        }
        template <class... A>
        Chain* transform(A&&...) {
            return this;
        }
        template <class... A>
        Chain* group(A&&...) {
            return this;
        }
    };
    template <class... A>
    Chain* add_option(const std::string& names, A&&...) {
        return record(names);
    }
    template <class... A>
    Chain* add_flag(const std::string& names, A&&...) {
        return record(names);
    }
    template <class T, class... A>
    Chain* add_option_function(const std::string& names, A&&...) {
        return record(names);
    }

    /// Whether `tokens` (the command line's option names) name any of them.
    bool named_in(const std::vector<std::string>& tokens) const {
        for (const auto& t : tokens)
            if (knows(t)) return true;
        return false;
    }
    bool knows(const std::string& token) const {
        return std::find(names_.begin(), names_.end(), token) != names_.end();
    }

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

/// The names a group of options registers, into `recorder`.
template <class Group>
void record_names(NameRecorder& recorder) {
    Group unused;
    add_group(recorder, unused);
}

/// Registers each of `groups` (in order, so --help reads the same) only when the command line
/// names one of its options (`tokens`), asks for help, or names an option none of them knows
/// (which CLI11 then reports as it always has): CLI11 checks each new option's names against
/// every earlier one's, so building the whole tree was most of a run's start-up.
/// Returns whether every group was built (help, or an option none of them knows).
template <class... Groups>
bool add_groups_used(CLI::App& app, const std::vector<std::string>& tokens, Groups&... groups) {
    std::array<NameRecorder, sizeof...(Groups)> names;
    std::size_t i = 0;
    (record_names<Groups>(names[i++]), ...);
    bool every_group = false;
    for (const auto& t : tokens) {
        const bool known =
            t == "--version" || std::any_of(names.begin(), names.end(),
                                            [&](const NameRecorder& n) { return n.knows(t); });
        every_group = every_group || t == "-h" || t == "--help" || !known;
    }
    i = 0;
    ((every_group || names[i].named_in(tokens) ? add_group(app, groups) : void(), ++i), ...);
    return every_group;
}

}  // namespace memcalc::cli
