// GPU latent-attention (MLA, weight-absorbed) decode benchmark (kvgate/cuda/ops.hpp "latent
// attention"): one query row per sequence over a KvLayout::mla_latent pool (per token a latent of 512
// in the K half, a RoPE key of 64 in the V half; pages of 64 tokens by default, DeepSeek's), the
// DeepSeek-V2-Lite (16 query heads) and V3 (128) shapes, for contexts x batches x latent formats:
// bf16 (dense: 1152 B/token), k=fp8_block128,v=bf16 (the fp8_ds_mla split: 512 + 4 x 4 + 128 = 656
// B/token) and k=fp8_e4m3,v=bf16 (640 B/token). Timed with CUDA events over CUDA-graph replays of
// mla_decode_attention with a plan made by plan_mla_decode, against the device-to-device copy bandwidth
// and a read-only streaming probe measured in the same run (the physical limits). Writes one JSON
// document (schema "kvgate.bench.cuda_mla_decode/1") and, with --md, the same table in Markdown.
//
//   bench_mla_decode [--out FILE] [--md FILE] [--contexts 32768] [--batches 16,64] [--heads 16,128]
//                    [--formats "bf16;k=fp8_block128,v=bf16;k=fp8_e4m3,v=bf16"] [--block 64] [--reps N]
//                    [--quick]
//
// --formats is separated by ';' (a pair's own name holds a comma). Bytes per call: the latent and
// RoPE-key pages every sequence's context covers (context / block pages of each half, whole pages),
// the traffic the kernel cannot avoid; the query and o_lat traffic (rows x heads x (kv_lora + rope +
// kv_lora) floats) is reported beside it, not counted in GB/s.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/cuda/util.hpp"
#include "kvgate/format.hpp"
#include "kvgate/kv_store.hpp"

namespace kc = kvgate::cuda;
using kvgate::KvFormat;
using kvgate::KvHalf;

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, sep))
    if (!tok.empty()) v.push_back(tok);
  return v;
}

using kvgate::bench::jnum;
using kvgate::bench::median;
using kvgate::bench::parse_ints;
using kvgate::bench::Timer;



}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "bench_mla_decode.json", md_path;
  std::vector<int> contexts{32768}, batches{16, 64}, heads{16, 128};
  std::vector<std::string> formats{"bf16", "k=fp8_block128,v=bf16", "k=fp8_e4m3,v=bf16"};
  int block = 64, reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value for %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--out") out_path = next();
    else if (a == "--md") md_path = next();
    else if (a == "--contexts") contexts = parse_ints(next());
    else if (a == "--batches") batches = parse_ints(next());
    else if (a == "--heads") heads = parse_ints(next());
    else if (a == "--formats") formats = split(next(), ';');
    else if (a == "--block") block = std::stoi(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--quick") {
      contexts = {8192};
      batches = {16};
      reps = 5;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  // The device, a stream and the limits measured in this run (bench_common.hpp).
  const kvgate::bench::BenchDevice bd = kvgate::bench::open_bench_device();
  if (!bd.dev) return 0;
  const kc::DeviceStatus& dev = *bd.dev;
  cudaStream_t st = bd.stream;
  Timer tm;
  const kvgate::bench::MemoryLimits lim = bd.lim;
  const double copy_GBps = lim.copy_GBps, read_GBps = lim.read_GBps;

  // DeepSeek-V2-Lite / V3's latent cache: kv_lora_rank 512, qk_rope_head_dim 64; the softmax scale is
  // the model's qk_head_dim^-0.5 (nope 128 + rope 64; the scale does not change the traffic).
  const int KL = 512, R = 64, B = block;
  const float softmax_scale = static_cast<float>(1.0 / std::sqrt(192.0));
  const int max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int max_heads = *std::max_element(heads.begin(), heads.end());
  const int n_seqs = std::max(64, max_batch);
  const int pages_per_seq = (max_ctx + B - 1) / B;
  std::ostringstream results, md;
  bool first_result = true;
  md << "| format | B/token | context | batch | heads | splits | grid | time (us) | KV MB | GB/s | % copy | % read |\n"
     << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  std::printf("%-22s %6s %7s %5s %5s %6s %6s %10s %9s %8s %7s %6s\n", "format", "B/tok", "ctx", "batch", "heads",
              "splits", "grid", "time_us", "KV_MB", "GB/s", "%copy", "%read");

  for (const std::string& fname : formats) {
    const auto fmt = kvgate::parse_kv_format(fname);
    if (!fmt) {
      std::fprintf(stderr, "unknown format %s\n", fname.c_str());
      return 2;
    }
    kvgate::StoreConfig cfg;
    cfg.format = *fmt;
    cfg.layout = kvgate::KvLayout::mla_latent;
    cfg.n_layers = 1;
    cfg.n_kv_heads = 1;
    cfg.head_dim = KL;
    cfg.v_head_dim = R;
    cfg.block_size = B;
    cfg.n_blocks = n_seqs * pages_per_seq;
    cfg.k_scale = {0.37f};
    cfg.v_scale = {0.0213f};
    const kc::OpSupport sup = kc::supports_mla(*fmt, KL, R, max_heads);
    if (!sup.ok) {
      std::printf("  %s: SKIPPED (%s: %s)\n", fname.c_str(), sup.reason.c_str(), sup.detail.c_str());
      continue;
    }
    auto store = std::make_unique<kc::CudaKvStore>(cfg);
    const kvgate::PageGeometry gk = cfg.half_geometry(KvHalf::K), gv = cfg.half_geometry(KvHalf::V);
    const double bytes_per_token = kvgate::bytes_per_cell(fmt->k, gk) + kvgate::bytes_per_cell(fmt->v, gv);

    // Fill every page through the store kernel (valid codes of random rows), in chunks of 32K
    // tokens; sequence s's page p is a random page of the pool.
    std::vector<int> perm(static_cast<std::size_t>(cfg.n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937 rng(1234);
    std::shuffle(perm.begin(), perm.end(), rng);
    const int chunk = 32768;
    float *dlat = nullptr, *drope = nullptr;
    int* dmap = nullptr;
    CK(cudaMalloc(&dlat, sizeof(float) * chunk * KL));
    CK(cudaMalloc(&drope, sizeof(float) * chunk * R));
    CK(cudaMalloc(&dmap, sizeof(int) * chunk));
    std::vector<int> map(chunk);
    const long seq_tokens = static_cast<long>(pages_per_seq) * B;
    const long total_tokens = static_cast<long>(cfg.n_blocks) * B;
    for (long t0 = 0, ci = 0; t0 < total_tokens; t0 += chunk, ++ci) {
      const int n = static_cast<int>(std::min<long>(chunk, total_tokens - t0));
      for (int t = 0; t < n; ++t) {
        const long tok = t0 + t;  // token tok of sequence tok / seq_tokens at position tok % seq_tokens
        const long s = tok / seq_tokens, pos = tok % seq_tokens;
        map[static_cast<std::size_t>(t)] = perm[static_cast<std::size_t>(s * pages_per_seq + pos / B)] * B + static_cast<int>(pos % B);
      }
      CK(cudaMemcpyAsync(dmap, map.data(), sizeof(int) * n, cudaMemcpyHostToDevice, st));
      kc::fill_random(dlat, std::size_t{1} * n * KL, 1000 + ci, 1.0f, st);  // an RMSNorm output: O(1)
      kc::fill_random(drope, std::size_t{1} * n * R, 5000 + ci, 1.0f, st);
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        kc::StoreRowsArgs a;
        a.rows = h == KvHalf::K ? dlat : drope;
        a.row_stride = static_cast<std::size_t>(h == KvHalf::K ? KL : R);
        a.slot_mapping = dmap;
        a.n_tokens = n;
        a.pool = store->pool(0, h);
        a.page_stride = store->page_stride(h);
        a.tensor_scale = store->tensor_scale(0, h);
        kc::store_rows(h == KvHalf::K ? fmt->k : fmt->v, h == KvHalf::K ? gk : gv, a, st);
      }
      CK(cudaStreamSynchronize(st));  // map is reused
    }
    CK(cudaFree(dlat));
    CK(cudaFree(drope));
    CK(cudaFree(dmap));

    // Block tables of all sequences (stride pages_per_seq), their lengths, the queries and outputs.
    std::vector<int> tables(static_cast<std::size_t>(n_seqs) * pages_per_seq);
    for (std::size_t i = 0; i < tables.size(); ++i) tables[i] = perm[i];
    int *dtables = nullptr, *dlens = nullptr;
    float *dq = nullptr, *dout = nullptr;
    const std::size_t q_row = static_cast<std::size_t>(max_heads) * (KL + R), o_row = static_cast<std::size_t>(max_heads) * KL;
    CK(cudaMalloc(&dtables, sizeof(int) * tables.size()));
    CK(cudaMemcpy(dtables, tables.data(), sizeof(int) * tables.size(), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dlens, sizeof(int) * n_seqs));
    CK(cudaMalloc(&dq, sizeof(float) * n_seqs * q_row));
    CK(cudaMalloc(&dout, sizeof(float) * n_seqs * o_row));
    kc::fill_random(dq, static_cast<std::size_t>(n_seqs) * q_row, 99, 0.1f, st);
    kc::DecodeWorkspace ws;

    for (int ctx : contexts)
      for (int batch : batches)
        for (int H : heads) {
          std::vector<int> lens(static_cast<std::size_t>(n_seqs), ctx);
          CK(cudaMemcpy(dlens, lens.data(), sizeof(int) * n_seqs, cudaMemcpyHostToDevice));
          kc::MlaDecodeArgs a;
          a.format = *fmt;
          a.block_size = B;
          a.kv_lora = KL;
          a.rope = R;
          a.n_heads = H;
          a.rows = batch;
          a.k_pool = store->pool(0, KvHalf::K);
          a.v_pool = store->pool(0, KvHalf::V);
          a.k_page_stride = store->page_stride(KvHalf::K);
          a.v_page_stride = store->page_stride(KvHalf::V);
          a.table_stride = pages_per_seq;
          a.max_seq_len = ctx;
          a.k_scale = store->tensor_scale(0, KvHalf::K);
          a.v_scale = store->tensor_scale(0, KvHalf::V);
          a.softmax_scale = softmax_scale;
          a.num_splits = 0;  // the planner's choice
          // One graph = R calls over different sequence windows (so the latent working set is far
          // larger than L2 at every batch).
          const int windows = std::max(1, n_seqs / batch);
          const int R_calls = std::min(16, windows);
          auto args_for = [&](int w) {
            kc::MlaDecodeArgs x = a;
            const int s0 = (w % windows) * batch;
            x.block_tables = dtables + static_cast<std::size_t>(s0) * pages_per_seq;
            x.seq_lens = dlens + s0;
            x.q = dq + static_cast<std::size_t>(s0) * H * (KL + R);
            x.out = dout + static_cast<std::size_t>(s0) * H * KL;
            return x;
          };
          const kc::DecodePlan plan = kc::plan_mla_decode(args_for(0));
          ws.reserve(plan.workspace_bytes);
          for (int w = 0; w < R_calls; ++w) kc::mla_decode_attention(args_for(w), plan, ws, st);  // warm-up, no capture
          CK(cudaStreamSynchronize(st));
          cudaGraph_t graph;
          cudaGraphExec_t exec;
          CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
          for (int w = 0; w < R_calls; ++w) kc::mla_decode_attention(args_for(w), plan, ws, st);
          CK(cudaStreamEndCapture(st, &graph));
          CK(cudaGraphInstantiate(&exec, graph, 0));
          for (int i = 0; i < 2; ++i) CK(cudaGraphLaunch(exec, st));
          // The pages each row's context covers, both halves (the context is a whole number of pages
          // at the default sizes; a partial last page counts whole).
          const double pages = static_cast<double>(batch) * ((ctx + B - 1) / B);
          const double kv_bytes = pages * static_cast<double>(store->page_bytes(KvHalf::K) + store->page_bytes(KvHalf::V));
          const double io_bytes = static_cast<double>(batch) * H * (KL + R + KL) * 4.0;
          const int launches = std::max(1, std::min(reps, static_cast<int>(4e9 / (kv_bytes * R_calls)) + 1));
          std::vector<double> ms;
          for (int i = 0; i < std::max(3, launches); ++i) {
            tm.start(st);
            CK(cudaGraphLaunch(exec, st));
            ms.push_back(tm.stop_ms(st) / R_calls);
          }
          CK(cudaGraphExecDestroy(exec));
          CK(cudaGraphDestroy(graph));
          const double t_ms = median(ms);
          const double GBps = kv_bytes / (t_ms * 1e-3) / 1e9;
          std::printf("%-22s %6.0f %7d %5d %5d %6d %6d %10.2f %9.1f %8.0f %6.1f%% %5.1f%%\n", fname.c_str(),
                      bytes_per_token, ctx, batch, H, plan.splits, plan.ctas, t_ms * 1e3, kv_bytes / 1e6, GBps,
                      100 * GBps / copy_GBps, 100 * GBps / read_GBps);
          std::fflush(stdout);
          results << (first_result ? "" : ",\n") << "    {\"format\": \"" << fname << "\", \"k\": \""
                  << kvgate::name(fmt->k) << "\", \"v\": \"" << kvgate::name(fmt->v)
                  << "\", \"bytes_per_token\": " << jnum(bytes_per_token) << ", \"context\": " << ctx
                  << ", \"batch\": " << batch << ", \"n_heads\": " << H << ", \"time_us\": " << jnum(t_ms * 1e3)
                  << ", \"kv_bytes\": " << static_cast<long long>(kv_bytes) << ", \"io_bytes\": " << static_cast<long long>(io_bytes)
                  << ", \"GBps\": " << jnum(GBps) << ", \"frac_of_copy\": " << jnum(GBps / copy_GBps)
                  << ", \"frac_of_read_probe\": " << jnum(GBps / read_GBps) << ", \"path\": \"" << plan.path
                  << "\", \"splits\": " << plan.splits << ", \"tokens_per_split\": " << plan.tokens_per_split
                  << ", \"head_chunks\": " << plan.head_chunks << ", \"ctas\": " << plan.ctas
                  << ", \"resident_ctas\": " << plan.resident_ctas << ", \"smem_bytes\": " << plan.smem_bytes
                  << ", \"workspace_bytes\": " << plan.workspace_bytes << ", \"timed_runs\": " << ms.size() << "}";
          first_result = false;
          char row[320];
          std::snprintf(row, sizeof row, "| %s | %.0f | %d | %d | %d | %d | %d | %.2f | %.1f | %.0f | %.1f | %.1f |\n",
                        fname.c_str(), bytes_per_token, ctx, batch, H, plan.splits, plan.ctas, t_ms * 1e3,
                        kv_bytes / 1e6, GBps, 100 * GBps / copy_GBps, 100 * GBps / read_GBps);
          md << row;
        }
    CK(cudaFree(dtables));
    CK(cudaFree(dlens));
    CK(cudaFree(dq));
    CK(cudaFree(dout));
    store.reset();
  }
  CK(cudaStreamDestroy(st));

  std::ostringstream o;
  o << "{\n" << kvgate::bench::document_head("kvgate.bench.cuda_mla_decode/1", dev, lim)
    << "  \"shape\": {\"kv_lora\": " << KL << ", \"rope\": " << R << ", \"block_size\": " << B
    << ", \"softmax_scale\": " << jnum(softmax_scale) << ", \"sequences_allocated\": " << n_seqs
    << ", \"kv_bytes_note\": \"latent + RoPE-key pages covered by each row's context\""
    << ", \"timing\": \"CUDA events over CUDA-graph replays of mla_decode_attention with a plan_mla_decode plan, median\"},\n"
    << "  \"mla_decode\": [\n" << results.str() << "\n  ]\n}\n";
  kvgate::bench::write_file_atomic(out_path, o.str());
  std::printf("wrote %s\n", out_path.c_str());
  if (!md_path.empty()) {
    std::ostringstream m;
    m << "# MLA latent decode, " << dev.name << " (driver CUDA " << kc::cuda_version_string(dev.driver_version)
      << ", runtime " << kc::cuda_version_string(dev.runtime_version) << ")\n\n"
      << "kv_lora " << KL << ", rope " << R << ", pages of " << B << " tokens; copy D2D " << jnum(copy_GBps)
      << " GB/s (read + write counted), read-only probe " << jnum(read_GBps)
      << " GB/s, measured in the same run. KV MB: the latent + RoPE-key pages the contexts cover; time per "
         "call: CUDA events over graph replays, median.\n\n"
      << md.str();
    kvgate::bench::write_file_atomic(md_path, m.str());
    std::printf("wrote %s\n", md_path.c_str());
  }
  return 0;
}
