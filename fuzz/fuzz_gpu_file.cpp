// libFuzzer target: a GPU file (--gpu-file); one that reads is the device of an estimate, a plan
// (its speeds give step times) and a serve's largest batch, through the program in process.
#include "gpu_file.hpp"
#include "in_process.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    enter_scratch_folder();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    run_with_file(data, size, memcalc::cli::parse_gpu_json, "gpu.json",
                  {"--preset gpt2 --seq 64 --gpu-file gpu.json --format json",
                   "plan --preset gpt2 --gpus 16 --seq 64 --global-batch 32 --gpu-file gpu.json",
                   "serve --preset gpt2 --context 512 --gpu-file gpu.json --format json"});
    return 0;
}
