// GPU engine gates: the CUDA engine's conversations (--conv-id) and streaming (--kv-resident), on
// stories260K (block size 16, prefill chunks of 32) over the first sequence of the committed
// teacher-forcing corpus.
//
//  PAR.cuda.persist.<fmt>        every preset:
//    (1) CUDA save -> CUDA hydrate: a conversation of n1 = 37 tokens (two whole pages and a partial
//        one) saved by one engine and hydrated by a fresh one continues -- a 20-token chunk, then 5
//        decode steps -- with logits bit-identical to an uninterrupted engine's (same kernels over
//        the same page bytes). The stats show n1 hydrated tokens and only the 20 new ones prefilled;
//        the KV file the uninterrupted engine writes at n1 is byte-identical to the saved one.
//    (2) CPU file -> CUDA, CUDA file -> CPU: the file one backend writes hydrates on the other; a
//        file saved right after the hydrate is byte-identical to the one read (the pages moved as a
//        byte copy, no re-quantization); the next 20 tokens' logits agree with the writing backend's
//        own continuation within the MOD.cuda f32 logit bound (bounds.hpp forward_f32_logit_bound of
//        the CPU chain plus the GPU chain, kGpuExtraPerLayer as cuda_model_gate.cpp) at every
//        position before the first new token whose K/V codes differ between the backends (a
//        last-ulp difference in a binary32 row can move a code across a rounding boundary; from then
//        on the inputs differ and the bound does not apply; the binary32 scales of the per-(token,
//        head) formats compare within 2^-20, token_codes_equal). At least the first position is compared.
//    Anti-vacuity: the hydrated continuation differs from a cold one (the prefix is read), the
//    logits are not constant, the bound is below kOraSensitivity of the logit RMS, the file's body
//    holds nonzero bytes.
//  PAR.cuda.engine_stream.<fmt>  every preset: an engine with --kv-resident 80 (5 pages per layer on
//    the device; the context is 256 tokens = 16 pages) runs the same calls as a resident engine
//    (prefill 37, a 23-token chunk, 5 decode steps) with bit-identical logits; the window's counters
//    equal the closed form of the access pattern (lookups = sum over calls of 2 x layers x pages
//    read, misses = layers x final pages, bytes moved = misses x (K + V page bytes)), the host
//    mirror is coherent with every resident device slot, the device holds less than the resident
//    pool, and the streamed engine's KV file equals the resident engine's byte for byte. A streamed
//    engine hydrating the resident engine's file continues bit-identically (its hydrated pages are
//    misses: uploaded from the mirror). A window smaller than one step's pages is refused with the
//    --kv-resident that would work, before the engine changes. Anti-vacuity: a host-mirror byte
//    changed behind the window fails the coherence check; misses and bytes moved are > 0.
//
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#ifndef KVGATE_SOURCE_DIR_DEFAULT
#define KVGATE_SOURCE_DIR_DEFAULT "."
#endif
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "kvgate/build_paths.hpp"
#include "../model_vs_oracle/model_harness.hpp"
#include "bounds.hpp"
#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "cuda_stories_subject.hpp"
#include "head_scales.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/loaders.hpp"
#include "models.hpp"
#include "scratch_dir.hpp"

using namespace kvgate;
using namespace kvgate::gates;
using namespace kvgate::gates::model_level;
namespace kc = kvgate::cuda;
namespace fs = std::filesystem;

namespace {

constexpr int kBlock = 16, kChunk = 32, kCtx = 256;
constexpr int kN1 = 37;     // saved prefix: 2 whole pages + 5 tokens of a third
constexpr int kTurn = 20;   // the next turn's chunk (persist); 23 in the streaming case
constexpr int kDecode = 5;  // decode steps after it
constexpr int kWindow = 80; // --kv-resident: 5 pages of 16
constexpr double kGpuExtraPerLayer = 8;  // as cuda_model_gate.cpp: + n_ctx per layer

using Subject = kvgate::gates::cuda_gate::StoriesSubject;

const Subject& subject() {
  const Subject& s = kvgate::gates::cuda_gate::stories_subject();
  REQUIRE(s.tokens.size() >= static_cast<std::size_t>(kN1 + 23 + kDecode + 1));
  return s;
}

// A run's KV scales (EngineOptions::k_scale / v_scale; empty: the default).
struct RunScales {
  std::vector<float> k, v;
};

EngineOptions cpu_opts(const KvFormat& f, const RunScales& sc = {}) {
  EngineOptions o = engine_options_for(f, 1);
  o.k_scale = sc.k;
  o.v_scale = sc.v;
  o.block_size = kBlock;
  o.max_context = kCtx;
  o.prefill_chunk = kChunk;
  return o;
}

kc::CudaEngineOptions gpu_opts(const KvFormat& f, int resident = 0, const RunScales& sc = {}) {
  kc::CudaEngineOptions o;
  o.engine = cpu_opts(f, sc);
  o.engine.kv.backend = "cuda";
  o.engine.kv_resident = resident;
  return o;
}

std::span<const int> toks(int from, int to) {
  return std::span<const int>(subject().tokens).subspan(static_cast<std::size_t>(from), static_cast<std::size_t>(to - from));
}

// One folder per process (mkdtemp, removed at exit): two gate_cuda processes on one machine (the
// driver's baseline beside a run by hand, or two variants) never write each other's KV files.
std::string temp_file(const std::string& name) {
  static const kvgate::gates::ScratchDir dir("kvgate_cuda_engine_gate");
  return dir.sub(name);
}

using kvgate::gates::cuda_gate::bit_equal;
using kvgate::gates::cuda_gate::file_bytes;

// The uninterrupted run's continuation after the first n1 tokens: a chunk of `turn` tokens (all
// logits), then kDecode decode steps fed with the corpus' next tokens (their logits appended).
template <class E>
std::vector<float> continuation(E& e, int turn) {
  std::vector<float> out = e.forward_all_logits(toks(kN1, kN1 + turn));
  for (int i = 0; i < kDecode; ++i) {
    const auto& lg = e.decode(subject().tokens[static_cast<std::size_t>(kN1 + turn + i)]);
    out.insert(out.end(), lg.begin(), lg.end());
  }
  return out;
}

// Binary32 scales a and b (n of them, unaligned) within 2^-20 of each other, relative.
bool f32_scales_close(const std::uint8_t* a, const std::uint8_t* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    float x, y;
    std::memcpy(&x, a + 4 * i, 4);
    std::memcpy(&y, b + 4 * i, 4);
    if (!(std::fabs(double(x) - double(y)) <= 0x1p-20 * std::max(std::fabs(double(x)), std::fabs(double(y))))) return false;
  }
  return true;
}

// Bytes of token t (layer l, half h) as the CPU store holds them and as the CUDA store does. The
// per-(token, head) formats store their scale as the binary32 amax / qmax: a last-ulp difference of
// a row's amax between the backends moves that scale by an ulp or so while every code stays, and the
// dequantized values then differ at the rows' own rounding level, which the bound covers (as for f32
// rows). Their scales compare within 2^-20 relative; codes (and every other scale) compare exactly.
bool token_codes_equal(Engine& cpu, kc::CudaEngine& gpu, int t) {
  const PagedKvStore& cs = cpu.store();
  kc::CudaKvStore& gs = gpu.store();
  const PageGeometry g = cs.geometry();
  for (int l = 0; l < cs.config().n_layers; ++l)
    for (KvHalf h : {KvHalf::K, KvHalf::V}) {
      const int p = t / kBlock;
      const std::uint8_t* a = cs.host_page(l, h, cs.block_table(cpu.sequence())[static_cast<std::size_t>(p)]);
      const std::vector<std::uint8_t> b = gs.download_page(l, h, gs.block_table(gpu.sequence())[static_cast<std::size_t>(p)]);
      const bool f32_scales = info(cs.half_format(h)).cell_scale_bytes == sizeof(float);
      for (const ByteRun& r : token_ranges(cs.half_format(h), g, t % kBlock)) {
        if (f32_scales && std::string_view(r.name) == "scales") {
          if (!f32_scales_close(a + r.offset, b.data() + r.offset, r.bytes / 4)) return false;
        } else if (std::memcmp(a + r.offset, b.data() + r.offset, r.bytes) != 0) {
          return false;
        }
      }
    }
  return true;
}

struct CrossCheck {
  int compared = 0, over = 0, first_code_diff = -1;
  double worst_ratio = 0, max_abs = 0, rms = 0, max_bound = 0;
  long nonfinite = 0;
};

// `a` (the writer's continuation) vs `b` (the reader's), positions cut .. cut + turn - 1, compared
// up to the first new token whose codes differ between the two engines' stores. With f32 K and V the
// codes are the binary32 rows themselves, so they differ by the very forward roundings the bound
// already covers (measured on the H200: at the first new token of every cut): compared throughout.
CrossCheck cross_check(const std::vector<float>& a, const std::vector<float>& b, Engine& cpu, kc::CudaEngine& gpu,
                       int cut, int turn, const KvFormat& f) {
  const bool codes_are_rows = f.k == HalfFormat::f32 && f.v == HalfFormat::f32;
  const ModelConfig& c = subject().m.config;
  const int V = c.vocab_size;
  CrossCheck r;
  double sq = 0;
  long n = 0;
  for (int i = 0; i < turn; ++i) {
    const int pos = cut + i;
    if (!token_codes_equal(cpu, gpu, pos)) {
      if (r.first_code_diff < 0) r.first_code_diff = pos;
      if (!codes_are_rows) break;
    }
    const float* x = a.data() + static_cast<std::size_t>(i) * V;
    const float* y = b.data() + static_cast<std::size_t>(i) * V;
    double zmax = 0, e = 0;
    for (int v = 0; v < V; ++v) {
      if (!std::isfinite(y[v]) || !std::isfinite(x[v])) ++r.nonfinite;
      zmax = std::max(zmax, std::fabs(double(x[v])));
      e = std::max(e, std::fabs(double(x[v]) - double(y[v])));
      sq += double(x[v]) * x[v];
      ++n;
    }
    const double chain_cpu = forward_rounding_chain(c.n_layers, c.dim, c.hidden_dim, c.head_dim, c.q_dim(), pos);
    const double chain_gpu = chain_cpu + c.n_layers * (kGpuExtraPerLayer + (pos + 1.0));
    const double bound = forward_f32_logit_bound(chain_cpu, zmax) + forward_f32_logit_bound(chain_gpu, zmax);
    r.max_bound = std::max(r.max_bound, bound);
    r.max_abs = std::max(r.max_abs, e);
    r.worst_ratio = std::max(r.worst_ratio, e / bound);
    if (e > bound) ++r.over;
    ++r.compared;
  }
  r.rms = n ? std::sqrt(sq / double(n)) : 0;
  return r;
}

struct CrossRun {
  CrossCheck check;
  bool round_trip_equal = false;  // the reader's file after the hydrate == the writer's file
  long long reader_prefill = 0;
};

// One direction at one cut: the writer (CPU when cpu_writes) prefills `cut` tokens and saves; the
// reader hydrates that file, saves it again at once, and both continue with `turn` tokens.
CrossRun cross_direction(const KvFormat& f, bool cpu_writes, int cut, int turn, const std::string& tag,
                         const RunScales& sc) {
  const Subject& s = subject();
  const std::string wfile = temp_file(tag + ".written.kv"), rfile = temp_file(tag + ".reread.kv");
  Engine cpu(s.m, cpu_opts(f, sc));
  kc::CudaEngine gpu(s.m, gpu_opts(f, 0, sc));
  CrossRun out;
  std::vector<float> wnext, rnext;
  if (cpu_writes) {
    cpu.prefill(toks(0, cut));
    cpu.save_kv(wfile);
    wnext = cpu.forward_all_logits(toks(cut, cut + turn));
    CHECK(gpu.hydrate(read_kv_file(wfile), toks(0, cut + turn)) == cut);
    gpu.save_kv(rfile);
    rnext = gpu.forward_all_logits(toks(cut, cut + turn));
    out.reader_prefill = gpu.stats().prefill_tokens;
  } else {
    gpu.prefill(toks(0, cut));
    gpu.save_kv(wfile);
    wnext = gpu.forward_all_logits(toks(cut, cut + turn));
    CHECK(cpu.hydrate(read_kv_file(wfile), toks(0, cut + turn)) == cut);
    cpu.save_kv(rfile);
    rnext = cpu.forward_all_logits(toks(cut, cut + turn));
    out.reader_prefill = cpu.stats().prefill_tokens;
  }
  out.round_trip_equal = file_bytes(rfile) == file_bytes(wfile);
  out.check = cross_check(wnext, rnext, cpu, gpu, cut, turn, f);
  return out;
}

// The first cut from kN1 on (all inside the third page) whose first new token has the same codes on
// both backends: a code can differ from a last-ulp difference of the binary32 rows (see the header).
CrossRun cross_parity(const char* id, const KvFormat& f, bool cpu_writes, const RunScales& sc) {
  CrossRun r;
  for (int cut = kN1; cut < 3 * kBlock; ++cut) {
    r = cross_direction(f, cpu_writes, cut, kTurn,
                        std::string(id) + (cpu_writes ? ".cpu" : ".cuda") + std::to_string(cut), sc);
    std::cout << id << ": " << (cpu_writes ? "CPU file hydrated on CUDA" : "CUDA file hydrated on the CPU") << ", cut "
              << cut << ": file after hydrate byte-identical: " << (r.round_trip_equal ? "yes" : "no") << ", compared "
              << r.check.compared << " positions (first differing new-token code at " << r.check.first_code_diff
              << "), max-abs " << r.check.max_abs << ", largest bound " << r.check.max_bound << ", worst max-abs/bound "
              << r.check.worst_ratio << ", over " << r.check.over << ", logit rms " << r.check.rms << "\n";
    if (r.check.compared > 0) break;
  }
  return r;
}

// sc: the run's KV scales (PAR.cuda.persist.fp8_head_scales: a per-KV-head table); with a table the
// uninterrupted run is repeated without CUDA graphs (bit-identical: the graph's captured decode reads
// the same device table) and the hydrated engine's store must hold the table per head.
void par_cuda_persist(const char* id, const std::string& preset, const RunScales& sc = {}) {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const auto f = parse_kv_format(preset);
  REQUIRE(f.has_value());
  const Subject& s = subject();
  std::cout << id << ": device " << kc::device_status().name << ", model stories260K, KV " << f->name()
            << ", block " << kBlock << ", chunk " << kChunk << ", prefix " << kN1 << " tokens, turn " << kTurn
            << " + " << kDecode << " decode steps\n";

  // (1) CUDA -> CUDA, against an uninterrupted engine.
  const std::string saved = temp_file(std::string(id) + ".saved.kv"), at_n1 = temp_file(std::string(id) + ".uninterrupted.kv");
  std::vector<float> whole;
  {
    kc::CudaEngine a(s.m, gpu_opts(*f, 0, sc));
    a.prefill(toks(0, kN1));
    a.save_kv(at_n1);
    whole = continuation(a, kTurn);
    if (!sc.k.empty()) CHECK(a.store().per_head_scales());
  }
  if (!sc.k.empty()) {  // CUDA graph capture/replay vs plain launches: the same bits
    kc::CudaEngineOptions o = gpu_opts(*f, 0, sc);
    o.cuda_graphs = false;
    kc::CudaEngine plain(s.m, o);
    plain.prefill(toks(0, kN1));
    const std::vector<float> p = continuation(plain, kTurn);
    std::cout << id << ": without CUDA graphs: bit-identical to the graph run: " << (bit_equal(whole, p) ? "yes" : "no") << "\n";
    CHECK(bit_equal(whole, p));
  }
  {
    kc::CudaEngine b(s.m, gpu_opts(*f, 0, sc));
    b.prefill(toks(0, kN1));
    b.save_kv(saved);
    REQUIRE(b.history().size() == static_cast<std::size_t>(kN1));
  }
  const std::vector<std::uint8_t> saved_bytes = file_bytes(saved);
  CHECK(saved_bytes == file_bytes(at_n1));  // the save is deterministic: same pages, same bytes
  {
    const KvFile kf = read_kv_file(saved);
    CHECK(kf.header.used_tokens == kN1);
    if (!sc.k.empty()) {  // the file carries the table (version 3's head-scales region)
      CHECK(kf.header.k_scale == sc.k);
      CHECK(kf.header.v_scale == sc.v);
    }
    CHECK(std::any_of(kf.body.begin(), kf.body.end(), [](std::uint8_t x) { return x != 0; }));  // anti-vacuity
  }
  std::vector<float> resumed;
  {
    kc::CudaEngine c(s.m, gpu_opts(*f, 0, sc));
    const KvFile kf = read_kv_file(saved);
    const int n = c.hydrate(kf, toks(0, kN1 + kTurn));
    CHECK(n == kN1);
    CHECK(c.stats().hydrated_tokens == kN1);
    CHECK(c.position() == kN1);
    resumed = continuation(c, kTurn);
    CHECK(c.stats().prefill_tokens == kTurn);  // only the new tokens were prefilled
    CHECK(c.stats().decode_tokens == kDecode);
    CHECK(c.history().size() == static_cast<std::size_t>(kN1 + kTurn + kDecode));
  }
  std::size_t first_diff = 0;
  while (first_diff < whole.size() && first_diff < resumed.size() &&
         std::memcmp(&whole[first_diff], &resumed[first_diff], sizeof(float)) == 0)
    ++first_diff;
  std::cout << id << ": CUDA save -> CUDA hydrate: " << resumed.size() << " logits, bit-identical to the uninterrupted run: "
            << (bit_equal(whole, resumed) ? "yes" : "no, first difference at logit " + std::to_string(first_diff)) << "\n";
  CHECK(bit_equal(whole, resumed));
  {  // Anti-vacuity: a cold engine over the same tokens (no prefix) gives other logits; logits vary.
    kc::CudaEngine cold(s.m, gpu_opts(*f, 0, sc));
    const std::vector<float> c = cold.forward_all_logits(toks(kN1, kN1 + kTurn));
    CHECK(!bit_equal(std::vector<float>(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(c.size())), c));
    CHECK(*std::max_element(whole.begin(), whole.end()) > *std::min_element(whole.begin(), whole.end()));
  }

  // (2) CPU-written file -> CUDA and CUDA-written file -> CPU.
  for (bool cpu_writes : {true, false}) {
    const CrossRun r = cross_parity(id, *f, cpu_writes, sc);
    CHECK(r.round_trip_equal);  // the pages moved between the backends as a byte copy
    CHECK(r.reader_prefill == kTurn);
    CHECK(r.check.nonfinite == 0);
    CHECK(r.check.compared >= 1);
    CHECK(r.check.over == 0);
    CHECK(r.check.max_bound < kOraSensitivity * r.check.rms);  // the bound is tight enough to see a wrong KV
  }
}

// Lookups of the streamed engine for one call that takes the sequence from `len` to `len + n`:
// every layer, K and V, every page of the new length.
long long lookups_for(int layers, int len_after) { return 2LL * layers * ((len_after + kBlock - 1) / kBlock); }

void par_cuda_engine_stream(const char* id, const std::string& preset) {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const auto f = parse_kv_format(preset);
  REQUIRE(f.has_value());
  const Subject& s = subject();
  const ModelConfig& c = s.m.config;
  const int L = c.n_layers, turn = 23;
  std::cout << id << ": device " << kc::device_status().name << ", model stories260K, KV " << f->name()
            << ", --kv-resident " << kWindow << " (" << kWindow / kBlock << " pages per layer) of a " << kCtx
            << "-token context, calls: prefill " << kN1 << " (chunks of " << kChunk << "), chunk " << turn << ", "
            << kDecode << " decode steps\n";
  const std::string res_file = temp_file(preset + ".resident.kv"), str_file = temp_file(preset + ".streamed.kv");
  std::vector<float> ref, got;
  std::size_t resident_pool = 0;
  {
    kc::CudaEngine r(s.m, gpu_opts(*f));
    resident_pool = r.stats().kv_device_bytes;
    r.prefill(toks(0, kN1));
    ref = continuation(r, turn);
    r.save_kv(res_file);
  }
  {
    kc::CudaEngine e(s.m, gpu_opts(*f, kWindow));
    REQUIRE(e.host_mirror() != nullptr);
    e.prefill(toks(0, kN1));
    got = continuation(e, turn);
    e.save_kv(str_file);
    const EngineStats& st = e.stats();
    long long want_lookups = 0;
    for (int len : {kChunk, kN1}) want_lookups += lookups_for(L, len);  // prefill chunks [0,32), [32,37)
    want_lookups += lookups_for(L, kN1 + turn);
    for (int i = 1; i <= kDecode; ++i) want_lookups += lookups_for(L, kN1 + turn + i);
    const int final_pages = (kN1 + turn + kDecode + kBlock - 1) / kBlock;
    const long long want_misses = static_cast<long long>(L) * final_pages;
    const PageGeometry g = e.host_mirror()->geometry();
    const long long page_pair = static_cast<long long>(page_bytes(f->k, g) + page_bytes(f->v, g));
    std::cout << id << ": lookups " << st.kv_block_lookups << " (closed form " << want_lookups << "), misses "
              << st.kv_block_misses << " (" << want_misses << "), bytes moved " << st.kv_bytes_moved << " ("
              << want_misses * page_pair << "), device bytes " << st.kv_device_bytes << " vs resident pool "
              << resident_pool << "\n";
    CHECK(st.kv_resident_tokens == kWindow);
    CHECK(st.kv_block_lookups == want_lookups);
    CHECK(st.kv_block_misses == want_misses);
    CHECK(st.kv_block_misses > 0);
    CHECK(st.kv_bytes_moved == want_misses * page_pair);
    CHECK(st.kv_device_bytes < resident_pool);  // the window is smaller than the context's pool
    CHECK(kWindow < kCtx);
    const std::string coh = e.check_stream_coherent();
    INFO(coh);
    CHECK(coh.empty());
    {  // Anti-vacuity: a mirror byte changed behind the window's back is seen (then restored).
      const PagedKvStore& h = *e.host_mirror();
      std::uint8_t* p = kvgate::gates::cuda_gate::resident_mirror_byte(h);
      p[0] ^= 0x5A;
      CHECK(!e.check_stream_coherent().empty());
      p[0] ^= 0x5A;
      CHECK(e.check_stream_coherent().empty());
    }
  }
  std::cout << id << ": streamed == resident logits bitwise: " << (bit_equal(ref, got) ? "yes" : "no") << " ("
            << got.size() << " logits)\n";
  CHECK(bit_equal(ref, got));
  CHECK(file_bytes(str_file) == file_bytes(res_file));  // the mirror holds the device's pages

  {  // Streamed hydrate: the resident engine's prefix file, continued in a streamed engine.
    const std::string pre = temp_file(preset + ".prefix.kv");
    std::vector<float> ref2;
    {
      kc::CudaEngine r(s.m, gpu_opts(*f));
      r.prefill(toks(0, kN1));
      r.save_kv(pre);
      ref2 = continuation(r, turn);
    }
    kc::CudaEngine e(s.m, gpu_opts(*f, kWindow));
    CHECK(e.hydrate(read_kv_file(pre), toks(0, kN1 + turn)) == kN1);
    const long long misses0 = e.stats().kv_block_misses;
    const std::vector<float> got2 = continuation(e, turn);
    CHECK(e.stats().kv_block_misses - misses0 == static_cast<long long>(L) * ((kN1 + turn + kDecode + kBlock - 1) / kBlock));
    CHECK(e.stats().prefill_tokens == turn);
    CHECK(e.check_stream_coherent().empty());
    std::cout << id << ": streamed hydrate == resident continuation bitwise: " << (bit_equal(ref2, got2) ? "yes" : "no")
              << "\n";
    CHECK(bit_equal(ref2, got2));
  }
  {  // A window smaller than one step's pages: refused with the size that works, nothing changed.
    kc::CudaEngine e(s.m, gpu_opts(*f, 2 * kBlock));
    bool refused = false;
    try {
      e.prefill(toks(0, kN1));
    } catch (const EngineError& ex) {
      refused = true;
      const std::string msg = ex.what();
      std::cout << id << ": refusal: " << msg << "\n";
      CHECK(msg.find("--kv-resident " + std::to_string(3 * kBlock) + " or more") != std::string::npos);
    }
    CHECK(refused);
    CHECK(e.position() == 0);
    CHECK(e.stats().kv_block_lookups == 0);
    e.prefill(toks(0, 2 * kBlock));  // what fits runs
    CHECK(e.position() == 2 * kBlock);
  }
}

}  // namespace

#define PAR_CUDA_ENGINE(id, preset)                                                                          \
  TEST_CASE("PAR.cuda.persist." id " CUDA conversations: save/hydrate bit-identical, CPU<->CUDA KV files",  \
            "[gate:PAR][cuda][fmt:" preset "]") {                                                            \
    par_cuda_persist("PAR.cuda.persist." id, preset);                                                        \
  }                                                                                                          \
  TEST_CASE("PAR.cuda.engine_stream." id " CUDA engine --kv-resident == resident, bitwise",                 \
            "[gate:PAR][cuda][fmt:" preset "]") {                                                            \
    par_cuda_engine_stream("PAR.cuda.engine_stream." id, preset);                                            \
  }

#define PAR_CUDA_ENGINE_ROW(A, name, k, v, slot, kind) PAR_CUDA_ENGINE(#name, #name)
KVGATE_PRESETS(PAR_CUDA_ENGINE_ROW, _)  // one row per preset: kvgate/format_list.hpp

// Static fp8 scales per KV head (docs/FORMATS.md "Static scales per KV head") through the scale
// lifecycle on the CUDA engine: save/hydrate on CUDA, the KV file between CPU and CUDA both ways, and
// CUDA graph replay vs plain launches, with a table distinct per layer, head and half.
TEST_CASE("PAR.cuda.persist.fp8_head_scales CUDA conversations, fp8 scales per KV head: save/hydrate bitwise, KV files "
          "across backends, graphs on == off",
          "[gate:PAR][cuda][fmt:fp8]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const ModelConfig& c = subject().m.config;
  const RunScales sc{gate_head_scales(c.n_layers, c.n_kv_heads, KvHalf::K), gate_head_scales(c.n_layers, c.n_kv_heads, KvHalf::V)};
  par_cuda_persist("PAR.cuda.persist.fp8_head_scales", "fp8", sc);
}
