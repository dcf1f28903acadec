// PAR.cuda.tp.persist.<fmt>: KV files with tensor parallelism on the CUDA engine
// (kvgate/cuda/tensor_parallel.hpp, docs/CUDA.md "Tensor parallelism"; the CPU counterpart is
// PAR.tp.persist, the layer split's PAR.cuda.pp.persist, gates/cuda/cuda_pipeline_gate.cpp).
//
// Model: the synth GQA Llama of PAR.cuda.tp (8 query / 4 KV heads of head_dim 32, hidden 256, FFN 512,
// 2 layers, f32 weights): --tp 2 gives each rank 2 KV heads, --tp 4 one. KV formats f32, int8, k8v4 and
// fp8_e4m3 (fp8 with static scales distinct per (layer, KV head), so a rank holding another rank's
// heads or scales is seen). Pages of 16 tokens, chunks of 7, a 128-token context. A prefix of 37 tokens
// (2 whole pages and 5 tokens of a third) is saved; a continuation is a 20-token chunk (all logits)
// then 5 decode steps fed fixed ids.
//
// A --tp engine writes the unsplit file (the layout an unsplit engine writes: every rank's pages are
// its KV heads' slices of the unsplit pages, gathered into one unsplit host store), and hydrates one by
// scattering each rank's heads. What is compared, and why each comparison is exact or not:
//   (1) layout    the --tp N file is read by the unsplit engine (its header is the unsplit store's),
//                 and the unsplit engine's save right after that hydrate is the same file, byte for byte.
//   (2) round trip  the --tp N file hydrated into a fresh --tp N engine: the save right after it is the
//                 file read, byte for byte, and the continuation is bitwise the uninterrupted --tp N
//                 engine's. ZERO bound: the ranks then hold the bytes they held when the file was saved
//                 and run the same kernels, GEMMs and rank-order all-reduce on the same rows (the
//                 argument of PAR.cuda.tp.stream: no result depends on a page's address).
//   (3) unsplit -> --tp N  the unsplit engine's file hydrated into a --tp N engine: the save right after
//                 it is the unsplit file, byte for byte (each rank holds exactly its heads' slices), and
//                 only the new tokens are prefilled. The continuation is not compared bitwise with the
//                 unsplit engine's: the split reassociates the Wo/W2 sums and cuBLAS sums the narrower
//                 Wk/Wv slices in another order (PAR.cuda.tp's bound; about 57% of a rank's K/V elements
//                 equal the unsplit ones on an H200); its largest difference is printed for the record.
//   (4) across rank counts  the --tp 2 file into --tp 4 and the --tp 4 file into --tp 2: the save
//                 right after the hydrate is the file read, byte for byte.
//   (5) streaming   --tp 2 --kv-resident 64 (a window and a host mirror per rank): its save after the
//                 same prefix is the resident --tp 2 file, byte for byte; the resident file hydrated into
//                 it saves back the same bytes and continues bitwise as the resident --tp 2 engine.
//   (7) two GPUs  where the machine has 2 GPUs of one model: --tp 2 --devices 0,1 saves the one-GPU
//                 --tp 2 file byte for byte and continues its hydrate bitwise as the one-GPU --tp 2
//                 engine (else that part prints SKIPPED: no multi-GPU machine has been lent yet).
//   (6) CPU <-> CUDA  the CPU engine's --tp 2 file hydrated into the CUDA --tp 2 engine saves back the
//                 same bytes, and the CUDA --tp 2 file hydrated into the CPU --tp 2 engine likewise (the
//                 page bytes are the CPU store's: ORA.cuda.store).
// Anti-vacuity: the files hold non-zero bytes; a cold engine over the continuation's tokens gives other
// logits than the hydrated one; each rank's store holds its heads only (n_kv_heads = 4 / N) and rank
// 0's and rank 1's pages differ after the hydrate; a file of another format is refused by the --tp
// engine before its ranks are touched (the position is kept).
// Without a device every case prints "SKIPPED: no CUDA device: <reason>" and passes.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <span>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "head_scales.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/kv_store.hpp"
#include "model_fixtures.hpp"
#include "scratch_dir.hpp"

using namespace kvgate;
namespace kc = kvgate::cuda;
using kvgate::gates::cuda_gate::bit_equal;
using kvgate::gates::cuda_gate::file_bytes;
using kvgate::gates::cuda_gate::saved_file_bytes;

namespace {

constexpr int kBlock = 16, kChunk = 7, kCtx = 128, kN1 = 37, kTurn = 20, kDecode = 5, kWindow = 64;

const Model& synth_tp() { return gates::synth_model_once("cuda_tp_persist", gates::synth_tp_options()); }

bool is_fp8(const KvFormat& f) { return f.k == HalfFormat::fp8_e4m3 || f.v == HalfFormat::fp8_e4m3; }

EngineOptions engine_opts(const Model& m, const KvFormat& f, int ranks) {
  EngineOptions o = engine_options_for(f, 1);
  o.block_size = kBlock;
  o.max_context = kCtx;
  o.prefill_chunk = kChunk;
  o.tensor_parallel = ranks;
  gates::set_gate_head_scales_if_fp8(o, f, m.config.n_layers, m.config.n_kv_heads);
  return o;
}

kc::CudaEngineOptions cuda_opts(const Model& m, const KvFormat& f, int ranks, int resident = 0) {
  kc::CudaEngineOptions o;
  o.engine = engine_opts(m, f, ranks);
  o.engine.kv.backend = "cuda";
  o.engine.kv_resident = resident;
  o.weights = kc::WeightType::f32;
  return o;
}

std::vector<int> ids(const Model& m, int from, int to) {
  std::vector<int> p;
  for (int i = from; i < to; ++i) p.push_back((37 * i + 11) % (m.config.vocab_size - 2));
  return p;
}
std::vector<int> prefix(const Model& m) { return ids(m, 0, kN1); }
std::vector<int> prompt(const Model& m) { return ids(m, 0, kN1 + kTurn); }  // what a hydrate is offered

// After the prefix: a chunk of kTurn tokens (all logits), then kDecode decode steps (their logits appended).
std::vector<float> continuation(kc::CudaEngine& e, const Model& m) {
  std::vector<float> out = e.forward_all_logits(ids(m, kN1, kN1 + kTurn));
  const std::vector<int> next = ids(m, kN1 + kTurn, kN1 + kTurn + kDecode);
  for (const int t : next) {
    const std::vector<float>& lg = e.decode(t);
    out.insert(out.end(), lg.begin(), lg.end());
  }
  return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  float d = a.size() == b.size() ? 0.0f : INFINITY;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

std::string temp_file(const std::string& name) {
  static const gates::ScratchDir dir("kvgate_cuda_tp_persist_gate");
  return dir.sub(name);
}

// A fresh CUDA engine of `ranks` ranks hydrated from `file`: the save right after the hydrate (its
// bytes) and, when `cont` is given, the continuation.
std::vector<std::uint8_t> hydrate_and_resave(const Model& m, const kc::CudaEngineOptions& o, const std::string& file,
                                             const std::string& resave, std::vector<float>* cont = nullptr) {
  kc::CudaEngine e(m, o);
  CHECK(e.hydrate(read_kv_file(file), prompt(m)) == kN1);
  CHECK(e.position() == kN1);
  e.save_kv(resave);
  if (cont) {
    *cont = continuation(e, m);
    CHECK(e.stats().prefill_tokens == kTurn);  // only the new tokens were prefilled
  }
  return file_bytes(resave);
}

void tp_persist(const char* id, const std::string& preset) {
  const auto f = parse_kv_format(preset);
  REQUIRE(f.has_value());
  const Model& m = synth_tp();
  const std::string tag = std::string(id);
  std::cout << id << ": device " << kc::device_status().name << ", synth GQA (4 KV heads of 32, 2 layers), KV "
            << f->name() << (is_fp8(*f) ? " (static scales per layer and KV head)" : "") << ", block " << kBlock
            << ", chunk " << kChunk << ", prefix " << kN1 << " tokens, turn " << kTurn << " + " << kDecode
            << " decode steps\n";

  // The unsplit engine: its file at the prefix and its continuation.
  const std::string unsplit_file = temp_file(tag + ".unsplit.kv");
  std::vector<float> whole_unsplit;
  {
    kc::CudaEngine u(m, cuda_opts(m, *f, 1));
    u.prefill(prefix(m));
    u.save_kv(unsplit_file);
    whole_unsplit = continuation(u, m);
  }
  const std::vector<std::uint8_t> unsplit_bytes = saved_file_bytes(unsplit_file, kN1);

  std::vector<std::string> tp_files;  // index: ranks 2, 4
  for (const int N : {2, 4}) {
    const std::string n = "--tp " + std::to_string(N);
    const std::string tp_file = temp_file(tag + ".tp" + std::to_string(N) + ".kv");
    tp_files.push_back(tp_file);
    std::vector<float> whole_tp;
    {  // The --tp N engine: its file and its uninterrupted continuation.
      kc::CudaEngine e(m, cuda_opts(m, *f, N));
      REQUIRE(e.n_stages() == N);  // the ranks
      for (int r = 0; r < N; ++r) CHECK(e.stage_store(r).config().n_kv_heads == m.config.n_kv_heads / N);
      e.prefill(prefix(m));
      e.save_kv(tp_file);
      whole_tp = continuation(e, m);
    }
    const std::vector<std::uint8_t> tp_bytes = file_bytes(tp_file);
    std::size_t same = 0;
    for (std::size_t i = 0; i < std::min(tp_bytes.size(), unsplit_bytes.size()); ++i) same += tp_bytes[i] == unsplit_bytes[i];
    std::cout << id << ": " << n << " file " << tp_bytes.size() << " bytes (unsplit " << unsplit_bytes.size() << "), "
              << same << " bytes equal to the unsplit file's\n";
    CHECK(tp_bytes.size() == unsplit_bytes.size());  // the unsplit layout, the same page count

    // (1) layout: the unsplit engine reads the --tp N file and saves it back unchanged.
    {
      INFO(id << ": " << n << " file -> unsplit");
      const auto back = hydrate_and_resave(m, cuda_opts(m, *f, 1), tp_file, temp_file(tag + ".tp_to_unsplit.kv"));
      std::cout << id << ": " << n << " file -> unsplit engine -> save == the file: " << (back == tp_bytes ? "yes" : "no") << "\n";
      CHECK(back == tp_bytes);
    }
    // (2) round trip: the --tp N file into a fresh --tp N engine.
    {
      INFO(id << ": " << n << " file -> " << n);
      std::vector<float> got;
      const auto back = hydrate_and_resave(m, cuda_opts(m, *f, N), tp_file, temp_file(tag + ".tp_to_tp.kv"), &got);
      std::cout << id << ": " << n << " file -> " << n << ": save == the file: " << (back == tp_bytes ? "yes" : "no")
                << "; continuation == uninterrupted " << n << ": " << (bit_equal(got, whole_tp) ? "yes" : "no") << "\n";
      CHECK(back == tp_bytes);
      CHECK(bit_equal(got, whole_tp));
    }
    // (3) the unsplit file into a --tp N engine.
    {
      INFO(id << ": unsplit file -> " << n);
      kc::CudaEngine e(m, cuda_opts(m, *f, N));
      CHECK(e.hydrate(read_kv_file(unsplit_file), prompt(m)) == kN1);
      e.save_kv(temp_file(tag + ".unsplit_to_tp.kv"));
      const bool same_file = file_bytes(temp_file(tag + ".unsplit_to_tp.kv")) == unsplit_bytes;
      {  // Anti-vacuity: the ranks hold different heads (rank 0's and rank 1's first K page differ).
        const kc::CudaKvStore& s0 = e.stage_store(0);
        const kc::CudaKvStore& s1 = e.stage_store(1);
        CHECK(s0.download_page(0, KvHalf::K, s0.block_table(e.sequence())[0]) !=
              s1.download_page(0, KvHalf::K, s1.block_table(e.sequence())[0]));
      }
      const std::vector<float> got = continuation(e, m);
      CHECK(e.stats().prefill_tokens == kTurn);
      std::cout << id << ": unsplit file -> " << n << ": save == the unsplit file: " << (same_file ? "yes" : "no")
                << "; continuation vs the unsplit engine's (not bitwise: the split's sums), max |diff| "
                << max_abs_diff(got, whole_unsplit) << "\n";
      CHECK(same_file);
      CHECK(std::all_of(got.begin(), got.end(), [](float x) { return std::isfinite(x); }));
      // Anti-vacuity: a cold --tp N engine over the continuation's tokens (no prefix) gives other logits.
      kc::CudaEngine cold(m, cuda_opts(m, *f, N));
      const std::vector<float> c = cold.forward_all_logits(ids(m, kN1, kN1 + kTurn));
      CHECK(!bit_equal(std::vector<float>(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(c.size())), c));
    }
  }
  // (4) across rank counts.
  for (const auto& [from, to] : {std::pair{0, 4}, std::pair{1, 2}}) {
    const std::string& file = tp_files[static_cast<std::size_t>(from)];
    const std::string name = "--tp " + std::to_string(from == 0 ? 2 : 4) + " file -> --tp " + std::to_string(to);
    INFO(id << ": " << name);
    const auto back = hydrate_and_resave(m, cuda_opts(m, *f, to), file, temp_file(tag + ".cross.kv"));
    std::cout << id << ": " << name << ": save == the file: " << (back == file_bytes(file) ? "yes" : "no") << "\n";
    CHECK(back == file_bytes(file));
  }
  // (5) streaming: --tp 2 --kv-resident 64.
  {
    const std::vector<std::uint8_t> tp2 = file_bytes(tp_files[0]);
    std::vector<float> whole_tp2;
    {
      kc::CudaEngine e(m, cuda_opts(m, *f, 2));
      e.prefill(prefix(m));
      whole_tp2 = continuation(e, m);
    }
    {
      kc::CudaEngine s(m, cuda_opts(m, *f, 2, kWindow));
      REQUIRE(s.stage_host_mirror(1) != nullptr);
      s.prefill(prefix(m));
      s.save_kv(temp_file(tag + ".stream_save.kv"));
      const bool same = file_bytes(temp_file(tag + ".stream_save.kv")) == tp2;
      std::cout << id << ": --tp 2 --kv-resident " << kWindow << " save == resident --tp 2 file: " << (same ? "yes" : "no")
                << "\n";
      CHECK(same);
    }
    {
      INFO(id << ": --tp 2 file -> --tp 2 --kv-resident " << kWindow);
      std::vector<float> got;
      const auto back =
          hydrate_and_resave(m, cuda_opts(m, *f, 2, kWindow), tp_files[0], temp_file(tag + ".stream_hyd.kv"), &got);
      std::cout << id << ": --tp 2 file -> --tp 2 --kv-resident " << kWindow << ": save == the file: "
                << (back == tp2 ? "yes" : "no") << "; continuation == resident --tp 2: "
                << (bit_equal(got, whole_tp2) ? "yes" : "no") << "\n";
      CHECK(back == tp2);
      CHECK(bit_equal(got, whole_tp2));
    }
    // (7) ranks on two GPUs (where the machine has two of the same model): --tp 2 --devices 0,1
    // saves the one-GPU --tp 2 file byte for byte (each rank runs the same kernels on the same rows;
    // the all-reduce sums in rank order on rank 0's device) and continues a hydrate of it bitwise.
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess) n_dev = 0;
    auto model_of = [](int d) {
      cudaDeviceProp p{};
      return cudaGetDeviceProperties(&p, d) == cudaSuccess ? std::string(p.name) : std::string();
    };
    if (n_dev >= 2 && model_of(0) == model_of(1)) {
      kc::CudaEngineOptions two = cuda_opts(m, *f, 2);
      two.devices = {0, 1};
      {
        kc::CudaEngine e(m, two);
        CHECK(e.stats().devices == 2);
        e.prefill(prefix(m));
        e.save_kv(temp_file(tag + ".two_gpus.kv"));
        const bool same = file_bytes(temp_file(tag + ".two_gpus.kv")) == tp2;
        std::cout << id << ": --tp 2 --devices 0,1 save == the one-GPU --tp 2 file: " << (same ? "yes" : "no") << "\n";
        CHECK(same);
      }
      std::vector<float> got;
      const auto back = hydrate_and_resave(m, two, tp_files[0], temp_file(tag + ".two_gpus_hyd.kv"), &got);
      std::cout << id << ": --tp 2 file -> --tp 2 --devices 0,1: save == the file: " << (back == tp2 ? "yes" : "no")
                << "; continuation == one-GPU --tp 2: " << (bit_equal(got, whole_tp2) ? "yes" : "no") << "\n";
      CHECK(back == tp2);
      CHECK(bit_equal(got, whole_tp2));
    } else {
      WARN("SKIPPED (part): --tp 2 on devices 0,1 needs 2 GPUs of one model; this machine has " << n_dev);
    }
  }
  // (6) CPU <-> CUDA, --tp 2 on both.
  {
    const std::string cpu_file = temp_file(tag + ".cpu_tp2.kv");
    {
      Engine c(m, engine_opts(m, *f, 2));
      c.prefill(prefix(m));
      c.save_kv(cpu_file);
    }
    const auto from_cpu = hydrate_and_resave(m, cuda_opts(m, *f, 2), cpu_file, temp_file(tag + ".cpu_to_cuda.kv"));
    const bool cpu_ok = from_cpu == file_bytes(cpu_file);
    Engine c(m, engine_opts(m, *f, 2));
    CHECK(c.hydrate(read_kv_file(tp_files[0]), prompt(m)) == kN1);
    c.save_kv(temp_file(tag + ".cuda_to_cpu.kv"));
    const bool cuda_ok = file_bytes(temp_file(tag + ".cuda_to_cpu.kv")) == file_bytes(tp_files[0]);
    std::cout << id << ": CPU --tp 2 file -> CUDA --tp 2 -> save == the file: " << (cpu_ok ? "yes" : "no")
              << "; CUDA --tp 2 file -> CPU --tp 2 -> save == the file: " << (cuda_ok ? "yes" : "no") << "\n";
    CHECK(cpu_ok);
    CHECK(cuda_ok);
  }
  {  // A file of another format is refused by the --tp engine before its ranks are touched.
    const KvFormat other = *parse_kv_format(f->name() == "int8" ? "f32" : "int8");
    const std::string other_file = temp_file(tag + ".other.kv");
    {
      kc::CudaEngine u(m, cuda_opts(m, other, 1));
      u.prefill(prefix(m));
      u.save_kv(other_file);
    }
    kc::CudaEngine e(m, cuda_opts(m, *f, 2));
    e.prefill(ids(m, 0, 9));
    CHECK_THROWS_WITH(e.hydrate(read_kv_file(other_file), prompt(m)), kvgate_catch::contains("does not match this run"));
    CHECK(e.position() == 9);  // nothing lost
    CHECK(e.stage_store(1).length(e.sequence()) == 9);
  }
}

}  // namespace

#define CUDA_TP_PERSIST_CASE(id, name)                                                                              \
  TEST_CASE("PAR.cuda.tp.persist." id " CUDA engine --tp 2 / --tp 4 KV files: the unsplit layout, byte for byte; "  \
            "hydrates across unsplit, rank counts, streaming and the CPU engine",                                   \
            "[gate:PAR][multigpu][fmt:" id "][cuda]") {                                                                       \
    KVGATE_REQUIRE_DEVICE_OR_SKIP();                                                                                \
    tp_persist("PAR.cuda.tp.persist." id, name);                                                                    \
  }

CUDA_TP_PERSIST_CASE("f32", "f32")
CUDA_TP_PERSIST_CASE("int8", "int8")
CUDA_TP_PERSIST_CASE("k8v4", "k8v4")
CUDA_TP_PERSIST_CASE("fp8_e4m3", "fp8")
