// Post-training jobs: the roles an algorithm keeps, the rollouts and the phases' peaks.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "memcalc/rl.hpp"
#include "model_file.hpp"
#include "run_program.hpp"

using namespace memcalc;

namespace {

RlSettings job(const char* algorithm, std::uint64_t completion = 256) {
    RlSettings s;
    s.algorithm = rl_row(rl_algorithms, algorithm);
    s.reference = s.algorithm->reference ? ReferenceMode::resident : ReferenceMode::none;
    s.reward_model = s.algorithm->reward_model;
    s.completion_len = completion;
    s.policy.recipe = builtin_recipe("bf16-adam");
    s.policy.recompute = Recompute::full;
    s.frozen_dtype = DType::bf16;
    return s;
}

std::vector<std::string> role_names(const RlReport& r) {
    std::vector<std::string> out;
    for (const RlRole& role : r.roles) out.emplace_back(role.role);
    return out;
}

const RlPhase& phase(const RlReport& r, const std::string& name) {
    for (const RlPhase& p : r.phases)
        if (p.name == name) return p;
    FAIL("no phase " << name);
    return r.phases.front();
}

Count term(const RlPhase& p, const std::string& name) {
    for (const RlTerm& t : p.terms)
        if (t.name == name) return t.bytes;
    return Count(0);
}

}  // namespace

TEST_CASE("each algorithm keeps its roles", "[rl]") {
    const Architecture m = fixtures::gpt2_small();
    using Names = std::vector<std::string>;
    const auto [algorithm, roles] = GENERATE(table<const char*, Names>({
        {"grpo", {"policy"}},
        {"rloo", {"policy", "reference"}},
        {"ppo", {"policy", "reference", "reward", "critic"}},
        {"dpo", {"policy", "reference"}},
        {"kto", {"policy", "reference"}},
        {"orpo", {"policy"}},
    }));
    CAPTURE(algorithm);
    const RlReport r = rl_job({&m}, job(algorithm));
    CHECK(role_names(r) == roles);
    CHECK(r.phases.back().name == (r.critic ? "train critic" : "train policy"));
    // The job's peak is its largest phase, named.
    for (const RlPhase& p : r.phases) CHECK(p.peak() <= r.peak());
}

TEST_CASE("the train phase is the policy's step beside what the other roles keep", "[rl]") {
    const Architecture model = GENERATE(fixtures::gpt2_small(), fixtures::llama_7b());
    RlSettings s = job("rloo");
    const RlReport r = rl_job({&model}, s);
    Settings step = s.policy;
    step.seq = s.prompt_len + s.completion_len, step.micro_batch = s.micro_batch;
    const Report alone = estimate(model, step);
    const RlPhase& train = phase(r, "train policy");
    CHECK(term(train, "policy's step") == alone.peak_step().bytes.total());
    // The reference, frozen in bf16, keeps its weights: 2 B a parameter.
    CHECK(term(train, "reference kept") == alone.parameter_count * 2);
    CHECK(train.peak() == alone.peak_step().bytes.total() + alone.parameter_count * 2);
    CHECK(train.at == "policy's " + alone.peak_step().name());
}

TEST_CASE("DPO's reference forward inside the step can set the job's peak", "[rl]") {
    const Architecture m = cli::load_preset("qwen2-0.5b").architecture;
    RlSettings s = job("dpo", 512);
    s.policy.recipe = builtin_recipe("fp32-adam");
    s.policy.recompute = Recompute::none;
    s.frozen_dtype = DType::fp32;
    s.micro_batch = 4;  // eight sequences: chosen and rejected
    const RlReport r = rl_job({&m}, s);
    REQUIRE(r.phases[r.peak_phase].name == "reference forward in the step");
    const RlPhase& in_step = r.phases[r.peak_phase];
    // The reference's whole-sequence logits in fp32: 8 sequences x 1,024 tokens x the vocabulary.
    CHECK(term(in_step, "reference's forward") >= Count(8ULL * 1024 * m.vocab * 4));
    CHECK(r.peak() > phase(r, "train policy").peak());
    // Precomputed log-probs keep no reference: the job is the policy's step alone.
    s.reference = ReferenceMode::precomputed;
    const RlReport precomputed = rl_job({&m}, s);
    CHECK(precomputed.phases.size() == 1);
    CHECK(precomputed.peak() == term(precomputed.phases.front(), "policy's step"));
}

TEST_CASE("the policy's generate() holds the rollouts' cache, growing with them", "[rl]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
    RlSettings s = job("grpo");
    s.num_generations = GENERATE(4, 16);
    s.prompts = 2;
    const RlReport r = rl_job({&m}, s);
    REQUIRE(r.rollouts == 2 * s.num_generations);
    // k and v of every layer in the policy's dtype (bf16 here), for every token of each rollout.
    const std::uint64_t tokens = s.prompt_len + s.completion_len;
    const Count per_token = Count(m.layers) * 2 * m.key_value_heads() * m.head_size() * 2;
    const RlPhase& generate = phase(r, "generate");
    CHECK(term(generate, "KV cache") == per_token * tokens * r.rollouts);
    CHECK(r.kv_needed == per_token * tokens * r.rollouts);
    CHECK(term(generate, "policy kept") == detail::kept_between_steps(r.policy));
    // An fp32 policy's generate() caches in fp32: twice the bytes, need and phase alike.
    s.policy.recipe = builtin_recipe("amp-adam");
    s.policy.activations = ActivationModel::architecture;
    const RlReport fp32 = rl_job({&m}, s);
    CHECK(fp32.kv_needed == r.kv_needed * 2);
    CHECK(term(phase(fp32, "generate"), "KV cache") == fp32.kv_needed);
}

TEST_CASE("the policy's generate() repeats grouped k and v: a decode step over the whole sequence",
          "[rl]") {
    Architecture m = fixtures::llama_7b();
    m.kv_heads = 8;  // 32 query heads of 128 over 8 key/value heads
    RlSettings s = job("grpo");
    s.prompts = 1, s.num_generations = 4;
    s.prompt_len = 64;
    s.completion_len = GENERATE(64u, 4096u);
    CAPTURE(s.completion_len);
    const RlReport r = rl_job({&m}, s);
    const RlPhase& generate = phase(r, "generate");
    // A decode step's k and v of every token so far, repeated to the 32 heads, in bf16.
    const Count decode = Count(r.rollouts) * (s.prompt_len + s.completion_len) * 2 * 32 * 128 * 2;
    const Count prefill = detail::total_bytes(
        detail::forward_temporaries(m, r.rollouts * s.prompt_len, r.rollouts, 1, true));
    if (decode > prefill) {
        CHECK(term(generate, "a decode step's k and v repeated to every head") == decode);
        CHECK(term(generate, "prefill") == Count(0));
    } else {
        CHECK(term(generate, "prefill") == prefill);
    }
    CHECK((s.completion_len == 4096) == (decode > prefill));  // a long completion's decode leads
}

TEST_CASE("a colocated engine holds its share; asleep it frees it between generations", "[rl]") {
    const Architecture m = fixtures::llama_7b();
    RlSettings s = job("grpo");
    s.rollout = Rollout::vllm;
    s.engine.rule = engine_rule("vllm", GENERATE("0.10", "0.21"));
    s.engine.share = GENERATE(0.3, 0.5);
    const Count memory = Count(80ULL << 30);
    CHECK_THROWS_AS(rl_job({&m}, s), error);  // a share of what? the device must be given
    const RlReport awake = rl_job({&m}, s, memory);
    REQUIRE(awake.engine);
    const Count share = awake.engine->terms.front().bytes;
    CHECK(share == detail::share(awake.engine->cuda_total, *s.engine.share));
    CHECK(awake.engine_bytes >= share);
    CHECK(term(phase(awake, "generate"), "engine's share (awake)") == awake.engine_bytes);
    CHECK(term(phase(awake, "train policy"), "engine's share (awake: no sleep mode)") ==
          awake.engine_bytes);
    s.sleeps = true;
    const RlReport asleep = rl_job({&m}, s, memory);
    CHECK(term(phase(asleep, "train policy"), "engine's share (awake: no sleep mode)") == Count(0));
    CHECK(asleep.peak() <= awake.peak());
    s.colocated = false;  // on its own GPUs: nothing on these
    CHECK(rl_job({&m}, s, memory).engine_bytes == Count(0));
}

TEST_CASE("roles on their own GPUs leave the policy's devices the policy's step", "[rl]") {
    const Architecture m = GENERATE(fixtures::gpt2_small(), fixtures::mistral_7b());
    RlSettings s = job("ppo");
    const RlReport together = rl_job({&m}, s);
    s.roles_colocated = false;
    const RlReport apart = rl_job({&m}, s);
    CHECK(role_names(apart) == role_names(together));
    for (const RlRole& role : apart.roles)
        CHECK((role.resident == Count(0)) == (role.role != Text("policy")));
    const std::vector<std::string> phases = {"generate", "train policy"};
    std::vector<std::string> named;
    for (const RlPhase& p : apart.phases) named.push_back(p.name);
    CHECK(named == phases);
    CHECK(apart.peak() == apart.policy.peak_step().bytes.total());
    CHECK(apart.peak() < together.peak());
}

TEST_CASE("rl_fit finds the largest completion that fits, and one more does not", "[rl]") {
    const Architecture m = GENERATE(fixtures::gpt2_small(), fixtures::llama_7b());
    RlSettings s = job("grpo");
    const Count capacity = rl_job({&m}, s).peak() * 2;
    const auto peak = [](const RlReport& r) { return r.peak(); };
    const RlFit f = rl_fit({&m}, s, RlFitDimension::completion_len, capacity, std::nullopt,
                           DeviceSettings{}, peak);
    REQUIRE(f.largest > 256);
    REQUIRE(f.at);
    CHECK(f.at->peak() <= capacity);
    s.completion_len = f.largest + 1;
    bool past = true;  // past the model's positions counts as not fitting
    try {
        past = rl_job({&m}, s).peak() > capacity;
    } catch (const error&) {}
    CHECK(past);
}

TEST_CASE("memcalc rl: roles, phases and the named peak in JSON; bad input named", "[rl][cli]") {
    const testing::Run run = testing::shell(
        "memcalc rl --algorithm ppo --preset gpt2 --prompt-len 128 --completion-len 64 "
        "--format json");
    REQUIRE(run.status == 0);
    const auto j = nlohmann::json::parse(run.out);
    CHECK(j["roles"].size() == 4);
    CHECK(j["roles"][3]["role"] == "critic");
    CHECK(j["roles"][3]["model"] == "gpt2");
    std::uint64_t largest = 0;
    std::string named;
    for (const auto& p : j["phases"])
        if (p["peak"].get<std::uint64_t>() > largest) largest = p["peak"], named = p["name"];
    CHECK(j["peak"]["bytes"] == largest);
    CHECK(j["peak"]["phase"] == named);
    const auto [args, message] = GENERATE(table<std::string, std::string>({
        {"--algorithm sft", "--algorithm must be one of"},
        {"--prompt-len 64", "rl needs --algorithm"},
        {"--algorithm grpo --seq 1024", "--seq 1024"},
        {"--algorithm grpo --engine vllm --gpu-memory-utilization 1.5 --gpu h100-sxm", "1.5"},
        {"--algorithm grpo --fit completion-len", "--fit needs"},
        {"--algorithm grpo --reference lazy", "--reference must be"},
        {"--algorithm grpo --engine vllm", "colocated engine"},
        {"--algorithm dpo --reward-model nowhere.json", "nowhere.json"},
    }));
    const testing::Run bad = testing::shell("memcalc rl --preset gpt2 " + args);
    CAPTURE(args);
    CHECK(bad.status != 0);
    CHECK(bad.out.empty());
    CHECK(bad.err.find(message) != std::string::npos);
}

namespace {
/// huggingface/trl#3168's job as TRL 0.16's defaults ran it, with `extra` options, as JSON.
nlohmann::json dpo_quick_start(const std::string& extra = "") {
    const testing::Run run = testing::shell(
        "memcalc rl --algorithm dpo --preset qwen2-0.5b --recipe fp32-adam --recompute none "
        "--prompt-len 512 --completion-len 512 --gpu a100-80gb --format json " +
        extra);
    REQUIRE(run.status == 0);
    return nlohmann::json::parse(run.out);
}
}  // namespace

TEST_CASE("huggingface/trl#3168: TRL's DPO quick start does not fit an A100 80GB", "[rl][cli]") {
    // TRL 0.16's defaults: an fp32 load without autocast, no gradient checkpointing, 8 pairs of
    // 1,024 tokens, the reference a second fp32 copy; it ran out of memory on the first step.
    const auto j = dpo_quick_start();
    CHECK(j["device"]["fits"] == false);
    CHECK(j["peak"]["phase"] == "reference forward in the step");
    // Its precomputed log-probs would not have saved it: the policy's step alone is over too.
    const auto k = dpo_quick_start("--reference precomputed");
    CHECK(k["peak"]["bytes"] < j["peak"]["bytes"]);
    CHECK(k["device"]["fits"] == false);
}
