// GPU decode-attention benchmark (docs/CUDA.md): Llama-3-8B attention shape (32 query heads, 8 KV
// heads, head_dim 128, pages of 16 tokens) for contexts x batches x KV formats, timed with CUDA
// events over CUDA-graph replays, against the device-to-device copy bandwidth and a read-only
// streaming probe measured in the same run. Also the store kernel: a 4K-token prefill and the
// per-token append latency at decode. Writes one JSON document (bench/results/ schema
// "kvgate.bench.cuda_decode/1").
//
//   bench_decode_attn [--out FILE] [--contexts 4096,32768,131072] [--batches 1,16,64]
//                     [--formats f32,f16,...] [--reps N] [--quick] [--splits 0,64,128,...]
// --splits: split counts to force (DecodeArgs::num_splits; 0 = the planner's, the default), one row
// each: the split-K sweep that shows what the planner's choice costs at each batch.
// Every row also times its launch floor: the same graph of R calls with empty kernels of the
// decode's and the merge's grids (launch_floor_us), what batch 1 pays before any work.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

namespace kc = kvgate::cuda;
using kvgate::HalfFormat;
using kvgate::KvFormat;
using kvgate::KvHalf;


namespace {

std::vector<std::string> parse_strs(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) v.push_back(tok);
  return v;
}

using kvgate::bench::jnum;
using kvgate::bench::median;
using kvgate::bench::parse_ints;
using kvgate::bench::Timer;



}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "bench_decode_attn.json";
  std::vector<int> contexts{4096, 32768, 131072}, batches{1, 16, 64};
  std::vector<std::string> formats;  // default: every preset (kvgate/format_list.hpp)
  for (const kvgate::Preset& p : kvgate::presets()) formats.emplace_back(p.name);
  int reps = 20;
  std::vector<int> split_counts = {0};
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
    else if (a == "--contexts") contexts = parse_ints(next());
    else if (a == "--batches") batches = parse_ints(next());
    else if (a == "--formats") formats = parse_strs(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--splits") split_counts = parse_ints(next());
    else if (a == "--quick") {
      contexts = {4096, 32768};
      batches = {1, 16};
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

  const int H = 8, Hq = 32, D = 128, B = 16;
  const int max_ctx = *std::max_element(contexts.begin(), contexts.end());
  const int max_batch = *std::max_element(batches.begin(), batches.end());
  const int n_seqs = std::max(64, max_batch);
  const int pages_per_seq = max_ctx / B;
  const kvgate::PageGeometry g{B, H, D};
  std::ostringstream results, stores;
  bool first_result = true, first_store = true;
  std::printf("%-9s %7s %5s %6s %10s %10s %8s %7s %6s %8s\n", "format", "ctx", "batch", "splits", "time_us", "KV_MB",
              "GB/s", "%copy", "%read", "floor_us");

  for (const std::string& fname : formats) {
    const auto fmt = kvgate::parse_kv_format(fname);
    if (!fmt) {
      std::fprintf(stderr, "unknown format %s\n", fname.c_str());
      return 2;
    }
    kvgate::StoreConfig cfg;
    cfg.format = *fmt;
    cfg.n_layers = 1;
    cfg.n_kv_heads = H;
    cfg.head_dim = D;
    cfg.block_size = B;
    cfg.n_blocks = n_seqs * pages_per_seq;
    cfg.k_scale = {0.37f};
    cfg.v_scale = {0.0213f};
    auto store = std::make_unique<kc::CudaKvStore>(cfg);

    // Fill every page through the store kernel, in chunks of 32K tokens; random page order.
    std::vector<int> perm(static_cast<std::size_t>(cfg.n_blocks));
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937 rng(1234);
    std::shuffle(perm.begin(), perm.end(), rng);
    const int chunk = 32768;
    float *dk = nullptr, *dv = nullptr;
    int* dmap = nullptr;
    CK(cudaMalloc(&dk, std::size_t{4} * chunk * H * D));
    CK(cudaMalloc(&dv, std::size_t{4} * chunk * H * D));
    CK(cudaMalloc(&dmap, sizeof(int) * chunk));
    std::vector<int> map(chunk);
    const long total_tokens = static_cast<long>(cfg.n_blocks) * B;
    for (long t0 = 0, ci = 0; t0 < total_tokens; t0 += chunk, ++ci) {
      const int n = static_cast<int>(std::min<long>(chunk, total_tokens - t0));
      for (int t = 0; t < n; ++t) {
        const long tok = t0 + t;  // token tok of sequence tok / max_ctx at position tok % max_ctx
        const long s = tok / max_ctx, pos = tok % max_ctx;
        map[t] = perm[static_cast<std::size_t>(s * pages_per_seq + pos / B)] * B + static_cast<int>(pos % B);
      }
      CK(cudaMemcpyAsync(dmap, map.data(), sizeof(int) * n, cudaMemcpyHostToDevice, st));
      kc::fill_random(dk, std::size_t{1} * n * H * D, 1000 + ci, 1.0f, st);
      kc::fill_random(dv, std::size_t{1} * n * H * D, 5000 + ci, 0.05f, st);
      for (KvHalf h : {KvHalf::K, KvHalf::V}) {
        kc::StoreRowsArgs a;
        a.rows = h == KvHalf::K ? dk : dv;
        a.row_stride = static_cast<std::size_t>(H) * D;
        a.slot_mapping = dmap;
        a.n_tokens = n;
        a.pool = store->pool(0, h);
        a.page_stride = store->page_stride(h);
        a.tensor_scale = store->tensor_scale(0, h);
        kc::store_rows(h == KvHalf::K ? fmt->k : fmt->v, g, a, st);
      }
      CK(cudaStreamSynchronize(st));  // map is reused
    }

    // Store kernel timings: 4K-token prefill (K and V) and one decode token (K and V).
    {
      const int prefill = 4096;
      for (int t = 0; t < prefill; ++t) map[t] = perm[static_cast<std::size_t>(t / B)] * B + t % B;
      CK(cudaMemcpyAsync(dmap, map.data(), sizeof(int) * prefill, cudaMemcpyHostToDevice, st));
      auto run_store = [&](int n) {
        for (KvHalf h : {KvHalf::K, KvHalf::V}) {
          kc::StoreRowsArgs a;
          a.rows = h == KvHalf::K ? dk : dv;
          a.row_stride = static_cast<std::size_t>(H) * D;
          a.slot_mapping = dmap;
          a.n_tokens = n;
          a.pool = store->pool(0, h);
          a.page_stride = store->page_stride(h);
          a.tensor_scale = store->tensor_scale(0, h);
          kc::store_rows(h == KvHalf::K ? fmt->k : fmt->v, g, a, st);
        }
      };
      for (int n : {prefill, 1}) {
        for (int i = 0; i < 5; ++i) run_store(n);
        std::vector<double> ms;
        for (int i = 0; i < 20; ++i) {
          tm.start(st);
          run_store(n);
          ms.push_back(tm.stop_ms(st));
        }
        const double us = median(ms) * 1e3;
        const double in_bytes = 2.0 * n * H * D * 4;
        const double out_bytes = static_cast<double>(n) * H * (kvgate::bytes_per_cell(fmt->k, g) + kvgate::bytes_per_cell(fmt->v, g));
        stores << (first_store ? "" : ",\n") << "    {\"format\": \"" << fname << "\", \"tokens\": " << n
               << ", \"time_us\": " << jnum(us) << ", \"tokens_per_s\": " << jnum(n / (us * 1e-6))
               << ", \"bytes_in\": " << jnum(in_bytes) << ", \"bytes_out\": " << jnum(out_bytes)
               << ", \"GBps\": " << jnum((in_bytes + out_bytes) / (us * 1e-6) / 1e9) << "}";
        first_store = false;
        std::printf("  store %-9s %5d tokens: %9.2f us (%.3g tok/s, %.0f GB/s in+out)\n", fname.c_str(), n, us,
                    n / (us * 1e-6), (in_bytes + out_bytes) / (us * 1e-6) / 1e9);
      }
    }
    CK(cudaFree(dk));
    CK(cudaFree(dv));
    CK(cudaFree(dmap));

    // Block tables of all sequences (stride pages_per_seq) and their lengths.
    std::vector<int> tables(static_cast<std::size_t>(n_seqs) * pages_per_seq);
    for (int s = 0; s < n_seqs; ++s)
      for (int p = 0; p < pages_per_seq; ++p)
        tables[static_cast<std::size_t>(s) * pages_per_seq + p] = perm[static_cast<std::size_t>(s) * pages_per_seq + p];
    int *dtables = nullptr, *dlens = nullptr;
    float *dq = nullptr, *dout = nullptr;
    CK(cudaMalloc(&dtables, sizeof(int) * tables.size()));
    CK(cudaMemcpy(dtables, tables.data(), sizeof(int) * tables.size(), cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dlens, sizeof(int) * n_seqs));
    CK(cudaMalloc(&dq, sizeof(float) * n_seqs * Hq * D));
    CK(cudaMalloc(&dout, sizeof(float) * n_seqs * Hq * D));
    kc::fill_random(dq, static_cast<std::size_t>(n_seqs) * Hq * D, 99, 1.0f, st);
    kc::DecodeWorkspace ws;

    for (int ctx : contexts)
      for (int batch : batches)
      for (int forced : split_counts) {
        std::vector<int> lens(n_seqs, ctx);
        CK(cudaMemcpy(dlens, lens.data(), sizeof(int) * n_seqs, cudaMemcpyHostToDevice));
        kc::DecodeArgs a;
        a.format = *fmt;
        a.geometry = g;
        a.n_heads = Hq;
        a.batch = batch;
        a.k_pool = store->pool(0, KvHalf::K);
        a.v_pool = store->pool(0, KvHalf::V);
        a.k_page_stride = store->page_stride(KvHalf::K);
        a.v_page_stride = store->page_stride(KvHalf::V);
        a.table_stride = pages_per_seq;
        a.max_seq_len = ctx;
        a.k_scale = cfg.k_scale[0];
        a.v_scale = cfg.v_scale[0];
        a.num_splits = forced;
        const kc::DecodePlan plan = kc::plan_decode(a);
        ws.reserve(plan.workspace_bytes);
        // One graph = R decode calls over different sequence windows (so the KV working set is
        // far larger than L2 even at batch 1).
        const int windows = std::max(1, n_seqs / batch);
        const int R = std::min(16, windows);
        auto args_for = [&](int w) {
          kc::DecodeArgs x = a;
          const int s0 = (w % windows) * batch;
          x.block_tables = dtables + static_cast<std::size_t>(s0) * pages_per_seq;
          x.seq_lens = dlens + s0;
          x.q = dq + static_cast<std::size_t>(s0) * Hq * D;
          x.out = dout + static_cast<std::size_t>(s0) * Hq * D;
          return x;
        };
        for (int w = 0; w < R; ++w) kc::decode_attention(args_for(w), plan, ws, st);  // warm-up, no capture
        CK(cudaStreamSynchronize(st));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int w = 0; w < R; ++w) kc::decode_attention(args_for(w), plan, ws, st);
        CK(cudaStreamEndCapture(st, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        for (int i = 0; i < 2; ++i) CK(cudaGraphLaunch(exec, st));
        std::vector<double> ms;
        const double bytes_per_call = static_cast<double>(batch) * ctx * H *
                                      (kvgate::bytes_per_cell(fmt->k, g) + kvgate::bytes_per_cell(fmt->v, g));
        const int launches = std::max(1, std::min(reps, static_cast<int>(4e9 / (bytes_per_call * R)) + 1));
        for (int i = 0; i < std::max(3, launches); ++i) {
          tm.start(st);
          CK(cudaGraphLaunch(exec, st));
          ms.push_back(tm.stop_ms(st) / R);
        }
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        const double t_ms = median(ms);
        // The launch floor of the same graph: R x (an empty kernel of the decode's grid, then one of
        // the merge's), timed alike: what a call costs with no work, beside what it costs with it.
        double floor_ms = 0;
        {
          CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
          for (int w = 0; w < R; ++w) {
            kc::launch_empty(plan.ctas, 128, st);
            kc::launch_empty(Hq * batch, 512, st);
          }
          CK(cudaStreamEndCapture(st, &graph));
          CK(cudaGraphInstantiate(&exec, graph, 0));
          for (int i = 0; i < 2; ++i) CK(cudaGraphLaunch(exec, st));
          std::vector<double> fl;
          for (int i = 0; i < 20; ++i) {
            tm.start(st);
            CK(cudaGraphLaunch(exec, st));
            fl.push_back(tm.stop_ms(st) / R);
          }
          CK(cudaGraphExecDestroy(exec));
          CK(cudaGraphDestroy(graph));
          floor_ms = median(fl);
        }
        const double GBps = bytes_per_call / (t_ms * 1e-3) / 1e9;
        std::printf("%-9s %7d %5d %6d %10.2f %10.1f %8.0f %6.1f%% %5.1f%% %8.2f\n", fname.c_str(), ctx, batch, plan.splits,
                    t_ms * 1e3, bytes_per_call / 1e6, GBps, 100 * GBps / copy_GBps, 100 * GBps / read_GBps, floor_ms * 1e3);
        std::fflush(stdout);
        results << (first_result ? "" : ",\n") << "    {\"format\": \"" << fname << "\", \"k\": \""
                << kvgate::name(fmt->k) << "\", \"v\": \"" << kvgate::name(fmt->v) << "\", \"context\": " << ctx
                << ", \"batch\": " << batch << ", \"time_us\": " << jnum(t_ms * 1e3)
                << ", \"kv_bytes\": " << jnum(bytes_per_call) << ", \"GBps\": " << jnum(GBps)
                << ", \"frac_of_copy\": " << jnum(GBps / copy_GBps) << ", \"frac_of_read_probe\": " << jnum(GBps / read_GBps)
                << ", \"path\": \"" << plan.path << "\", \"splits\": " << plan.splits << ", \"ctas\": " << plan.ctas
                << ", \"resident_ctas\": " << plan.resident_ctas << ", \"forced_splits\": " << forced
                << ", \"timed_runs\": " << ms.size() << ", \"launch_floor_us\": " << jnum(floor_ms * 1e3) << "}";
        first_result = false;
      }
    CK(cudaFree(dtables));
    CK(cudaFree(dlens));
    CK(cudaFree(dq));
    CK(cudaFree(dout));
    store.reset();
  }
  CK(cudaStreamDestroy(st));

  std::ostringstream o;
  o << "{\n" << kvgate::bench::document_head("kvgate.bench.cuda_decode/1", dev, lim)
    << "  \"shape\": {\"n_heads\": " << Hq << ", \"n_kv_heads\": " << H << ", \"head_dim\": " << D
    << ", \"block_size\": " << B << ", \"sequences_allocated\": " << n_seqs << ", \"timing\": \"CUDA events over CUDA-graph replays, median\"},\n"
    << "  \"combine_pdl\": " << (kvgate::cuda::decode_combine_pdl() ? "true" : "false") << ",\n"
    << "  \"page_tiles\": " << (kvgate::cuda::decode_page_tiles() ? "true" : "false") << ",\n"
    << "  \"decode\": [\n" << results.str() << "\n  ],\n  \"store\": [\n" << stores.str() << "\n  ]\n}\n";
  kvgate::bench::write_file_atomic(out_path, o.str());
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
