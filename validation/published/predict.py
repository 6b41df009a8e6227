#!/usr/bin/python3
"""memcalc's prediction beside each published GPU peak in measurements.json (issue 14).

Each row below is the memcalc command that describes the published run as its source states it, and,
where memcalc does not model something the run used, why the figure is only the nearest one. Nothing
here is fitted to the published figures: a row's settings come from its source (quoted in
measurements.json), never from its number.

  predict.py [--memcalc build/memcalc]          writes predictions.json and predictions.md
  predict.py [--memcalc build/memcalc] --check  fails if the committed files differ from a fresh run
Standard library only.
"""
import argparse
import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MODELS = "validation/published/models/"

# Megatron-LM's bf16 run: its own attention/Adam/main_grad profile, and fp32 main_grad, which --bf16
# forces (accumulate_allreduce_grads_in_fp32); the golden value is global rank world_size-1's.
MEGATRON = ["--activations", "architecture", "--profile", "megatron", "--recipe", "mixed-adam-fp32-grads"]
# Megatron-LM's GPT functional tests set CUBLAS_WORKSPACE_CONFIG :4096:8 (their model_config.yaml ENV_VARS,
# for determinism): PyTorch's cuBLAS workspaces are then 32 MiB each on every GPU, the A100 too.
MEGATRON_GPT = MEGATRON + ["--cublas-workspace-config", ":4096:8"]
# Transformer Engine's attention backend (attention/dot_product_attention/utils.py @d0067d0: FusedAttention
# is preferred on Hopper and later alone; on sm100 fused_attn.cpp:481-488 turns it off for a deterministic
# training run with dropout, which these tests are) is flash-attn on the A100 and the GB200: its output comes
# back to Megatron's [s, b, h] layers as a transposed view the output projection copies (sequence_first).
TE_FLASH = ["--attention-kernel", "flash-attention-2"]
TE_FLASH_WHY = ("Transformer Engine runs flash-attn here (cuDNN's fused attention is preferred on Hopper "
                "alone, and on sm100 not for a deterministic run with dropout): --attention-kernel "
                "flash-attention-2; at micro-batch 2 the output projection copies the kernel's output "
                "(sequence_first, the megatron profile's)")
# Megatron-LM's VocabParallelCrossEntropy (megatron/core/tensor_parallel/cross_entropy.py) makes one fp32
# copy of its logits shard and works in place on it (max, subtract, exp, divide; the backward writes the
# gradient over the saved softmax): 6 B per logit with the bf16 logits. memcalc's fp32 loss is
# log_softmax + nll as autograd runs them: 12 B per logit at the loss step. The difference is stated.
# torchtitan: FSDP2 over fp32 parameters (16 B a parameter, sharded, as mixed-adam's 16), --zero 3;
# its Attention copies k and v to every query head (repeat_kv) before SDPA: --repeat-kv true.
TORCHTITAN = ["--activations", "architecture", "--profile", "torchtitan", "--zero", "3",
              "--repeat-kv", "true"]
COMPILED_LAYERS = ["--compile", "layers"]  # torch.compile on each block
TORCHTITAN_COMPILED = TORCHTITAN + COMPILED_LAYERS  # compile.enable
# torchtune's single-device recipe: the model in bf16 with torch.optim.AdamW (bf16 moments), SDPA, the
# loss over fp32 logits (TransformerDecoder.unembed: self.output(h).float()), then 'del logits'.
# Its MultiHeadAttention expands k and v to every query head and reshapes them (a copy) before SDPA
# (torchtune/modules/attention.py): --repeat-kv true.
TORCHTUNE = ["--activations", "architecture", "--recipe", "bf16-adam", "--profile", "pytorch",
             "--attention", "flash", "--logits", "freed", "--repeat-kv", "true"]

# Reasons shared by many rows (each names what memcalc does not model, or what the source leaves unsaid).
RESERVED = ("max reserved (the caching allocator's segments) is above max allocated by fragmentation "
            "and cached free blocks, which memcalc does not model")
OP_SAC = ("torchtitan's per-op selective checkpointing is memcalc's --recompute op, measured on eager layers "
          "without tensor parallelism; under torch.compile which tensors exist differs, so the nearest, "
          "--recompute selective (Korthikanti's rule), is shown")
UNFUSED = ("--attention-backend unfused: Megatron's core attention keeps the s x s probabilities "
           "once, in bf16 (its fused scale-mask-softmax): --attention eager --softmax-fp32 false")
# Megatron-LM's DeepSeek-V3-style proxies at their golden values' commits: the multi-token-prediction
# layer (--mtp-num-layers 1, the model files' mtp_layers) and the facts the megatron profile says
# (fused SwiGLU, MLA's v copied contiguous for TE, the token dispatchers' permutation).
MOE_PROXY = ("multi-token prediction, latent attention, the shared expert and EP over TP x DP "
             "(--etp 1) as the model files and the megatron profile say them")
COMPILE = ("--compile layers: each layer as torch.compile's partition keeps it (measured on CPU with torch "
           "1.13's min-cut partitioner and torch 2.6's torch.compile, validation/compile_partitioner.py: a "
           "LLaMA-style layer keeps the same on both); inductor's CUDA kernels' temporaries not measured")
# torchtune's CEWithChunkedOutputLoss, num_output_chunks 8: memcalc's --loss chunked is its eager run.
CHUNKED = ["--loss", "chunked", "--loss-chunks", "8"]
# torchtune compiles the loss with the model (training.compile_loss): --loss chunked-compiled.
CHUNKED_COMPILE = ["--loss", "chunked-compiled", "--loss-chunks", "8"]
CHUNKED_COMPILED = ("; --loss chunked-compiled is CEWithChunkedOutputLoss compiled as torchtune does with "
                    "compile on: on torch 2.6 each chunk's graph keeps the chunk and 8 B a token, no fp32 "
                    "log-probabilities (validation/compiled_loss_saved.py, chunked_loss_peak.py), and "
                    "autograd runs every chunk's loss backward before the head's: the logits, then their "
                    "gradients, beside the head weight's gradient (twice, as autograd adds the next in)")
COMPILED_UNDER = ("inductor's CUDA kernels' temporaries and the head's backward at this size are not measured "
                  "(on CPU, torch 2.6, the loss alone is as counted, within 0.1%, forward and backward; "
                  "with a head, CPU's own matmul temporaries add to its backward: -8% of the rule where "
                  "the head is small); torchtune's RoPE gathers an fp32 cache per call "
                  "(about 235 MB) as in the eager packed row")
# torchtune's compile: each layer compiled (training.compile_model) and the loss's chunks.
COMPILED_TUNE = COMPILE
# torchao's float8 linears (torchtitan's --model.converters float8): tensorwise unless the row says
# rowwise; the weights gathered in float8 where the row says enable_fsdp_float8_all_gather.
FLOAT8 = ["--recipe", "float8-tensorwise"]
FLOAT8_GATHER = ["--recipe", "float8-all-gather"]
FP8 = ("float8 linears are torchao's: --recipe float8-tensorwise (read from torchao v0.18, not "
       "measured); whether FSDP gathered the weights in float8 is not stated: bf16 gathers, leaning high")
FP8_GATHER = ("float8 linears are torchao's, the weights gathered in float8: --recipe float8-all-gather "
              "(read from torchao v0.18, not measured)")
SEQ_ASSUMED = "sequence not stated by the page: the llama3 toml's default 8192 is assumed"
# Megatron's golden values, with its in-place loss modelled (--loss fp32-inplace): what is left short.
MEGATRON_SHORT = ("not modelled: NCCL's and the distributed optimizer's buffers that the allocator "
                  "hands out (PyTorch's cuBLAS and cuBLASLt and Transformer Engine's workspaces are "
                  "counted: the device rows in the allocator). Not measured here (no GPU)")
LORA = ("LoRA: its rank and targets are not stated, which memcalc's --train lora needs, so the full "
        "finetune is shown (far above: a frozen base keeps no gradients or optimizer state)")
# LitGPT's LoRA runs: the table's 4,194,304 trainable parameters are rank 8 on query and value (memcalc counts
# them exactly), dropout 0.05, adapters in the model's bf16 (bf16-true). Its finetune/lora.py of the time (read
# at 0010d8e) forces the longest sample into the first batch, runs the head in chunks of 128 tokens, and
# validates and generates a sample (a KV cache) inside the run it measures.
# LitGPT's finetune/lora.py at commit 8641822 (its resource tables' runs), each fact read from its source
# and measured on CPU in validation/third_party/litgpt_run.py: lit-gpt's own LoRA on the query and value parts
# of its fused qkv linear (LoRAQKVLinear, --lora-variant merged), bf16-true (the model, the adapters and
# AdamW's moments in bf16), the head a 128-token chunk at a time with chunked_cross_entropy on each chunk,
# the logits fp32 as Fabric's wrapper hands them back (the model files' logits_fp32), SDPA's flash kernel.
# Samples vary in length and the longest is forced into the first micro-batch: that micro-batch is the
# step's peak, no earlier one's logits beside it (--microbatches 1; the later, shorter ones lower).
LITGPT_LORA = ["--activations", "architecture", "--recipe", "bf16-adam", "--profile", "pytorch",
               "--attention", "flash", "--loss", "chunked-bf16", "--loss-chunk-tokens", "128",
               "--torch-version", "2.1", "--train", "lora", "--lora-rank", "8", "--lora-targets",
               "q_proj,v_proj", "--lora-variant", "merged", "--lora-dropout", "0.05", "--lora-dtype", "bf16"]
LITGPT_NOTE = ("the longest Alpaca sample ({} tokens) in the first micro-batch, the others padded to it; "
               "lit-gpt @8641822 as validation/third_party/litgpt_run.py measures it on CPU "
               "(validation/third_party/litgpt/README.md); validation, sample generation and the optimizer's "
               "first step come below this")


LITGPT_UNDER = ("by 0.3% at most: less than the caching allocator's rounding, which max_memory_allocated counts "
                "(each block rounded up, a remainder under 1 MB left unsplit: memcalc's allocator model, "
                "peak.reserved's allocated_bytes, is at or above the published figure for eight of the nine "
                "rows, 0.23% below for Llama 2 7B at micro-batch 2) and the table's two decimals (5 MB)")


# --quantize bnb.nf4 / bnb.nf4-dq in the same runs: Lightning's BitsandbytesPrecision makes every linear, the
# head too, bitsandbytes 0.41.1's Linear4bit, each quantised from fp16 (--qlora-quantizer lightning); its
# MatMul4Bit keeps its input (--bitsandbytes-version 0.41.1); PagedAdamW keeps fp32 moments. The input it keeps
# for the output projection is a copy of the flash output (q_heads_first in the model files: torch 2.1's
# FlashAttention-2 writes its output in q's layout, heads-first after lit-gpt's rotary cat, and the reshape copies).
LITGPT_QLORA = ["--qlora-quantizer", "lightning", "--bitsandbytes-version", "0.41.1", "--recipe-file",
                MODELS + "bnb-paged-adamw.json"]
LITGPT_QLORA_NOTE = ("; 4-bit: the base and the head as Lightning's BitsandbytesPrecision quantises them, "
                     "bitsandbytes 0.41.1's MatMul4Bit (its input kept; each weight dequantised to fp16 and "
                     "cast), measured on CPU with a stand-in of it (litgpt_run.py --quantize); the output "
                     "projection keeps a copy of the flash output, which torch 2.1's FlashAttention-2 writes "
                     "heads-first in q's layout (q_heads_first)")
LITGPT_QLORA_UNDER = ("by 0.1% at most: less than the caching allocator's rounding, which max_memory_allocated "
                      "counts (memcalc's allocator model, peak.reserved's allocated_bytes, is above the published "
                      "figure in all eight rows) and the table's two decimals (5 MB)")


# torchtune's README table (1814feb17): its rows from '+ Activation Checkpointing' on peak in backward
# or at the optimizer step, which the table's optimizer decides; the baseline's is an override,
# optimizer._component_=torch.optim.AdamW, whose other keys the row does not give.
TUNE_ADAMW = ("which AdamW steps is not stated: torch.optim.AdamW's foreach default peaks at its step "
              "(sqrt(v) of every parameter at once: memcalc 29.9 GiB, above the published 24.9), so "
              "the run's was fused or a for-loop, both peaking in backward with the same bytes here: "
              "--optimizer-impl fused, inferred from the figure")
# full_finetune_single_device at 1814feb17 calls training.compile_loss(self._loss_fn) and drops what it
# returns: a chunked loss is compiled in place, any other returned anew, so the '+ Compile' row's loss
# runs eager.
TUNE_EAGER_LOSS = ("the loss runs eager: the recipe at 1814feb17 drops what training.compile_loss "
                   "returns, which compiles only CEWithChunkedOutputLoss in place")
TUNE_COMPILE_UNDER = ("as in the eager packed row: torchtune's RoPE with packed positions gathers an "
                      "fp32 cache per call (about 235 MB) and max active counts blocks the allocator "
                      "splits, neither counted")
# optimizer_in_bwd: an optimizer per parameter, stepped by a post-accumulate-grad hook and its
# gradient freed (training.register_optim_in_bwd_hooks): --grad-buffer stepped.
TUNE_IN_BACKWARD = ["--grad-buffer", "stepped"]
TUNE_IN_BACKWARD_NOTE = ("optimizer_in_bwd: an AdamW per parameter, stepped once its gradient is whole "
                         "and the gradient freed (training.register_optim_in_bwd_hooks, a post-"
                         "accumulate-grad hook): --grad-buffer stepped; the tied table's gradient "
                         "waits for both its uses. Which AdamW runs, as in the AC row: fused")
TUNE_OFFLOAD = ("activation offloading: each layer's checkpointed input to the host (torchtune's "
                "OffloadActivations over AC): --offload activations")
TUNE_LOSS_UNDER = ("the peak is the loss step, as in the AC row's before (memcalc 22.6 GiB there, its "
                   "peak at backward 1 +2.3%): about 0.5 GB of it is not found; counted are the "
                   "weights, AdamW's state, every layer's checkpoint (or, offloaded, two), the logits' "
                   "gradients and the head's, twice, as the head's backward runs (chunked_loss_peak.py "
                   "measures a chunk's gradient more beside them on CPU, 0.26 GB, taken there for a "
                   "CPU matmul temporary)")
TUNE_8BIT = ("bitsandbytes' 8-bit AdamW under optimizer_in_bwd, bf16 weights and no master (the recipe "
             "file bnb-adamw8bit-bf16.json); the config's PagedAdamW8bit keeps a state of 1e5 elements "
             "or more in CUDA managed memory, outside PyTorch's allocator and so outside max active, "
             "and the row does not say whether it ran paged: with every state counted memcalc is "
             "-11.7%, 2.2 GB not found, with the paged ones left out further below")
# The LoRA and QLoRA rows: lora_finetune_single_device with llama3_2/3B_lora_single_device.yaml and
# 3B_qlora_single_device.yaml at 1814feb17 (rank 64, alpha 128, q_proj, v_proj, output_proj and the MLP's
# w1, w2, w3, no dropout, bf16 adapters, torch.optim.AdamW fused=True) with the README's overrides:
# packed 4096-token samples, 2 a step, compile, CEWithChunkedOutputLoss, AC, activation offloading.
TUNE_LORA = ["--lora-rank", "64", "--lora-targets",
             "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj", "--lora-dropout", "0", "--lora-dtype",
             "bf16", "--optimizer-impl", "fused", "--offload", "activations"]
TUNE_LORA_NOTE = ("the settings of llama3_2/3B_{kind}_single_device.yaml at 1814feb17 (rank 64 on "
                  "q, v, output_proj, w1, w2, w3, no dropout, bf16 adapters, AdamW fused) and the "
                  "README's overrides (packed 4096, batch 2, compile, chunked CE, AC, activation "
                  "offloading: --offload activations, torchtune's OffloadActivations keeping the "
                  "last saved tensors on the device until backward); ")
TUNE_QLORA = ("torchao's NF4 base (64-value blocks, int8 scalers with a factor per 256): the bytes of "
              "bitsandbytes' nf4 with double quantisation to under 1 MB, dequantised per call and no "
              "input kept, as --train qlora counts it; ")
TUNE_LORA_HIGH = ("memcalc leans high by the same 0.42 GB in both rows: beside the weights, the "
                  "adapters' state and the logits (2.10 GB) the published figures leave under 0.12 GB, "
                  "where memcalc counts, as the loss's backward starts, one chunk's gradient beside "
                  "the logits (0.26 GB; measured on CPU, torch 2.6: chunked_loss_peak.py) and the "
                  "offload's last saved tensors (0.2 GB); without AdamW's state (0.36 GB), as in a "
                  "first step before it exists, memcalc would be +0.7% and +1.4%: the table does not "
                  "say which step it reports")


def torchtune_adapter(kind):
    """torchtune's LoRA or QLoRA row of its README table (kind: lora or qlora)."""
    args = (["--model-file", MODELS + "llama-3.2-3b.json", "--seq", "4096", "-b", "2"]
            + CHUNKED_COMPILE + ["--recompute", "full"] + COMPILED_LAYERS + TORCHTUNE + ["--train", kind]
            + TUNE_LORA)
    note = TUNE_LORA_NOTE.format(kind=kind) + (TUNE_QLORA if kind == "qlora" else "")
    return dict(args=args, note=note + COMPILED_TUNE + CHUNKED_COMPILED + "; " + TUNE_LORA_HIGH)


def without_recipe(args):
    """A command's arguments without its --recipe NAME pair (for one that names a recipe file)."""
    i = args.index("--recipe")
    return args[:i] + args[i + 2:]


def litgpt_qlora(model, seq, double_quant):
    """A LitGPT QLoRA row: the LoRA row's run with --quantize bnb.nf4 or bnb.nf4-dq."""
    row = litgpt(model, seq, 1)
    args = without_recipe(row["args"])
    args[args.index("lora")] = "qlora"
    return dict(args=args + LITGPT_QLORA + ["--qlora-double-quant", "true" if double_quant else "false"],
                note=row["note"] + LITGPT_QLORA_NOTE, under_estimate=LITGPT_QLORA_UNDER)


# LitGPT's Adapter rows, added to the table with --quantize for the adapter scripts (lit-gpt @0f021f3a, PR #694:
# lit_gpt/adapter.py and adapter_v2.py as at 8641822), and its multi-GPU LoRA rows. finetune/adapter.py's loop is
# lora.py's (the head in 128-token chunks, fp32 logits held, AdamW), its sanity-check validation first under
# no_grad, which caches each layer's prompt keys and values outside any graph: LLaMA-Adapter as --train adapter
# counts it, measured on CPU with lit-gpt's adapter.py (litgpt_run.py --method adapter, adapter_v2).
# The program is 0f021f3a's, not 8641822's: its RMSNorm (since #606) runs on an fp32 copy of x and multiplies the
# weight into the fp32 result (the Llama model file litgpt-llama-2-7b-0f021f3a.json). Its README recommends a
# PyTorch 2.2 nightly (for FlashAttention-2), whose mean() keeps no input (pytorch#109935): --torch-version 2.2.
# Inferred from the rows: v1's cannot tell (an fp32 x is a bf16 x and x^2), v2's, whose trained norms keep an fp32
# x_norm, fit only this (8641822's RMSNorm: -3.1..-3.8%; 0f021f3a's under torch 2.1's mean: +4.9%).
LITGPT_ADAPTER_PROGRAM = ("; lit-gpt @0f021f3a's RMSNorm (an fp32 copy of x, the weight multiplied in fp32: "
                          "--rmsnorm-kernel torch --rmsnorm-fp32-scale true in the model file) on the PyTorch 2.2 "
                          "nightly its README recommends (mean keeps no input: --torch-version 2.2), inferred: "
                          "the v2 rows fit nothing else")
LITGPT_ADAPTER_NOTE = ("the longest Alpaca sample ({} tokens) in the first micro-batch; LLaMA-Adapter as lit-gpt "
                       "@0f021f3a runs it (a 10-token prompt in every layer from the third, its keys and values "
                       "cached by the sanity-check validation under no_grad; the prompt attention SDPA's "
                       "memory-efficient kernel), measured on CPU with lit-gpt's adapter.py "
                       "(litgpt_run.py --method adapter)")
LITGPT_ADAPTER_V2_NOTE = ("the longest Alpaca sample ({} tokens) in the first micro-batch; LLaMA-Adapter v2 as "
                          "lit-gpt @0f021f3a runs it (adapter.py's prompt, a trained scale and bias on every "
                          "linear's output and the head's, each keeping its output plus the bias, and the norms "
                          "trained: --train adapter-v2), measured on CPU with lit-gpt's adapter_v2.py "
                          "(litgpt_run.py --method adapter_v2)")
LITGPT_ADAPTER_UNDER = ("by 0.4% at most: the caching allocator's rounding, which max_memory_allocated counts "
                        "(memcalc's allocator model, peak.reserved's allocated_bytes, is at or above the published "
                        "figure), and the table's two decimals; lit-gpt's cached prompt keys and values (5 MB) stand "
                        "in memcalc for the prompt's gradient and optimizer state, which lit-gpt never makes (the "
                        "same bytes under bf16-adam)")
LITGPT_ADAPTER_NF4 = ("; 4-bit: the base and the head as the QLoRA rows' (Lightning's BitsandbytesPrecision, "
                      "bitsandbytes 0.41.1's MatMul4Bit keeping its input, PagedAdamW: --train qadapter or "
                      "qadapter-v2), measured on CPU with the stand-in of MatMul4Bit (litgpt_run.py --quantize)")


def litgpt_adapter(model, seq, quantized=None, v2=False):
    """A LitGPT Adapter row: LLaMA-Adapter (v2: LLaMA-Adapter v2) over lit-gpt @0f021f3a's model, or over
    its 4-bit base (quantized: "nf4" or "nf4-dq", as its QLoRA rows)."""
    program = model + "-0f021f3a" if "llama" in model else model  # StableLM's LayerNorm is as at 8641822
    args = litgpt(program, seq, 1)["args"]
    args[args.index("--torch-version") + 1] = "2.2"
    mode = ("q" if quantized else "") + ("adapter-v2" if v2 else "adapter")
    args = args[:args.index("--train")] + ["--train", mode]
    note = (LITGPT_ADAPTER_V2_NOTE if v2 else LITGPT_ADAPTER_NOTE).format(seq) + LITGPT_ADAPTER_PROGRAM
    if not quantized:
        return dict(args=args, note=note, under_estimate=LITGPT_ADAPTER_UNDER)
    args = [a for a in args if a != "bf16-adam"]
    args[args.index("--recipe"):args.index("--recipe") + 1] = []
    return dict(args=args + LITGPT_QLORA + ["--qlora-double-quant", "true" if quantized == "nf4-dq" else "false"],
                note=note + LITGPT_ADAPTER_NF4, under_estimate=LITGPT_ADAPTER_UNDER)


LITGPT_FSDP = ("Fabric's FSDP (FSDP1) over every Block, each checkpointed, 128 sequences a step: with the "
               "switches its sources give, not comparable yet. lit-gpt accumulates under fabric.no_backward_sync, "
               "FSDP's no_sync (lightning@71aed751 _FSDPBackwardSyncControl), so the micro-batches before the last "
               "hold each Block's gradient unsharded (--grad-sync last-microbatch); with use_orig_params=True "
               "(Fabric's default) a Block mixing LoRA and frozen weights has one flat gradient over all of them "
               "(--grad-units flat): a bf16 copy of the layers' weights, which the published peaks show; and "
               "FSDP1 does not reshard the root unit (the embedding, final norm and head) after forward "
               "(_post_forward_reshard: --root-gather kept). What is left is the later micro-batches' length: "
               "they hold those gradients, and lit-gpt draws their samples at random (only the first is forced "
               "to the longest), so each is shorter than --seq, by an amount the table does not give; with every "
               "micro-batch at the longest memcalc is -7% to +20% (high at micro-batch 4, where the logits grow "
               "with the length; at micro-batch 1 -0.8% to -2.5%, StableLM 3B's -6.9%, 0.9 GB not found)")


def litgpt_fsdp(model, seq, micro_batch, gpus):
    """A LitGPT multi-GPU LoRA row: Fabric's FSDP1, its no_sync accumulation over 128 sequences a step,
    every micro-batch at the longest sample's length (the later ones are shorter: not comparable)."""
    row = litgpt(model, seq, micro_batch)
    return dict(args=row["args"] + ["--dp", str(gpus), "--zero", "3", "--recompute", "full", "--microbatches",
                                    str(128 // gpus // micro_batch), "--grad-sync", "last-microbatch",
                                    "--grad-units", "flat", "--root-gather", "kept"],
                comparable=False, why=LITGPT_FSDP)

def litgpt(model, seq, micro_batch):
    """A LitGPT LoRA row: lit-gpt's model as its config.py builds it, the longest sample's micro-batch."""
    return dict(args=["--model-file", MODELS + model + ".json", "--seq", str(seq), "-b", str(micro_batch)]
                + LITGPT_LORA, note=LITGPT_NOTE.format(seq), under_estimate=LITGPT_UNDER)


ROWS = {
    # ---- Megatron-LM functional-test golden values (max allocated, one rank: the last pipeline stage)
    "megatron-gpt-small-tp2pp2-a100": dict(
        args=["--model-file", MODELS + "megatron-gpt-small-tp2.json", "--seq", "1024", "-b", "4",
              "--tp", "2", "--pp", "2", "--dp", "2", "--global-batch", "32", "--attention", "eager", "--softmax-fp32", "false"] + MEGATRON_GPT,
        rank="last", under_estimate=MEGATRON_SHORT, note=UNFUSED),
    "megatron-gpt-small-fullrecompute-h100": dict(
        args=["--model-file", MODELS + "megatron-gpt-small-tp1.json", "--seq", "1024", "-b", "4",
              "--dp", "8", "--global-batch", "32", "--recompute", "full"] + MEGATRON_GPT,
        rank="last", under_estimate=MEGATRON_SHORT, note="recompute-method uniform, recompute-num-layers 1: every layer checkpointed"),
    "megatron-7b-tp1pp4-vpp-h100": dict(
        args=["--model-file", MODELS + "megatron-gpt-7b-tp1.json", "--seq", "8192", "-b", "1",
              "--pp", "4", "--vpp", "8", "--dp", "2", "--zero", "1", "--global-batch", "8"] + MEGATRON_GPT,
        rank="last", under_estimate=MEGATRON_SHORT, note="1 layer per virtual stage: 8 chunks a rank; distributed optimizer as ZeRO-1"),
    "megatron-7b-tp1pp4-vpp-a100": dict(same_as="megatron-7b-tp1pp4-vpp-h100", extra_args=TE_FLASH,
        note="1 layer per virtual stage: 8 chunks a rank; distributed optimizer as ZeRO-1; " + TE_FLASH_WHY
             + " (at micro-batch 1 the transposed view is contiguous: no copy)"),
    "megatron-7b-tp4pp1-h100": dict(
        args=["--model-file", MODELS + "megatron-gpt-7b-tp4.json", "--seq", "8192", "-b", "2",
              "--tp", "4", "--dp", "2", "--zero", "1", "--global-batch", "8"] + MEGATRON_GPT,
        rank="last", under_estimate=MEGATRON_SHORT, note="TP 4 without sequence parallelism; distributed optimizer as ZeRO-1"),
    "megatron-7b-tp4pp1-gb200": dict(same_as="megatron-7b-tp4pp1-h100", extra_args=TE_FLASH,
        note="TP 4 without sequence parallelism; distributed optimizer as ZeRO-1; " + TE_FLASH_WHY),
    "megatron-7b-tp4pp1-a100": dict(same_as="megatron-7b-tp4pp1-h100", extra_args=TE_FLASH,
        note="TP 4 without sequence parallelism; distributed optimizer as ZeRO-1; " + TE_FLASH_WHY),
    "megatron-moe-mla-tp2pp2ep4-h100": dict(
        args=["--model-file", MODELS + "megatron-moe-proxy-1024.json", "--seq", "4096", "-b", "4",
              "--tp", "2", "--sp", "--pp", "2", "--vpp", "4", "--dp", "2", "--ep", "4", "--etp", "1", "--zero", "1",
              "--global-batch", "32", "--attention", "eager", "--softmax-fp32", "false"] + MEGATRON,
        rank="last", under_estimate=MEGATRON_SHORT,
        why=MOE_PROXY + "; " + UNFUSED + " (with transformers' fp32 softmax: +104%); the recipe lists "
                        "the test as mr-broken"),
    # At 870bbf2e the router runs on an fp32 copy of its input (router.py gating:
    # input.to(router_dtype), --moe-router-dtype fp32) and the loss is Transformer Engine's
    # (--cross-entropy-fusion-impl te: parallel_cross_entropy writes the gradient over the logits).
    "megatron-moe-mla-ep8-h100": dict(
        args=["--model-file", MODELS + "megatron-moe-proxy-2560.json", "--seq", "4096", "-b", "1",
              "--dp", "8", "--ep", "8", "--zero", "1", "--global-batch", "128"] + MEGATRON +
             ["--router-input-fp32", "true", "--loss", "fused"],
        rank="last", under_estimate=MEGATRON_SHORT,
        why=MOE_PROXY + "; the router's fp32 input copy (before July 2025) and TE's fused loss"),
    # ---- torchtitan benchmarks (max reserved, max over GPUs)
    "titan-l31-8b-fsdp8-sac": dict(
        args=["--preset", "llama-3-8b", "--seq", "8192", "-b", "2", "--dp", "8", "--recompute",
              "selective"] + TORCHTITAN, comparable=False, why=OP_SAC + "; " + SEQ_ASSUMED),
    "titan-l31-8b-fsdp8-sac-compile": dict(
        args=["--preset", "llama-3-8b", "--seq", "8192", "-b", "2", "--dp", "8", "--recompute",
              "selective"] + TORCHTITAN_COMPILED, comparable=False,
        why=COMPILE + "; " + OP_SAC + "; " + SEQ_ASSUMED),
    "titan-l31-8b-fsdp8-sac-compile-fp8": dict(same_as="titan-l31-8b-fsdp8-sac-compile",
        extra_args=FLOAT8, why=FP8 + "; " + COMPILE + "; " + OP_SAC),
    "titan-l31-8b-fsdp8-cp1-32k": dict(
        args=["--preset", "llama-3-8b", "--seq", "32768", "-b", "1", "--dp", "8", "--recompute",
              "full"] + TORCHTITAN_COMPILED + FLOAT8, comparable=False, why=FP8 + "; " + COMPILE),
    "titan-l31-8b-fsdp4-cp2-64k": dict(
        args=["--preset", "llama-3-8b", "--seq", "65536", "-b", "1", "--dp", "4", "--cp", "2",
              "--recompute", "full"] + TORCHTITAN_COMPILED + FLOAT8, comparable=False,
        why=FP8 + "; " + COMPILE),
    "titan-l31-8b-fsdp1-cp8-256k": dict(
        args=["--preset", "llama-3-8b", "--seq", "262144", "-b", "1", "--cp", "8", "--recompute",
              "full"] + TORCHTITAN_COMPILED + FLOAT8, comparable=False, why=FP8 + "; " + COMPILE),
    "titan-l31-8b-fsdp128-sac": dict(
        args=["--preset", "llama-3-8b", "--seq", "8192", "-b", "2", "--dp", "128", "--recompute",
              "selective"] + TORCHTITAN, comparable=False, why=OP_SAC + "; " + SEQ_ASSUMED),
    "titan-l31-70b-fsdp32-tp8": dict(
        args=["--preset", "llama-3-70b", "--seq", "8192", "-b", "16", "--tp", "8", "--sp", "--dp", "32",
              "--recompute", "full"] + TORCHTITAN_COMPILED + FLOAT8, comparable=False,
        why=FP8 + "; " + COMPILE + "; " + SEQ_ASSUMED),
    "titan-l31-70b-fsdp32-tp8-asynctp": dict(same_as="titan-l31-70b-fsdp32-tp8",
        why=FP8 + "; " + COMPILE + "; async TP's symmetric-memory buffers; " + SEQ_ASSUMED),
    "titan-l31-405b-3d-1f1b": dict(
        args=["--preset", "llama-3.1-405b", "--seq", "8192", "-b", "4", "--tp", "8", "--sp", "--pp", "8", "--first-stage-layers", "15", "--last-stage-layers", "15",
              "--dp", "8", "--global-batch", "256", "--recompute", "full"] + TORCHTITAN_COMPILED + FLOAT8,
        comparable=False,
        why=FP8 + "; " + COMPILE + "; " + SEQ_ASSUMED + "; micro-batches not stated (8 of 4 assumed); the 126 layers split 15, 16 x 6, 15 (assumed)"),
    "titan-l31-405b-3d-interleaved": dict(
        args=["--preset", "llama-3.1-405b", "--seq", "8192", "-b", "4", "--tp", "8", "--sp", "--pp", "8", "--first-stage-layers", "15", "--last-stage-layers", "15",
              "--dp", "8", "--global-batch", "256", "--recompute", "full"] + TORCHTITAN_COMPILED + FLOAT8,
        comparable=False,
        why=FP8 + "; " + COMPILE + "; " + SEQ_ASSUMED + "; micro-batches and stages per rank not stated "
            "(8 of 4 assumed); memcalc cannot interleave 126 layers over 8 ranks (its chunks are even), so "
            "this is the 1F1B row's figure"),
    "titan-l31-405b-4d-cp1-32k": dict(
        args=["--preset", "llama-3.1-405b", "--seq", "32768", "-b", "1", "--tp", "8", "--sp", "--pp", "8", "--first-stage-layers", "15", "--last-stage-layers", "15",
              "--dp", "8", "--global-batch", "64", "--recompute", "full"] + TORCHTITAN_COMPILED + FLOAT8,
        comparable=False,
        why=FP8 + "; " + COMPILE + "; micro-batches not stated (8 of 1 assumed); the 126 layers split 15, 16 x 6, 15 (assumed)"),
    "titan-l31-405b-4d-cp8-256k": dict(
        args=["--preset", "llama-3.1-405b", "--seq", "262144", "-b", "1", "--tp", "8", "--sp", "--pp", "8", "--first-stage-layers", "15", "--last-stage-layers", "15",
              "--cp", "8", "--global-batch", "8", "--recompute", "full"] + TORCHTITAN_COMPILED + FLOAT8,
        comparable=False,
        why=FP8 + "; " + COMPILE + "; micro-batches not stated (8 of 1 assumed); the 126 layers split 15, 16 x 6, 15 (assumed)"),
    "titan-l31-8b-h200-32gpu-fp8": dict(
        args=["--preset", "llama-3-8b", "--seq", "8192", "-b", "2", "--dp", "32", "--recompute",
              "selective"] + TORCHTITAN_COMPILED + FLOAT8_GATHER, comparable=False,
        why=FP8_GATHER + "; " + COMPILE + "; " + OP_SAC + "; " + SEQ_ASSUMED),
    # ---- torchao's float8 README (torchtitan runs; max reserved, in GiB though headed GB)
    "torchao-l3-8b-bf16-sac": dict(
        args=["--preset", "llama-3-8b", "--seq", "8192", "-b", "1", "--dp", "8", "--recompute",
              "selective"] + TORCHTITAN_COMPILED, comparable=False, why=COMPILE + "; " + OP_SAC, unit_bytes=2**30),
    "torchao-l3-8b-fp8-tensorwise-sac": dict(same_as="torchao-l3-8b-bf16-sac",
        extra_args=FLOAT8_GATHER, why=FP8_GATHER + "; " + COMPILE + "; " + OP_SAC),
    "torchao-l3-8b-fp8-rowwise-sac": dict(same_as="torchao-l3-8b-bf16-sac",
        extra_args=["--recipe", "float8-rowwise"],
        why=("float8 linears are torchao's, rowwise, the weights gathered in bf16: --recipe "
             "float8-rowwise (read from torchao v0.18, not measured); ") + COMPILE + "; " + OP_SAC),
    # ---- torchtune README
    "torchtune-l31-8b-full-4090": dict(
        args=["--preset", "llama-3-8b", "--seq", "2048", "-b", "2", "--recompute", "full"]
             + COMPILED_LAYERS + TORCHTUNE,
        comparable=False,
        why=("the table states neither the memory statistic, the optimizer nor AC; its config's defaults "
             "(bitsandbytes PagedAdamW8bit, optimizer_in_bwd) are not modelled; " + COMPILE)),
    "torchtune-l31-8b-full-a6000": dict(same_as="torchtune-l31-8b-full-4090",
        why=("the same model and setting as the 4090 row at twice the memory: its settings differ and are "
             "not stated; " + COMPILE)),
    "torchtune-l31-8b-lora-4090": dict(same_as="torchtune-l31-8b-full-4090", why=LORA + "; settings not stated"),
    "torchtune-l31-8b-qlora-4090": dict(same_as="torchtune-l31-8b-full-4090",
        why="QLoRA (NF4 base weights) and " + LORA + "; settings not stated"),
    "torchtune-l31-70b-lora-8xa100": dict(
        args=["--preset", "llama-3-70b", "--seq", "2048", "-b", "2", "--dp", "8", "--zero", "3",
              "--recompute", "full"] + TORCHTUNE, comparable=False, why=LORA + "; settings not stated"),
    "torchtune-l32-3b-full-baseline": dict(
        args=["--model-file", MODELS + "llama-3.2-3b.json", "--seq", "4096", "-b", "2"] + TORCHTUNE,
        comparable=False,
        why="unpacked Alpaca samples: each batch is as long as its longest sample, not 4096 (an upper bound)"),
    "torchtune-l32-3b-full-packed": dict(
        under_estimate=("the k and v copies SDPA keeps are counted (--repeat-kv true: 1.88 GB); what is "
                        "left may be torchtune's RoPE with packed positions, a gathered fp32 cache per "
                        "call, 4 s b d bytes for q and for k in every layer (about 235 MB here), not "
                        "counted, and max active counting blocks the caching allocator splits, not "
                        "modelled"),
        args=["--model-file", MODELS + "llama-3.2-3b.json", "--seq", "4096", "-b", "2"] + TORCHTUNE,
        note=("the table's first rows add one technique each, so this run has no compile, no chunked "
              "loss, no AC, torch.optim.AdamW (not the config's 8-bit one) and no optimizer_in_bwd")),
    "torchtune-l32-3b-full-packed-compile": dict(
        args=["--model-file", MODELS + "llama-3.2-3b.json", "--seq", "4096", "-b", "2"] + COMPILED_LAYERS
             + TORCHTUNE,
        note=COMPILED_TUNE + "; " + TUNE_EAGER_LOSS, under_estimate=TUNE_COMPILE_UNDER),
    "torchtune-l32-3b-full-packed-compile-chunkedce": dict(
        args=["--model-file", MODELS + "llama-3.2-3b.json", "--seq", "4096", "-b", "2"] + CHUNKED_COMPILE
             + COMPILED_LAYERS + TORCHTUNE,
        note=COMPILED_TUNE + CHUNKED_COMPILED, under_estimate=COMPILED_UNDER),
    "torchtune-l32-3b-full-packed-compile-chunkedce-ac": dict(
        args=["--model-file", MODELS + "llama-3.2-3b.json", "--seq", "4096", "-b", "2"] + CHUNKED_COMPILE
             + ["--recompute", "full"] + COMPILED_LAYERS + TORCHTUNE + ["--optimizer-impl", "fused"],
        note=COMPILED_TUNE + CHUNKED_COMPILED + "; " + TUNE_ADAMW),
    "torchtune-l32-3b-full-packed-compile-chunkedce-ac-optinbwd": dict(
        same_as="torchtune-l32-3b-full-packed-compile-chunkedce-ac", extra_args=TUNE_IN_BACKWARD,
        note=COMPILED_TUNE + CHUNKED_COMPILED + "; " + TUNE_IN_BACKWARD_NOTE,
        under_estimate=TUNE_LOSS_UNDER),
    "torchtune-l32-3b-full-packed-compile-chunkedce-ac-optinbwd-offload": dict(
        same_as="torchtune-l32-3b-full-packed-compile-chunkedce-ac",
        extra_args=TUNE_IN_BACKWARD + ["--offload", "activations"],
        note=COMPILED_TUNE + CHUNKED_COMPILED + "; " + TUNE_IN_BACKWARD_NOTE + "; " + TUNE_OFFLOAD,
        under_estimate=TUNE_LOSS_UNDER),
    "torchtune-l32-3b-full-packed-compile-chunkedce-ac-optinbwd-offload-8bit": dict(
        args=["--model-file", MODELS + "llama-3.2-3b.json", "--seq", "4096", "-b", "2"] + CHUNKED_COMPILE
             + ["--recompute", "full"] + COMPILED_LAYERS + without_recipe(TORCHTUNE) + TUNE_IN_BACKWARD
             + ["--offload", "activations", "--recipe-file", MODELS + "bnb-adamw8bit-bf16.json"],
        comparable=False, why=TUNE_8BIT),
    "torchtune-l32-3b-lora": torchtune_adapter("lora"),
    "torchtune-l32-3b-qlora": torchtune_adapter("qlora"),
    # ---- LitGPT resource tables (max allocated, GB = 1e9 bytes)
    "litgpt-llama2-7b-lora-mb1": litgpt("litgpt-llama-2-7b", 1304, 1),
    "litgpt-llama2-7b-lora-mb2": litgpt("litgpt-llama-2-7b", 1304, 2),
    "litgpt-phi-1_5-lora-mb1": litgpt("litgpt-phi-1_5", 1044, 1),
    "litgpt-phi-1_5-lora-mb2": litgpt("litgpt-phi-1_5", 1044, 2),
    "litgpt-phi-1_5-lora-mb4": litgpt("litgpt-phi-1_5", 1044, 4),
    "litgpt-stablelm-3b-lora-mb1": litgpt("litgpt-stablelm-base-alpha-3b", 1034, 1),
    "litgpt-stablelm-3b-lora-mb2": litgpt("litgpt-stablelm-base-alpha-3b", 1034, 2),
    "litgpt-stablelm-3b-lora-mb4": litgpt("litgpt-stablelm-base-alpha-3b", 1034, 4),
    "litgpt-llama2-13b-lora-mb1": litgpt("litgpt-llama-2-13b", 1304, 1),
    "litgpt-phi-1_5-qlora-nf4-mb1": litgpt_qlora("litgpt-phi-1_5", 1044, False),
    "litgpt-phi-1_5-qlora-nf4-dq-mb1": litgpt_qlora("litgpt-phi-1_5", 1044, True),
    "litgpt-stablelm-3b-qlora-nf4-mb1": litgpt_qlora("litgpt-stablelm-base-alpha-3b", 1034, False),
    "litgpt-stablelm-3b-qlora-nf4-dq-mb1": litgpt_qlora("litgpt-stablelm-base-alpha-3b", 1034, True),
    "litgpt-llama2-7b-qlora-nf4-mb1": litgpt_qlora("litgpt-llama-2-7b", 1304, False),
    "litgpt-llama2-7b-qlora-nf4-dq-mb1": litgpt_qlora("litgpt-llama-2-7b", 1304, True),
    "litgpt-llama2-13b-qlora-nf4-mb1": litgpt_qlora("litgpt-llama-2-13b", 1304, False),
    "litgpt-llama2-13b-qlora-nf4-dq-mb1": litgpt_qlora("litgpt-llama-2-13b", 1304, True),
    "litgpt-stablelm-3b-adapter-mb1": litgpt_adapter("litgpt-stablelm-base-alpha-3b", 1034, None, False),
    "litgpt-stablelm-3b-adapter-nf4-mb1": litgpt_adapter("litgpt-stablelm-base-alpha-3b", 1034, "nf4", False),
    "litgpt-stablelm-3b-adapter-nf4-dq-mb1": litgpt_adapter("litgpt-stablelm-base-alpha-3b", 1034, "nf4-dq", False),
    "litgpt-stablelm-3b-adapter-v2-mb1": litgpt_adapter("litgpt-stablelm-base-alpha-3b", 1034, None, True),
    "litgpt-stablelm-3b-adapter-v2-nf4-mb1": litgpt_adapter("litgpt-stablelm-base-alpha-3b", 1034, "nf4", True),
    "litgpt-stablelm-3b-adapter-v2-nf4-dq-mb1": litgpt_adapter("litgpt-stablelm-base-alpha-3b", 1034, "nf4-dq", True),
    "litgpt-llama2-7b-adapter-mb1": litgpt_adapter("litgpt-llama-2-7b", 1304, None, False),
    "litgpt-llama2-7b-adapter-nf4-mb1": litgpt_adapter("litgpt-llama-2-7b", 1304, "nf4", False),
    "litgpt-llama2-7b-adapter-nf4-dq-mb1": litgpt_adapter("litgpt-llama-2-7b", 1304, "nf4-dq", False),
    "litgpt-llama2-7b-adapter-v2-mb1": litgpt_adapter("litgpt-llama-2-7b", 1304, None, True),
    "litgpt-llama2-7b-adapter-v2-nf4-mb1": litgpt_adapter("litgpt-llama-2-7b", 1304, "nf4", True),
    "litgpt-llama2-7b-adapter-v2-nf4-dq-mb1": litgpt_adapter("litgpt-llama-2-7b", 1304, "nf4-dq", True),
    "litgpt-phi-1_5-lora-2gpu-mb1": litgpt_fsdp("litgpt-phi-1_5", 1044, 1, 2),
    "litgpt-phi-1_5-lora-2gpu-mb2": litgpt_fsdp("litgpt-phi-1_5", 1044, 2, 2),
    "litgpt-phi-1_5-lora-2gpu-mb4": litgpt_fsdp("litgpt-phi-1_5", 1044, 4, 2),
    "litgpt-stablelm-3b-lora-2gpu-mb1": litgpt_fsdp("litgpt-stablelm-base-alpha-3b", 1034, 1, 2),
    "litgpt-stablelm-3b-lora-2gpu-mb2": litgpt_fsdp("litgpt-stablelm-base-alpha-3b", 1034, 2, 2),
    "litgpt-stablelm-3b-lora-2gpu-mb4": litgpt_fsdp("litgpt-stablelm-base-alpha-3b", 1034, 4, 2),
    "litgpt-llama2-7b-lora-2gpu-mb1": litgpt_fsdp("litgpt-llama-2-7b", 1304, 1, 2),
    "litgpt-llama2-7b-lora-2gpu-mb2": litgpt_fsdp("litgpt-llama-2-7b", 1304, 2, 2),
    "litgpt-llama2-7b-lora-2gpu-mb4": litgpt_fsdp("litgpt-llama-2-7b", 1304, 4, 2),
    "litgpt-llama2-13b-lora-4gpu-mb1": litgpt_fsdp("litgpt-llama-2-13b", 1304, 1, 4),
    # ---- PEFT README: batch, sequence, precision, rank and the statistic are not stated
    "peft-bloomz-7b1-lora-pytorch": dict(args=None, comparable=False,
        why="batch, sequence, precision, LoRA rank and the statistic are not stated: nothing to predict"),
    "peft-bloomz-7b1-lora-deepspeed-offload": dict(args=None, comparable=False,
        why="as above, and ZeRO-3 with CPU offload of an unstated stage: nothing to predict"),
}


def spec_of(row_id):
    """A row's spec, with `same_as` resolved (its own keys win)."""
    spec = dict(ROWS[row_id])
    if "same_as" in spec:
        base = dict(ROWS[spec.pop("same_as")])
        base.update(spec)
        spec = base
    if "extra_args" in spec:  # the base row's command and these
        spec["args"] = spec["args"] + spec.pop("extra_args")
    return spec


def published_bytes(row, spec):
    """The published figure in bytes; GB is 10^9 unless the row's source says the column is GiB."""
    unit = spec.get("unit_bytes") or {"bytes": 1, "GiB": 2**30, "GB": 10**9}[row["unit"]]
    return row["value"] * unit


def command_line(args):
    return "memcalc " + " ".join(shlex.quote(a) for a in args)


# The GPU each row's rows (CUDA context, library workspaces) follow, by the source's GPU name.
GPUS = [("H100", "h100-sxm"), ("H200", "h200"), ("GB200", "b200"), ("A100-SXM4-40GB", "a100-40gb"),
        ("A100", "a100-80gb"), ("RTX 4090", "rtx-4090"), ("RTX A6000", "rtx-a6000")]


def gpu_args(row):
    return next((["--gpu", name] for prefix, name in GPUS if row["gpu_type"].startswith(prefix)), [])


def predict(memcalc, args, rank, measured):
    """memcalc's figure for what the row measured: max allocated (or active) counts the model's tensors
    and the libraries' workspaces the allocator hands out (peak.outside's rows in the allocator); max
    reserved is peak.reserved_bytes (the most loaded device's); else the allocated peak."""
    out = subprocess.run([memcalc] + args + ["--format", "json"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"predict.py: {command_line(args)} failed: {out.stderr.strip()}")
    report = json.loads(out.stdout)
    # Megatron's golden value is global rank world_size-1: the last pipeline stage.
    peak, stage = ((report["ranks"][-1]["peak"], report["ranks"][-1]["stage"]) if rank == "last"
                   else (report["peak"], report["peak"]["stage"]))
    what = measured.split(" ")[0]
    figure = peak["bytes"]
    if what in ("max_allocated", "max_active"):
        figure += sum(r["count"] * r["bytes"] for r in report["peak"]["outside"] or [] if r["in_allocator"])
    elif what == "max_reserved" and rank != "last" and report["peak"]["reserved_bytes"] is not None:
        figure = report["peak"]["reserved_bytes"]
    return figure, peak["step"], stage, report


def layout(row):
    parts = [f"{k} {row[k]}" for k in ("tp", "pp", "dp", "cp", "ep", "vpp") if row.get(k) not in (None, 1)]
    return ", ".join(parts) or "1 GPU"


def build(memcalc):
    rows = json.loads((HERE / "measurements.json").read_text())
    unknown = sorted(set(r["id"] for r in rows) ^ set(ROWS))
    if unknown:
        raise SystemExit(f"predict.py: rows without a prediction spec, or specs without a row: {unknown}")
    results = []
    for row in rows:
        spec = spec_of(row["id"])
        published = published_bytes(row, spec)
        entry = {"id": row["id"], "framework": row["framework"], "model": row["model"], "layout": layout(row),
                 "sequence": row["sequence"],
                 "micro_batch": row["micro_batch"], "global_batch": row["global_batch"],
                 "recompute": row["recompute"], "precision": row["precision"], "measured": row["measured"],
                 "published": row["value"], "unit": row["unit"], "published_bytes": round(published),
                 "comparable": spec.get("comparable", True), "why": spec.get("why", spec.get("note", "")),
                 "command": None, "memcalc_bytes": None, "memcalc_step": None, "memcalc_stage": None,
                 "error": None}
        if spec["args"] is not None:
            args = spec["args"] + gpu_args(row)
            entry["command"] = command_line(args)
            got, step, stage, report = predict(memcalc, args, spec.get("rank", "peak"), row["measured"])
            entry.update(memcalc_bytes=got, memcalc_step=step, memcalc_stage=stage,
                         error=round(got / published - 1, 4))
        results.append(entry)
    return results


def summary(results):
    comparable = [r for r in results if r["comparable"] and r["error"] is not None]
    errors = [abs(r["error"]) for r in comparable]
    under = [r["id"] for r in comparable if r["error"] < 0]
    return {"rows": len(results), "comparable": len(comparable),
            "median_abs_error": round(statistics.median(errors), 4) if errors else None,
            "max_abs_error": round(max(errors), 4) if errors else None,
            "under_estimates": under}


def by_framework(results):
    """A Markdown table: each framework's rows, how many are comparable, and their errors."""
    lines = ["| framework | rows | comparable | median \\|error\\| | errors |", "|---|---:|---:|---:|---|"]
    for framework in dict.fromkeys(r["framework"] for r in results):
        mine = [r for r in results if r["framework"] == framework]
        errors = [r["error"] for r in mine if r["comparable"] and r["error"] is not None]
        spread = (f"{pct(statistics.median(abs(e) for e in errors))[1:]} | {pct(min(errors))} .. "
                  f"{pct(max(errors))}") if errors else "— | —"
        lines.append(f"| {framework} | {len(mine)} | {len(errors)} | {spread} |")
    return lines


def figure(value_bytes, unit, unit_bytes):
    shown = "GB" if unit == "bytes" else unit
    scale = 10**9 if unit == "bytes" else unit_bytes
    return f"{value_bytes / scale:,.2f} {shown}"


def markdown(results, stats, memcalc_shown):
    lines = ["# memcalc beside published GPU peaks", "",
             f"Generated by `/usr/bin/python3 validation/published/predict.py --memcalc {memcalc_shown}` from "
             "`measurements.json` (sources and quotes there). Each command runs from the repository root. "
             "Error = memcalc / published - 1. Rows marked *no* need something memcalc does not model, or "
             "settings the source does not state: memcalc's nearest figure is shown, and the row is left "
             "out of the summary.", "",
             f"Comparable rows: {stats['comparable']} of {stats['rows']}; median |error| "
             f"{pct(stats['median_abs_error'])}, max |error| {pct(stats['max_abs_error'])}; under-estimates: "
             f"{len(stats['under_estimates'])}" + (f" ({', '.join(stats['under_estimates'])})"
                                                    if stats['under_estimates'] else "") + ".", "",
             *by_framework(results), "",
             "| id | model | layout | seq | micro / global batch | recompute | precision | measured | "
             "published | memcalc | error | comparable | why | command |",
             "|---|---|---|---:|---|---|---|---|---:|---:|---:|---|---|---|"]
    for r in results:
        spec = spec_of(r["id"])
        unit_bytes = r["published_bytes"] / r["published"]
        ours = "—" if r["memcalc_bytes"] is None else (
            figure(r["memcalc_bytes"], r["unit"], unit_bytes) + f" ({r['memcalc_step']}, stage {r['memcalc_stage']})")
        cells = [r["id"], r["model"], r["layout"], str(r["sequence"]), f"{r['micro_batch']} / {r['global_batch']}",
                 str(r["recompute"]), str(r["precision"]), r["measured"],
                 figure(r["published_bytes"], r["unit"], unit_bytes) if r["unit"] == "bytes"
                 else f"{r['published']} {r['unit']}" + (" (GiB)" if spec.get("unit_bytes") == 2**30 else ""),
                 ours, pct(r["error"]), "yes" if r["comparable"] else "no", r["why"],
                 f"`{r['command']}`" if r["command"] else "—"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def pct(x):
    return "—" if x is None else f"{x * 100:+.1f}%"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memcalc", default="build/memcalc", help="the memcalc program (default build/memcalc)")
    parser.add_argument("--check", action="store_true", help="fail if the committed files differ from a fresh run")
    opts = parser.parse_args()
    memcalc = str(Path(opts.memcalc).resolve())
    results = build(memcalc)
    stats = summary(results)
    unexplained = [r["id"] for r in results if r["comparable"] and r["error"] is not None and r["error"] < 0
                   and not spec_of(r["id"]).get("under_estimate")]
    for r in results:
        cause = spec_of(r["id"]).get("under_estimate")
        if cause:
            r["why"] = (r["why"] + "; " if r["why"] else "") + "under-estimate: " + cause
    document = {"summary": stats, "rows": results}
    files = {HERE / "predictions.json": json.dumps(document, indent=1) + "\n",
             HERE / "predictions.md": markdown(results, stats, "build/memcalc")}
    if opts.check:
        stale = [p.name for p, text in files.items() if not p.exists() or p.read_text() != text]
        if stale:
            print(f"predict.py: {', '.join(stale)} differ from a fresh run; rerun "
                  "validation/published/predict.py", file=sys.stderr)
            sys.exit(1)
        if unexplained:  # the house rule: an under-estimate is never silent
            print(f"predict.py: under-estimates without a stated cause: {unexplained}", file=sys.stderr)
            sys.exit(1)
        print(f"predict.py: {stats['rows']} rows, {stats['comparable']} comparable, committed files agree")
        return
    for path, text in files.items():
        path.write_text(text)
    print(json.dumps(stats))
    if unexplained:  # the house rule: an under-estimate is never silent
        print(f"predict.py: under-estimates without a stated cause: {unexplained}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
