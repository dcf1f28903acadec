// GPU gates of the static fp8 scales per KV head (docs/FORMATS.md "Static scales per KV head") that
// the oracle rows (ORA.cuda.store_head_scales, ORA.cuda.*_head_scales.<pair>) cannot see:
//
//  PAR.cuda.head_scales.uniform     a per-head table whose heads all hold the tensor scale s gives
//                                   the bits of the per-tensor call with s: the store kernel, decode
//                                   on each kernel (tensor-core, CUDA-core fast, generic) and prefill
//                                   on both kernels. The kernels compute a head's query multiplier
//                                   from the table on the device; this is the gate that holds that
//                                   product to the host's order (binary64 products, one rounding), a
//                                   difference of an ulp that no oracle bound can see.
//  PAR.cuda.head_scales.layers      a three-layer CUDA store with scales distinct per layer, head and
//                                   half writes each layer's pages as the CPU store does (the CPU
//                                   store's bytes are held to the oracle by ORA.head_scales.bytes):
//                                   the device table's layer and half strides.
//
// Anti-vacuity: the same calls with one head's entry moved (x 1.5) give other bytes / outputs, so
// the table is what the kernels read; every layer's scales differ from every other layer's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "catch_compat.hpp"
#include "cuda_gate_common.hpp"
#include "head_scales.hpp"
#include "kvgate/cuda/kv_store.hpp"
#include "kvgate/cuda/ops.hpp"
#include "kvgate/kv_store.hpp"
#include "store_harness.hpp"

using namespace kvgate;
using namespace kvgate::gates;
namespace kc = kvgate::cuda;
using kvgate::gates::cuda_gate::DevFloats;

namespace {

// n bytes of device memory (RAII).
struct DevBytes {
  void* p = nullptr;
  explicit DevBytes(std::size_t n) { REQUIRE(cudaMalloc(&p, std::max<std::size_t>(1, n)) == cudaSuccess); }
  ~DevBytes() { cudaFree(p); }
  DevBytes(const DevBytes&) = delete;
  DevBytes& operator=(const DevBytes&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

std::size_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// Scale tables (device, one entry per KV head): every head s, or every head s but head 1 at 1.5 s.
struct Tables {
  DevFloats k_uniform, v_uniform, k_moved, v_moved;
  Tables(int H, float ks, float vs) : k_uniform(H), v_uniform(H), k_moved(H), v_moved(H) {
    std::vector<float> k(H, ks), v(H, vs);
    k_uniform.put(k);
    v_uniform.put(v);
    k[1] *= 1.5f;
    v[1] *= 1.5f;
    k_moved.put(k);
    v_moved.put(v);
  }
};

// An attention call (DecodeArgs / PrefillArgs) over layer 0 of the store with the tensor scales
// ks / vs; variant 1 adds the uniform tables, variant 2 the moved ones.
template <class Args>
void set_layer0(const kc::CudaKvStore& gpu, int n_heads, int variant, const Tables& tab, float ks, float vs, Args& a) {
  a.format = gpu.config().format;
  a.geometry = gpu.geometry();
  a.n_heads = n_heads;
  a.k_pool = gpu.pool(0, KvHalf::K);
  a.v_pool = gpu.pool(0, KvHalf::V);
  a.k_page_stride = gpu.page_stride(KvHalf::K);
  a.v_page_stride = gpu.page_stride(KvHalf::V);
  a.k_scale = ks;
  a.v_scale = vs;
  if (variant == 1) a.k_head_scales = tab.k_uniform.p, a.v_head_scales = tab.v_uniform.p;
  if (variant == 2) a.k_head_scales = tab.k_moved.p, a.v_head_scales = tab.v_moved.p;
}

struct Counts {
  long store = 0, decode = 0, prefill = 0, moved_seen = 0, moved_runs = 0;
  std::set<std::string> paths;
};

void run_uniform(const KvFormat& fmt, int D, float ks, float vs, Counts& n) {
  const int H = 4, group = 2, Hq = H * group, B = 16, T = 150, HD = H * D;
  const PageGeometry g{B, H, D};
  INFO("format " << fmt.name() << " head_dim " << D << " kv_heads " << H << " gqa_group " << group << " tokens " << T
                   << " k_scale " << ks << " v_scale " << vs);
  StoreConfig cfg;
  cfg.format = fmt;
  cfg.n_kv_heads = H;
  cfg.head_dim = D;
  cfg.block_size = B;
  cfg.n_blocks = (T + B - 1) / B + 2;
  cfg.k_scale = {ks};
  cfg.v_scale = {vs};
  kc::CudaKvStore gpu(cfg);
  REQUIRE_FALSE(gpu.per_head_scales());
  const SeqId decoy = gpu.create_sequence();  // the sequence's pages do not start at block 0
  gpu.extend(decoy, 3);
  const SeqId s = gpu.create_sequence();
  gpu.extend(s, T);
  const StoreCase rows{B, H, D, T, Pattern::gaussian, 1234u + static_cast<std::uint64_t>(D), 0};
  // Rows sized to the scales (x / s within the fp8 range, away from saturation).
  const std::vector<float> k = make_rows(rows, 3 * ks, 1), v = make_rows(rows, 3 * vs, 2);
  gpu.write_host(s, 0, 0, T, k.data(), HD, v.data(), HD);
  const Tables tab(H, ks, vs);
  const auto table = gpu.block_table(s);
  const std::vector<int> tbl(table.begin(), table.end());
  DevBytes d_tbl(tbl.size() * sizeof(int)), d_len(sizeof(int));
  REQUIRE(cudaMemcpy(d_tbl.p, tbl.data(), tbl.size() * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(d_len.p, &T, sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);

  // 1. Store: the same rows through store_rows into a second pool with the uniform table, then with
  //    the moved one; pages compared with the store's own (written with the tensor scale).
  {
    std::vector<int> map(T);
    for (int t = 0; t < T; ++t) map[static_cast<std::size_t>(t)] = tbl[static_cast<std::size_t>(t / B)] * B + t % B;
    DevBytes d_map(map.size() * sizeof(int));
    REQUIRE(cudaMemcpy(d_map.p, map.data(), map.size() * sizeof(int), cudaMemcpyHostToDevice) == cudaSuccess);
    DevFloats d_rows(static_cast<std::size_t>(T) * HD);
    for (KvHalf h : {KvHalf::K, KvHalf::V}) {
      const HalfFormat hf = gpu.half_format(h);
      d_rows.put(h == KvHalf::K ? k : v);
      const std::size_t stride = gpu.page_stride(h), pool_bytes = stride * static_cast<std::size_t>(cfg.n_blocks);
      for (int moved = 0; moved < 2; ++moved) {
        DevBytes pool(pool_bytes);
        REQUIRE(cudaMemset(pool.p, 0, pool_bytes) == cudaSuccess);
        kc::StoreRowsArgs a;
        a.rows = d_rows.p;
        a.row_stride = static_cast<std::size_t>(HD);
        a.slot_mapping = d_map.as<int>();
        a.n_tokens = T;
        a.pool = pool.as<std::uint8_t>();
        a.page_stride = stride;
        a.tensor_scale = h == KvHalf::K ? ks : vs;
        const DevFloats& t = h == KvHalf::K ? (moved ? tab.k_moved : tab.k_uniform) : (moved ? tab.v_moved : tab.v_uniform);
        a.head_scales = t.p;
        kc::store_rows(hf, g, a);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        bool same = true;
        for (int b : tbl) {
          std::vector<std::uint8_t> got(gpu.page_bytes(h));
          REQUIRE(cudaMemcpy(got.data(), pool.as<std::uint8_t>() + static_cast<std::size_t>(b) * stride, got.size(),
                             cudaMemcpyDeviceToHost) == cudaSuccess);
          const auto want = gpu.download_page(0, h, b);
          same = same && got == want;
        }
        const bool scaled = hf == HalfFormat::fp8_e4m3 || hf == HalfFormat::fp8_e5m2;
        INFO((h == KvHalf::K ? "K" : "V") << (moved ? " moved table" : " uniform table") << ": pages "
                                          << (same ? "equal" : "differ"));
        if (!moved) {
          CHECK(same);
          ++n.store;
        } else if (scaled) {
          CHECK_FALSE(same);
          ++n.moved_runs;
          n.moved_seen += !same;
        }
      }
    }
  }

  // 2. Decode (the plan's kernel, then the generic one through a window) and 3. prefill (the
  //    tensor-core kernel where it applies, the CUDA-core one through a window): per-tensor call vs
  //    the uniform table (bits equal) vs the moved table (outputs differ).
  Rng r(77 + static_cast<std::uint64_t>(D));
  std::vector<float> q(static_cast<std::size_t>(Hq) * D);
  for (auto& x : q) x = 1.5f * r.normal();
  DevFloats dq(q.size()), dout(q.size());
  dq.put(q);
  kc::DecodeWorkspace ws;
  for (int window : {0, 37}) {
    std::vector<float> out[3];
    for (int variant = 0; variant < 3; ++variant) {
      kc::DecodeArgs a;
      set_layer0(gpu, Hq, variant, tab, ks, vs, a);
      a.batch = 1;
      a.block_tables = d_tbl.as<int>();
      a.table_stride = static_cast<int>(tbl.size());
      a.seq_lens = d_len.as<int>();
      a.max_seq_len = T;
      a.q = dq.p;
      a.out = dout.p;
      a.window = window;
      const kc::DecodePlan p = kc::decode_attention(a, ws);
      if (variant == 0) n.paths.insert(window > 0 ? std::string("generic") : p.path);
      out[variant] = dout.get();
    }
    INFO("decode window " << window << ": uniform table differs in " << bits_differ(out[0], out[1])
                          << " outputs, moved table in " << bits_differ(out[0], out[2]));
    CHECK(bits_differ(out[0], out[1]) == 0);
    CHECK(bits_differ(out[0], out[2]) > 0);
    ++n.decode;
  }
  const int n_new = 40;
  std::vector<float> qp(static_cast<std::size_t>(n_new) * Hq * D);
  for (auto& x : qp) x = 1.5f * r.normal();
  DevFloats dqp(qp.size()), doutp(qp.size());
  dqp.put(qp);
  for (int window : {0, 17}) {
    std::vector<float> out[3];
    for (int variant = 0; variant < 3; ++variant) {
      kc::PrefillArgs a;
      set_layer0(gpu, Hq, variant, tab, ks, vs, a);
      a.block_table = d_tbl.as<int>();
      a.n_past = T - n_new;
      a.n_new = n_new;
      a.q = dqp.p;
      a.out = doutp.p;
      a.window = window;
      kc::prefill_attention(a);
      out[variant] = doutp.get();
    }
    if (window == 0) n.paths.insert(kc::supports_op(kc::Op::prefill, fmt, g, Hq).path);
    INFO("prefill window " << window << ": uniform table differs in " << bits_differ(out[0], out[1])
                           << " outputs, moved table in " << bits_differ(out[0], out[2]));
    CHECK(bits_differ(out[0], out[1]) == 0);
    CHECK(bits_differ(out[0], out[2]) > 0);
    ++n.prefill;
  }
}

}  // namespace

TEST_CASE("PAR.cuda.head_scales.uniform a per-head fp8 scale table whose heads all hold s == the tensor scale s, bit "
          "for bit: store, decode and prefill on every kernel",
          "[gate:PAR][fmt:fp8][fmt:fp8_e5m2][cuda]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  Counts n;
  const KvFormat pairs[] = {{HalfFormat::fp8_e4m3, HalfFormat::fp8_e4m3},
                            {HalfFormat::fp8_e5m2, HalfFormat::fp8_e5m2},
                            {HalfFormat::fp8_e4m3, HalfFormat::bf16},
                            {HalfFormat::bf16, HalfFormat::fp8_e5m2}};
  // Three scale pairs: the query multiplier's product (softmax scale x log2(e) x s) rounds
  // differently for each, so an order or precision other than the host's shows in some of them.
  const std::pair<float, float> scales[] = {{kGateKScale, kGateVScale}, {0.011f, 0.93f}, {2.9f, 0.047f}};
  for (const auto& [ks, vs] : scales)
    for (const KvFormat& f : pairs)
      for (int D : {8, 64, 128}) run_uniform(f, D, ks, vs, n);
  std::string paths;
  for (const auto& p : n.paths) paths += p + " ";
  INFO("kernels that ran: " << paths);
  // Anti-vacuity: every kernel that reads the tables ran (decode: tensor-core, CUDA-core fast,
  // generic; prefill: tensor-core and CUDA-core), and the moved table changed every run that reads it.
  CHECK(n.paths.count("generic") == 1);
  CHECK(std::any_of(n.paths.begin(), n.paths.end(), [](const std::string& p) { return p.rfind("mma(", 0) == 0; }));
  CHECK(std::any_of(n.paths.begin(), n.paths.end(), [](const std::string& p) { return p.rfind("fast(", 0) == 0; }));
  CHECK(std::any_of(n.paths.begin(), n.paths.end(), [](const std::string& p) { return p.rfind("prefill(mma", 0) == 0; }));
  CHECK(n.paths.count("prefill(fp32)") == 1);
  CHECK(n.store == 3 * 4 * 3 * 2);
  CHECK(n.decode == 3 * 4 * 3 * 2);
  CHECK(n.prefill == 3 * 4 * 3 * 2);
  CHECK(n.moved_runs == 3 * 6 * 3);
  CHECK(n.moved_seen == n.moved_runs);
}

TEST_CASE("PAR.cuda.head_scales.layers a three-layer CUDA store with fp8 scales distinct per layer, head and half "
          "writes every layer's pages as the CPU store does",
          "[gate:PAR][fmt:fp8][fmt:fp8_e5m2][cuda]") {
  KVGATE_REQUIRE_DEVICE_OR_SKIP();
  const int L = 3, B = 16;
  long pages = 0;
  for (const KvFormat fmt : {KvFormat{HalfFormat::fp8_e4m3, HalfFormat::fp8_e5m2}, KvFormat{HalfFormat::fp8_e5m2, HalfFormat::fp8_e4m3}})
    for (const auto [H, D] : {std::pair{4, 64}, std::pair{2, 128}, std::pair{8, 8}}) {
      const int n = 2 * B + 5, HD = H * D;
      const auto ks = gate_head_scales(L, H, KvHalf::K), vs = gate_head_scales(L, H, KvHalf::V);
      // The CPU store (fill_head_scaled) holds rows sized to each head's scale; the GPU store gets the
      // same rows and the same tables.
      const HeadScaledStore cpu = fill_head_scaled(fmt, L, H, D, B, n, ks, vs, 5 + static_cast<std::uint64_t>(H));
      kc::CudaKvStore gpu(cpu.store->config());
      REQUIRE(gpu.per_head_scales());
      const SeqId s = gpu.create_sequence();
      gpu.extend(s, n);
      for (int l = 0; l < L; ++l) {
        INFO("format " << fmt.name() << " H=" << H << " D=" << D << " layer " << l);
        CHECK(std::equal(ks.begin() + l * H, ks.begin() + (l + 1) * H, gpu.head_scales(l, KvHalf::K).begin()));
        gpu.write_host(s, l, 0, n, cpu.k[static_cast<std::size_t>(l)].data(), HD, cpu.v[static_cast<std::size_t>(l)].data(), HD);
      }
      const auto ct = cpu.store->block_table(cpu.seq), gt = gpu.block_table(s);
      REQUIRE(ct.size() == gt.size());
      for (int l = 0; l < L; ++l)
        for (KvHalf h : {KvHalf::K, KvHalf::V})
          for (std::size_t p = 0; p < ct.size(); ++p) {
            const auto got = gpu.download_page(l, h, gt[p]);
            const std::uint8_t* want = cpu.store->page(l, h, ct[p]);
            INFO("format " << fmt.name() << " H=" << H << " D=" << D << " layer " << l << (h == KvHalf::K ? " K" : " V")
                           << " page " << p << ": " << cuda_gate::first_diff(got.data(), want, got.size(), "gpu", "cpu"));
            CHECK(std::memcmp(got.data(), want, got.size()) == 0);
            ++pages;
          }
      // Anti-vacuity: layer 0's table differs from every other layer's in every head (a store that
      // read one layer's table for all would write other bytes: ORA.head_scales.bytes's head-0 and
      // other-half alternatives show a different scale changes the bytes).
      for (int l = 1; l < L; ++l)
        for (int h = 0; h < H; ++h) CHECK(ks[static_cast<std::size_t>(l * H + h)] != ks[static_cast<std::size_t>(h)]);
    }
  CHECK(pages >= 2 * 3 * 3 * 2 * 3);
}
