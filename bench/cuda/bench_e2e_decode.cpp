// End-to-end throughput of the whole-model CUDA forward (docs/CUDA.md): a random-weight model of a
// real checkpoint's shape (bench_models.hpp: Llama-3-8B / Llama-3.1-8B, Gemma-3-4B, or
// DeepSeek-V2-Lite (MLA + MoE); bf16 weights generated on the device, FP32 accumulate), per KV preset:
//  - decode: a batch of sequences at a long context. The KV of every sequence is filled with random
//    rows through the CUDA store kernel (no prefill of the context); then N decode steps run through
//    CudaForward::forward_decode (embedding .. classifier + GPU argmax, one token per sequence, CUDA
//    graph replay), each timed on the host (wall, including staging and the argmax download) and
//    with CUDA events on the forward's stream; the median is reported. Also graph replay vs plain
//    launches (bf16 KV, the batch and batch 1).
//  - TTFT (--ttft N): one N-token prompt prefilled as the CUDA engine prefills it (CudaEngine::
//    generate, greedy: chunks of --prefill-chunk tokens through CudaForward::forward_chunk, the last
//    one returning the GPU argmax, i.e. the first token), on a store sized as the engine sizes it for a
//    context of N + 8 tokens; host wall from the first chunk's call to the first token on the host,
//    and CUDA events around the whole prefill on the forward's stream; median of --ttft-runs runs
//    after --ttft-warmup runs, each on a fresh sequence.
// A preset without CUDA kernels for the model's geometry (supports_op) or whose pool does not fit
// next to the weights is recorded as skipped with the reason. The JSON document (schema
// "kvgate.bench.cuda_e2e_decode/2") is rewritten atomically after every measurement ("complete":
// false until the last one), so a run cut short still leaves what it measured.
//
//   bench_e2e_decode [--out FILE] [--arch llama|gemma3|deepseek_v2_lite] [--rope plain|llama3|dynamic]
//                    [--mla-cache latent|expanded] [--layers N] [--context 32768] [--batch 16]
//                    [--steps 8] [--warmup 2] [--formats f32,f16,...] [--no-decode] [--ttft N]
//                    [--prefill-chunk C] [--ttft-runs 3] [--ttft-warmup 1]
//   --rope (llama only): plain; llama3 = Llama 3.1's rope_parameters (factor 8, low/high 1/4,
//   original 8192; a static table like plain); dynamic = dynamic NTK factor 4 over 8192 (per-call
//   rows staged on the host). Gemma 3's RoPE is its own (linear 8 on global layers, base 1e4 local).
//   --layers: default the shape's (Llama 32, Gemma 3 34, DeepSeek-V2-Lite 27); Llama and Gemma 3 fit
//   16 x 32K of bf16 KV on an H200.
//   --formats: names separated by ',' or ';'; a pair "k=<K>,v=<V>" keeps its own comma (a "k=" item
//   followed by a "v=" item is one pair), e.g. "bf16;k=fp8_block128,v=bf16" or "bf16,k=int8,v=bf16".
//   Default: every preset (deepseek_v2_lite with the latent cache: also k=fp8_block128,v=bf16 and
//   k=fp8_e4m3,v=bf16, the latent kernel's split formats).
//   --arch deepseek_v2_lite (bench_models.hpp; the loader's DeepseekV3 reading of the shape, V3's
//   sigmoid router): --mla-cache latent (default) stores the MLA latent cache (KvLayout::mla_latent:
//   K half = the latent c_kv, 512 wide, V half = the RoPE key, 64 wide, each half in its own format;
//   attention is the weight-absorbed latent kernel, supports_op(Op::decode, StoreConfig)); expanded
//   stores per-head K/V (16 heads x head_dim 192, V zero-padded) read by the ordinary decode kernel:
//   10.7x the bytes, so only short contexts fit (16 x 4K of bf16 KV = 22 GB). Weights: 15.7 B
//   parameters = 31.4 GB of bf16; the device memory needed (weights + the largest KV pool) is printed
//   before anything is allocated, and the run is refused when the weights do not fit. The CUDA
//   forward's MoE runs all 64 routed experts on every row (moe_ffn: dense gate weights, 0 where a
//   row did not pick the expert), so routing does not change the work (see the JSON's moe_note).
//   --mla-cache is refused for the other shapes.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "bench_models.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/cuda/util.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/synth.hpp"

namespace kc = kvgate::cuda;
using kvgate::KvFormat;
using kvgate::KvHalf;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

using kvgate::bench::median;
using kvgate::bench::elapsed_s;
using kvgate::bench::progress;

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "bench_e2e_decode: %s\n", msg.c_str());
  std::exit(2);
}

int parse_int(const std::string& flag, const std::string& v, int lo) {
  try {
    std::size_t used = 0;
    const int x = std::stoi(v, &used);
    if (used != v.size() || x < lo) throw std::invalid_argument(v);
    return x;
  } catch (const std::exception&) {
    usage_error(flag + " = '" + v + "' must be an integer >= " + std::to_string(lo));
  }
}

// The document, written to a temporary name beside `path` and renamed over it.
void write_json(const std::string& path, const json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << j.dump(2) << "\n";
    if (!f) usage_error("cannot write '" + tmp + "' (the --out directory must exist and be writable)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) usage_error("cannot rename '" + tmp + "' to '" + path + "': " + ec.message());
}

// Fills `ctx` tokens of each sequence with random K/V rows through the store kernel, every layer;
// each half with its own row width (the MLA latent cache: K rows kv_lora wide, V rows rope wide).
double fill_kv(kc::CudaKvStore& store, const std::vector<kvgate::SeqId>& seqs, int ctx, float* rows_k, float* rows_v,
               int* d_slots) {
  const auto t0 = Clock::now();
  const int B = store.config().block_size;
  std::vector<int> slots(static_cast<std::size_t>(ctx));
  for (kvgate::SeqId s : seqs) {
    const auto table = store.block_table(s);
    for (int p = 0; p < ctx; ++p) slots[static_cast<std::size_t>(p)] = table[static_cast<std::size_t>(p / B)] * B + p % B;
    CK(cudaMemcpy(d_slots, slots.data(), slots.size() * sizeof(int), cudaMemcpyHostToDevice));
    for (int l = 0; l < store.config().n_layers; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        const kvgate::PageGeometry hg = store.config().half_geometry(h);  // geometry() for kv_heads
        kc::StoreRowsArgs a;
        a.rows = h == KvHalf::K ? rows_k : rows_v;
        a.row_stride = static_cast<std::size_t>(hg.row_elems());
        a.slot_mapping = d_slots;
        a.n_tokens = ctx;
        a.pool = store.pool(l, h);
        a.page_stride = store.page_stride(h);
        a.tensor_scale = store.tensor_scale(l, h);
        kc::store_rows(store.half_format(h), hg, a, nullptr);
      }
  }
  CK(cudaDeviceSynchronize());
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct StepTimes {
  double wall_ms = 0, device_ms = 0;
  std::vector<double> wall, device;
};

// warmup + steps decode steps of the batch; per step host wall time and CUDA-event device time.
StepTimes time_steps(kc::CudaForward& fwd, const std::vector<kvgate::SeqId>& seqs, int warmup, int steps) {
  std::vector<int> tokens(seqs.size(), 1), ids(seqs.size(), 0);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  StepTimes t;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto h0 = Clock::now();
    CK(cudaEventRecord(e0, fwd.stream()));
    fwd.forward_decode(seqs, tokens, nullptr, ids.data());
    CK(cudaEventRecord(e1, fwd.stream()));
    CK(cudaEventSynchronize(e1));
    const double wall = std::chrono::duration<double, std::milli>(Clock::now() - h0).count();
    float dev = 0;
    CK(cudaEventElapsedTime(&dev, e0, e1));
    for (std::size_t b = 0; b < ids.size(); ++b) tokens[b] = ids[b];  // greedy feedback
    if (i >= warmup) {
      t.wall.push_back(wall);
      t.device.push_back(dev);
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  t.wall_ms = median(t.wall);
  t.device_ms = median(t.device);
  return t;
}

struct TtftTimes {
  double wall_ms = 0, device_ms = 0;
  std::vector<double> wall, device;
  int first_token = -1;
};

// The CUDA engine's greedy prefill of `prompt` (CudaEngine::generate: chunks of fwd.options().max_rows
// tokens, the last returning the GPU argmax), on a fresh sequence per run.
TtftTimes time_ttft(kc::CudaForward& fwd, kc::CudaKvStore& store, const std::vector<int>& prompt, int warmup, int runs) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  TtftTimes t;
  const std::size_t C = static_cast<std::size_t>(fwd.options().max_rows);
  const std::span<const int> all(prompt);
  for (int i = 0; i < warmup + runs; ++i) {
    const kvgate::SeqId s = store.create_sequence();
    CK(cudaDeviceSynchronize());  // the new sequence's page zeroing is not part of the prefill
    int first = -1;
    const auto h0 = Clock::now();
    CK(cudaEventRecord(e0, fwd.stream()));
    for (std::size_t p = 0; p < prompt.size(); p += C) {
      const std::size_t n = std::min(C, prompt.size() - p);
      const bool last = p + n == prompt.size();
      fwd.forward_chunk(s, all.subspan(p, n), nullptr, false, last ? &first : nullptr);
    }
    CK(cudaEventRecord(e1, fwd.stream()));
    CK(cudaEventSynchronize(e1));
    const double wall = std::chrono::duration<double, std::milli>(Clock::now() - h0).count();
    float dev = 0;
    CK(cudaEventElapsedTime(&dev, e0, e1));
    store.free_sequence(s);
    if (i >= warmup) {
      t.wall.push_back(wall);
      t.device.push_back(dev);
    }
    t.first_token = first;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  t.wall_ms = median(t.wall);
  t.device_ms = median(t.device);
  return t;
}

std::string mib(std::size_t b) { return std::to_string(b >> 20) + " MiB"; }

// --formats: items separated by ';' or ','; within one ';' part a "k=<K>" item followed by a "v=<V>"
// item is one pair "k=<K>,v=<V>" (its own comma). A plain comma list of presets splits as before.
std::vector<std::string> parse_format_list(const std::string& s) {
  std::vector<std::string> items;
  std::stringstream outer(s);
  std::string part;
  while (std::getline(outer, part, ';')) {
    const std::size_t first = items.size();
    std::stringstream inner(part);
    std::string tok;
    while (std::getline(inner, tok, ',')) {
      if (items.size() > first && tok.rfind("v=", 0) == 0 && items.back().rfind("k=", 0) == 0 &&
          items.back().find(',') == std::string::npos)
        items.back() += "," + tok;
      else
        items.push_back(tok);
    }
  }
  return items;
}

// Bytes of a store of `n_blocks` pages per layer (page bytes and the store's guard bytes).
std::size_t store_bytes(const kvgate::StoreConfig& sc, std::size_t page_k, std::size_t page_v) {
  return static_cast<std::size_t>(sc.n_blocks) * sc.n_layers * (page_k + page_v + 4 * sc.guard_bytes);
}

json rope_json(const kvgate::RopeConfig& r, float model_theta) {
  json j = {{"type", kvgate::rope_type_name(r.type)}, {"theta", r.theta > 0 ? r.theta : model_theta}};
  if (r.type != kvgate::RopeType::plain) j["describe"] = kvgate::describe_rope(r);
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "bench_e2e_decode.json", arch = "llama", rope, mla_cache;
  int context = 32768, batch = 16, steps = 8, warmup = 2, layers = 0;
  int ttft = 0, ttft_runs = 3, ttft_warmup = 1, prefill_chunk = kvgate::default_prefill_chunk("cuda");
  bool decode = true, formats_given = false;
  std::vector<std::string> formats;
  for (const auto& p : kvgate::presets()) formats.emplace_back(p.name);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--out") out_path = val();
    else if (a == "--arch") arch = val();
    else if (a == "--context") context = parse_int(a, val(), 1);
    else if (a == "--batch") batch = parse_int(a, val(), 1);
    else if (a == "--steps") steps = parse_int(a, val(), 1);
    else if (a == "--warmup") warmup = parse_int(a, val(), 0);
    else if (a == "--layers") layers = parse_int(a, val(), 1);
    else if (a == "--rope") rope = val();
    else if (a == "--mla-cache") mla_cache = val();
    else if (a == "--no-decode") decode = false;
    else if (a == "--ttft") ttft = parse_int(a, val(), 1);
    else if (a == "--prefill-chunk") prefill_chunk = parse_int(a, val(), 1);
    else if (a == "--ttft-runs") ttft_runs = parse_int(a, val(), 1);
    else if (a == "--ttft-warmup") ttft_warmup = parse_int(a, val(), 0);
    else if (a == "--formats") {
      formats = parse_format_list(val());
      formats_given = true;
    } else {
      usage_error("unknown argument '" + a +
                  "'; usage: bench_e2e_decode [--out FILE] [--arch llama|gemma3|deepseek_v2_lite] "
                  "[--rope plain|llama3|dynamic] [--mla-cache latent|expanded] "
                  "[--layers N] [--context N] [--batch B] [--steps N] [--warmup N] [--formats a,b;k=K,v=V] "
                  "[--no-decode] [--ttft N] [--prefill-chunk C] [--ttft-runs N] [--ttft-warmup N]");
    }
  }
  if (!decode && ttft == 0) usage_error("--no-decode without --ttft N measures nothing");

  // The model: its description (synth options or config.json) and the loader's ModelConfig.
  kvgate::ModelConfig cfg;
  json model_j;
  if (arch == "llama") {
    if (rope.empty()) rope = "plain";
    const kvgate::SynthOptions synth = kvgate::bench::llama3_8b_synth(layers > 0 ? layers : 32, rope);
    std::string why;
    if (!kvgate::bench::llama_config(synth, rope, &cfg, &why)) usage_error(why);
    model_j = {{"shape", rope == "llama3" ? "Llama-3.1-8B" : "Llama-3-8B"},
               {"synth", {{"arch", synth.arch}, {"layers", synth.layers}, {"hidden", synth.hidden}, {"ffn", synth.ffn},
                          {"heads", synth.heads}, {"kv_heads", synth.kv_heads}, {"head_dim", synth.head_dim},
                          {"vocab", synth.vocab}, {"dtype", synth.dtype}, {"rope_theta", synth.rope_theta},
                          {"rope", rope}, {"max_seq_len", synth.max_seq_len},
                          {"tie_embeddings", synth.tie_embeddings}}}};
    if (rope == "dynamic") model_j["synth"]["rope_note"] = "dynamic NTK (factor 4 over 8192) has no synth option; set by hand";
  } else if (arch == "gemma3") {
    if (!rope.empty()) usage_error("--rope applies to --arch llama only (Gemma 3's RoPE is its config's)");
    rope = "gemma3";
    kvgate::bench::Gemma3Shape g;
    if (layers > 0) g.layers = layers;
    cfg = kvgate::bench::gemma3_config(g);
    model_j = {{"shape", "Gemma-3-4B"}, {"hf_config", kvgate::bench::gemma3_hf_config(g)}};
  } else if (arch == "deepseek_v2_lite") {
    if (!rope.empty()) usage_error("--rope applies to --arch llama only (DeepSeek-V2-Lite's RoPE is its config's YaRN)");
    rope = "yarn";
    kvgate::bench::DeepseekV2LiteShape s;
    if (layers > 0) s.layers = layers;
    cfg = kvgate::bench::deepseek_v2_lite_config(s);
    model_j = {{"shape", "DeepSeek-V2-Lite"},
               {"hf_config", kvgate::bench::deepseek_v2_lite_hf_config(s)},
               {"hub_config", kvgate::bench::deepseek_v2_lite_hub_config(s)},
               {"loader_note",
                "the Hugging Face loader (load_hf.cpp) reads DeepseekV3ForCausalLM only, so the shape is run as "
                "hf_config: a transformers DeepseekV3 export with the V2-Lite numbers (hub_config is the V2 "
                "config.json as published). The one difference: V3's router (sigmoid_groups: sigmoid(logit) "
                "scores, n_group 1, topk_group 1, zero e_score_correction_bias) where V2-Lite's is softmax + "
                "greedy top-6; both are monotonic in the router logits, so the experts picked are the same and "
                "only their weights differ (norm_topk_prob false, routed_scaling_factor 1)"}};
  } else {
    usage_error("--arch must be llama, gemma3 or deepseek_v2_lite (got '" + arch + "')");
  }
  if (!cfg.mla.any() && !mla_cache.empty())
    usage_error("--mla-cache applies to --arch deepseek_v2_lite only (the " + arch + " shape has no latent attention)");
  if (cfg.mla.any() && mla_cache.empty()) mla_cache = "latent";
  if (cfg.mla.any() && mla_cache != "latent" && mla_cache != "expanded")
    usage_error("--mla-cache must be latent or expanded (got '" + mla_cache + "')");
  // The MLA latent cache (KvLayout::mla_latent, as make_store_config builds it for --mla-cache latent).
  const bool latent = cfg.mla.any() && mla_cache == "latent";
  if (latent && !formats_given)
    for (const char* f : {"k=fp8_block128,v=bf16", "k=fp8_e4m3,v=bf16"}) formats.emplace_back(f);
  const int n_slide = kvgate::bench::sliding_layers(cfg);

  const kc::DeviceStatus& dev = kc::device_status();
  if (!dev.available) {
    std::fprintf(stderr, "bench_e2e_decode: %s\n", dev.reason.c_str());
    return 1;
  }
  // Steps of every measurement (format runs, then graph-vs-plain runs on the bf16 store) fit in the context.
  const int extra = 4 * (warmup + steps) + 8;
  const int max_ctx = context + extra;
  // Page geometry of each half (kv_half_geometries, as the engine's store): K and V alike for the
  // kv_heads layout; the latent (kv_lora) and the RoPE key (rope) for the MLA latent cache.
  const kvgate::HalfGeometries hgeo = kvgate::kv_half_geometries(cfg, 16, latent);
  const kvgate::PageGeometry g = hgeo.k, gv = hgeo.v;
  auto store_config = [&](const KvFormat& f) {
    kvgate::StoreConfig sc;
    sc.format = f;
    sc.n_layers = cfg.n_layers;
    sc.n_kv_heads = g.n_kv_heads;
    sc.head_dim = g.head_dim;
    if (latent) {
      sc.layout = kvgate::KvLayout::mla_latent;
      sc.v_head_dim = gv.head_dim;
    }
    sc.block_size = 16;
    return sc;
  };
  // Device memory: the weights, the KV fill rows, and the largest decode pool of the formats asked
  // for (the pools are allocated one at a time); 2 GiB kept for the forward's buffers.
  const std::size_t weight_need = kvgate::bench::random_weight_bytes(cfg, true);
  const std::size_t rows_need =
      decode ? static_cast<std::size_t>(context) * (static_cast<std::size_t>(g.row_elems()) + gv.row_elems() + 1) * 4 : 0;
  std::size_t pool_need = 0;
  std::string pool_fmt = "-";
  for (const std::string& fname : formats) {
    const auto fmt = kvgate::parse_kv_format(fname);
    if (!fmt || !kvgate::supports(fmt->k, g).ok || !kvgate::supports(fmt->v, gv).ok) continue;  // skipped below
    kvgate::StoreConfig sc = store_config(*fmt);
    sc.n_blocks = std::max(decode ? batch * ((max_ctx + 15) / 16) : 0, ttft > 0 ? (ttft + 8 + 15) / 16 : 0);
    const std::size_t b = store_bytes(sc, kvgate::page_bytes(fmt->k, g), kvgate::page_bytes(fmt->v, gv));
    if (b > pool_need) pool_need = b, pool_fmt = fname;
  }
  {
    std::size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    const std::size_t reserve = 2ull << 30;
    progress("device memory: weights %.2f GB (bf16) + KV fill rows %.2f GB + largest KV pool %.2f GB (%s) + 2 GiB "
             "for the forward = %.2f GB needed; the device has %.2f GB free of %.2f GB",
             weight_need / 1e9, rows_need / 1e9, pool_need / 1e9, pool_fmt.c_str(),
             (weight_need + rows_need + pool_need + reserve) / 1e9, free_b / 1e9, total_b / 1e9);
    if (weight_need + rows_need + reserve > free_b) {
      std::fprintf(stderr,
                   "bench_e2e_decode: refused: the %s weights (%.2f GB of bf16, %d layers) and the KV fill rows "
                   "(%.2f GB) with 2 GiB for the forward's buffers need %.2f GB, but the device has %.2f GB free "
                   "of %.2f GB (cudaMemGetInfo); use --layers N for fewer layers, a smaller --context, or a GPU "
                   "with more memory\n",
                   model_j["shape"].get<std::string>().c_str(), weight_need / 1e9, cfg.n_layers, rows_need / 1e9,
                   (weight_need + rows_need + reserve) / 1e9, free_b / 1e9, total_b / 1e9);
      return 1;
    }
    if (weight_need + rows_need + pool_need + reserve > free_b)
      progress("note: the largest KV pool (%s) does not fit next to the weights; formats whose pool does not fit "
               "are recorded as skipped", pool_fmt.c_str());
  }
  progress("model: %s shape (%s), %d layers (%d sliding), bf16 random weights on the device, RoPE %s; decode %s at "
           "context %d x batch %d, %d steps (+%d warmup); TTFT %d tokens (chunks of %d, %d runs + %d warmup)",
           model_j["shape"].get<std::string>().c_str(), arch.c_str(), cfg.n_layers, n_slide, rope.c_str(),
           decode ? "on" : "off", context, batch, steps, warmup, ttft, prefill_chunk, ttft_runs, ttft_warmup);
  const auto tw = Clock::now();
  const auto model = kc::CudaModel::random(cfg, kc::WeightType::bf16, 8);
  const double weights_ms = std::chrono::duration<double, std::milli>(Clock::now() - tw).count();
  progress("weights: %.2f GB generated in %.0f ms", model->weight_bytes() / 1e9, weights_ms);

  float *rows_k = nullptr, *rows_v = nullptr;
  int* d_slots = nullptr;
  if (decode) {  // one random row per position for each half, at the half's width
    const std::size_t k_elems = static_cast<std::size_t>(context) * g.row_elems(),
                      v_elems = static_cast<std::size_t>(context) * gv.row_elems();
    CK(cudaMalloc(&rows_k, k_elems * sizeof(float)));
    CK(cudaMalloc(&rows_v, v_elems * sizeof(float)));
    CK(cudaMalloc(&d_slots, static_cast<std::size_t>(context) * sizeof(int)));
    kc::fill_random(rows_k, k_elems, 11, 1.0f);
    kc::fill_random(rows_v, v_elems, 12, 1.0f);
    CK(cudaDeviceSynchronize());
  }

  json j;
  j["schema"] = "kvgate.bench.cuda_e2e_decode/2";
  {
    std::time_t now = std::time(nullptr);
    char buf[64];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    j["date"] = buf;
  }
  j["complete"] = false;
  j["device"] = {{"name", dev.name},
                 {"cc", std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor)},
                 {"sm_count", dev.sm_count},
                 {"total_mem", dev.total_mem},
                 {"driver", kc::cuda_version_string(dev.driver_version)},
                 {"cuda_runtime", kc::cuda_version_string(dev.runtime_version)}};
  model_j["arch"] = cfg.arch;
  model_j["rope"] = rope;
  model_j["layers"] = cfg.n_layers;
  model_j["layers_note"] = layers > 0 ? "--layers " + std::to_string(layers) + " (not the shape's own count)"
                                      : "the shape's own layer count (every layer)";
  model_j["config"] = {{"dim", cfg.dim}, {"ffn", cfg.hidden_dim}, {"heads", cfg.n_heads}, {"kv_heads", cfg.n_kv_heads},
                       {"head_dim", cfg.head_dim}, {"vocab", cfg.vocab_size}, {"tied_embeddings", cfg.tied_embeddings},
                       {"rope", rope_json(cfg.rope, cfg.rope_theta)}, {"sliding_layers", n_slide},
                       {"global_layers", cfg.n_layers - n_slide}};
  if (cfg.has_rope_local) model_j["config"]["rope_local"] = rope_json(cfg.rope_local, cfg.rope_theta);
  if (n_slide > 0) {
    int w = 0;
    for (int l = 0; l < cfg.n_layers; ++l) w = std::max(w, cfg.window(l));
    model_j["config"]["window"] = w;
    model_j["config"]["qk_norm"] = cfg.qk_norm;
    model_j["config"]["post_norms"] = cfg.post_norms;
    model_j["config"]["ffn_act"] = cfg.ffn_act == kvgate::FfnAct::gelu_tanh ? "gelu_tanh" : "silu";
    model_j["config"]["attn_scale"] = cfg.attn_scale;
    model_j["config"]["embed_scale"] = cfg.embed_scale;
    // The store keeps one block table per sequence for all layers; the engine releases pages only
    // when every layer is windowed (EngineOptions::release_outside_window, widest_window_if_all).
    const int rel = kvgate::widest_window_if_all(cfg);
    model_j["kv_release"] =
        rel > 0 ? "every layer is windowed: the engine releases the pages before the widest window (" +
                      std::to_string(rel) + " tokens); this benchmark's decode store holds the whole context"
                : "none: " + std::to_string(cfg.n_layers - n_slide) +
                      " global layers read the whole context, and the store's one block table per sequence serves "
                      "every layer, so the " + std::to_string(n_slide) +
                      " sliding layers hold full-context pages too (their attention reads only the last " +
                      std::to_string(w) + " positions)";
  }
  if (cfg.mla.any()) {  // DeepSeek-V2-Lite: latent attention, experts, and the cache layout this run stores
    const kvgate::MlaConfig& a = cfg.mla;
    const kvgate::MoeConfig& moe = cfg.moe;
    int moe_layers = 0;
    for (int l = 0; l < cfg.n_layers; ++l) moe_layers += moe.is_moe(l) ? 1 : 0;
    model_j["config"]["attn_scale"] = cfg.attn_scale;
    model_j["config"]["mla"] = {{"kv_lora_rank", a.kv_lora_rank}, {"q_lora_rank", a.q_lora_rank},
                                {"qk_nope_head_dim", a.nope_dim}, {"qk_rope_head_dim", a.rope_dim},
                                {"v_head_dim", a.v_dim}, {"rope_interleave", a.rope_interleave}};
    model_j["config"]["moe"] = {
        {"router", moe.router == kvgate::MoeConfig::Router::sigmoid_groups ? "sigmoid_groups (V3)" : "softmax_topk"},
        {"n_routed_experts", moe.n_experts}, {"num_experts_per_tok", moe.top_k}, {"moe_intermediate_size", moe.expert_dim},
        {"shared_dim", moe.shared_dim}, {"n_group", moe.n_group}, {"topk_group", moe.topk_group},
        {"norm_topk_prob", moe.norm_topk}, {"routed_scaling_factor", moe.routed_scale},
        {"moe_layers", moe_layers}, {"dense_layers", cfg.n_layers - moe_layers}};
    model_j["moe_note"] =
        "random weights: the router is a random matrix, so which " + std::to_string(moe.top_k) + " of " +
        std::to_string(moe.n_experts) + " experts a row picks is whatever it picks (the tokens are the greedy "
        "feedback of random logits), not a trained model's routing. The CUDA forward's moe_ffn runs every routed "
        "expert on every row (the route kernel writes dense gate weights, 0 for the experts a row did not pick; no "
        "host round trip, so the decode step is one graph): the per-step FFN work is all " +
        std::to_string(moe.n_experts) + " experts (+ the shared one) on each of the " + std::to_string(moe_layers) +
        " MoE layers whatever the routing, not the top-" + std::to_string(moe.top_k) +
        " a grouped-GEMM serving stack runs; the expert GEMMs dominate the step, which dilutes the KV format's share";
    const double kb16 = 2.0 * g.row_elems(), vb16 = 2.0 * gv.row_elems();  // bf16 bytes per token, layer and half
    model_j["kv_cache"] = {
        {"mla_cache", mla_cache},
        {"layout", latent ? "mla_latent" : "kv_heads (MLA expanded)"},
        {"k_half", latent ? "the latent c_kv = rmsnorm(kv_a)[:kv_lora_rank]: one row of " + std::to_string(g.head_dim) +
                                " per token and layer"
                          : std::to_string(g.n_kv_heads) + " heads x " + std::to_string(g.head_dim) +
                                " per token and layer: [k_nope " + std::to_string(a.nope_dim) + " | k_rope " +
                                std::to_string(a.rope_dim) + "]"},
        {"v_half", latent ? "the RoPE key k_rope (rotated): one row of " + std::to_string(gv.head_dim) +
                                " per token and layer"
                          : std::to_string(gv.n_kv_heads) + " heads x " + std::to_string(gv.head_dim) +
                                " per token and layer: v " + std::to_string(a.v_dim) + ", zero-padded to the key width"},
        {"k_row_elems", g.row_elems()},
        {"v_row_elems", gv.row_elems()},
        {"attention", latent ? "weight-absorbed latent kernel (mla_decode_attention: W_UK folded into q, W_UV after; "
                               "decode steps and prefill chunks alike)"
                             : "the kv_heads decode kernel over the expanded heads (prefill chunks: the prefill kernel)"},
        {"bf16_bytes_per_token_per_layer", kb16 + vb16},
        {"bf16_bytes_per_token", (kb16 + vb16) * cfg.n_layers},
        {"per_format", "results[].kv_bytes_per_token and kv_bytes_per_token_per_layer: page bytes of each half "
                       "(scales included) / block_size"}};
    std::size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    j["memory"] = {{"weights_bytes_expected", weight_need}, {"kv_fill_rows_bytes", rows_need},
                   {"largest_pool_bytes", pool_need}, {"largest_pool_format", pool_fmt},
                   {"forward_reserve_bytes", 2ull << 30},
                   {"needed_bytes", weight_need + rows_need + pool_need + (2ull << 30)},
                   {"free_after_weights_and_rows", free_b}, {"total", total_b}};
  }
  model_j["weights"] = "bf16 (cublasGemmEx, FP32 accumulate), random, generated on the device (norm gains 1)";
  model_j["weight_bytes"] = model->weight_bytes();
  model_j["max_seq_len_note"] = "the forward's context (RoPE tables, block tables) is the run's, not max_position_embeddings";
  j["model"] = model_j;
  j["setup"] = {{"decode", decode},
                {"context", context}, {"batch", batch}, {"steps", steps}, {"warmup", warmup}, {"block_size", 16},
                {"timing", "median over steps; wall = host time of forward_decode (staging, graph launch, argmax "
                           "download, sync); device = CUDA events on the forward's stream"},
                {"kv_fill", "random rows (unit variance) through the CUDA store kernel, every layer and sequence"}};
  if (ttft > 0)
    j["setup"]["ttft"] = {
        {"prompt_tokens", ttft}, {"prefill_chunk", prefill_chunk}, {"runs", ttft_runs}, {"warmup", ttft_warmup},
        {"max_context", ttft + 8},
        {"path", "as CudaEngine::generate (greedy): chunks through CudaForward::forward_chunk (prefill kernel), the "
                 "last one's GPU argmax = the first token; a fresh sequence per run"},
        {"timing", "median over runs; wall = host time from the first chunk's call to the first token on the host; "
                   "device = CUDA events on the forward's stream around the whole prefill (host gaps between chunks "
                   "included)"}};
  json rows = json::array();
  std::map<std::string, double> tok_s;
  j["results"] = rows;
  j["graph_vs_plain"] = json::object();
  auto publish = [&] {
    j["results"] = rows;
    write_json(out_path, j);
  };

  for (const std::string& fname : formats) {
    const auto fmt = kvgate::parse_kv_format(fname);
    json r;
    r["format"] = fname;
    if (!fmt) {
      r["skipped"] = "unknown format (" + kvgate::known_formats_text() + ")";
      progress("%-16s skipped: unknown format", fname.c_str());
      rows.push_back(r);
      publish();
      continue;
    }
    kvgate::StoreConfig sc = store_config(*fmt);
    std::string no_kernel;
    for (kc::Op op : {kc::Op::store, kc::Op::decode, kc::Op::prefill}) {
      // The latent cache: store per half at its width, attention = the latent kernel (supports_mla)
      // for decode steps and prefill chunks alike.
      const kc::OpSupport s = latent ? kc::supports_op(op, sc, cfg.n_heads) : kc::supports_op(op, *fmt, g, cfg.n_heads);
      if (!s.ok && no_kernel.empty())
        no_kernel = std::string(latent ? "no CUDA latent-cache kernel (" : "no CUDA kernel (") + s.reason + "): " + s.detail;
      if (s.ok && op == kc::Op::decode) r["decode_path"] = s.path;
      if (s.ok && op == kc::Op::prefill) r["prefill_path"] = s.path;
    }
    if (!no_kernel.empty()) {
      r["skipped"] = no_kernel;
      progress("%-16s skipped: %s", fname.c_str(), no_kernel.c_str());
      rows.push_back(r);
      publish();
      continue;
    }
    const std::size_t page_k = kvgate::page_bytes(fmt->k, g), page_v = kvgate::page_bytes(fmt->v, gv);
    r["kv_bytes_per_token"] = static_cast<double>(cfg.n_layers) * (page_k + page_v) / 16.0;
    if (cfg.mla.any()) {
      r["kv_bytes_per_token_per_layer"] = static_cast<double>(page_k + page_v) / 16.0;
      r["kv_layout"] = latent ? "mla_latent" : "kv_heads (MLA expanded)";
    }
    if (n_slide > 0 && cfg.n_layers > n_slide) {  // what the attention reads per token of a 32K sequence
      int w = 0;
      for (int l = 0; l < cfg.n_layers; ++l) w = std::max(w, cfg.window(l));
      r["kv_bytes_per_token_read_at_context"] =
          (static_cast<double>(cfg.n_layers - n_slide) + static_cast<double>(n_slide) * std::min(1.0, double(w) / context)) *
          (page_k + page_v) / 16.0;
    }
    if (decode) {
      sc.n_blocks = batch * ((max_ctx + 15) / 16);
      const std::size_t need = store_bytes(sc, page_k, page_v);
      std::size_t free_b = 0, total_b = 0;
      CK(cudaMemGetInfo(&free_b, &total_b));
      r["pool_bytes"] = need;
      if (need + (2ull << 30) > free_b) {
        r["decode_skipped"] = "the KV pool of " + std::to_string(batch) + " x " + std::to_string(max_ctx) +
                              " tokens needs " + mib(need) + ", " + mib(free_b) +
                              " free next to the weights (2 GiB kept for the forward's buffers)";
        progress("%-16s decode skipped: %s", fname.c_str(), r["decode_skipped"].get<std::string>().c_str());
      } else {
        try {
          kc::CudaKvStore store(sc);
          std::vector<kvgate::SeqId> seqs;
          for (int b = 0; b < batch; ++b) {
            seqs.push_back(store.create_sequence());
            store.extend(seqs.back(), context);
          }
          const double fill_ms = fill_kv(store, seqs, context, rows_k, rows_v, d_slots);
          kc::CudaForward fwd(*model, store, kc::CudaForwardOptions{batch, max_ctx, true});
          const StepTimes t = time_steps(fwd, seqs, warmup, steps);
          r["fill_ms"] = fill_ms;
          r["step_wall_ms"] = t.wall_ms;
          r["step_device_ms"] = t.device_ms;
          r["step_wall_ms_all"] = t.wall;
          r["tok_s"] = batch * 1e3 / t.wall_ms;
          r["cuda_graph"] = true;
          tok_s[fname] = batch * 1e3 / t.wall_ms;
          progress("%-16s decode %7.1f tok/s  step %.3f ms wall, %.3f ms device  (KV %.0f B/token, pool %.1f GB, fill %.0f ms)",
                   fname.c_str(), batch * 1e3 / t.wall_ms, t.wall_ms, t.device_ms,
                   r["kv_bytes_per_token"].get<double>(), need / 1e9, fill_ms);
          if (fname == "bf16") {  // graph replay vs plain launches, the batch and batch 1
            kc::CudaForward plain(*model, store, kc::CudaForwardOptions{batch, max_ctx, false});
            const StepTimes tp = time_steps(plain, seqs, warmup, steps);
            const std::vector<kvgate::SeqId> one{seqs[0]};
            kc::CudaForward g1(*model, store, kc::CudaForwardOptions{1, max_ctx, true});
            const StepTimes t1g = time_steps(g1, one, warmup, steps);
            kc::CudaForward p1(*model, store, kc::CudaForwardOptions{1, max_ctx, false});
            const StepTimes t1p = time_steps(p1, one, warmup, steps);
            j["graph_vs_plain"] = {
                {"format", "bf16"},
                {"batch", {{"batch", batch}, {"graph_wall_ms", t.wall_ms}, {"plain_wall_ms", tp.wall_ms},
                           {"graph_device_ms", t.device_ms}, {"plain_device_ms", tp.device_ms}}},
                {"batch1", {{"batch", 1}, {"graph_wall_ms", t1g.wall_ms}, {"plain_wall_ms", t1p.wall_ms},
                            {"graph_device_ms", t1g.device_ms}, {"plain_device_ms", t1p.device_ms},
                            {"graph_tok_s", 1e3 / t1g.wall_ms}, {"plain_tok_s", 1e3 / t1p.wall_ms}}}};
            progress("graph vs plain (bf16 KV): batch %d %.3f vs %.3f ms/step; batch 1 %.3f vs %.3f ms/step", batch,
                     t.wall_ms, tp.wall_ms, t1g.wall_ms, t1p.wall_ms);
          }
        } catch (const std::exception& e) {
          r["decode_error"] = e.what();
          progress("%-16s decode error: %s", fname.c_str(), e.what());
        }
      }
      publish();
    }
    if (ttft > 0) {
      const int tctx = ttft + 8;
      sc.n_blocks = (tctx + 15) / 16;  // as the engine sizes its pool for --max-context (one sequence)
      const std::size_t need = store_bytes(sc, page_k, page_v);
      std::size_t free_b = 0, total_b = 0;
      CK(cudaMemGetInfo(&free_b, &total_b));
      json tj = {{"prompt_tokens", ttft}, {"prefill_chunk", prefill_chunk}, {"pool_bytes", need}};
      if (need + (4ull << 30) > free_b) {
        tj["skipped"] = "the KV pool of " + std::to_string(tctx) + " tokens needs " + mib(need) + ", " + mib(free_b) +
                        " free next to the weights (4 GiB kept for the forward's buffers)";
        progress("%-16s TTFT skipped: %s", fname.c_str(), tj["skipped"].get<std::string>().c_str());
      } else {
        try {
          kc::CudaKvStore store(sc);
          kc::CudaForward fwd(*model, store,
                              kc::CudaForwardOptions{std::max(1, std::min(prefill_chunk, tctx)), tctx, true});
          std::vector<int> prompt(static_cast<std::size_t>(ttft));
          for (int i = 0; i < ttft; ++i)
            prompt[static_cast<std::size_t>(i)] = static_cast<int>((1 + 7919ull * static_cast<unsigned>(i)) % cfg.vocab_size);
          const TtftTimes t = time_ttft(fwd, store, prompt, ttft_warmup, ttft_runs);
          tj["wall_ms"] = t.wall_ms;
          tj["device_ms"] = t.device_ms;
          tj["wall_ms_all"] = t.wall;
          tj["device_ms_all"] = t.device;
          tj["prefill_tok_s"] = ttft * 1e3 / t.wall_ms;
          tj["first_token"] = t.first_token;
          progress("%-16s TTFT %d tokens: %.1f ms wall, %.1f ms device (%.0f tok/s prefill)", fname.c_str(), ttft,
                   t.wall_ms, t.device_ms, ttft * 1e3 / t.wall_ms);
        } catch (const std::exception& e) {
          tj["error"] = e.what();
          progress("%-16s TTFT error: %s", fname.c_str(), e.what());
        }
      }
      r["ttft"] = tj;
    }
    rows.push_back(r);
    publish();
  }
  if (tok_s.count("bf16"))
    for (auto& r : rows)
      if (r.contains("tok_s")) r["ratio_vs_bf16"] = r["tok_s"].get<double>() / tok_s["bf16"];
  j["complete"] = true;
  j["elapsed_s"] = elapsed_s();
  if (rows_k) cudaFree(rows_k);
  if (rows_v) cudaFree(rows_v);
  if (d_slots) cudaFree(d_slots);
  publish();
  progress("wrote %s", out_path.c_str());
  return 0;
}
