// MOD.cuda.window_release: the CUDA engine's sliding-window page release (docs/CUDA.md), the GPU twin
// of MOD.engine.window_release. stories260K with a sliding window on every layer (widest 40, per-layer
// windows 40/24/40/33/17) runs 320 tokens -- a prefill of 160 in chunks of 16 (the prefill kernel over
// released pages from position 144 on), then 160 decode steps (the generic windowed decode kernel,
// through a captured CUDA graph) -- through a pool of 6 pages of 16 tokens (96 tokens):
//  - logits bit-identical at every position to the same CUDA engine with a pool for the whole run and
//    no release (exact: the kernels read the same page bytes of the kept pages in the same order, and
//    no key before the first one read is kept or needed), resident and streamed (--kv-resident 96,
//    whose host mirror releases the pages);
//  - logits within the CUDA-vs-CPU f32 bound of MOD.cuda.logits.f32 (cuda_f32_bound.hpp) of the CPU
//    engine at every position (same windows);
//  - the block table stays consistent: the released prefix reads kReleasedBlock, the kept entries are
//    distinct pages of the pool, and kept + free pages = the pool (none leaked or handed out twice).
// Anti-vacuity: the run is longer than the pool; pages were released (> 0 tokens, at most
// run - window), the held KV bytes are below the whole run's; the same small pool without the release
// runs out of blocks; saving the released prefix and writing a released position are refused naming
// why; a model with one full-attention layer releases nothing.
//
// Without a device the case prints "SKIPPED: no CUDA device: <reason>" and passes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "cuda_f32_bound.hpp"
#include "cuda_gate_common.hpp"
#include "kvgate/cuda/device.hpp"
#include "kvgate/cuda/engine.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/loaders.hpp"
#include "models.hpp"
#include "scratch_dir.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace kc = kvgate::cuda;

namespace {

constexpr int kWidest = 40, kRun = 320, kPrefill = 160, kChunk = 16, kBlock = 16, kPoolBlocks = 6;
const std::vector<int> kWindows = {40, 24, 40, 33, 17};  // one per stories260K layer

Model windowed(const Model& base, std::vector<int> windows) {
  Model m;
  m.path = base.path + " (sliding windows)";
  m.source_kind = base.source_kind;
  m.config = base.config;
  m.weights = base.weights;
  m.fingerprint = base.fingerprint;
  m.config.layer_window = std::move(windows);
  return m;
}

EngineOptions engine_opts(int n_blocks, bool release) {
  EngineOptions o = engine_options_for(KvFormat{HalfFormat::f32, HalfFormat::f32}, 1);
  o.block_size = kBlock;
  o.n_blocks = n_blocks;
  o.prefill_chunk = kChunk;
  o.max_context = kRun;
  o.release_outside_window = release;
  return o;
}

kc::CudaEngineOptions gpu_opts(int n_blocks, bool release, int resident = 0) {
  kc::CudaEngineOptions o;
  o.engine = engine_opts(n_blocks, release);
  o.engine.kv.backend = "cuda";
  o.engine.kv_resident = resident;
  o.cuda_graphs = true;
  return o;
}

// Logits of every position: the prefill's (all rows), then one decode step per token.
template <class E>
std::vector<float> run(E& e, const std::vector<int>& ids) {
  std::vector<float> all = e.forward_all_logits(std::span<const int>(ids.data(), kPrefill));
  for (int i = kPrefill; i < kRun; ++i) {
    const std::vector<float>& z = e.decode(ids[static_cast<std::size_t>(i)]);
    all.insert(all.end(), z.begin(), z.end());
  }
  return all;
}

std::size_t first_diff_pos(const std::vector<float>& a, const std::vector<float>& b, int V) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return i / static_cast<std::size_t>(V);
  return static_cast<std::size_t>(kRun);
}

// The small engine's table after the run: the released prefix is kReleasedBlock, the kept entries are
// distinct pages of the pool, and kept + free = the pool (resident store only).
void check_table(kc::CudaEngine& e) {
  const kc::CudaKvStore& st = e.store();
  const auto table = st.block_table(e.sequence());
  const int released_pages = st.released_tokens(e.sequence()) / kBlock;
  REQUIRE(static_cast<int>(table.size()) == (kRun + kBlock - 1) / kBlock);
  std::set<int> kept;
  int bad = 0;
  for (int p = 0; p < static_cast<int>(table.size()); ++p) {
    const int b = table[static_cast<std::size_t>(p)];
    if (p < released_pages) bad += b != kc::CudaKvStore::kReleasedBlock;
    else if (b < 0 || b >= st.total_blocks() || !kept.insert(b).second) ++bad;
  }
  INFO("table entries out of place: " << bad);
  CHECK(bad == 0);
  CHECK(static_cast<int>(kept.size()) + st.free_blocks() == st.total_blocks());
}

}  // namespace

TEST_CASE("MOD.cuda.window_release GPU pages outside every window return to the pool; logits unchanged",
          "[gate:MOD][cuda][fmt:f32]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const ModelLookup lk = find_model("stories260K/stories260K.bin");
  if (!lk.found()) FAIL(lk.message);
  const Model base = load_model(lk.path);
  REQUIRE(static_cast<int>(kWindows.size()) == base.config.n_layers);
  REQUIRE(*std::max_element(kWindows.begin(), kWindows.end()) == kWidest);
  REQUIRE(kRun > kPoolBlocks * kBlock);
  const Model m = windowed(base, kWindows);
  REQUIRE(widest_window_if_all(m.config) == kWidest);
  const int V = m.config.vocab_size;
  std::mt19937 rng(14);
  std::vector<int> ids(kRun);
  for (int& t : ids) t = static_cast<int>(rng() % static_cast<unsigned>(V));
  const int whole = (kRun + kBlock - 1) / kBlock;

  kc::CudaEngine ref(m, gpu_opts(whole, false));
  const std::vector<float> want = run(ref, ids);
  REQUIRE(want.size() == static_cast<std::size_t>(kRun) * static_cast<std::size_t>(V));
  CHECK(ref.store().released_tokens(ref.sequence()) == 0);

  kc::CudaEngine small(m, gpu_opts(kPoolBlocks, true));
  const std::vector<float> got = run(small, ids);
  REQUIRE(got.size() == want.size());
  const std::size_t diff = first_diff_pos(got, want, V);
  INFO("first differing logit (resident, released) at position " << diff);
  CHECK(diff == static_cast<std::size_t>(kRun));
  check_table(small);

  kc::CudaEngine streamed(m, gpu_opts(kPoolBlocks, true, kPoolBlocks * kBlock));
  const std::vector<float> got_s = run(streamed, ids);
  REQUIRE(got_s.size() == want.size());
  const std::size_t diff_s = first_diff_pos(got_s, want, V);
  INFO("first differing logit (streamed, released) at position " << diff_s);
  CHECK(diff_s == static_cast<std::size_t>(kRun));
  REQUIRE(streamed.host_mirror() != nullptr);  // anti-vacuity: the streamed engine streams

  // The CPU engine with the same windows: the CUDA-vs-CPU f32 bound at every position.
  Engine cpu(m, engine_opts(whole, false));
  const std::vector<float> cpu_logits = run(cpu, ids);
  const cuda_gate::F32Check r = cuda_gate::check_f32({cpu_logits}, {got}, m.config);

  const int released = small.store().released_tokens(small.sequence());
  const EngineStats& ss = small.stats();
  const EngineStats& rs = ref.stats();
  std::cout << "MOD.cuda.window_release: device " << kc::device_status().name << ", " << kRun
            << " tokens (prefill " << kPrefill << " in chunks of " << kChunk << ", then decode), windows up to "
            << kWidest << " on all " << m.config.n_layers << " layers, pool " << kPoolBlocks << " x " << kBlock
            << " tokens; released " << released << " tokens, held " << ss.kv_bytes << " KV bytes (whole-run pool "
            << rs.kv_bytes << "); streamed: first differing position " << diff_s << " of " << kRun
            << "; GPU vs CPU: " << cuda_gate::describe(r) << "\n";
  CHECK(released > 0);
  CHECK(released <= kRun - kWidest);
  CHECK(ss.kv_bytes < rs.kv_bytes);
  CHECK(ss.kv_bytes <= ss.kv_pool_bytes);
  CHECK(streamed.store().released_tokens(streamed.sequence()) == released);  // the mirror released as many
  CHECK(streamed.stats().kv_bytes == ss.kv_bytes);
  {
    INFO(cuda_gate::describe(r));
    REQUIRE(r.nonfinite == 0);
    CHECK(r.positions == kRun);
    CHECK(r.nmse <= r.nmse_bound);
    CHECK(r.worst_ratio <= 1.0);
    CHECK(r.top1_unexplained == 0);
    CHECK(r.min_std > 0);  // logits are not constant at any position
  }

  // A released prefix cannot be saved (resident and streamed), and the message names why.
  for (kc::CudaEngine* e : {&small, &streamed}) {
    const ScratchDir td("kvgate-cudawin");
    std::string msg;
    try {
      e->save_kv(td.sub("w.kvc"));
    } catch (const std::exception& ex) {
      msg = ex.what();
    }
    INFO("save_kv message: " << msg);
    CHECK(msg.find("released") != std::string::npos);
  }
  {  // Writing a released position is refused.
    const std::vector<float> row(static_cast<std::size_t>(m.config.kv_dim()), 0.5f);
    CHECK_THROWS_AS(small.store().write_host(small.sequence(), 0, 0, 1, row.data(), row.size(), row.data(), row.size()),
                    KvStoreError);
  }
  // Control: the same small pool without the release runs out of blocks.
  {
    kc::CudaEngine no_release(m, gpu_opts(kPoolBlocks, false));
    CHECK_THROWS_AS(run(no_release, ids), KvStoreError);
  }
  // One full-attention layer (Gemma-style interleaving): nothing is released.
  std::vector<int> mixed = kWindows;
  mixed[0] = 0;
  const Model mm = windowed(base, mixed);
  kc::CudaEngine full(mm, gpu_opts(whole, true));
  (void)run(full, ids);
  CHECK(full.store().released_tokens(full.sequence()) == 0);
}
