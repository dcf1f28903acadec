// The split benchmark of the CUDA forward (docs/CUDA.md "Split benchmark"): decode tok/s and time to
// first token of a Llama-3-8B-shaped model (bench_models.hpp: 32 layers, hidden 4096, 32 query / 8 KV
// heads of 128, FFN 14336, vocab 128256; random weights) split over parts, per KV preset, beside the
// unsplit forward measured in the same run, and the bytes the split moves between its parts.
//
// Splits (--splits, run in the order given, every one per preset, presets in the outer loop):
//   1       unsplit: one CudaModel + CudaKvStore + CudaForward (decode replays a CUDA graph, as the
//           CUDA engine runs it)
//   1eager  unsplit without CUDA graphs: the baseline the tensor-parallel ranks (which run eagerly)
//           compare with. Listed with 1, it is measured in split 1's run (a second CudaForward without
//           graphs over the same weights, store and sequences, decoding after split 1's steps; its
//           TTFT is split 1's: the prefill runs no graph either way) instead of prefilling again
//   tpN     CudaTensorParallel with N ranks (kvgate/cuda/tensor_parallel.hpp; eager decode)
//   ppN     CudaPipeline with N stages (kvgate/cuda/pipeline.hpp; the CPU split's even layer ranges,
//           each stage's decode replays its own graph)
// Part i runs on --devices[i mod the list's length]; default: device i mod the machine's device count,
// so on a one-GPU machine every part shares device 0. Then the split's copies between parts are
// device-local and the run measures the split's overhead (more launches, the hand-over / all-reduce
// copies, eager decode for tp), not a speedup; the output says so. On N GPUs the same command puts the
// parts on devices 0..N-1.
//
// The host model. CudaPipeline and CudaTensorParallel take a host kvgate::Model (the ranks slice it on
// the host: tensor_parallel_model), so the weights are generated on the host: every matrix bf16
// (Weight::half_view over memory the model owns; bf16 is what the device holds, so the upload is a
// copy), uniform with standard deviation 1/sqrt(fan_in) (embeddings 1), norm gains 1, as
// CudaModel::random draws them (not the same values). Each chunk of 2^20 elements draws from its own
// xoshiro256** stream (SynthRng) seeded from (--seed, tensor, chunk), so the weights do not depend on
// the thread count. 8.03 B parameters = 16.1 GB of host memory; a tpN configuration adds the ranks'
// FP32 slices of the layer matrices (27.9 GB for 32 layers, whatever N) while it lives; --layers N
// shrinks both. Both are printed, and checked against the host's available memory, before anything is
// allocated.
//
// Per (preset, split):
//   1. memory: the parts' weights, KV pools (pages rounded to the store's 256-byte stride) and an
//      estimate of the forwards' buffers, per device, against cudaMemGetInfo: "skipped: needs X GiB
//      on cuda:D, the device has Y GiB free" when it does not fit (nothing is allocated then).
//   2. the split is built (weights uploaded, pools allocated and zeroed), timed as construct_s.
//   3. TTFT: after a warm-up chunk on a throw-away sequence, sequence 0's prompt of --context tokens
//      is prefilled through the split's forward_chunk in chunks of --prefill-chunk tokens (the CUDA
//      engine's prefill), the last chunk returning the GPU argmax: host wall time from the first
//      chunk's call (every device synchronised before) to the first token on the host.
//   4. the other batch - 1 sequences get their KV: --fill copy (default) extends each by --context
//      tokens in every part's store and copies sequence 0's pages into theirs, device to device in
//      that store (coalesced runs of consecutive pages; one page pair per layer, half and part is
//      downloaded and compared after the copy); --fill prefill prefills each through forward_chunk.
//      A decode step's time depends on the KV length, not on its values.
//   5. --warmup + --steps batched forward_decode calls over the batch (greedy feedback: each step's
//      GPU argmax is the next step's token), each timed on the host (the split returns with every
//      device synchronised); decode_tok_s = batch * steps / the steps' summed wall time.
// Bytes between parts per decode step (rows = batch), from the split's structure:
//   tpN: two all-reduces per layer (CudaTensorParallel::all_reduce); each copies the N - 1 other
//        ranks' partials [rows][dim] FP32 into rank 0's gather buffer and the sum back into their
//        partial buffers: 2 (N - 1) rows x dim x 4 bytes, and on rank 0's device 3 copies of its own
//        (its partial into the gather buffer, the sum's initial value, the sum back into its partial).
//   ppN: each stage after the first copies the residual rows [rows][dim] FP32 the stage before it
//        left (CudaForward::begin_layers): (N - 1) rows x dim x 4 bytes.
//   The same formulas with rows = the prompt's tokens give the TTFT prefill's bytes. "between devices"
//   counts the copies whose two parts are on different devices (0 when every part shares one GPU).
//
// Cross-check: each row records its first token and sequence 0's greedy decode ids; same_ids_as_1 says
// whether they equal split 1's (a ppN row must: the layer split is bitwise the unsplit forward; a tpN
// row may not: tensor parallelism reassociates the block sums).
//
// The JSON document (schema "kvgate.bench.cuda_split_decode/1", --out) is rewritten atomically after
// every record ("complete": false until the last), so a run cut short keeps what it measured; a
// Markdown table goes to stdout at the end. --plan prints the configurations' memory and traffic
// without a device (nothing generated or allocated) and exits 0. Without a CUDA device the run exits 1
// with the reason.
//
//   bench_split_decode [--out FILE] [--splits 1,tp2,pp2] [--devices 0,1] [--presets bf16,fp8,int8,k8v4]
//                      [--context 32768] [--batch 16] [--steps 32] [--warmup 2] [--layers 32]
//                      [--prefill-chunk 512] [--fill copy|prefill] [--seed 1] [--threads 0] [--plan]
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
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
#include "kvgate/cuda/pipeline.hpp"
#include "kvgate/cuda/tensor_parallel.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format.hpp"
#include "kvgate/memory_info.hpp"
#include "kvgate/model.hpp"
#include "kvgate/parallel.hpp"
#include "kvgate/synth.hpp"
#include "kvgate/tensor_parallel.hpp"
#include "kvgate/weight.hpp"

namespace kc = kvgate::cuda;
using kvgate::SeqId;
using nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
using kvgate::bench::elapsed_s;
using kvgate::bench::progress;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

constexpr double kGiB = 1073741824.0;
constexpr int kBlock = 16;               // tokens per KV page (the engine's default block_size)
constexpr std::size_t kPageAlign = 256;  // CudaKvStore's page stride alignment (kv_store.cpp)


std::string gib(double b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f GiB", b / kGiB);
  return s;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  std::string t;
  while (std::getline(ss, t, ','))
    if (!t.empty()) v.push_back(t);
  return v;
}

// --- the splits -------------------------------------------------------------------------------

enum class Kind { unsplit, tp, pp };
struct SplitSpec {
  std::string name;
  Kind kind = Kind::unsplit;
  int parts = 1;
  bool graphs = true;  // decode graph replay (the tensor-parallel ranks run eagerly whatever this says)
};

std::optional<SplitSpec> parse_split(const std::string& s, std::string* why) {
  SplitSpec p;
  p.name = s;
  if (s == "1") return p;
  if (s == "1eager") {
    p.graphs = false;
    return p;
  }
  if ((s.rfind("tp", 0) == 0 || s.rfind("pp", 0) == 0) && s.size() > 2 &&
      s.find_first_not_of("0123456789", 2) == std::string::npos && s.size() < 6) {
    p.kind = s[0] == 't' ? Kind::tp : Kind::pp;
    p.parts = std::stoi(s.substr(2));
    if (p.parts >= 1) return p;
  }
  *why = "split '" + s + "' is not 1, 1eager, tpN or ppN (N >= 1)";
  return std::nullopt;
}

// --- the host model ----------------------------------------------------------------------------

// Bytes of the host model: bf16 matrices, FP32 norm gains.
std::size_t host_model_bytes(const kvgate::ModelConfig& c) { return kvgate::bench::random_weight_bytes(c, true); }

// FP32 bytes of the layer matrices the tensor-parallel ranks' host slices hold together (N slices of
// 1/N each: the same for every N); embeddings and head are shared with the host model (Weight copies).
std::size_t tp_slice_bytes(const kvgate::ModelConfig& c) {
  const std::size_t dim = c.dim;
  const std::size_t per_layer = 2 * static_cast<std::size_t>(c.q_dim()) * dim + 2 * static_cast<std::size_t>(c.kv_dim()) * dim +
                                3 * static_cast<std::size_t>(c.hidden_dim) * dim;
  return per_layer * static_cast<std::size_t>(c.n_layers) * 4;
}

struct FillJob {
  std::uint16_t* p;
  std::size_t n;
  float a;  // values uniform in [-a, a)
};

// A bf16 weight of n elements over memory it keeps alive, filled later by fill_weights (job `jobs`).
// The memory is 2 MiB aligned and advised for transparent huge pages (fewer page faults on first touch,
// which the parallel fill does); uninitialised: the fill writes every element.
kvgate::Weight bf16_weight(std::size_t n, float stddev, std::vector<FillJob>& jobs) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t bytes = (n * sizeof(std::uint16_t) + kHuge - 1) / kHuge * kHuge;
  void* raw = std::aligned_alloc(kHuge, bytes);
  if (!raw) throw std::bad_alloc();
  (void)madvise(raw, bytes, MADV_HUGEPAGE);  // advice only: without it the pages are 4 KiB ones
  std::shared_ptr<std::uint16_t[]> mem(static_cast<std::uint16_t*>(raw), [](std::uint16_t* q) { std::free(q); });
  jobs.push_back({mem.get(), n, std::sqrt(3.0f) * stddev});
  return kvgate::Weight::half_view(kvgate::WeightDtype::bf16, mem.get(), n,
                                   std::shared_ptr<const void>(mem, static_cast<const void*>(mem.get())));
}

constexpr std::size_t kChunk = std::size_t{1} << 20;

// Every job's elements: chunk k of job j from SynthRng(seed ^ mix(j, k)), two 24-bit uniforms per draw,
// u in [0, 2^24) -> (u 2^-23 - 1) a rounded to bf16 (RNE). Chunks run on `threads` threads (0: all
// cores); which thread runs a chunk does not change its values.
void fill_weights(const std::vector<FillJob>& jobs, std::uint64_t seed, int threads) {
  std::vector<std::pair<std::size_t, std::size_t>> chunks;  // (job, chunk)
  for (std::size_t j = 0; j < jobs.size(); ++j)
    for (std::size_t k = 0; k * kChunk < jobs[j].n; ++k) chunks.emplace_back(j, k);
  kvgate::parallel_indices(chunks.size(), threads, [&](std::size_t i) {
    const auto [j, k] = chunks[i];
    const FillJob& f = jobs[j];
    kvgate::SynthRng rng(seed ^ (0xD1B54A32D192ED03ull * (static_cast<std::uint64_t>(j) * 65536u + k + 1)));
    std::uint16_t* out = f.p + k * kChunk;
    const std::size_t n = std::min(kChunk, f.n - k * kChunk);
    auto val = [&](std::uint64_t u24) {  // kvgate::f32_to_bf16_rne inlined (the values are finite: no NaN case)
      const std::uint32_t u = std::bit_cast<std::uint32_t>((static_cast<float>(u24) * 0x1.0p-23f - 1.0f) * f.a);
      return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    };
    std::size_t e = 0;
    for (; e + 1 < n; e += 2) {
      const std::uint64_t r = rng.next();
      out[e] = val(r >> 40);
      out[e + 1] = val((r >> 16) & 0xFFFFFFu);
    }
    if (e < n) out[e] = val(rng.next() >> 40);
  });
}

// The Llama-shaped host model of `c` with random weights (see the header).
kvgate::Model random_host_model(const kvgate::ModelConfig& c, std::uint64_t seed, int threads) {
  kvgate::Model m;
  m.path = "random (bench_split_decode --seed " + std::to_string(seed) + ")";
  m.source_kind = "random";
  m.fingerprint = "random-bf16-seed-" + std::to_string(seed);
  m.config = c;
  const std::size_t dim = c.dim, qd = c.q_dim(), kvd = c.kv_dim(), hid = c.hidden_dim, V = c.vocab_size;
  const float s_dim = 1.0f / std::sqrt(static_cast<float>(dim)), s_q = 1.0f / std::sqrt(static_cast<float>(qd)),
              s_hid = 1.0f / std::sqrt(static_cast<float>(hid));
  std::vector<FillJob> jobs;
  kvgate::ModelWeights& w = m.weights;
  w.tok_embeddings = bf16_weight(V * dim, 1.0f, jobs);
  if (!c.tied_embeddings) w.classifier = bf16_weight(V * dim, s_dim, jobs);
  w.final_norm.assign(dim, 1.0f);
  w.layers.resize(static_cast<std::size_t>(c.n_layers));
  for (kvgate::LayerWeights& L : w.layers) {
    L.attn_norm.assign(dim, 1.0f);
    L.ffn_norm.assign(dim, 1.0f);
    L.wq = bf16_weight(qd * dim, s_dim, jobs);
    L.wk = bf16_weight(kvd * dim, s_dim, jobs);
    L.wv = bf16_weight(kvd * dim, s_dim, jobs);
    L.wo = bf16_weight(dim * qd, s_q, jobs);
    L.w1 = bf16_weight(hid * dim, s_dim, jobs);
    L.w2 = bf16_weight(dim * hid, s_hid, jobs);
    L.w3 = bf16_weight(hid * dim, s_dim, jobs);
  }
  fill_weights(jobs, seed, threads);
  return m;
}

// --- what a configuration needs ---------------------------------------------------------------

struct PartPlan {
  int device = 0;
  int layer0 = 0, layer1 = 0;  // model layers [layer0, layer1)
  int kv_heads = 0, q_heads = 0, ffn = 0;
  std::size_t weight_bytes = 0;  // on the device (bf16 matrices, FP32 gains)
  std::size_t kv_bytes = 0;      // pool allocation (pages at the store's stride)
  std::size_t buffer_bytes = 0;  // the forward's buffers (estimate)
};

struct Plan {
  std::vector<PartPlan> parts;
  std::map<int, std::size_t> need;  // device -> bytes
  bool shared_device = false;
  std::string unsupported;  // a kernel the configuration lacks (supports_op), else empty
};

std::size_t stride_of(std::size_t page_bytes) { return (page_bytes + kPageAlign - 1) / kPageAlign * kPageAlign; }

// Device bytes of the weights of layers [l0, l1) sliced over `tp` ranks, as CudaModel uploads them:
// the embeddings on a part that starts at layer 0, the classifier and final norm on one that ends at
// the last layer (every tensor-parallel rank holds both).
std::size_t part_weight_bytes(const kvgate::ModelConfig& c, int l0, int l1, int tp) {
  const std::size_t dim = c.dim, V = c.vocab_size;
  std::size_t mat = 0, vec = 0;
  const bool embeds = l0 == 0, head = l1 == c.n_layers;
  if (embeds || (head && c.tied_embeddings)) mat += V * dim;
  if (head) {
    if (!c.tied_embeddings) mat += V * dim;
    vec += dim;
  }
  const std::size_t n = static_cast<std::size_t>(tp);
  for (int l = l0; l < l1; ++l) {
    vec += 2 * dim;
    mat += 2 * (static_cast<std::size_t>(c.q_dim()) / n) * dim + 2 * (static_cast<std::size_t>(c.kv_dim()) / n) * dim +
           3 * (static_cast<std::size_t>(c.hidden_dim) / n) * dim;
  }
  return mat * 2 + vec * 4;
}

// The forward's device buffers for max_rows rows (CudaForward's constructor: activations, logits, the
// bf16 GEMM input, RoPE tables, metadata, the tensor-parallel partial) and 768 MiB for what is not
// sized here (cuBLAS handle and workspace, the decode workspaces, the graph's workspace).
std::size_t forward_buffer_bytes(const kvgate::ModelConfig& c, int q_heads, int kv_heads, int ffn, int max_rows,
                                 int max_ctx) {
  const std::size_t R = static_cast<std::size_t>(max_rows), dim = c.dim, hd = c.head_dim;
  const std::size_t qd = static_cast<std::size_t>(q_heads) * hd, kvd = static_cast<std::size_t>(kv_heads) * hd,
                    hid = static_cast<std::size_t>(ffn);
  const std::size_t act = R * (dim + std::max(dim, qd) + 2 * qd + 2 * kvd + 2 * hid + c.vocab_size + 1 + dim) * 4 +
                          R * std::max({dim, qd, hid}) * 2;
  const std::size_t rope = 2 * (static_cast<std::size_t>(max_ctx) + 8) * (hd / 2) * 4;
  const std::size_t meta = (4 * R + R * ((static_cast<std::size_t>(max_ctx) + kBlock - 1) / kBlock)) * 4;
  return act + rope + meta + (std::size_t{768} << 20);
}

// Part i's device: the --devices list's entry i mod its length, else i mod the machine's devices.
int part_device(const std::vector<int>& devices, int n_machine, int i) {
  if (!devices.empty()) return devices[static_cast<std::size_t>(i) % devices.size()];
  return i % std::max(1, n_machine);
}

// forwards: CudaForwards per part (2 for split 1 when split 1eager rides on its run).
Plan make_plan(const SplitSpec& sp, const kvgate::ModelConfig& c, const kvgate::KvFormat& fmt, const std::vector<int>& devices,
               int n_machine, int batch, int max_ctx, int max_rows, int forwards = 1) {
  Plan p;
  const int n_blocks = batch * ((max_ctx + kBlock - 1) / kBlock);
  std::vector<std::pair<int, int>> ranges;
  if (sp.kind == Kind::pp) {
    kvgate::EngineOptions eo;
    eo.pipeline_stages = sp.parts;
    ranges = kvgate::pipeline_ranges(c, eo);  // throws EngineError for more stages than layers
  } else {
    ranges.assign(static_cast<std::size_t>(sp.parts), {0, c.n_layers});
  }
  const int tp = sp.kind == Kind::tp ? sp.parts : 1;
  for (int i = 0; i < static_cast<int>(ranges.size()); ++i) {
    PartPlan q;
    q.device = part_device(devices, n_machine, i);
    q.layer0 = ranges[static_cast<std::size_t>(i)].first;
    q.layer1 = ranges[static_cast<std::size_t>(i)].second;
    q.kv_heads = c.n_kv_heads / tp;
    q.q_heads = c.n_heads / tp;
    q.ffn = c.hidden_dim / tp;
    q.weight_bytes = part_weight_bytes(c, q.layer0, q.layer1, tp);
    const kvgate::PageGeometry g{kBlock, q.kv_heads, c.head_dim};
    q.kv_bytes = static_cast<std::size_t>(n_blocks) * static_cast<std::size_t>(q.layer1 - q.layer0) *
                 (stride_of(kvgate::page_bytes(fmt.k, g)) + stride_of(kvgate::page_bytes(fmt.v, g)));
    q.buffer_bytes = static_cast<std::size_t>(forwards) * forward_buffer_bytes(c, q.q_heads, q.kv_heads, q.ffn, max_rows, max_ctx);
    if (sp.kind == Kind::tp && i == 0)  // rank 0's gather and sum buffers
      q.buffer_bytes += (static_cast<std::size_t>(tp) + 1) * static_cast<std::size_t>(max_rows) * c.dim * 4;
    for (kc::Op op : {kc::Op::store, kc::Op::decode, kc::Op::prefill}) {
      const kc::OpSupport s = kc::supports_op(op, fmt, g, q.q_heads);
      if (!s.ok && p.unsupported.empty()) p.unsupported = "no CUDA kernel (" + s.reason + "): " + s.detail;
    }
    p.need[q.device] += q.weight_bytes + q.kv_bytes + q.buffer_bytes;
    p.parts.push_back(q);
  }
  std::set<int> used;
  for (const PartPlan& q : p.parts) p.shared_device |= !used.insert(q.device).second;
  return p;
}

// --- bytes between parts -------------------------------------------------------------------------

struct Traffic {
  std::uint64_t between_parts = 0;    // bytes copied from one part's buffer to another part's
  std::uint64_t between_devices = 0;  // those of them whose parts are on different devices
  std::uint64_t local = 0;            // device-local copies within one part (tp: rank 0's own)
  std::uint64_t copies_between_parts = 0;
  std::uint64_t copies_between_devices = 0;
};

// One forward call over `rows` rows (a decode step: rows = batch; a prompt's prefill: its tokens).
Traffic traffic(const SplitSpec& sp, const kvgate::ModelConfig& c, const Plan& p, std::uint64_t rows) {
  Traffic t;
  const std::uint64_t row_bytes = rows * static_cast<std::uint64_t>(c.dim) * 4;
  auto copy = [&](int from, int to) {
    if (from == to) {
      t.local += row_bytes;
      return;
    }
    t.between_parts += row_bytes;
    ++t.copies_between_parts;
    if (p.parts[static_cast<std::size_t>(from)].device != p.parts[static_cast<std::size_t>(to)].device) {
      t.between_devices += row_bytes;
      ++t.copies_between_devices;
    }
  };
  const int n = static_cast<int>(p.parts.size());
  if (sp.kind == Kind::tp && n > 1) {
    for (int ar = 0; ar < 2 * c.n_layers; ++ar) {  // the attention and the FFN all-reduce of every layer
      for (int r = 0; r < n; ++r) copy(r, 0);      // partials into rank 0's gather buffer
      copy(0, 0);                                   // the sum's initial value (gather[0])
      for (int r = 0; r < n; ++r) copy(0, r);      // the sum back into every rank's partial buffer
    }
  } else if (sp.kind == Kind::pp) {
    for (int i = 1; i < n; ++i) copy(i - 1, i);  // the residual rows handed to the next stage
  }
  return t;
}

json traffic_json(const Traffic& t) {
  return {{"between_parts_bytes", t.between_parts}, {"between_devices_bytes", t.between_devices},
          {"device_local_bytes", t.local}, {"copies_between_parts", t.copies_between_parts},
          {"copies_between_devices", t.copies_between_devices}};
}

std::string traffic_formula(const SplitSpec& sp, int n) {
  if (sp.kind == Kind::tp && n > 1)
    return "2 all-reduces per layer x n_layers x 2(N-1) copies (the N-1 other ranks' partials into rank 0's gather "
           "buffer, the sum back into their partial buffers) x rows x dim x 4 B; plus 3 device-local copies of rows x "
           "dim x 4 B per all-reduce on rank 0 (CudaTensorParallel::all_reduce, cudaMemcpyDefault)";
  if (sp.kind == Kind::pp && n > 1)
    return "(N-1) hand-overs x rows x dim x 4 B: each stage after the first copies the residual rows the stage "
           "before it left (CudaForward::begin_layers, cudaMemcpyDefault)";
  return "none: one part";
}

// --- the split objects behind one interface ------------------------------------------------------

struct Part {
  int device = 0;
  kc::CudaKvStore* store = nullptr;
  std::size_t weight_bytes = 0;
  std::string what;  // "layers 0-15", "rank 1: KV heads 4-7"
};

class Runner {
 public:
  virtual ~Runner() = default;
  virtual SeqId create_sequence() = 0;
  virtual void free_sequence(SeqId s) = 0;
  virtual void forward_chunk(SeqId s, std::span<const int> tokens, int* argmax) = 0;
  virtual void forward_decode(std::span<const SeqId> seqs, std::span<const int> tokens, int* argmax) = 0;
  virtual std::vector<Part> parts() = 0;
  virtual std::string topology() const = 0;
  void sync() {
    std::set<int> done;
    for (const Part& p : parts())
      if (done.insert(p.device).second) {
        kc::DeviceScope on(p.device);
        CK(cudaDeviceSynchronize());
      }
  }
};

class Unsplit final : public Runner {
 public:
  Unsplit(const kvgate::Model& m, const kvgate::StoreConfig& sc, kc::CudaForwardOptions fo, int device) : device_(device) {
    kc::DeviceScope on(device);
    model_ = std::make_unique<kc::CudaModel>(m, kc::WeightType::bf16);
    store_ = std::make_unique<kc::CudaKvStore>(sc);
    fwd_ = std::make_unique<kc::CudaForward>(*model_, *store_, fo);
  }
  ~Unsplit() override {
    kc::DeviceScope on(device_);
    eager_.reset();
    fwd_.reset();
    store_.reset();
    model_.reset();
  }
  SeqId create_sequence() override {
    kc::DeviceScope on(device_);
    return store_->create_sequence();
  }
  void free_sequence(SeqId s) override {
    kc::DeviceScope on(device_);
    store_->free_sequence(s);
  }
  void forward_chunk(SeqId s, std::span<const int> tokens, int* argmax) override {
    kc::DeviceScope on(device_);
    fwd_->forward_chunk(s, tokens, nullptr, false, argmax);
  }
  void forward_decode(std::span<const SeqId> seqs, std::span<const int> tokens, int* argmax) override {
    kc::DeviceScope on(device_);
    (eager_ ? eager_ : fwd_)->forward_decode(seqs, tokens, nullptr, argmax);
  }
  // From now on decode runs through a second forward over the same weights and store without CUDA
  // graphs (split 1eager measured on split 1's sequences: the prefill path has no graph either way).
  void switch_to_eager() {
    kc::DeviceScope on(device_);
    kc::CudaForwardOptions o = fwd_->options();
    o.cuda_graphs = false;
    eager_ = std::make_unique<kc::CudaForward>(*model_, *store_, o);
  }
  std::vector<Part> parts() override { return {{device_, store_.get(), model_->weight_bytes(), "every layer"}}; }
  std::string topology() const override {
    const bool graphs = !eager_ && fwd_->options().cuda_graphs;
    return std::string("unsplit on cuda:") + std::to_string(device_) + (graphs ? " (decode graph replay)" : " (eager decode)");
  }

 private:
  int device_;
  std::unique_ptr<kc::CudaModel> model_;
  std::unique_ptr<kc::CudaKvStore> store_;
  std::unique_ptr<kc::CudaForward> fwd_, eager_;
};

// A split's Runner: CudaPipeline and CudaTensorParallel take the same calls (no logits, the GPU
// argmax); each split lists its own parts.
template <class Split, class Options>
class SplitRunner : public Runner {
 public:
  SplitRunner(const kvgate::Model& m, Options o) : split_(m, std::move(o)) {}
  SeqId create_sequence() override { return split_.create_sequence(); }
  void free_sequence(SeqId s) override { split_.free_sequence(s); }
  void forward_chunk(SeqId s, std::span<const int> tokens, int* argmax) override {
    split_.forward_chunk(s, tokens, nullptr, false, argmax);
  }
  void forward_decode(std::span<const SeqId> seqs, std::span<const int> tokens, int* argmax) override {
    split_.forward_decode(seqs, tokens, nullptr, argmax);
  }
  std::string topology() const override { return split_.topology(); }

 protected:
  Split split_;
};

class Pipe final : public SplitRunner<kc::CudaPipeline, kc::PipelineOptions> {
 public:
  using SplitRunner::SplitRunner;
  std::vector<Part> parts() override {
    std::vector<Part> v;
    for (int i = 0; i < split_.n_stages(); ++i) {
      kc::CudaPipeline::Stage& st = split_.stage(i);
      v.push_back({st.device, st.store.get(), st.model->weight_bytes(),
                   "stage " + std::to_string(i) + ": layers " + std::to_string(st.range.first) + "-" +
                       std::to_string(st.range.end - 1)});
    }
    return v;
  }
};

class Tp final : public SplitRunner<kc::CudaTensorParallel, kc::TensorParallelOptions> {
 public:
  using SplitRunner::SplitRunner;
  std::vector<Part> parts() override {
    std::vector<Part> v;
    for (int r = 0; r < split_.ranks(); ++r) {
      kc::CudaTensorParallel::Rank& k = split_.rank(r);
      v.push_back({k.device, k.store.get(), k.weights->weight_bytes(),
                   "rank " + std::to_string(r) + ": KV heads " + std::to_string(k.slice.kv_head0) + "-" +
                       std::to_string(k.slice.kv_head0 + k.slice.kv_heads - 1) + ", FFN rows " +
                       std::to_string(k.slice.ffn0) + "-" + std::to_string(k.slice.ffn0 + k.slice.ffn - 1)});
    }
    return v;
  }
};

// --- the KV fill --------------------------------------------------------------------------------

// Sequence `dst` (fresh, length 0) of every part's store gets `ctx` tokens: extended, then sequence
// `src`'s pages copied into its pages, layer by layer and half by half, device to device within the
// part's store (runs of consecutive pages in both tables as one copy). Returns the copies issued.
std::size_t copy_sequence_kv(Runner& run, SeqId src, const std::vector<SeqId>& dsts, int ctx) {
  std::size_t copies = 0;
  for (const Part& p : run.parts()) {
    kc::DeviceScope on(p.device);
    kc::CudaKvStore& st = *p.store;
    if (st.length(src) != ctx)
      throw std::runtime_error("fill copy: the source sequence holds " + std::to_string(st.length(src)) +
                               " tokens in a part's store, expected " + std::to_string(ctx));
    const std::vector<int> from(st.block_table(src).begin(), st.block_table(src).end());
    const std::size_t pages = static_cast<std::size_t>((ctx + st.config().block_size - 1) / st.config().block_size);
    for (SeqId d : dsts) {
      if (st.length(d) != 0) throw std::runtime_error("fill copy: a target sequence is not empty");
      st.extend(d, ctx);
      const std::vector<int> to(st.block_table(d).begin(), st.block_table(d).end());
      if (from.size() < pages || to.size() < pages) throw std::runtime_error("fill copy: a block table is short");
      for (int l = 0; l < st.config().n_layers; ++l)
        for (kvgate::KvHalf h : {kvgate::KvHalf::K, kvgate::KvHalf::V}) {
          const std::size_t stride = st.page_stride(h), bytes = st.page_bytes(h);
          std::uint8_t* pool = st.pool(l, h);
          for (std::size_t i = 0; i < pages;) {
            std::size_t run_len = 1;
            while (i + run_len < pages && from[i + run_len] == from[i] + static_cast<int>(run_len) &&
                   to[i + run_len] == to[i] + static_cast<int>(run_len))
              ++run_len;
            CK(cudaMemcpyAsync(pool + static_cast<std::size_t>(to[i]) * stride,
                               pool + static_cast<std::size_t>(from[i]) * stride, (run_len - 1) * stride + bytes,
                               cudaMemcpyDeviceToDevice, nullptr));
            ++copies;
            i += run_len;
          }
        }
    }
    CK(cudaDeviceSynchronize());
  }
  return copies;
}

// After the copy: in every part, layer 0's and the last layer's first and last page of each half of
// `src` and `dst`, downloaded and compared byte for byte. Returns "" or what differs.
std::string check_copy(Runner& run, SeqId src, SeqId dst, int ctx) {
  for (const Part& p : run.parts()) {
    kc::DeviceScope on(p.device);
    const kc::CudaKvStore& st = *p.store;
    const auto a = st.block_table(src), b = st.block_table(dst);
    const std::size_t last = static_cast<std::size_t>((ctx - 1) / st.config().block_size);
    for (int l : {0, st.config().n_layers - 1})
      for (kvgate::KvHalf h : {kvgate::KvHalf::K, kvgate::KvHalf::V})
        for (std::size_t i : {std::size_t{0}, last})
          if (st.download_page(l, h, a[i]) != st.download_page(l, h, b[i]))
            return p.what + ": layer " + std::to_string(l) + (h == kvgate::KvHalf::K ? " K" : " V") + " page " +
                   std::to_string(i) + " differs from the source sequence's after the copy";
  }
  return "";
}

std::vector<int> prompt_tokens(int n, int vocab) {
  std::vector<int> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    t[static_cast<std::size_t>(i)] = static_cast<int>((1 + 7919ull * static_cast<unsigned>(i)) % static_cast<unsigned>(vocab));
  return t;
}

// The prompt through forward_chunk in chunks of `chunk`; the last chunk's GPU argmax returned.
int prefill(Runner& run, SeqId s, const std::vector<int>& prompt, int chunk) {
  const std::span<const int> all(prompt);
  int first = -1;
  for (std::size_t p = 0; p < prompt.size(); p += static_cast<std::size_t>(chunk)) {
    const std::size_t n = std::min(static_cast<std::size_t>(chunk), prompt.size() - p);
    run.forward_chunk(s, all.subspan(p, n), p + n == prompt.size() ? &first : nullptr);
  }
  return first;
}

// --warmup + --steps batched decode steps (greedy feedback through `tokens`), each timed on the host;
// the record's decode fields.
void measure_decode(Runner& run, const std::vector<SeqId>& seqs, std::vector<int>& tokens, int warmup, int steps,
                    json& r) {
  std::vector<int> ids(seqs.size(), 0), ids0;
  std::vector<double> wall;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto h0 = Clock::now();
    run.forward_decode(seqs, tokens, ids.data());
    const double ms = ms_since(h0);
    tokens = ids;  // greedy feedback
    ids0.push_back(ids[0]);
    if (i >= warmup) wall.push_back(ms);
  }
  r["decode_ids_seq0"] = ids0;  // every step's greedy id of sequence 0, warm-up steps included
  double sum = 0;
  for (double x : wall) sum += x;
  const double batch = static_cast<double>(seqs.size());
  r["decode_ms_per_step"] = kvgate::bench::median(wall);
  r["decode_ms_all"] = wall;
  r["decode_tok_s"] = batch * steps * 1e3 / sum;
  r["decode_tok_s_median"] = batch * 1e3 / kvgate::bench::median(wall);
}

// --- the device block and the table -------------------------------------------------------------

json device_block(int n_dev) {
  json gpus = json::array();
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  for (int d = 0; d < n_dev; ++d) {
    cudaDeviceProp pr{};
    CK(cudaGetDeviceProperties(&pr, d));
    gpus.push_back({{"index", d}, {"name", pr.name}, {"cc", std::to_string(pr.major) + "." + std::to_string(pr.minor)},
                    {"sm_count", pr.multiProcessorCount}, {"total_mem", pr.totalGlobalMem}});
  }
  // cudaDeviceCanAccessPeer per ordered pair; the runtime enables no peer access (no
  // cudaDeviceEnablePeerAccess), so its cross-device cudaMemcpyDefault copies take the driver's path.
  json peer = json::array();
  for (int a = 0; a < n_dev; ++a)
    for (int b = 0; b < n_dev; ++b)
      if (a != b) {
        int can = 0;
        CK(cudaDeviceCanAccessPeer(&can, a, b));
        peer.push_back({{"from", a}, {"to", b}, {"can_access_peer", can != 0}});
      }
  return {{"count", n_dev}, {"driver", kc::cuda_version_string(drv)}, {"cuda_runtime", kc::cuda_version_string(rt)},
          {"gpus", gpus}, {"peer", peer}, {"peer_access_enabled", false}};
}

std::string fmt_num(const json& r, const char* key, const char* f) {
  if (!r.contains(key) || !r[key].is_number()) return "-";
  char s[64];
  std::snprintf(s, sizeof s, f, r[key].get<double>());
  return s;
}

std::string human_bytes(std::uint64_t b) {
  char s[32];
  if (b >= (1ull << 30)) std::snprintf(s, sizeof s, "%.2f GiB", b / kGiB);
  else if (b >= (1ull << 20)) std::snprintf(s, sizeof s, "%.2f MiB", b / 1048576.0);
  else if (b >= 1024) std::snprintf(s, sizeof s, "%.1f KiB", b / 1024.0);
  else std::snprintf(s, sizeof s, "%llu B", static_cast<unsigned long long>(b));
  return s;
}

// Every measured row's ratios to the unsplit rows ("1", and "1eager" when it ran) of its preset in
// this run: decode_tok_s_vs_1 = its decode tok/s / theirs, ttft_vs_1 = its TTFT / theirs. And whether
// its first token and sequence 0's greedy decode ids equal split 1's (same_ids_as_1): the layer split
// computes the unsplit forward's logits bitwise (gate PAR.cuda.pp), so a ppN row must say true;
// tensor parallelism reassociates the block sums (PAR.cuda.tp), so a tpN row may differ; 1eager
// decodes after split 1's steps (not compared).
void add_ratios(json& rows) {
  for (json& r : rows) {
    if (!r.contains("decode_tok_s")) continue;
    for (const json& b : rows)
      if (r.value("split", "") != "1eager" && b.value("preset", "") == r.value("preset", "") &&
          b.value("split", "") == "1" && b.contains("decode_ids_seq0"))
        r["same_ids_as_1"] = r["first_token"] == b["first_token"] && r["decode_ids_seq0"] == b["decode_ids_seq0"];
    for (const char* base : {"1", "1eager"})
      for (const json& b : rows)
        if (b.value("preset", "") == r.value("preset", "") && b.value("split", "") == base && b.contains("decode_tok_s")) {
          const std::string suffix = std::string("_vs_") + base;
          r["decode_tok_s" + suffix] = r["decode_tok_s"].get<double>() / b["decode_tok_s"].get<double>();
          r["ttft" + suffix] = r["ttft_ms"].get<double>() / b["ttft_ms"].get<double>();
        }
  }
}

void print_table(const json& rows) {
  std::printf("\n| preset | split | parts | devices | shared | TTFT ms | decode tok/s | ms/step | decode vs 1 | TTFT vs 1 "
              "| ids = 1 | between parts / step | between devices / step | KV pool | topology / note |\n");
  std::printf("|---|---|---:|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|\n");
  for (const json& r : rows) {
    std::string devs;
    if (r.contains("devices"))
      for (const auto& d : r["devices"]) devs += (devs.empty() ? "" : ",") + std::to_string(d.get<int>());
    std::string note = r.value("topology", "");
    if (r.contains("skipped")) note = "skipped: " + r["skipped"].get<std::string>();
    if (r.contains("error")) note = "error: " + r["error"].get<std::string>();
    const json* st = r.contains("bytes_between_parts_per_step") ? &r["bytes_between_parts_per_step"] : nullptr;
    const std::string same = !r.contains("same_ids_as_1") ? "-" : r["same_ids_as_1"].get<bool>() ? "yes" : "no";
    std::printf("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
                r.value("preset", "").c_str(), r.value("split", "").c_str(), r.value("parts", 0), devs.c_str(),
                r.value("shared_device", false) ? "yes" : "no", fmt_num(r, "ttft_ms", "%.1f").c_str(),
                fmt_num(r, "decode_tok_s", "%.1f").c_str(), fmt_num(r, "decode_ms_per_step", "%.2f").c_str(),
                fmt_num(r, "decode_tok_s_vs_1", "%.3f").c_str(), fmt_num(r, "ttft_vs_1", "%.3f").c_str(), same.c_str(),
                st ? human_bytes((*st)["between_parts_bytes"].get<std::uint64_t>()).c_str() : "-",
                st ? human_bytes((*st)["between_devices_bytes"].get<std::uint64_t>()).c_str() : "-",
                r.contains("kv_pool_bytes") ? human_bytes(r["kv_pool_bytes"].get<std::uint64_t>()).c_str() : "-",
                note.c_str());
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "bench_split_decode.json", splits_s = "1,tp2,pp2", devices_s,
              presets_s = "bf16,fp8,int8,k8v4", fill = "copy";
  int context = 32768, batch = 16, steps = 32, warmup = 2, layers = 32, threads = 0;
  int prefill_chunk = kvgate::default_prefill_chunk("cuda");
  std::uint64_t seed = 1;
  bool plan_only = false;
  CLI::App app{"bench_split_decode: decode tok/s and TTFT of an 8B-shaped model split over parts (tensor parallel, "
               "layer split) vs unsplit, per KV preset, and the bytes moved between the parts per step"};
  app.add_option("--out", out_path, "JSON output (written atomically after every record)");
  app.add_option("--splits", splits_s, "comma list of 1, 1eager, tpN, ppN")->capture_default_str();
  app.add_option("--devices", devices_s,
                 "comma list of CUDA devices; part i runs on entry i mod its length (default: device i mod the "
                 "machine's device count)");
  app.add_option("--presets", presets_s, "comma list of KV presets (kvgate formats)")->capture_default_str();
  app.add_option("--context", context, "prompt tokens per sequence (the KV length decode starts from)")
      ->check(CLI::Range(1, 1 << 22))->capture_default_str();
  app.add_option("--batch", batch, "sequences decoded together")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--steps", steps, "decode steps timed")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--warmup", warmup, "decode steps run before the timed ones")->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--layers", layers, "model layers (the Llama-3-8B shape has 32)")->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--prefill-chunk", prefill_chunk,
                 "tokens per forward_chunk of the prefill (default_prefill_chunk(\"cuda\"): the CLI's on --device cuda)")
      ->check(CLI::Range(1, 65536))->capture_default_str();
  app.add_option("--fill", fill, "how the other sequences get their KV: copy (sequence 0's pages) or prefill")
      ->check(CLI::IsMember({"copy", "prefill"}))->capture_default_str();
  app.add_option("--seed", seed, "host weight generator seed")->capture_default_str();
  app.add_option("--threads", threads, "host weight generator threads (0: all cores)")->check(CLI::Range(0, 4096))
      ->capture_default_str();
  app.add_flag("--plan", plan_only, "print every configuration's memory and traffic, then exit (no device needed)");
  CLI11_PARSE(app, argc, argv);

  // Splits, devices, presets.
  std::vector<SplitSpec> splits;
  for (const std::string& s : split_list(splits_s)) {
    std::string why;
    const auto sp = parse_split(s, &why);
    if (!sp) {
      std::fprintf(stderr, "bench_split_decode: %s\n", why.c_str());
      return 2;
    }
    splits.push_back(*sp);
  }
  std::vector<int> devices;
  for (const std::string& d : split_list(devices_s)) {
    try {
      std::size_t used = 0;
      const int v = std::stoi(d, &used);
      if (used != d.size() || v < 0) throw std::invalid_argument(d);
      devices.push_back(v);
    } catch (const std::exception&) {
      std::fprintf(stderr, "bench_split_decode: --devices entry '%s' is not a device index\n", d.c_str());
      return 2;
    }
  }
  std::vector<std::pair<std::string, kvgate::KvFormat>> presets;
  for (const std::string& f : split_list(presets_s)) {
    const auto fmt = kvgate::parse_kv_format(f);
    if (!fmt) {
      std::fprintf(stderr, "bench_split_decode: unknown KV preset '%s' (%s)\n", f.c_str(), kvgate::known_formats_text().c_str());
      return 2;
    }
    presets.emplace_back(f, *fmt);
  }
  if (splits.empty() || presets.empty()) {
    std::fprintf(stderr, "bench_split_decode: --splits and --presets must each name at least one\n");
    return 2;
  }

  // The model config: the Llama-3-8B shape with --layers layers.
  kvgate::ModelConfig cfg;
  {
    std::string why;
    if (!kvgate::bench::llama_config(kvgate::bench::llama3_8b_synth(layers, "plain"), "plain", &cfg, &why)) {
      std::fprintf(stderr, "bench_split_decode: %s\n", why.c_str());
      return 2;
    }
  }
  for (const SplitSpec& sp : splits) {
    if (sp.kind == Kind::tp) {
      if (const std::string why = kvgate::tensor_parallel_refusal(cfg, sp.parts); !why.empty()) {
        std::fprintf(stderr, "bench_split_decode: split %s: %s\n", sp.name.c_str(), why.c_str());
        return 2;
      }
    }
    if (sp.kind == Kind::pp && sp.parts > cfg.n_layers) {
      std::fprintf(stderr, "bench_split_decode: split %s: %d stages for %d layers\n", sp.name.c_str(), sp.parts, cfg.n_layers);
      return 2;
    }
  }
  bool has_1 = false, has_1eager = false;
  for (const SplitSpec& sp : splits) has_1 |= sp.name == "1", has_1eager |= sp.name == "1eager";
  // With both, 1eager is measured in split 1's run (a second, graph-less forward over its store and
  // sequences) instead of prefilling its own: its decode steps come after split 1's.
  const bool eager_rides = has_1 && has_1eager;
  // Every decode step fits (the forward checks length + 1), split 1eager's after split 1's too.
  const int max_ctx = context + (eager_rides ? 2 : 1) * (warmup + steps) + 8;
  const int max_rows = std::max(batch, std::min(prefill_chunk, context));
  const std::size_t host_bytes = host_model_bytes(cfg);
  bool any_tp = false;
  for (const SplitSpec& sp : splits) any_tp |= sp.kind == Kind::tp && sp.parts > 1;
  const std::size_t slice_bytes = any_tp ? tp_slice_bytes(cfg) : 0;

  // The device(s).
  const kc::DeviceStatus& dev = kc::device_status();
  int n_machine = 0;
  if (dev.available && cudaGetDeviceCount(&n_machine) != cudaSuccess) n_machine = 0;
  if (!plan_only && !dev.available) {
    std::fprintf(stderr,
                 "bench_split_decode: %s; this benchmark times the CUDA forward and needs a CUDA device (--plan prints "
                 "the configurations' memory and traffic without one)\n",
                 dev.reason.c_str());
    return 1;
  }
  for (int d : devices)
    if (dev.available && d >= n_machine) {
      std::fprintf(stderr, "bench_split_decode: --devices names cuda:%d; the machine has %d CUDA device%s\n", d, n_machine,
                   n_machine == 1 ? "" : "s");
      return 2;
    }
  const int plan_devices = dev.available ? n_machine : 1;  // --plan without a device: one assumed

  std::set<int> used_devices;
  int max_parts = 1;
  for (const SplitSpec& sp : splits) {
    max_parts = std::max(max_parts, sp.parts);
    for (int i = 0; i < sp.parts; ++i) used_devices.insert(part_device(devices, plan_devices, i));
  }
  const bool one_gpu = used_devices.size() == 1;
  const std::string shared_note =
      one_gpu ? "every part of every split runs on cuda:" + std::to_string(*used_devices.begin()) +
                    ": the copies between parts are device-local and the parts take turns on one GPU, so a split row "
                    "measures the split's overhead (more launches, the hand-over / all-reduce copies, eager decode for "
                    "tp), not a speedup"
              : "parts on " + std::to_string(used_devices.size()) +
                    " devices; a row whose shared_device is true has two parts on one GPU";

  progress("model: Llama-3-8B shape, %d layers, bf16 random weights (seed %llu); host model %s, tensor-parallel host "
           "slices %s while a tp configuration lives; %s", cfg.n_layers, static_cast<unsigned long long>(seed),
           gib(static_cast<double>(host_bytes)).c_str(), gib(static_cast<double>(slice_bytes)).c_str(),
           shared_note.c_str());
  progress("setup: context %d x batch %d, %d decode steps (+%d warmup), prefill chunks of %d, fill %s; pools for %d "
           "tokens per sequence", context, batch, steps, warmup, prefill_chunk, fill.c_str(), max_ctx);

  // The plan of every configuration (printed; each is checked again against the free memory right
  // before it runs).
  for (const auto& [pname, fmt] : presets)
    for (const SplitSpec& sp : splits) {
      if (eager_rides && sp.name == "1eager") {
        progress("plan %-6s %-7s: measured in split 1's run (a second forward, no CUDA graphs)", pname.c_str(), "1eager");
        continue;
      }
      Plan p;
      try {
        p = make_plan(sp, cfg, fmt, devices, plan_devices, batch, max_ctx, max_rows, eager_rides && sp.name == "1" ? 2 : 1);
      } catch (const std::exception& e) {
        progress("plan %-6s %-7s: %s", pname.c_str(), sp.name.c_str(), e.what());
        continue;
      }
      std::string need;
      for (const auto& [d, b] : p.need) need += " cuda:" + std::to_string(d) + " " + gib(static_cast<double>(b));
      std::size_t w = 0, kv = 0;
      for (const PartPlan& q : p.parts) w += q.weight_bytes, kv += q.kv_bytes;
      const Traffic t = traffic(sp, cfg, p, static_cast<std::uint64_t>(batch));
      const Traffic pre = traffic(sp, cfg, p, static_cast<std::uint64_t>(context));
      progress("plan %-6s %-7s: %d part%s, weights %s, KV pools %s, needs%s%s; between parts per decode step %s (%llu "
               "copies), per prompt prefill %s", pname.c_str(), sp.name.c_str(), static_cast<int>(p.parts.size()),
               p.parts.size() == 1 ? "" : "s", gib(static_cast<double>(w)).c_str(), gib(static_cast<double>(kv)).c_str(),
               need.c_str(), p.unsupported.empty() ? "" : ("; " + p.unsupported).c_str(),
               human_bytes(t.between_parts).c_str(), static_cast<unsigned long long>(t.copies_between_parts),
               human_bytes(pre.between_parts).c_str());
    }
  if (plan_only) return 0;

  // Host memory: the model, and the ranks' slices while a tp configuration lives.
  {
    const kvgate::MemoryAvailable avail = kvgate::host_memory_available();
    progress("host memory: needs %s (model) + %s (tp slices) = %s; available %s (%s)", gib(static_cast<double>(host_bytes)).c_str(),
             gib(static_cast<double>(slice_bytes)).c_str(), gib(static_cast<double>(host_bytes + slice_bytes)).c_str(),
             gib(static_cast<double>(avail.bytes)).c_str(), avail.source.c_str());
    if (avail.bytes > 0 && host_bytes + slice_bytes > avail.bytes) {
      std::fprintf(stderr,
                   "bench_split_decode: refused: the host model (%s) and the tensor-parallel slices (%s) need %s of host "
                   "memory, %s is available (%s); use --layers N for fewer layers\n",
                   gib(static_cast<double>(host_bytes)).c_str(), gib(static_cast<double>(slice_bytes)).c_str(),
                   gib(static_cast<double>(host_bytes + slice_bytes)).c_str(), gib(static_cast<double>(avail.bytes)).c_str(),
                   avail.source.c_str());
      return 1;
    }
  }

  json j;
  j["schema"] = "kvgate.bench.cuda_split_decode/1";
  {
    const std::time_t now = std::time(nullptr);
    char buf[64];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    j["date"] = buf;
  }
  j["complete"] = false;
  j["device"] = device_block(n_machine);
  j["model"] = {{"shape", "Llama-3-8B"}, {"layers", cfg.n_layers},
                {"layers_note", layers == 32 ? "the shape's own 32 layers" : "--layers " + std::to_string(layers) + " (not the shape's 32)"},
                {"dim", cfg.dim}, {"ffn", cfg.hidden_dim}, {"heads", cfg.n_heads}, {"kv_heads", cfg.n_kv_heads},
                {"head_dim", cfg.head_dim}, {"vocab", cfg.vocab_size}, {"rope_theta", cfg.rope_theta},
                {"weights", "random, generated on the host: bf16 matrices uniform with standard deviation 1/sqrt(fan_in) "
                            "(embeddings 1), norm gains 1; device weights bf16 (cublasGemmEx, FP32 accumulate)"},
                {"seed", seed}, {"host_model_bytes", host_bytes}, {"tp_host_slice_bytes", slice_bytes}};
  j["setup"] = {{"context", context}, {"batch", batch}, {"steps", steps}, {"warmup", warmup},
                {"prefill_chunk", prefill_chunk}, {"fill", fill}, {"block_size", kBlock}, {"pool_tokens_per_sequence", max_ctx},
                {"max_rows", max_rows}, {"devices_arg", devices_s}, {"one_gpu", one_gpu}, {"note", shared_note},
                {"ttft", "host wall time of sequence 0's prefill of --context tokens (forward_chunk in chunks of "
                         "--prefill-chunk, after a warm-up chunk on another sequence and a sync of every device) to its "
                         "first token (the last chunk's GPU argmax) on the host"},
                {"decode", "per step host wall time of one batched forward_decode (the split returns with its devices "
                           "synchronised); decode_tok_s = batch * steps / the steps' summed time; decode_ms_per_step = "
                           "the median step"},
                {"fill_note", fill == "copy" ? "sequences 1.. get sequence 0's KV pages, copied device to device in "
                                               "each part's store (decode time depends on the KV length, not its values)"
                                             : "every sequence prefilled through forward_chunk"},
                {"bytes_between_parts", "from the split's structure (see traffic_formula per record); rows = batch per "
                                        "decode step, = context for the prompt's prefill"}};
  json rows = json::array();
  auto publish = [&] {
    add_ratios(rows);
    j["results"] = rows;
    j["elapsed_s"] = elapsed_s();
    kvgate::bench::write_file_atomic(out_path, j.dump(2) + "\n");
  };
  publish();

  // The host model, once.
  const auto tg = Clock::now();
  kvgate::Model model;
  try {
    model = random_host_model(cfg, seed, threads);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "bench_split_decode: out of host memory generating the %s host model; use --layers N\n",
                 gib(static_cast<double>(host_bytes)).c_str());
    return 1;
  }
  const double gen_s = ms_since(tg) / 1e3;
  j["model"]["host_generate_s"] = gen_s;
  progress("host model: %s generated in %.1f s", gib(static_cast<double>(host_bytes)).c_str(), gen_s);

  const std::vector<int> prompt = prompt_tokens(context, cfg.vocab_size);

  for (const auto& [pname, fmt] : presets) {
    for (const SplitSpec& sp : splits) {
      if (eager_rides && sp.name == "1eager") continue;  // measured in split 1's run
      json r, eager;
      r["preset"] = pname;
      r["split"] = sp.name;
      r["kind"] = sp.kind == Kind::tp ? "tensor_parallel" : sp.kind == Kind::pp ? "pipeline" : "unsplit";
      r["parts"] = sp.parts;
      auto finish = [&] {
        rows.push_back(r);
        if (eager_rides && sp.name == "1") {
          if (eager.is_null()) {
            eager = {{"preset", pname}, {"split", "1eager"}, {"kind", "unsplit"}, {"parts", 1}};
            eager["skipped"] = "measured in split 1's run, which did not reach its decode";
          }
          rows.push_back(eager);
        }
        publish();
      };
      Plan p;
      try {
        p = make_plan(sp, cfg, fmt, devices, n_machine, batch, max_ctx, max_rows, eager_rides && sp.name == "1" ? 2 : 1);
      } catch (const std::exception& e) {
        r["error"] = e.what();
        finish();
        continue;
      }
      json devs = json::array();
      for (const PartPlan& q : p.parts) devs.push_back(q.device);
      r["devices"] = devs;
      r["shared_device"] = p.shared_device;
      const Traffic step = traffic(sp, cfg, p, static_cast<std::uint64_t>(batch));
      r["bytes_between_parts_per_step"] = traffic_json(step);
      r["bytes_between_parts_prefill"] = traffic_json(traffic(sp, cfg, p, static_cast<std::uint64_t>(context)));
      r["traffic_formula"] = traffic_formula(sp, sp.parts);
      r["copies_device_local"] = step.between_devices == 0;
      {
        const kvgate::PageGeometry g{kBlock, cfg.n_kv_heads, cfg.head_dim};
        const double per_tok = static_cast<double>(cfg.n_layers) *
                               static_cast<double>(kvgate::page_bytes(fmt.k, g) + kvgate::page_bytes(fmt.v, g)) / kBlock;
        r["kv_bytes_per_token"] = per_tok;
        r["kv_bytes_at_context"] = per_tok * static_cast<double>(batch) * context;
      }
      if (!p.unsupported.empty()) {
        r["skipped"] = p.unsupported;
        progress("%-6s %-7s skipped: %s", pname.c_str(), sp.name.c_str(), p.unsupported.c_str());
        finish();
        continue;
      }
      // Device memory, per device used, right before anything is allocated.
      std::string no_room;
      json mem = json::object();
      for (const auto& [d, need] : p.need) {
        std::size_t free_b = 0, total_b = 0;
        {
          kc::DeviceScope on(d);
          CK(cudaMemGetInfo(&free_b, &total_b));
        }
        const std::size_t margin = std::size_t{1} << 30;
        mem["cuda:" + std::to_string(d)] = {{"needed_bytes", need + margin}, {"free_bytes", free_b}, {"total_bytes", total_b}};
        if (need + margin > free_b && no_room.empty()) {
          std::size_t w = 0, kv = 0, buf = 0;
          for (const PartPlan& q : p.parts)
            if (q.device == d) w += q.weight_bytes, kv += q.kv_bytes, buf += q.buffer_bytes;
          no_room = "needs " + gib(static_cast<double>(need + margin)) + " on cuda:" + std::to_string(d) + " (weights " +
                    gib(static_cast<double>(w)) + " + KV " + gib(static_cast<double>(kv)) + " + buffers " +
                    gib(static_cast<double>(buf)) + " + 1 GiB margin), the device has " + gib(static_cast<double>(free_b)) +
                    " free of " + gib(static_cast<double>(total_b));
        }
      }
      r["memory"] = mem;
      if (!no_room.empty()) {
        r["skipped"] = no_room;
        progress("%-6s %-7s skipped: %s", pname.c_str(), sp.name.c_str(), no_room.c_str());
        finish();
        continue;
      }
      try {
        const auto tc = Clock::now();
        kvgate::EngineOptions eo = kvgate::engine_options_for(fmt);
        eo.block_size = kBlock;
        eo.n_blocks = batch * ((max_ctx + kBlock - 1) / kBlock);
        const kvgate::StoreConfig sc = kvgate::make_store_config(model, eo, max_ctx, "bench_split_decode");
        const kc::CudaForwardOptions fo{max_rows, max_ctx, sp.graphs};
        std::vector<int> part_devs;
        for (const PartPlan& q : p.parts) part_devs.push_back(q.device);
        std::unique_ptr<Runner> run;
        if (sp.kind == Kind::unsplit) {
          run = std::make_unique<Unsplit>(model, sc, fo, part_devs[0]);
        } else if (sp.kind == Kind::pp) {
          kc::PipelineOptions po;
          po.devices = part_devs;
          po.weights = kc::WeightType::bf16;
          po.store = sc;
          po.forward = fo;
          run = std::make_unique<Pipe>(model, std::move(po));
        } else {
          kc::TensorParallelOptions to;
          to.ranks = sp.parts;
          to.devices = part_devs;
          to.weights = kc::WeightType::bf16;
          to.store = sc;
          to.forward = fo;
          run = std::make_unique<Tp>(model, std::move(to));
        }
        run->sync();
        r["construct_s"] = ms_since(tc) / 1e3;
        r["topology"] = run->topology();
        json parts = json::array();
        std::size_t pool = 0;
        for (const Part& q : run->parts()) {
          parts.push_back({{"device", q.device}, {"what", q.what}, {"weight_bytes", q.weight_bytes},
                           {"kv_pool_bytes", q.store->pool_bytes()}});
          pool += q.store->pool_bytes();
        }
        r["part_list"] = parts;
        r["kv_pool_bytes"] = pool;
        progress("%-6s %-7s built in %.1f s: %s", pname.c_str(), sp.name.c_str(), r["construct_s"].get<double>(),
                 r["topology"].get<std::string>().c_str());

        // TTFT: a warm-up chunk on a throw-away sequence, then sequence 0's whole prompt.
        const int chunk = std::min(prefill_chunk, context);
        {
          const SeqId w = run->create_sequence();
          int id = -1;
          run->forward_chunk(w, std::span<const int>(prompt).first(static_cast<std::size_t>(chunk)), &id);
          run->free_sequence(w);
          run->sync();
        }
        const SeqId s0 = run->create_sequence();
        run->sync();
        const auto t0 = Clock::now();
        const int first = prefill(*run, s0, prompt, chunk);
        const double ttft = ms_since(t0);
        r["ttft_ms"] = ttft;
        r["prefill_tok_s"] = context * 1e3 / ttft;
        r["first_token"] = first;
        progress("%-6s %-7s TTFT %.1f ms (%d tokens, %.0f tok/s prefill)", pname.c_str(), sp.name.c_str(), ttft, context,
                 context * 1e3 / ttft);

        // The other sequences' KV.
        std::vector<SeqId> seqs{s0}, rest;
        for (int b = 1; b < batch; ++b) rest.push_back(run->create_sequence());
        seqs.insert(seqs.end(), rest.begin(), rest.end());
        const auto tf = Clock::now();
        if (fill == "copy") {
          const std::size_t copies = rest.empty() ? 0 : copy_sequence_kv(*run, s0, rest, context);
          r["fill_copies"] = copies;
          if (!rest.empty()) {
            const std::string bad = check_copy(*run, s0, rest.back(), context);
            if (!bad.empty()) throw std::runtime_error("fill copy check: " + bad);
            r["fill_check"] = "first and last page of layer 0 and the last layer, K and V, of the last sequence == "
                              "sequence 0's, byte for byte, in every part";
          }
        } else {
          for (SeqId s : rest) prefill(*run, s, prompt, chunk);
        }
        run->sync();
        r["fill_ms"] = ms_since(tf);

        // Decode.
        std::vector<int> tokens(seqs.size(), first >= 0 ? first : 1);
        measure_decode(*run, seqs, tokens, warmup, steps, r);
        progress("%-6s %-7s decode %.1f tok/s, %.2f ms/step (median), fill %.0f ms; between parts %s per step",
                 pname.c_str(), sp.name.c_str(), r["decode_tok_s"].get<double>(), r["decode_ms_per_step"].get<double>(),
                 r["fill_ms"].get<double>(), human_bytes(step.between_parts).c_str());
        if (eager_rides && sp.name == "1") {  // split 1eager on the same weights, store and sequences
          eager = r;
          eager["split"] = "1eager";
          for (const char* k : {"decode_ms_per_step", "decode_ms_all", "decode_tok_s", "decode_tok_s_median", "decode_ids_seq0"})
            eager.erase(k);
          static_cast<Unsplit&>(*run).switch_to_eager();
          measure_decode(*run, seqs, tokens, warmup, steps, eager);
          eager["topology"] = run->topology();
          eager["measured_with"] =
              "split 1's run: a second CudaForward without CUDA graphs over the same weights and store; TTFT, fill "
              "and construct_s are split 1's (the prefill runs no graph either way); the decode steps start " +
              std::to_string(warmup + steps) + " tokens further into the context than split 1's";
          progress("%-6s %-7s decode %.1f tok/s, %.2f ms/step (median), eager, on split 1's sequences", pname.c_str(),
                   "1eager", eager["decode_tok_s"].get<double>(), eager["decode_ms_per_step"].get<double>());
        }
      } catch (const std::exception& e) {
        r["error"] = e.what();
        if (!eager.is_null() && !eager.contains("decode_tok_s")) eager["error"] = e.what();
        progress("%-6s %-7s error: %s", pname.c_str(), sp.name.c_str(), e.what());
        for (int d : used_devices) {  // a CUDA error (e.g. out of memory) must not leak into the next row
          kc::DeviceScope on(d);
          (void)cudaDeviceSynchronize();
          (void)cudaGetLastError();
        }
      }
      finish();
    }
  }
  j["complete"] = true;
  publish();
  std::printf("\n%s\n", shared_note.c_str());
  print_table(rows);
  progress("wrote %s", out_path.c_str());
  return 0;
}
