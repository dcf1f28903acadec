// STO.mla.fp8_ds_mla_synth: DeepSeek's fp8_ds_mla cache (docs/FORMATS.md "fp8_block128", "MLA latent
// cache") end to end on a model whose latent has DeepSeek-V3's widths (kv_lora_rank 512,
// qk_rope_head_dim 64), which the transformers reference directories (32-wide latents) cannot give:
// `kvgate synth --arch deepseek_v3` writes it (random weights, 2 dense layers), load_hf reads it, the
// CPU engine runs `--mla-cache latent --kv k=fp8_block128,v=bf16` strict.
//
// Bounds (exact): the format is the one asked (no fallback), 656 bytes per token and layer (512 E4M3
// codes + 4 binary32 tile scales + 64 bf16), the pool and the held sequence at that size; layer 0's
// latent and RoPE-key pages are, byte for byte, the oracle's quantization (fp8_block128, bf16) of the
// rows an f32-latent engine holds for the same tokens (layer 0's rows are computed from the
// embeddings alone, so both engines compute the same binary32 rows there). Anti-vacuity: the
// quantized run's logits are finite and differ from the f32 run's; tiles 1-3 of a latent row carry
// scales other than tile 0's (a reader or writer with one scale per row would be caught).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/kv_store.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/resolve.hpp"
#include "kvgate/synth.hpp"
#include "kvgate_oracle/formats.hpp"
#include "model_fixtures.hpp"
#include "scratch_dir.hpp"

using namespace kvgate;
namespace ko = kvgate_oracle;

TEST_CASE("STO.mla.fp8_ds_mla_synth fp8_ds_mla (k=fp8_block128,v=bf16, latent cache) on a 512-wide latent: strict, "
          "656 B per token and layer, layer 0's pages == the oracle's",
          "[gate:STO][mla][fmt:fp8_block128]") {
  const gates::ScratchDir dir("kvgate-mla-synth");
  SynthOptions so = gates::deepseek_latent512_options();
  so.out = dir.sub("model");
  (void)synth_hf(so);
  const Model m = load_model(so.out);
  const ModelConfig& c = m.config;
  REQUIRE(c.mla.kv_lora_rank == 512);
  REQUIRE(c.mla.rope_dim == 64);

  const int B = 16, n = 41, L = c.n_layers;
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) ids.push_back((37 * i + 11) % 256);
  auto run = [&](const KvFormat& f) {
    KvRequest req;  // as `kvgate run --mla-cache latent --kv <f> --strict-kv`: resolved, never a fallback
    req.flag = f;
    req.strict = true;
    req.mla_latent = true;
    EngineOptions o = engine_options_for(f, 1);
    o.kv = resolve_kv(req, c, B);
    o.mla_cache = MlaCache::latent;
    o.block_size = B;
    o.max_context = 64;
    o.threads = 1;
    auto e = std::make_unique<Engine>(m, o);
    std::vector<float> logits = e->forward_all_logits(ids);
    return std::make_pair(std::move(e), std::move(logits));
  };
  const KvFormat ds{HalfFormat::fp8_block128, HalfFormat::bf16}, f32{HalfFormat::f32, HalfFormat::f32};
  auto [eq, lq] = run(ds);
  auto [ef, lf] = run(f32);

  // The format asked, not a fallback; its bytes.
  const EngineStats st = eq->stats();
  const double per_token = 512 + 4 * 4 + 64 * 2;
  std::cout << "STO.mla.fp8_ds_mla_synth: model " << L << " layers, dim " << c.dim << ", " << c.n_heads
            << " heads, kv_lora " << c.mla.kv_lora_rank << ", rope " << c.mla.rope_dim << "; effective '" << st.effective_kv
            << "', fallback '" << st.fallback_reason << "', sequence " << st.kv_bytes << " bytes, pool " << st.kv_pool_bytes
            << " bytes in " << st.n_blocks << " blocks (656 B per token and layer expected)\n";
  CHECK(st.effective_kv == ds.name());
  CHECK(st.fallback_reason.empty());
  CHECK(st.kv_layout.rfind("mla_latent", 0) == 0);
  CHECK(st.kv_bytes == static_cast<std::size_t>(per_token * L * B * ((n + B - 1) / B)));
  CHECK(st.kv_pool_bytes == static_cast<std::size_t>(per_token * L * B * st.n_blocks));

  // Layer 0's pages vs the oracle's quantization of the f32 engine's layer-0 rows.
  const PagedKvStore& qs = eq->store();
  const PagedKvStore& fs_ = ef->store();
  long pages = 0, tile_scales_differ = 0;
  for (KvHalf h : {KvHalf::K, KvHalf::V}) {
    const PageGeometry g = qs.half_geometry(h);
    REQUIRE(g.n_kv_heads == 1);
    REQUIRE(g.head_dim == (h == KvHalf::K ? 512 : 64));
    const ko::PageShape shape{B, 1, g.head_dim};
    const ko::Half oh = h == KvHalf::K ? ko::Half::fp8_block128 : ko::Half::bf16;
    const auto qt = qs.block_table(eq->sequence()), ft = fs_.block_table(ef->sequence());
    for (int t0 = 0; t0 < n; t0 += B) {
      const int nt = std::min(B, n - t0);
      std::vector<float> rows(static_cast<std::size_t>(nt) * g.head_dim);
      fs_.read(ef->sequence(), 0, h, t0, nt, rows.data());
      const auto want = ko::quantize_page(oh, shape, rows.data(), nt, 1.0f);
      const std::uint8_t* got = qs.page(0, h, qt[static_cast<std::size_t>(t0 / B)]);
      INFO((h == KvHalf::K ? "latent" : "RoPE key") << " page " << t0 / B);
      REQUIRE(want.size() == qs.page_bytes(h));
      CHECK(std::memcmp(got, want.data(), want.size()) == 0);
      ++pages;
      if (h == KvHalf::K)  // anti-vacuity: the row's four tiles carry scales of their own
        for (int t = 0; t < nt; ++t)
          for (int k = 1; k < 4; ++k)
            tile_scales_differ += ko::element_scale(oh, shape, want.data(), t, 0, 128 * k, 1.0f) !=
                                  ko::element_scale(oh, shape, want.data(), t, 0, 0, 1.0f);
    }
  }
  CHECK(pages == 2 * ((n + B - 1) / B));
  CHECK(tile_scales_differ > 0);

  // The quantized run's logits: finite, and not the f32 run's.
  REQUIRE(lq.size() == lf.size());
  long nonfinite = 0;
  double diff = 0;
  for (std::size_t i = 0; i < lq.size(); ++i) {
    nonfinite += !std::isfinite(lq[i]);
    diff = std::max(diff, std::fabs(double(lq[i]) - double(lf[i])));
  }
  std::cout << "STO.mla.fp8_ds_mla_synth: layer-0 pages compared " << pages << ", logits max |fp8_ds_mla - f32| " << diff
            << ", nonfinite " << nonfinite << "\n";
  CHECK(nonfinite == 0);
  CHECK(diff > 0);
}
