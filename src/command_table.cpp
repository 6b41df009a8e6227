// The rows of memcalc's command table (command_table.hpp): each command's help, the function that
// registers its options (composed of option_groups.hpp's groups) and the one that runs it.
#include "command_table.hpp"

#include <CLI/CLI.hpp>

#include <initializer_list>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "commands.hpp"
#include "option_groups.hpp"

namespace memcalc::cli {
namespace {

const char* const estimate_summary =
    "memcalc: how much device memory one training step of a transformer language model takes,\n"
    "from the architecture alone, exactly: parameters, training state, saved activations,\n"
    "and the peak over the step's timeline.";

const char* const estimate_footer =
    "Examples:\n"
    "  memcalc --preset llama-7b --seq 4096 --recompute selective\n"
    "  memcalc --preset llama-7b --seq 4096 --recompute full --timeline\n"
    "  memcalc --preset llama-7b --seq 4096 --format json\n"
    "  memcalc --preset llama-2-70b --seq 1024,2048,4096 --recompute all --format csv\n"
    "  memcalc --model-file my-model.json --seq 2048 --micro-batch 4 --units gib\n"
    "  memcalc --config Llama-2-7b-hf/config.json --seq 4096 --recompute full\n"
    "  memcalc --config Llama-2-7b-hf --seq 4096\n"
    "  memcalc --preset llama-3-8b --seq 8192 --activations architecture --attention flash "
    "--per-layer\n"
    "  memcalc --preset llama-2-70b --seq 4096 --tp 8 --sp --pp 4 --dp 2 --zero 1 "
    "--global-batch 128 --recompute selective\n"
    "  memcalc --preset llama-7b --seq 4096 --recompute selective --microbatches 4 "
    "--grad-buffer persistent\n"
    "  memcalc --preset llama-3.1-405b --seq 8192 --tp 8 --pp 16 --dp 8 --zero 1 "
    "--first-stage-layers 7 --last-stage-layers 7\n"
    "  memcalc --preset llama-7b --seq 4096 --activations architecture --profile megatron "
    "--recipe mixed-adam-fp32-grads\n"
    "  memcalc --preset llama-3-8b --seq 2048 --train qlora --lora-rank 16 --lora-targets "
    "all-linear --recompute full\n"
    "  memcalc --preset llama-7b --seq 2048 --train lora --lora-rank 8 --lora-targets "
    "q_proj,v_proj\n"
    "  memcalc --preset llama-7b --seq 2048 --train frozen --frozen embeddings,attention\n"
    "  memcalc fit --preset llama-3-70b --train qlora --lora-targets all-linear --recompute "
    "full --device-memory 48GB\n"
    "  memcalc serve --preset llama-3-70b --context 32768 --batch 8 --tp 8 --gpu h100-sxm\n"
    "  memcalc presets\n"
    "  memcalc recipes\n"
    "  memcalc profiles\n"
    "  memcalc gpus\n"
    "  memcalc activation-functions\n"
    "\n"
    "Exit status: 0 on success, 1 for a bad model (preset, model file, sizes that overflow),\n"
    "2 for a bad command line. Errors are one line on stderr; nothing is printed on stdout "
    "then.";

const char* const fit_footer =
    "Searches the sequence length at --micro-batch (default 1), or, when --seq is given, the\n"
    "micro-batch at that sequence; for each --recompute mode (default: all three). The peak "
    "never falls\n"
    "as either grows, so the search doubles, then bisects, and reports the largest size that "
    "fits, its\n"
    "peak and headroom, and the next size up, which does not. With --seq and --global-batch it "
    "tries each\n"
    "micro-batch that divides the global batch per replica, with the micro-batches per step "
    "that implies\n"
    "(fewer, larger ones can fit where more, smaller ones hold gradients that do not).\n"
    "\n"
    "Examples:\n"
    "  memcalc fit --preset llama-7b --device-memory 80GB --recompute selective\n"
    "  memcalc fit --preset llama-7b --gpu h100-sxm --recompute selective\n"
    "  memcalc fit --preset llama-3-8b --device-memory 80GB --seq 8192 --activations "
    "architecture --attention flash\n"
    "  memcalc fit --preset llama-2-70b --device-memory 80GB --tp 8 --sp --dp 8 --zero 1 "
    "--multiple-of 1024";

const char* const plan_footer =
    "Enumerates every valid layout: data, tensor, pipeline (1F1B, and interleaved 1F1B with\n"
    "each vpp that splits a rank's layers evenly, when the micro-batches are a multiple of "
    "pp; uneven\n"
    "stages interleave where the ends are a layer short, the embedding and the loss counted "
    "as layers), context and\n"
    "expert (for mixture-of-experts models) degrees whose product is --gpus, ZeRO stage 0-3, "
    "with\n"
    "--offload the offload alternatives it lists (optimizer with ZeRO 1-3; parameters with "
    "ZeRO 3;\n"
    "activations, alone or as optimizer+activations or parameters+activations, as a single "
    "estimate's\n"
    "--offload; not searched unless asked for, since their host memory is checked only with "
    "--host-memory\n"
    "and the CPU optimiser's time is an assumption's), sequence parallelism on or off, every\n"
    "micro-batch that divides the global batch per replica, and each\n"
    "recomputation mode; where full recomputation fits and none does not, also the fewest "
    "layers per stage\n"
    "(per model chunk with vpp) whose full recomputation fits, the rest keeping their "
    "activations (Megatron-LM's\n"
    "--recompute-num-layers, block method; a binary search, as the peak falls with each layer "
    "recomputed;\n"
    "--recompute-layers N pins it, and full recomputation with it); with --schedule, the "
    "pipeline schedules it\n"
    "lists (zb-h1, zb-v, dualpipe where their rules allow). --dp, --tp, --pp, --vpp, "
    "--schedule, --cp, --ep,\n"
    "--zero, --offload, --sp, --recompute and -b, given, restrict the search to them.\n"
    "Without --gpus it tries 1, 2, 3, ... devices (with --gpu: 1, 2, 3, ... of its nodes) up "
    "to 16,384\n"
    "and answers with the first count on which some layout fits.\n"
    "The search runs at most --time-limit seconds (default 10): past them plan shows the best "
    "layouts\nfound so far and the fraction of the search evaluated. Given --search-limit, a "
    "search that would\nmeasure more pipeline stages (each layout those that may hold its peak; "
    "without --gpus, every\ncount's) is refused before it starts, naming its size.\n"
    "It keeps those whose most loaded device fits in --device-memory less --reserve and ranks "
    "them by\n"
    "  1. the estimated step time, with --gpu or a --gpu-file that gives the figures (an "
    "estimate, not a\n"
    "     simulation): compute = the matrix products' FLOPs, recomputation included, at the "
    "GPU's\n"
    "     gemm_efficiency (0.7) of its dense bf16 peak, or its memory's rate where reading the "
    "weights\n"
    "     is slower; the attention core's at its fused kernel's measured share on Hopper\n"
    "     (--attention-kernel), else attention_efficiency (0.4; a fused kernel computes half a\n"
    "     causal mask); element-wise work, 4 x the bytes each layer keeps and what its eager\n"
    "     kernels' temporaries move (RMSNorm's; none compiled or fused), at the memory's "
    "rate; plus\n"
    "     the schedule's bubble over a micro-batch's whole time, with "
    "F, B and W\n"
    "     one chunk's forward, full backward and weight-gradient times from the FLOPs (W = F, "
    "B = the rest\n"
    "     of the chunk, recomputation included): 1F1B and interleaved (P-1)(F+B), i.e. (pp - "
    "1) / (micro-\n"
    "     batches x vpp) of the compute; ZB-H1 (P-1)(F+B-2W); ZB-V 0 (its paper's figure for F "
    "= B-W = W,\n"
    "     applied under recomputation too: optimistic there); DualPipe (P/2-1)(F&B+B-3W) with "
    "F&B = F+B;\n"
    "     plus what no computation hides of every byte a device sends at its group's "
    "bandwidth\n"
    "     and every message at its latency (10 us in a node, 20 across): tensor-parallel "
    "collectives and\n"
    "     pipeline sends in full (collective matmuls, --tp-overlap matmul, but a piece of each),\n"
    "     expert all-to-alls but under DualPipe, the context-parallel ring less\n"
    "     the attention it feeds, the data-parallel all-reduce (2 x gradient bytes x (dp - 1) / "
    "dp; ZeRO-3:\n"
    "     also its weight gathers) less the last micro-batch's backward; a group runs at the "
    "GPU's\n"
    "     intra-node figures when it fits in a node (ranks in\n"
    "     the order tp, cp, dp, pp), else at its per-GPU network bandwidth; plus offload's "
    "host transfers\n"
    "     at the GPU's host-link (PCIe) bandwidth, none of them overlapped either: optimizer "
    "offload moves\n"
    "     the device's gradient shard to the host and the updated weight shard back each step, "
    "parameter\n"
    "     offload the gradient shard down and the weight shard up for each micro-batch's "
    "forward and\n"
    "     backward, activation offload each micro-batch's kept activations down and back up "
    "(from the\n"
    "     stage that offloads the most; frameworks overlap these copies with compute on a "
    "stream of their\n"
    "     own, so this time leans slow). A GPU without a host-link figure gives such layouts "
    "no time. The\n"
    "     host's optimiser step (ZeRO-Offload's CPUAdam) reads and writes the master copy and "
    "the state,\n"
    "     reads the fp32 gradient shard and writes the weights, at an assumed 20 GB/s of host "
    "memory per\n"
    "     GPU (DeepSpeed's own measurement gives at least 19), not overlapped. Plus the host's\n"
    "     dispatch: each kernel the step launches (each layer's ops as eager PyTorch runs them, "
    "the\n"
    "     optimiser's loop over its tensors) takes launch_seconds (18.4 us) of host time, and "
    "where\n"
    "     the matrix products', the other ops' or the optimiser's launches take longer than their\n"
    "     kernels run, the difference is added (most of a small model's step). Tokens per second\n"
    "     per GPU are shown beside it;\n"
    "  2. then wasted compute: recomputation's extra FLOPs plus the pipeline bubble (1F1B: "
    "(P-1)/(vM+P-1)),\n"
    "     as fractions of the step;\n"
    "  3. then the bytes each device sends per step (host transfers included);\n"
    "  4. then the peak.\n"
    "Where pp does not divide the layers, the first and last stages take fewer than the others "
    "(Llama 3\n"
    "405B's 126 layers on 16 stages: 7, 14 x 8, 7; DeepSeek-V3's 61: 2, 14 x 4, 3), unless "
    "--first-stage-layers or\n"
    "--last-stage-layers say otherwise. Every micro-batch after the first holds the gradients "
    "of the\n"
    "step so far (see --grad-buffer). Only the best --top layouts are kept, so memory does not "
    "grow with\n"
    "the cluster.\n"
    "\n"
    "Examples:\n"
    "  memcalc plan --preset llama-2-70b --gpus 64 --device-memory 80GB --seq 4096 "
    "--global-batch 512\n"
    "  memcalc plan --preset llama-3-70b --gpu h100-sxm --seq 8192 --global-batch 512 --tp 8\n"
    "  memcalc plan --preset llama-3-70b --gpu h100-sxm --gpus 256 --seq 8192 --global-batch 512 "
    "--profile torchtitan --recompute full --recompute-layers all --microbatches pp --tp-overlap "
    "matmul";

const char* const serve_footer =
    "Per tensor-parallel rank: the weights (linear layers in --weights' format; embeddings, "
    "norms,\n"
    "routers and the head in bf16), the KV cache (k and v of every layer's key/value heads for "
    "each\n"
    "token, each sequence rounded up to whole blocks; with fewer key/value heads than ranks "
    "each rank\n"
    "keeps a whole head), and the activations of one forward of a prefill chunk (the residual "
    "stream,\n"
    "the larger of attention's q, k, v and output and the MLP's hidden tensors, and the last "
    "tokens'\n"
    "logits). With --device-memory or --gpu: whether it fits, the KV cache capacity in tokens "
    "beside the\n"
    "weights and activations, and the largest batch at --context. Beside them, what the caching\n"
    "allocator reserves and what the device shows. With --engine vllm: the KV cache as the engine\n"
    "sizes it (its bytes, blocks, tokens and concurrency at --max-model-len), term by term.\n"
    "\n"
    "Examples:\n"
    "  memcalc serve --preset llama-3-8b --context 8192 --batch 16\n"
    "  memcalc serve --preset llama-3-8b --engine vllm --max-model-len 32768 --gpu h100-sxm\n"
    "  memcalc serve --preset llama-3-70b --context 32768 --batch 8 --tp 8 --gpu h100-sxm\n"
    "  memcalc serve --preset llama-3-70b --context 8192 --weights int4 --kv-dtype fp8 "
    "--device-memory 48GB --format json";

const char* const rl_footer =
    "A post-training job on one device: the roles --algorithm keeps (the policy trained, a\n"
    "reference, a reward model, a critic trained), the rollouts beside them (the policy's own\n"
    "generate(), or vLLM or SGLang holding its share of the device), and the job's phases in\n"
    "order: generate, score (the frozen roles' forwards), train. Each phase's peak is what every\n"
    "role keeps plus what the phase makes; the job's peak is the largest, named. --trainer sets\n"
    "the defaults as TRL, verl or OpenRLHF lay the job out (validation/published/rl.md); each\n"
    "option given overrides one. With a device: whether it fits, and --fit finds the largest\n"
    "--num-generations or --completion-len that fits (and whose rollouts an engine holds at\n"
    "once).\n"
    "\n"
    "Examples:\n"
    "  memcalc rl --algorithm grpo --preset qwen2.5-7b --num-generations 8 --gpu h100-sxm\n"
    "  memcalc rl --algorithm grpo --preset qwen2.5-7b --engine vllm --gpu-memory-utilization "
    "0.3 --gpu h100-sxm\n"
    "  memcalc rl --algorithm dpo --preset qwen2-0.5b --recipe fp32-adam --recompute none "
    "--prompt-len 512 --completion-len 512 --gpu a100-80gb\n"
    "  memcalc rl --algorithm ppo --trainer openrlhf --preset llama-3-8b --gpu h100-sxm --fit "
    "completion-len";

/// Options a command takes one value of, where the estimate takes a comma list: said so in --help.
void single_valued(CLI::App& app, std::initializer_list<const char*> names) {
    for (const char* name : names) {
        CLI::Option* option = app.get_option(name);
        option->type_name(option->get_type_name().substr(0, option->get_type_name().find('[')));
        std::string text = option->get_description();
        for (const char* list :
             {", or a comma list to sweep", ", or a comma list", " or a comma list"}) {
            const auto at = text.find(list);
            if (at != std::string::npos) text.erase(at, std::string(list).size());
        }
        option->description(text + " (one value)");
    }
}

/// memcalc with no command: every group, each registered only when the command line uses it.
void add_estimate(CLI::App& app, EstimateOptions& q, CommandLine& line) {
    line.every = add_groups_used(app, line.tokens, q.model, q.step, q.recipe, q.training,
                                 q.activation, q.output, q.framework, q.parallel, q.report);
}

void estimate_command(const EstimateOptions& q, Spool& out, std::vector<PendingFile>& files) {
    run_estimate(q, out, files);
}

void add_fit(CLI::App& fit, FitOptions& q, CommandLine&) {
    add_training_step_groups(fit, q);
    add_group(fit, q.parallel);
    single_valued(fit, {"--seq", "--micro-batch", "--attention", "--dp", "--tp", "--pp", "--zero"});
    fit.get_option("--recompute")
        ->description("Recomputation modes to answer for, a comma list (default: all three)");
    fit.get_option("--dp")->description("Data-parallel replicas (default 1)");
    add_device_options(fit, q.device, "The device's memory: 80GB, 141GB, 24GiB, ... (or --gpu)");
    fit.add_option("--multiple-of", q.multiple_of, "Search only multiples of this size (default 1)")
        ->type_name("N");
}

void fit_command(const FitOptions& q, Spool& out, std::vector<PendingFile>&) {
    out.append(run_fit(q));
}

/// What plan searches over, and how much of it it shows.
void add_plan_search(CLI::App& plan, PlanOptions& q) {
    add_training_step_groups(plan, q);
    single_valued(plan, {"--seq", "--attention"});
    plan.get_option("--recompute")
        ->description(
            "Recomputation modes to try, a comma list (default: none, selective, full;\n"
            "op, torchtitan's per-op policy, only where named, and without tp)");
    plan.get_option("--micro-batch")
        ->description(
            "Micro-batches to try, a comma list (default: every one that divides\n"
            "the global batch per replica)");
    plan.add_option("--microbatches", q.parallel.microbatches,
                    "Micro-batches per step to try, a comma list, or pp: as many as pipeline "
                    "stages\n(torchtitan's default; default: every count the micro-batches give)")
        ->type_name("M[,M...]|pp");
    plan.add_option("--gpus", q.gpus,
                    "Devices in the cluster (default: the fewest on which a layout fits, in whole "
                    "nodes\nof --gpu's node size, else any count)")
        ->type_name("N");
    add_device_options(plan, q.device,
                       "Each device's memory: 80GB, 141GB, ... (or --gpu, which also times the "
                       "step)");
    plan.add_option("--global-batch", q.parallel.global_batch, "Sequences per step (required)")
        ->type_name("G");
    plan.add_option("--top", q.top, "How many layouts to show (default 10)")->type_name("K");
    plan.add_option("--max-tp", q.max_tp,
                    "Largest tensor-parallel degree to try, e.g. the GPUs of a node")
        ->type_name("N");
    plan.add_option("--search-limit", q.search_limit,
                    "Refuse a search that would measure more pipeline stages than this,\n"
                    "counted before it starts (default: none; each layout measures the\n"
                    "stages that may hold its peak)")
        ->type_name("N");
    plan.add_option("--time-limit", q.time_limit,
                    "Seconds the search may run (default 10; 0: no limit): past them plan\n"
                    "shows the best layouts found so far and the fraction evaluated")
        ->type_name("SECONDS");
}

/// The degrees, stages, schedules and offloads plan tries: each given restricts the search.
void add_plan_pinned(CLI::App& plan, ParallelOptions& q) {
    const char* pinned = "Pinned (each given restricts the search to it; a comma list to several)";
    for (auto [option, value, what] :
         {std::tuple{"--dp", &q.dp, "Data-parallel degrees"},
          std::tuple{"--tp", &q.tp, "Tensor-parallel degrees"},
          std::tuple{"--pp", &q.pp, "Pipeline stages"},
          std::tuple{"--cp", &q.cp, "Context-parallel degrees"},
          std::tuple{"--ep", &q.ep, "Expert-parallel degrees"},
          std::tuple{"--vpp", &q.vpp, "Virtual stages per pipeline rank (interleaved 1F1B)"}})
        plan.add_option(option, *value, std::string(what) + " to try")
            ->group(pinned)
            ->type_name("N[,N...]");
    plan.add_option("--zero", q.zero, "ZeRO stages to try (0-3)")
        ->group(pinned)
        ->type_name("STAGE[,STAGE...]");
    plan.add_option("--schedule", q.schedule,
                    "Pipeline schedules to try: 1f1b, interleaved, zb-h1, zb-v, dualpipe, or all "
                    "(default:\n1f1b,interleaved, which every pipeline framework runs; the others "
                    "need their own runtimes\nand their bubbles are their papers' ideal figures)")
        ->group(pinned)
        ->type_name("NAME[,NAME...]");
    // Offload is searched only when asked for: its host memory is checked only against
    // --host-memory, and the CPU optimiser step's time rests on an assumed host bandwidth, so one
    // that fits only by offloading is not offered unasked.
    plan.add_option("--offload", q.offload,
                    "Offload alternatives to try: none (default), optimizer (with ZeRO 1-3), "
                    "parameters (with\nZeRO 3), activations (activation offload, as a single "
                    "estimate's), or one joined with\nactivations by '+'; e.g. --offload "
                    "none,optimizer,activations,optimizer+activations")
        ->group(pinned)
        ->type_name("MODE[,MODE...]");
    add_host_memory_option(plan, q)->group(pinned);
    plan.add_option("--loading", q.loading,
                    "Weigh each layout's loading too, by this method (see the estimate's "
                    "--loading)")
        ->group(pinned)
        ->type_name("METHOD");
    CLI::Option* sp =
        plan.add_flag("--sp", q.sp, "Sequence parallelism wherever tp > 1, as Megatron-LM's")
            ->group(pinned);
    plan.add_flag("--no-sp", q.no_sp,
                  "No sequence parallelism (Megatron-LM before 2022, Megatron-DeepSpeed)")
        ->group(pinned)
        ->excludes(sp);
    add_stage_options(plan, q, "Options");
}

void add_plan(CLI::App& plan, PlanOptions& q, CommandLine&) {
    add_plan_search(plan, q);
    add_plan_pinned(plan, q.parallel);
}

void plan_command(const PlanOptions& q, Spool& out, std::vector<PendingFile>&) {
    out.append(run_plan(q));
}

void add_serve_engine(CLI::App& serve, ServeOptions& q);
void add_serve_adapters(CLI::App& serve, ServeOptions& q);

void add_serve(CLI::App& serve, ServeOptions& q, CommandLine&) {
    add_group(serve, q.model);
    add_group(serve, q.output);
    serve
        .add_option("--context", q.context, "Tokens of each sequence, prompt and output (required)")
        ->type_name("N");
    serve.add_option("--batch", q.batch, "Sequences served at once (default 1)")->type_name("B");
    serve
        .add_option("--weights", q.weights,
                    "How the linear layers are stored: bf16 (default), fp8 (a scale per matrix), "
                    "int8 (a\nscale per output channel), int4 (AWQ/GPTQ: a scale and a zero "
                    "point per 128 inputs)")
        ->type_name("FORMAT");
    serve
        .add_option("--kv-dtype", q.kv_dtype,
                    "The KV cache's dtype: bf16 (default), fp16, fp8, fp8-e5m2, fp32")
        ->type_name("DTYPE");
    serve
        .add_option("--kv-cache-dtype", q.kv_cache_dtype,
                    "--kv-dtype as --engine spells it, refused where that version lacks it "
                    "(vllm: auto, fp8,\nfp8_e4m3, fp8_e5m2, and bfloat16 from 0.10; sglang: auto, "
                    "fp8_e5m2, fp8_e4m3), e.g.\n--engine vllm --kv-cache-dtype fp8")
        ->type_name("DTYPE");
    serve
        .add_option("--tp", q.tp,
                    "Tensor-parallel ranks: heads, MLP columns and vocabulary split (default 1)")
        ->type_name("N");
    serve
        .add_option("--block-size", q.block_size,
                    "Tokens per KV-cache block, each sequence rounded up (default 16); with "
                    "--engine vllm one\nthat version takes (0.6: 8, 16, 32, 64, 128; 0.10: 1 "
                    "too; 0.21: 256 too), e.g. --block-size 32")
        ->type_name("N");
    serve
        .add_option("--prefill-chunk", q.prefill_chunk,
                    "Most tokens one forward takes (chunked prefill; default 8192; not with "
                    "--engine hf)")
        ->type_name("N");
    serve
        .add_option("--images", q.images,
                    "Images a prompt may hold (vLLM's --limit-mm-per-prompt): the vision tower "
                    "encodes a prefill's\n"
                    "before it, their outputs cached through it")
        ->type_name("N");
    serve
        .add_option("--image-size", q.image_size,
                    "The largest image, in pixels (a tower of one size, Gemma 3's, needs none)")
        ->type_name("WxH");
    add_serve_engine(serve, q);
    add_device_options(serve, q.device,
                       "The device's memory: with it, the KV cache capacity and the largest batch");
}

/// The engine whose KV-cache rule serve follows, and that engine's settings.
void add_serve_engine(CLI::App& serve, ServeOptions& q) {
    serve
        .add_option("--engine", q.engine,
                    "Size the KV cache as this engine does (vllm, sglang): its share of the "
                    "device less its\nweights, profiling peak (vLLM) and memory outside PyTorch; "
                    "hf (transformers' generate())\nbudgets nothing: the batch's own cache, as "
                    "without --engine, every prompt in one\nforward and k and v repeated to every "
                    "head")
        ->type_name("NAME");
    serve
        .add_option(
            "--engine-version", q.engine_version,
            "The engine's version whose rule to follow (vllm: 0.6, 0.7, 0.10, 0.21 and later; "
            "sglang: 0.4; default the newest)")
        ->type_name("X.Y");
    serve
        .add_option("--gpu-memory-utilization", q.gpu_memory_utilization,
                    "vLLM's share of the device's memory (default 0.9)")
        ->type_name("F");
    serve
        .add_option("--mem-fraction-static", q.mem_fraction_static,
                    "SGLang's share for the weights and the cache (default by --tp: 0.88 to 0.79)")
        ->type_name("F");
    serve
        .add_option("--max-model-len", q.max_model_len,
                    "The engine's longest request (default the model's max_positions)")
        ->type_name("N");
    serve
        .add_option("--max-num-seqs", q.max_num_seqs,
                    "The engine's most sequences a step (default by version and GPU)")
        ->type_name("N");
    serve
        .add_option("--max-num-batched-tokens", q.max_num_batched_tokens,
                    "The engine's most tokens a step, its profiling forward's (default by "
                    "version and GPU)")
        ->type_name("N");
    serve.add_flag("--enforce-eager", q.enforce_eager,
                   "The engine captures no CUDA graphs (vLLM's --enforce-eager): no graph pool");
    add_serve_adapters(serve, q);
}

/// What the engine serves beside the model: LoRA slots and a speculative-decoding draft.
void add_serve_adapters(CLI::App& serve, ServeOptions& q) {
    serve
        .add_option("--max-loras", q.max_loras,
                    "LoRA adapters served at once (vLLM's --max-loras with --enable-lora): each "
                    "linear layer\nkeeps A and B for that many slots, e.g. --max-loras 4")
        ->type_name("N");
    serve
        .add_option("--max-lora-rank", q.max_lora_rank,
                    "The slots' rank (default 16; with --engine vllm one of 1, 8, 16, 32, 64, "
                    "128, 256, 320,\n512), e.g. --max-loras 4 --max-lora-rank 64")
        ->type_name("R");
    serve
        .add_option("--draft-preset", q.draft_preset,
                    "A speculative-decoding draft model, a preset (with --engine and "
                    "--num-speculative-tokens):\nits weights in bf16 and its KV cache beside the "
                    "model's, e.g. --draft-preset llama-3.2-1b")
        ->type_name("NAME");
    serve
        .add_option("--draft-config", q.draft_config,
                    "The draft model as a config.json or a folder holding one")
        ->type_name("PATH");
    serve
        .add_option("--num-speculative-tokens", q.num_speculative_tokens,
                    "Tokens the draft proposes a step (vLLM's num_speculative_tokens)")
        ->type_name("K");
}

void serve_command(const ServeOptions& q, Spool& out, std::vector<PendingFile>&) {
    out.append(run_serve(q));
}

/// The algorithm, the trainer whose defaults fill the rest, and each role's model.
void add_rl_roles(CLI::App& rl, RlOptions& q) {
    rl.add_option("--algorithm", q.algorithm, "grpo, ppo, rloo, dpo, kto or orpo (required)")
        ->type_name("NAME");
    rl.add_option("--trainer", q.trainer,
                  "Whose defaults: trl (1.9, default), verl (0.7) or openrlhf (0.11)")
        ->type_name("NAME");
    rl.add_option("--reference", q.reference,
                  "Where the reference lives: none, resident, offloaded (to the host) or "
                  "precomputed\n(its log-probs before training); default by algorithm and trainer")
        ->type_name("MODE");
    for (auto [option, value, role] :
         {std::tuple{"--reference-model", &q.reference_model, "the reference"},
          std::tuple{"--reward-model", &q.reward_model, "a reward model (given: one is kept)"},
          std::tuple{"--critic-model", &q.critic_model, "PPO's critic"}})
        rl.add_option(option, *value,
                      fmt::format("The model of {}: a preset, a config.json or a model file "
                                  "(default the policy's)",
                                  role))
            ->type_name("MODEL");
    rl.add_option("--role-placement", q.role_placement,
                  "colocated (every role on the policy's GPUs) or separate (each on its own; "
                  "default\nthe trainer's: OpenRLHF separate)")
        ->type_name("WHERE");
    rl.add_option("--frozen-dtype", q.frozen_dtype,
                  "The reference's and reward model's weights: fp32, bf16 or fp16 (default the "
                  "trainer's)")
        ->type_name("DTYPE");
}

/// The rollouts and what generates them.
void add_rl_rollouts(CLI::App& rl, RlOptions& q) {
    for (auto [option, value, what] :
         {std::tuple{"--num-generations", &q.num_generations,
                     "Completions per prompt (default the algorithm's: GRPO 8, RLOO 2)"},
          std::tuple{"--prompt-len", &q.prompt_len, "Prompt tokens (default the trainer's)"},
          std::tuple{"--completion-len", &q.completion_len,
                     "Completion tokens (default the trainer's); DPO: the response"},
          std::tuple{"--prompts", &q.prompts,
                     "Prompts a device generates for at once (default micro-batch / "
                     "generations)"},
          std::tuple{"--engine-tp", &q.engine_tp, "The engine's tensor parallelism (default 1)"}})
        rl.add_option(option, *value, what)->type_name("N");
    rl.add_option("--engine", q.rollout,
                  "What generates: hf (the policy's generate()), vllm or sglang (default the "
                  "trainer's)")
        ->type_name("NAME");
    rl.add_option("--engine-placement", q.placement,
                  "colocated (on the training GPUs) or separate (default the trainer's)")
        ->type_name("WHERE");
    rl.add_option("--engine-version", q.engine_version, "The engine's version (see serve)")
        ->type_name("X.Y");
    rl.add_option("--gpu-memory-utilization", q.gpu_memory_utilization,
                  "The engine's share of the device (default the trainer's: TRL 0.3, verl 0.5)")
        ->type_name("F");
    rl.add_option("--engine-sleep", q.sleep,
                  "on: the engine frees its weights and cache between generations (default "
                  "the trainer's)")
        ->type_name("on|off");
}

void add_rl(CLI::App& rl, RlOptions& q, CommandLine&) {
    add_training_step_groups(rl, q);
    add_group(rl, q.parallel);
    single_valued(rl, {"--micro-batch", "--attention", "--dp", "--tp", "--pp", "--zero"});
    rl.get_option("--micro-batch")
        ->description(
            "Examples a training micro-batch holds: completions, or DPO's pairs "
            "(default the trainer's)");
    rl.get_option("--recompute")
        ->description(
            "The policy's recomputation: none, selective or full (default the "
            "trainer's gradient checkpointing)");
    add_rl_roles(rl, q);
    add_rl_rollouts(rl, q);
    add_device_options(rl, q.device, "The device's memory: with it, whether the job fits");
    rl.add_option("--fit", q.fit,
                  "With a device: the largest num-generations or completion-len that fits")
        ->type_name("WHAT");
}

void rl_command(const RlOptions& q, Spool& out, std::vector<PendingFile>&) {
    out.append(run_rl(q));
}

/// A catalogue takes only --format.
void add_catalogue(CLI::App& catalogue, CatalogueOptions& q, CommandLine&) {
    const std::vector<std::string> formats = {"table", "json", "csv"};
    catalogue.add_option("--format", q.format, "table (default), json or csv")
        ->check(CLI::IsMember(formats));
}

template <std::string (*List)(const std::string& format)>
void catalogue_command(const CatalogueOptions& q, Spool& out, std::vector<PendingFile>&) {
    out.append(List(q.format));
}

/// A command's options, as `Add` registers them, and `Run` runs them.
template <class Options, void (*Run)(const Options&, Spool&, std::vector<PendingFile>&)>
class ParsedAs final : public ParsedCommand {
public:
    Options options;
    void run(Spool& out, std::vector<PendingFile>& files) const override {
        Run(options, out, files);
    }
    std::string output_file() const override { return options.output_file(); }
};

/// A row's `add`: `Add` registers the options of a command that `Run` runs.
template <class Options, void (*Add)(CLI::App&, Options&, CommandLine&),
          void (*Run)(const Options&, Spool&, std::vector<PendingFile>&)>
std::unique_ptr<ParsedCommand> command(CLI::App& app, CommandLine& line) {
    auto parsed = std::make_unique<ParsedAs<Options, Run>>();
    Add(app, parsed->options, line);
    return parsed;
}

template <std::string (*List)(const std::string& format)>
constexpr auto catalogue = &command<CatalogueOptions, add_catalogue, catalogue_command<List>>;

}  // namespace

const std::vector<CommandRow>& command_table() {
    static const std::vector<CommandRow> rows = {
        {nullptr, estimate_summary, estimate_footer,
         command<EstimateOptions, add_estimate, estimate_command>},
        {"fit", "The longest sequence (or largest micro-batch) that fits in a device's memory",
         fit_footer, command<FitOptions, add_fit, fit_command>},
        {"plan",
         "The layouts of a cluster that fit, ranked by estimated step time; or the fewest GPUs",
         plan_footer, command<PlanOptions, add_plan, plan_command>},
        {"serve", "Serving memory: the weights in a storage format, the KV cache, prefill",
         serve_footer, command<ServeOptions, add_serve, serve_command>},
        {"rl", "A post-training job (GRPO, PPO, DPO, ...): its roles, rollouts and phases",
         rl_footer, command<RlOptions, add_rl, rl_command>},
        {"presets", "List the built-in models with their parameter counts", nullptr,
         catalogue<run_presets>},
        {"recipes", "List the training recipes (bytes per parameter)", nullptr,
         catalogue<run_recipes>},
        {"optimizers", "List the optimizers: their state, and whether their step is a fused kernel",
         nullptr, catalogue<run_optimizers>},
        {"profiles", "List the framework profiles (what --profile sets)", nullptr,
         catalogue<run_profiles>},
        {"gpus", "List the GPUs --gpu names, with their memory as the driver reports it", nullptr,
         catalogue<run_gpus>},
        {"activation-functions",
         "List the MLP's activation functions: the code each runs, what autograd keeps", nullptr,
         catalogue<run_activation_functions>},
        {"program-facts",
         "List how a model's code is written (attention, norms, experts), as options say it",
         nullptr, catalogue<run_program_facts>},
    };
    return rows;
}

bool CommandLine::mentions(const char* word) const {
    for (int i = 1; i < argc; ++i)
        if (std::string(argv[i]) == word) return true;
    return false;
}

std::vector<std::string> option_tokens(int argc, const char* const* argv) {
    std::vector<std::string> tokens;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg.size() > 1 && arg[0] == '-') tokens.emplace_back(arg.substr(0, arg.find('=')));
    }
    return tokens;
}

}  // namespace memcalc::cli
