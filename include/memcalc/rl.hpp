#pragma once
/// A post-training job on one device: the roles an algorithm keeps (the policy it trains, a frozen
/// reference, a reward model, a trained critic), what generates the rollouts beside them (the
/// policy's own generate() or an engine's share of the device), and the job's phases in order:
/// generate, score, train. Each phase's peak is what every role keeps between phases plus what
/// the phase makes; the job's peak is the largest. Algorithms and trainers are rows, each with its
/// source (validation/published/rl.md has them in full); each role's training step is the
/// estimate's, and each forward and cache the serve model's.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcalc/device_memory.hpp"
#include "memcalc/engine_budget.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/serve.hpp"

namespace memcalc {

/// Where a frozen reference lives.
enum class ReferenceMode : std::uint8_t {
    none,         ///< no reference: GRPO's KL off (beta 0), ORPO, or a PEFT adapter disabled
    resident,     ///< on the device between phases
    offloaded,    ///< on the host, its layers brought in turn for its forward (verl's)
    precomputed,  ///< its log-probs computed over the data set before training; not kept
};

/// What generates the rollouts.
enum class Rollout : std::uint8_t {
    hf,  ///< the policy's own generate(): a KV cache that grows with the completions
    vllm,
    sglang,
};

struct RlAlgorithm {
    Text name;
    bool generates;          ///< rollouts every step
    bool reference;          ///< a reference model unless told otherwise
    bool reward_model;       ///< a reward model unless told otherwise (else reward functions)
    bool critic;             ///< a value model, trained beside the policy
    bool reference_in_step;  ///< the reference's forward runs inside the policy's step
    std::uint64_t sequences_per_example;  ///< chosen and rejected concatenated: 2
    std::uint64_t num_generations;        ///< completions per prompt by default
    Text source;
};

inline constexpr std::array<RlAlgorithm, 6> rl_algorithms{{
    {"grpo", true, false, false, false, false, 1, 8,
     "trl@v1.9.0 grpo_config.py:474-475 (num_generations 8), 671-677 (beta 0.0 since v0.19.0: "
     "no reference)"},
    {"rloo", true, true, false, false, false, 1, 2,
     "trl@v1.9.0 rloo_config.py:297,311 (beta 0.05, num_generations 2)"},
    {"ppo", true, true, true, true, false, 1, 1,
     "trl@v1.9.0 experimental/ppo/ppo_trainer.py:275-294 (policy and value model trained, "
     "a reference, a reward model)"},
    {"dpo", false, true, false, false, true, 2, 1,
     "trl@v1.9.0 dpo_trainer.py:1329-1395 (chosen and rejected in one batch; the reference's "
     "forward under no_grad after the policy's)"},
    {"kto", false, true, false, false, true, 1, 1,
     "trl@v1.9.0 kto_trainer.py:913-915 (a reference as DPO's)"},
    {"orpo", false, false, false, false, false, 2, 1,
     "trl@v1.9.0 experimental/orpo/orpo_config.py:80-91 (the policy alone; chosen and rejected "
     "in one batch)"},
}};

/// How a trainer lays the job out by default.
struct RlTrainer {
    Text name, version;
    Text recipe;              ///< the policy's, as the trainer loads and trains it
    DType frozen_dtype;       ///< the reference's and the reward model's weights
    ReferenceMode reference;  ///< where a reference lives when the algorithm has one
    Rollout rollout;          ///< what generates by default
    bool colocated;           ///< an engine on the training GPUs
    bool roles_colocated;     ///< the other roles on the policy's GPUs (else each on its own)
    double share;             ///< a colocated engine's gpu_memory_utilization
    bool sleeps;              ///< the engine frees its weights and cache between generations
    bool checkpointing;       ///< gradient checkpointing by default
    std::uint64_t micro_batch, prompt_len, completion_len;
    Text source;
};

inline constexpr std::array<RlTrainer, 3> rl_trainers{{
    {"trl", "1.9", "amp-adam", DType::fp32, ReferenceMode::resident, Rollout::hf, true, true, 0.3,
     false, true, 8, 512, 256,
     "trl@v1.9.0 utils.py:1144 (fp32 load), base_config.py:61-68 (gradient checkpointing, bf16 "
     "autocast), grpo_config.py:488 (256 completion tokens), 577 (use_vllm off), 602 (sleep "
     "off), 646 (vllm_gpu_memory_utilization 0.3); per_device_train_batch_size 8; prompts of "
     "512 (max_prompt_length up to v0.25)"},
    {"verl", "0.7", "amp-adam", DType::fp32, ReferenceMode::offloaded, Rollout::vllm, true, true,
     0.5, true, true, 8, 512, 512,
     "verl@v0.7.0 rollout.yaml:32 (gpu_memory_utilization 0.5), 47 (free_cache_engine), "
     "fsdp_workers.py:324-328 (fp32 model), 516-518 (reference offloaded); "
     "ppo_micro_batch_size_per_gpu has no default: TRL's 8"},
    {"openrlhf", "0.11", "mixed-adam", DType::bf16, ReferenceMode::resident, Rollout::vllm, false,
     false, 0.95, false, false, 1, 1024, 1024,
     "OpenRLHF@v0.11.0 train_ppo_ray.py:198-257 (each role and vLLM on its own GPUs unless "
     "--train.colocate_all; vLLM 0.95), 308-322 (ZeRO-2 "
     "bf16), 376-386 (lengths); deepspeed.py:489-499 (reference a full copy below ZeRO-3)"},
}};

template <class Row, std::size_t N>
const Row* rl_row(const std::array<Row, N>& rows, std::string_view name) {
    for (const Row& r : rows)
        if (r.name == name) return &r;
    return nullptr;
}

/// The job's settings; models the caller gives beside them (RlModels).
struct RlSettings {
    const RlAlgorithm* algorithm = &rl_algorithms[0];
    Settings policy;  ///< the policy's step: its seq and micro-batch come from the fields below
    std::uint64_t prompt_len = 512, completion_len = 256, num_generations = 8;
    std::uint64_t prompts = 1;      ///< prompts a device generates for at once
    std::uint64_t micro_batch = 8;  ///< examples a training micro-batch holds (completions, pairs)
    ReferenceMode reference = ReferenceMode::resident;
    bool reward_model = false;
    DType frozen_dtype = DType::fp32;
    Rollout rollout = Rollout::hf;
    bool colocated = true, sleeps = false;
    bool roles_colocated = true;  ///< reference, reward and critic on the policy's GPUs
    EngineSettings engine;        ///< the engine's rule and share (vllm, sglang)
    std::uint64_t engine_tp = 1;  ///< the engine's tensor parallelism
};

/// The models of the roles; nullptr: the policy's.
struct RlModels {
    const Architecture* policy = nullptr;
    const Architecture* reference = nullptr;
    const Architecture* reward = nullptr;
    const Architecture* critic = nullptr;
};

struct RlTerm {
    std::string name;
    Count bytes;
};

/// One phase: what it holds, term by term, and where in it the peak falls.
struct RlPhase {
    std::string name, at;
    std::vector<RlTerm> terms;
    Count peak() const {
        Count sum;
        for (const RlTerm& t : terms) sum += t.bytes;
        return sum;
    }
};

struct RlRole {
    Text role;
    std::string model;
    Count parameters;
    bool trained = false;
    Count resident;  ///< on the device between phases
    Count weights;   ///< its weights on this device while in use (a frozen role's)
    std::string where;
};

struct RlReport {
    std::vector<RlRole> roles;
    std::vector<RlPhase> phases;
    std::size_t peak_phase = 0;
    Report policy;
    std::optional<Report> critic;
    std::uint64_t rollouts = 0;  ///< sequences generated at once on a device
    Count kv_needed;             ///< their cache at full length
    std::optional<EngineBudget> engine;
    Count engine_bytes;         ///< the engine's footprint awake (its share)
    bool engine_starts = true;  ///< its share was free beside the roles' weights when it started
    Count peak() const { return phases[peak_phase].peak(); }
};

namespace detail {

/// `bf16_bytes` of tensors, in dtype `d` instead.
inline Count in_dtype(Count bf16_bytes, DType d) {
    return Count(bf16_bytes.value() / dtype::bf16) * bytes_per_element(d);
}

/// The largest temporaries of a no-grad forward of `m` in `d` over `sequences` of `tokens`, whose
/// last `kept` positions get logits (0: a score head): the layers' (serve's), or the last hidden
/// states beside `copies` of the logits (GRPO's division by the temperature makes a second) and a
/// row's fp32 log-softmax (selective_log_softmax loops over rows; trl@v1.9.0 utils.py:479-518).
inline Count scoring_forward(const Architecture& m, DType d, std::uint64_t sequences,
                             std::uint64_t tokens, std::uint64_t kept, std::uint64_t copies = 2) {
    const Count all = Count(sequences) * tokens;
    const Count layers = in_dtype(total_bytes(forward_temporaries(m, all.value(), 0, 1)), d);
    if (kept == 0) return layers;
    const Count logits = Count(sequences) * kept * m.vocab * bytes_per_element(d);
    const Count chain = all * m.hidden * bytes_per_element(d) + logits * copies +
                        Count(kept) * m.vocab * dtype::fp32;
    return std::max(layers, chain);
}

/// A frozen model's parameters and its weights in `d` over `shards` ranks.
inline std::pair<Count, Count> frozen_weights(const Architecture& m, DType d,
                                              std::uint64_t shards) {
    const Count parameters = parameter_table(m).total();
    return {parameters, ceil_div(parameters * bytes_per_element(d), shards)};
}

/// What a trained role keeps between steps: its weights, master copy and optimizer state (the
/// gradients are freed when the step ends, zero_grad(set_to_none=True)).
inline Count kept_between_steps(const Report& r) {
    const TrainingState& s = r.busiest().state;
    return s.weights + s.master_weights + s.optimizer_state;
}

}  // namespace detail

namespace detail {

/// Where a frozen role's weights live, said.
inline std::string frozen_where(ReferenceMode mode, DType d, std::uint64_t shards) {
    const std::string sharded =
        shards > 1 ? ", sharded over " + std::to_string(shards) + " ranks" : "";
    switch (mode) {
        case ReferenceMode::offloaded:
            return std::string("on the host in ") + dtype_name(d) + sharded +
                   ", its layers brought in turn";
        case ReferenceMode::precomputed:
            return "not kept: its log-probs precomputed over the data set";
        default: return std::string("on the device in ") + dtype_name(d) + sharded;
    }
}

/// The roles, their models and what each keeps between phases; the trained ones' steps.
inline void add_roles(RlReport& r, const RlModels& m, const RlSettings& s, const Settings& step) {
    const Architecture& policy = *m.policy;
    r.policy = estimate(policy, step);
    r.roles.push_back({"policy", policy.name, r.policy.parameter_count, true,
                       kept_between_steps(r.policy), r.policy.busiest().state.weights,
                       "on the device: weights, master copy and optimizer state"});
    const std::uint64_t shards = step.parallel.zero == 3 ? step.parallel.sharding() : 1;
    const std::string elsewhere = "on its own GPUs: not on the policy's";
    const auto frozen = [&](Text role, const Architecture* given, ReferenceMode mode) {
        const Architecture& a = given ? *given : policy;
        const auto [parameters, bytes] = frozen_weights(a, s.frozen_dtype, shards);
        const bool here = s.roles_colocated && mode == ReferenceMode::resident;
        r.roles.push_back({role, a.name, parameters, false, here ? bytes : Count(0), bytes,
                           s.roles_colocated || mode == ReferenceMode::precomputed
                               ? frozen_where(mode, s.frozen_dtype, shards)
                               : elsewhere});
    };
    if (s.reference != ReferenceMode::none) frozen("reference", m.reference, s.reference);
    if (s.reward_model) frozen("reward", m.reward, ReferenceMode::resident);
    if (!s.algorithm->critic) return;
    const Architecture& critic = m.critic ? *m.critic : policy;
    r.critic = estimate(critic, step);
    r.roles.push_back({"critic", critic.name, r.critic->parameter_count, true,
                       s.roles_colocated ? kept_between_steps(*r.critic) : Count(0),
                       r.critic->busiest().state.weights,
                       s.roles_colocated ? "on the device: weights, master copy and optimizer "
                                           "state (a value head counted as the model's own head)"
                                         : elsewhere});
}

inline const RlRole* find_role(const RlReport& r, Text role) {
    for (const RlRole& each : r.roles)
        if (each.role == role) return &each;
    return nullptr;
}

/// What every role but `except` keeps, and a colocated engine's share while awake between
/// generations, as a phase's first terms.
inline std::vector<RlTerm> kept_terms(const RlReport& r, const RlSettings& s, Text except = {},
                                      bool engine = true) {
    std::vector<RlTerm> out;
    for (const RlRole& role : r.roles)
        if (role.role != except && role.resident > Count(0))
            out.push_back({std::string(role.role) + " kept", role.resident});
    if (engine && r.engine_bytes > Count(0) && !s.sleeps)
        out.push_back({"engine's share (awake: no sleep mode)", r.engine_bytes});
    return out;
}

/// A colocated engine's budget and footprint: its share of the device (with the CUDA graphs'
/// pool where its rule leaves them outside the share).
inline void add_engine(RlReport& r, const Architecture& policy, const RlSettings& s,
                       const std::optional<Count>& memory, const DeviceSettings& device) {
    if (s.rollout == Rollout::hf || !s.colocated) return;
    if (!memory)
        throw error(
            "a colocated engine takes a share of the device's memory: give the device (its "
            "memory or a GPU)");
    ServeSettings ss;
    ss.context = s.prompt_len + s.completion_len, ss.batch = r.rollouts, ss.tp = s.engine_tp;
    EngineSettings e = s.engine;
    if (!e.max_model_len) e.max_model_len = ss.context;
    r.engine = engine_budget(policy, ss, e, *memory, device);
    Parallelism p;
    p.tp = s.engine_tp;
    const ServingRows row{
        device_rows(Framework{}, p, device.gpu, {outside_rows::Job::serving, ss.cuda_graphs})};
    r.engine_bytes = r.engine->terms.front().bytes +
                     (e.rule->graphs_in_budget ? Count(0) : row("cuda_graph_pool"));
    Count weights;
    for (const RlRole& role : r.roles)
        weights += role.resident > Count(0) ? role.weights : Count(0);
    r.engine_starts = weights + r.engine_bytes <= r.engine->cuda_total;
}

/// The rollouts: an engine awake holds its share; the policy's generate() its cache (remade a
/// layer at a time as it grows: torch.cat), its prompts' prefill, and under ZeRO-3 the policy's
/// gathered weights (ds3_gather_for_generation).
inline RlPhase generate_phase(const RlReport& r, const RlSettings& s, const Architecture& policy) {
    RlPhase phase{"generate", "", kept_terms(r, s, {}, false)};
    const std::uint64_t tokens = s.prompt_len + s.completion_len;
    phase.at = std::to_string(r.rollouts) + (r.rollouts == 1 ? " sequence of " : " sequences of ") +
               std::to_string(s.prompt_len) + " + " + std::to_string(s.completion_len) + " tokens";
    if (s.rollout != Rollout::hf) {
        if (s.colocated) phase.terms.push_back({"engine's share (awake)", r.engine_bytes});
        if (!s.colocated) phase.at += ", by an engine on its own GPUs";
        return phase;
    }
    const DType d = s.policy.recipe.weights;
    ServeSettings ss;
    ss.context = tokens, ss.batch = r.rollouts, ss.kv_dtype = d, ss.block_size = 1;
    const ServeReport cache = serve(policy, ss);
    phase.terms.push_back({"KV cache", cache.kv_cache});
    if (cache.cache_layers > 0)
        phase.terms.push_back(
            {"a layer's cache remade as it grows", ceil_div(cache.kv_cache, cache.cache_layers)});
    // SDPA repeats grouped k and v (repeat_kv): in the prefill over the prompts, in a decode step
    // over the whole sequence so far, which a long completion makes the larger.
    const Count prefill =
        total_bytes(forward_temporaries(policy, r.rollouts * s.prompt_len, r.rollouts, 1, true));
    const Count decode = repeated_kv(policy, r.rollouts * tokens, 1);
    phase.terms.push_back(
        {decode > prefill ? "a decode step's k and v repeated to every head" : "prefill",
         in_dtype(std::max(prefill, decode), d)});
    const Count whole = r.policy.parameter_count * s.policy.recipe.weight_bytes();
    const Count shard = std::min(whole, r.policy.busiest().state.weights);
    if (s.policy.parallel.zero == 3)
        phase.terms.push_back(
            {"the policy's weights gathered", Count(whole.value() - shard.value())});
    return phase;
}

/// A frozen role's forward: its temporaries, and where it is offloaded, a layer and the next
/// brought in.
inline RlTerm frozen_forward(const RlRole& role, const Architecture& m, DType d,
                             std::uint64_t sequences, std::uint64_t tokens, std::uint64_t kept,
                             std::uint64_t copies = 2) {
    Count bytes = scoring_forward(m, d, sequences, tokens, kept, copies);
    if (role.resident == Count(0)) bytes += ceil_div(role.weights, m.layers) * 2;
    return {std::string(role.role) + "'s forward", bytes};
}

/// Scoring the rollouts, a micro-batch at a time: the reference's log-probs of the completions,
/// the reward model's and the critic's scores (score heads: no logits), one forward after another.
inline RlPhase score_phase(const RlReport& r, const RlSettings& s, const RlModels& m) {
    RlPhase phase{"score", "", kept_terms(r, s)};
    const std::uint64_t tokens = s.prompt_len + s.completion_len, kept = s.completion_len + 1;
    std::optional<RlTerm> largest;
    const auto consider = [&](const RlTerm& t) {
        if (!largest || t.bytes > largest->bytes) largest = t;
    };
    if (!s.roles_colocated) return phase;  // each scores on its own GPUs
    const RlRole* ref = find_role(r, "reference");
    if (ref && s.reference != ReferenceMode::precomputed)
        consider(frozen_forward(*ref, m.reference ? *m.reference : *m.policy, s.frozen_dtype,
                                s.micro_batch, tokens, kept));
    if (const RlRole* reward = find_role(r, "reward"))
        consider(frozen_forward(*reward, m.reward ? *m.reward : *m.policy, s.frozen_dtype,
                                s.micro_batch, tokens, 0));
    if (find_role(r, "critic"))
        consider({"critic's values",
                  scoring_forward(m.critic ? *m.critic : *m.policy, s.policy.recipe.weights,
                                  s.micro_batch, tokens, 0)});
    if (!largest) return phase;
    phase.at = largest->name;
    phase.terms.push_back(*largest);
    return phase;
}

/// The largest loss step of a report's busiest rank: the forward done, the logits made.
inline Count loss_step(const Report& r) {
    Count most;
    for (const Step& step : r.timeline())
        if (step.phase == Phase::loss) most = std::max(most, step.bytes.total());
    return most;
}

/// A trained role's step beside what the others keep.
inline RlPhase train_phase(const RlReport& r, const RlSettings& s, Text role, const Report& step) {
    RlPhase phase{"train " + std::string(role), std::string(role) + "'s " + step.peak_step().name(),
                  kept_terms(r, s, role)};
    phase.terms.push_back({std::string(role) + "'s step", step.peak_step().bytes.total()});
    return phase;
}

/// DPO's and KTO's reference forward inside the policy's step: after the policy's forward, its
/// saved tensors and logits live, the reference's whole-sequence logits under no_grad (one copy:
/// no temperature).
inline RlPhase in_step_reference(const RlReport& r, const RlSettings& s, const RlModels& m) {
    const RlRole* ref = find_role(r, "reference");
    RlPhase phase{"reference forward in the step", "after the policy's loss",
                  kept_terms(r, s, "policy")};
    phase.terms.push_back({"policy's forward and loss", loss_step(r.policy)});
    const std::uint64_t tokens = s.prompt_len + s.completion_len;
    phase.terms.push_back(
        frozen_forward(*ref, m.reference ? *m.reference : *m.policy, s.frozen_dtype,
                       s.micro_batch * s.algorithm->sequences_per_example, tokens, tokens, 1));
    return phase;
}

}  // namespace detail

/// The job `s` runs with `models` on one device of `memory` bytes (nvidia-smi's total; needed
/// for a colocated engine's share) with `device`'s rows.
inline RlReport rl_job(const RlModels& models, const RlSettings& s,
                       const std::optional<Count>& memory = std::nullopt,
                       const DeviceSettings& device = {}) {
    detail::require_positive("prompt length", s.prompt_len);
    detail::require_positive("completion length", s.completion_len);
    detail::require_positive("num_generations", s.num_generations);
    detail::require_positive("prompts", s.prompts);
    detail::require_positive("micro-batch", s.micro_batch);
    const RlAlgorithm& a = *s.algorithm;
    Settings step = s.policy;
    step.seq = s.prompt_len + s.completion_len;
    step.micro_batch = s.micro_batch * a.sequences_per_example;
    RlReport r;
    r.rollouts = a.generates ? s.prompts * s.num_generations : 0;
    detail::add_roles(r, models, s, step);
    const Architecture& policy = *models.policy;
    if (a.generates) {
        ServeSettings ss;
        ss.context = step.seq, ss.batch = r.rollouts, ss.block_size = 1;
        // generate() caches in the policy's dtype, as the generate phase counts it; an engine bf16.
        ss.kv_dtype = s.rollout == Rollout::hf ? step.recipe.weights : DType::bf16;
        r.kv_needed = serve(policy, ss).kv_cache;
        detail::add_engine(r, policy, s, memory, device);
        r.phases.push_back(detail::generate_phase(r, s, policy));
        RlPhase score = detail::score_phase(r, s, models);
        if (!score.at.empty()) r.phases.push_back(std::move(score));
    }
    if (a.reference_in_step && detail::find_role(r, "reference") &&
        s.reference != ReferenceMode::precomputed)
        r.phases.push_back(detail::in_step_reference(r, s, models));
    r.phases.push_back(detail::train_phase(r, s, "policy", r.policy));
    if (r.critic && s.roles_colocated)
        r.phases.push_back(detail::train_phase(r, s, "critic", *r.critic));
    for (std::size_t i = 1; i < r.phases.size(); ++i)
        if (r.phases[i].peak() > r.phases[r.peak_phase].peak()) r.peak_phase = i;
    return r;
}

/// What the device shows at the job's peak, its high end: the peak, and beside it what the
/// policy's step holds beyond its tensors (the rows and the allocator's fragmentation).
inline Count rl_device_high(const RlReport& r, const DeviceSettings& device) {
    const DeviceFigures d = device_figures(r.policy, device).front();
    return r.peak() + Count(d.high_bytes.value() - std::min(d.high_bytes, d.allocated).value());
}

/// What rl's fit searches: completions per prompt, or the completion's length.
enum class RlFitDimension : std::uint8_t { num_generations, completion_len };

struct RlFit {
    std::uint64_t largest = 0;  ///< 0: none fits
    bool bounded = true;        ///< false: the search's ceiling (2^24) fits too
    std::optional<RlReport> at;
};

/// The largest `dimension` at which the job's figure `weigh(report)` fits `capacity` and, with a
/// colocated engine, the rollouts' cache fits the engine's at once (else it preempts them), by
/// doubling then bisecting; a size the model cannot take (its learned positions) does not fit.
template <class Weigh>
RlFit rl_fit(const RlModels& m, RlSettings s, RlFitDimension dimension, Count capacity,
             const std::optional<Count>& memory, const DeviceSettings& device, Weigh weigh) {
    std::uint64_t& field =
        dimension == RlFitDimension::num_generations ? s.num_generations : s.completion_len;
    const auto fits = [&](std::uint64_t value) -> std::optional<RlReport> {
        field = value;
        try {
            RlReport r = rl_job(m, s, memory, device);
            if (weigh(r) > capacity || (r.engine && r.kv_needed > r.engine->kv_cache_bytes))
                return std::nullopt;
            return r;
        } catch (const error&) {  // past the model's positions, or 64 bits
            return std::nullopt;
        }
    };
    RlFit f;
    constexpr std::uint64_t ceiling = std::uint64_t{1} << 24;
    f.at = fits(1);
    if (!f.at) return f;
    std::uint64_t lo = 1, hi = 2;  // lo fits; hi is to be tried
    while (hi <= ceiling && fits(hi)) lo = hi, hi *= 2;
    f.bounded = hi <= ceiling;
    if (!f.bounded) hi = lo;
    while (hi - lo > 1) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    f.largest = lo;
    f.at = fits(lo);
    return f;
}

}  // namespace memcalc
