// End-to-end decode throughput of the whole-model CUDA forward (issue 6): a Llama-3-8B-shaped
// random-weight model (dim 4096, 32 layers, 32 query / 8 KV heads, head_dim 128, FFN 14336, vocab
// 128256; bf16 weights generated on the device, FP32 accumulate) decoding a batch of sequences at a
// long context, per KV preset. The KV of every sequence is filled with random rows through the CUDA
// store kernel (no prefill of the context); then N decode steps run through CudaForward::
// forward_decode (embedding .. classifier + GPU argmax, one token per sequence, CUDA graph replay),
// each timed on the host (wall, including staging and the argmax download) and with CUDA events
// on the forward's stream; the median is reported. Also: graph replay vs plain launches (bf16 KV,
// the batch and batch 1). Writes one JSON document (schema "kvgate.bench.cuda_e2e_decode/1").
//
//   bench_e2e_decode [--out FILE] [--context 32768] [--batch 16] [--steps 8] [--warmup 2]
//                    [--formats f32,f16,...] [--layers 32] [--rope plain|llama3|dynamic]
//   --rope: the model's RoPE (rope.hpp): llama3 = Llama 3.1's rope_parameters (factor 8, low/high
//   1/4, original 8192; a static table like plain), dynamic = dynamic NTK factor 4 over 8192
//   (per-call rows staged on the host).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/cuda/util.hpp"
#include "kvgate/format.hpp"
#include "kvgate/synth.hpp"

namespace kc = kvgate::cuda;
using kvgate::KvFormat;
using kvgate::KvHalf;
using nlohmann::json;


namespace {

using Clock = std::chrono::steady_clock;

using kvgate::bench::median;

// The model, described as `kvgate synth` describes one (runtime/include/kvgate/synth.hpp), mapped
// to the runtime's ModelConfig the loader would produce from that directory.
kvgate::SynthOptions llama3_8b_synth(int layers) {
  kvgate::SynthOptions s;
  s.arch = "llama";
  s.layers = layers;
  s.hidden = 4096;
  s.ffn = 14336;
  s.heads = 32;
  s.kv_heads = 8;
  s.head_dim = 128;
  s.vocab = 128256;
  s.dtype = "bf16";
  s.rope_theta = 500000.0;
  s.tie_embeddings = false;
  return s;
}

kvgate::ModelConfig to_config(const kvgate::SynthOptions& s, int max_seq_len, const std::string& rope) {
  kvgate::ModelConfig c;
  c.arch = s.arch;
  c.dim = s.hidden;
  c.hidden_dim = s.ffn;
  c.n_layers = s.layers;
  c.n_heads = s.heads;
  c.n_kv_heads = s.kv_heads;
  c.head_dim = s.head_dim > 0 ? s.head_dim : s.hidden / s.heads;
  c.vocab_size = s.vocab;
  c.max_seq_len = max_seq_len;
  c.rope_theta = static_cast<float>(s.rope_theta);
  c.rope_style = kvgate::RopeStyle::half;  // Hugging Face checkpoints
  c.tied_embeddings = s.tie_embeddings;
  if (rope == "llama3") {  // as load_hf reads `kvgate synth --rope llama3`
    c.rope.type = kvgate::RopeType::llama3;
    c.rope.factor = 8;
    c.rope.low_freq_factor = 1;
    c.rope.high_freq_factor = 4;
    c.rope.original_max = 8192;
  } else if (rope == "dynamic") {
    c.rope.type = kvgate::RopeType::dynamic;
    c.rope.factor = 4;
    c.rope.max_position = 8192;
  } else if (rope != "plain") {
    std::fprintf(stderr, "bench_e2e_decode: --rope must be plain, llama3 or dynamic\n");
    std::exit(2);
  }
  return c;
}

// Fills `ctx` tokens of each sequence with random K/V rows through the store kernel, every layer.
double fill_kv(kc::CudaKvStore& store, const std::vector<kvgate::SeqId>& seqs, int ctx, float* rows_k, float* rows_v,
               int* d_slots) {
  const auto t0 = Clock::now();
  const int B = store.config().block_size, HD = store.geometry().row_elems();
  std::vector<int> slots(static_cast<std::size_t>(ctx));
  for (kvgate::SeqId s : seqs) {
    const auto table = store.block_table(s);
    for (int p = 0; p < ctx; ++p) slots[static_cast<std::size_t>(p)] = table[static_cast<std::size_t>(p / B)] * B + p % B;
    CK(cudaMemcpy(d_slots, slots.data(), slots.size() * sizeof(int), cudaMemcpyHostToDevice));
    for (int l = 0; l < store.config().n_layers; ++l)
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        kc::StoreRowsArgs a;
        a.rows = h == KvHalf::K ? rows_k : rows_v;
        a.row_stride = static_cast<std::size_t>(HD);
        a.slot_mapping = d_slots;
        a.n_tokens = ctx;
        a.pool = store.pool(l, h);
        a.page_stride = store.page_stride(h);
        a.tensor_scale = store.tensor_scale(l, h);
        kc::store_rows(store.half_format(h), store.geometry(), a, nullptr);
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

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "bench_e2e_decode.json";
  int context = 32768, batch = 16, steps = 8, warmup = 2, layers = 32;
  std::string rope = "plain";
  std::vector<std::string> formats;
  for (const auto& p : kvgate::presets()) formats.emplace_back(p.name);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_e2e_decode: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--out") out_path = val();
    else if (a == "--context") context = std::stoi(val());
    else if (a == "--batch") batch = std::stoi(val());
    else if (a == "--steps") steps = std::stoi(val());
    else if (a == "--warmup") warmup = std::stoi(val());
    else if (a == "--layers") layers = std::stoi(val());
    else if (a == "--rope") rope = val();
    else if (a == "--formats") {
      formats.clear();
      std::stringstream ss(val());
      std::string tok;
      while (std::getline(ss, tok, ',')) formats.push_back(tok);
    } else {
      std::fprintf(stderr,
                   "usage: bench_e2e_decode [--out FILE] [--context N] [--batch B] [--steps N] [--warmup N] "
                   "[--formats a,b] [--layers N] [--rope plain|llama3|dynamic]\n");
      return 2;
    }
  }
  const kc::DeviceStatus& dev = kc::device_status();
  if (!dev.available) {
    std::fprintf(stderr, "bench_e2e_decode: %s\n", dev.reason.c_str());
    return 1;
  }
  // Steps of every measurement (format runs, then graph-vs-plain runs on the bf16 store) fit in the context.
  const int extra = 4 * (warmup + steps) + 8;
  const int max_ctx = context + extra;
  const kvgate::SynthOptions synth = llama3_8b_synth(layers);
  const kvgate::ModelConfig cfg = to_config(synth, max_ctx, rope);
  std::printf("model: Llama-3-8B shape, %d layers, bf16 random weights on the device, RoPE %s; context %d, batch %d, %d steps (+%d warmup)\n",
              layers, rope.c_str(), context, batch, steps, warmup);
  std::fflush(stdout);
  const auto tw = Clock::now();
  const auto model = kc::CudaModel::random(cfg, kc::WeightType::bf16, 8);
  const double weights_ms = std::chrono::duration<double, std::milli>(Clock::now() - tw).count();
  std::printf("weights: %.2f GB generated in %.0f ms\n", model->weight_bytes() / 1e9, weights_ms);

  const kvgate::PageGeometry g{16, cfg.n_kv_heads, cfg.head_dim};
  const std::size_t rows_elems = static_cast<std::size_t>(context) * g.row_elems();
  float *rows_k = nullptr, *rows_v = nullptr;
  int* d_slots = nullptr;
  CK(cudaMalloc(&rows_k, rows_elems * sizeof(float)));
  CK(cudaMalloc(&rows_v, rows_elems * sizeof(float)));
  CK(cudaMalloc(&d_slots, static_cast<std::size_t>(context) * sizeof(int)));
  kc::fill_random(rows_k, rows_elems, 11, 1.0f);
  kc::fill_random(rows_v, rows_elems, 12, 1.0f);
  CK(cudaDeviceSynchronize());

  json j;
  j["schema"] = "kvgate.bench.cuda_e2e_decode/1";
  {
    std::time_t now = std::time(nullptr);
    char buf[64];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    j["date"] = buf;
  }
  j["device"] = {{"name", dev.name},
                 {"cc", std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor)},
                 {"sm_count", dev.sm_count},
                 {"total_mem", dev.total_mem},
                 {"driver", kc::cuda_version_string(dev.driver_version)},
                 {"cuda_runtime", kc::cuda_version_string(dev.runtime_version)}};
  j["model"] = {{"shape", "Llama-3-8B"},
                {"synth", {{"arch", synth.arch}, {"layers", synth.layers}, {"hidden", synth.hidden}, {"ffn", synth.ffn},
                           {"heads", synth.heads}, {"kv_heads", synth.kv_heads}, {"head_dim", synth.head_dim},
                           {"vocab", synth.vocab}, {"dtype", synth.dtype}, {"rope_theta", synth.rope_theta}, {"rope", rope},
                           {"tie_embeddings", synth.tie_embeddings}}},
                {"weights", "bf16 (cublasGemmEx, FP32 accumulate), random, generated on the device"},
                {"weight_bytes", model->weight_bytes()}};
  j["setup"] = {{"context", context}, {"batch", batch}, {"steps", steps}, {"warmup", warmup}, {"block_size", 16},
                {"timing", "median over steps; wall = host time of forward_decode (staging, graph launch, argmax "
                           "download, sync); device = CUDA events on the forward's stream"},
                {"kv_fill", "random rows (unit variance) through the CUDA store kernel, every layer and sequence"}};
  json rows = json::array();
  std::map<std::string, double> tok_s;
  json graph_cmp = json::object();
  for (const std::string& fname : formats) {
    const auto fmt = kvgate::parse_kv_format(fname);
    json r;
    r["format"] = fname;
    if (!fmt) {
      r["skipped"] = "unknown format";
      rows.push_back(r);
      continue;
    }
    kvgate::StoreConfig sc;
    sc.format = *fmt;
    sc.n_layers = cfg.n_layers;
    sc.n_kv_heads = cfg.n_kv_heads;
    sc.head_dim = cfg.head_dim;
    sc.block_size = 16;
    sc.n_blocks = batch * ((max_ctx + 15) / 16);
    const std::size_t page_k = kvgate::page_bytes(fmt->k, g), page_v = kvgate::page_bytes(fmt->v, g);
    const std::size_t need = static_cast<std::size_t>(sc.n_blocks) * cfg.n_layers * (page_k + page_v);
    std::size_t free_b = 0, total_b = 0;
    CK(cudaMemGetInfo(&free_b, &total_b));
    r["kv_bytes_per_token"] = static_cast<double>(cfg.n_layers) * (page_k + page_v) / 16.0;
    r["pool_bytes"] = need;
    if (need + (2ull << 30) > free_b) {
      r["skipped"] = "the KV pool needs " + std::to_string(need / (1ull << 20)) + " MiB, " +
                     std::to_string(free_b / (1ull << 20)) + " MiB free next to the weights";
      std::printf("%-10s skipped: %s\n", fname.c_str(), r["skipped"].get<std::string>().c_str());
      rows.push_back(r);
      continue;
    }
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
      std::printf("%-10s %7.1f tok/s  step %.3f ms wall, %.3f ms device  (KV %.0f B/token, pool %.1f GB, fill %.0f ms)\n",
                  fname.c_str(), batch * 1e3 / t.wall_ms, t.wall_ms, t.device_ms,
                  r["kv_bytes_per_token"].get<double>(), need / 1e9, fill_ms);
      std::fflush(stdout);
      if (fname == "bf16") {  // graph replay vs plain launches, the batch and batch 1
        kc::CudaForward plain(*model, store, kc::CudaForwardOptions{batch, max_ctx, false});
        const StepTimes tp = time_steps(plain, seqs, warmup, steps);
        const std::vector<kvgate::SeqId> one{seqs[0]};
        kc::CudaForward g1(*model, store, kc::CudaForwardOptions{1, max_ctx, true});
        const StepTimes t1g = time_steps(g1, one, warmup, steps);
        kc::CudaForward p1(*model, store, kc::CudaForwardOptions{1, max_ctx, false});
        const StepTimes t1p = time_steps(p1, one, warmup, steps);
        graph_cmp = {{"format", "bf16"},
                     {"batch", {{"batch", batch}, {"graph_wall_ms", t.wall_ms}, {"plain_wall_ms", tp.wall_ms},
                                {"graph_device_ms", t.device_ms}, {"plain_device_ms", tp.device_ms}}},
                     {"batch1", {{"batch", 1}, {"graph_wall_ms", t1g.wall_ms}, {"plain_wall_ms", t1p.wall_ms},
                                 {"graph_device_ms", t1g.device_ms}, {"plain_device_ms", t1p.device_ms},
                                 {"graph_tok_s", 1e3 / t1g.wall_ms}, {"plain_tok_s", 1e3 / t1p.wall_ms}}}};
        std::printf("graph vs plain (bf16 KV): batch %d %.3f vs %.3f ms/step; batch 1 %.3f vs %.3f ms/step\n", batch,
                    t.wall_ms, tp.wall_ms, t1g.wall_ms, t1p.wall_ms);
      }
    } catch (const std::exception& e) {
      r["error"] = e.what();
      std::printf("%-10s error: %s\n", fname.c_str(), e.what());
    }
    rows.push_back(r);
  }
  if (tok_s.count("bf16"))
    for (auto& r : rows)
      if (r.contains("tok_s")) r["ratio_vs_bf16"] = r["tok_s"].get<double>() / tok_s["bf16"];
  j["results"] = rows;
  j["graph_vs_plain"] = graph_cmp;
  cudaFree(rows_k);
  cudaFree(rows_v);
  cudaFree(d_slots);
  std::ofstream(out_path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
