// The layout argument behind KV files with tensor parallelism (kvgate/format.hpp, copy_head_slice /
// place_head_slice): for every half format of the traits table, a page quantized from rows of 4 KV
// heads holds, byte for byte, the pages that rows of heads [0, 2) and [2, 4) alone quantize to (with
// those heads' per-head scales), at the offsets copy_head_slice reads; and placing the two rank pages
// into a page of junk rebuilds the 4-head page byte for byte. The rank pages are quantized on their
// own (the format's QuantizeTokenFn over the sliced rows), never cut from the full page, so a wrong
// layout assumption (a region cut at the wrong offset, a scale shared across heads, a missed region)
// fails here. A format whose heads straddle a block is refused (head_slice_refusal) and the refusal
// is checked to agree with the rank store's own (supports: the rank row is not whole blocks).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "catch_compat.hpp"
#include "kvgate/format.hpp"

using namespace kvgate;

namespace {

// Per-head scales (fp8 halves per KV head; nvfp4's one global scale on every head).
std::vector<float> head_scales_for(HalfFormat f, int H) {
  std::vector<float> s;
  for (int h = 0; h < H; ++h) s.push_back(f == HalfFormat::nvfp4 ? 0.37f : 0.21f + 0.13f * static_cast<float>(h));
  return s;
}

}  // namespace

TEST_CASE("head_slice every half format: a rank page == the slice of the full page; the slices rebuild it",
          "[unit][head_slice]") {
  constexpr int B = 16, H = 4, kRankHeads = 2;
  int decomposed = 0;
  for (const HalfFormat f : all_half_formats()) {
    const HalfFormatInfo& fi = info(f);
    for (const int D : {32, 64}) {
      INFO("format " << fi.name << ", head_dim " << D);
      const PageGeometry full{B, H, D}, rank{B, kRankHeads, D};
      REQUIRE(supports(f, full).ok);
      const std::string why0 = head_slice_refusal(f, full, 0, kRankHeads);
      if (!why0.empty()) {  // heads straddle a block: the rank store cannot exist either
        CHECK_FALSE(supports(f, rank).ok);
        std::vector<std::uint8_t> a(page_bytes(f, full)), b(page_bytes(f, full));
        CHECK_THROWS_AS(copy_head_slice(f, full, 0, kRankHeads, a.data(), b.data()), std::invalid_argument);
        std::printf("head_slice %-20s D=%-3d refused: %s\n", std::string(fi.name).c_str(), D, why0.c_str());
        continue;
      }
      REQUIRE(supports(f, rank).ok);
      std::mt19937 rng(1000u * static_cast<unsigned>(f) + static_cast<unsigned>(D));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      // Rows whose heads differ in magnitude (per-head scales and block scales then differ by head).
      std::vector<float> rows(static_cast<std::size_t>(B) * H * D);
      for (int t = 0; t < B; ++t)
        for (int h = 0; h < H; ++h)
          for (int i = 0; i < D; ++i)
            rows[(static_cast<std::size_t>(t) * H + h) * D + i] = nd(rng) * (0.05f + 0.7f * static_cast<float>(h + t % 3));
      const std::vector<float> scales = head_scales_for(f, H);
      std::vector<std::uint8_t> full_page(page_bytes(f, full), 0);
      for (int t = 0; t < B; ++t)
        fi.quantize_token(full, t, rows.data() + static_cast<std::size_t>(t) * H * D, scales.data(), full_page.data());
      std::vector<std::uint8_t> rebuilt(full_page.size(), 0xCD);  // junk: every byte must be placed
      std::vector<std::vector<std::uint8_t>> rank_pages;
      for (int r = 0; r < H / kRankHeads; ++r) {
        const int h0 = r * kRankHeads;
        INFO("rank " << r << " (heads " << h0 << ".." << h0 + kRankHeads - 1 << ")");
        REQUIRE(head_slice_refusal(f, full, h0, kRankHeads).empty());
        // The rank's own page: its heads' rows quantized with its heads' scales.
        std::vector<std::uint8_t> own(page_bytes(f, rank), 0);
        std::vector<float> slice(static_cast<std::size_t>(kRankHeads) * D);
        for (int t = 0; t < B; ++t) {
          const float* src = rows.data() + (static_cast<std::size_t>(t) * H + h0) * D;
          std::copy(src, src + slice.size(), slice.begin());
          fi.quantize_token(rank, t, slice.data(), scales.data() + h0, own.data());
        }
        CHECK(std::any_of(own.begin(), own.end(), [](std::uint8_t b) { return b != 0; }));  // anti-vacuity
        std::vector<std::uint8_t> cut(own.size(), 0xEE);
        copy_head_slice(f, full, h0, kRankHeads, full_page.data(), cut.data());
        CHECK(cut == own);
        place_head_slice(f, full, h0, kRankHeads, own.data(), rebuilt.data());
        rank_pages.push_back(std::move(own));
      }
      CHECK(rank_pages[0] != rank_pages[1]);  // the ranks hold different bytes
      CHECK(rebuilt == full_page);
      // A slice placed at the wrong heads does not rebuild the page (the check can fail).
      std::vector<std::uint8_t> wrong(full_page.size(), 0xCD);
      place_head_slice(f, full, 0, kRankHeads, rank_pages[1].data(), wrong.data());
      place_head_slice(f, full, 2, kRankHeads, rank_pages[0].data(), wrong.data());
      CHECK(wrong != full_page);
      ++decomposed;
      std::printf("head_slice %-20s D=%-3d decomposes (page %zu bytes, rank page %zu)\n", std::string(fi.name).c_str(), D,
                  full_page.size(), page_bytes(f, rank));
    }
  }
  CHECK(decomposed >= 2 * kHalfFormatCount - 1);  // only fp8_block128 at D=32 (a 128-tile of 2 heads) is refused
}

TEST_CASE("head_slice refusals: heads outside the page, a head range that is not whole blocks", "[unit][head_slice]") {
  const PageGeometry g{16, 4, 32};
  CHECK_FALSE(head_slice_refusal(HalfFormat::int8, g, 3, 2).empty());
  CHECK_FALSE(head_slice_refusal(HalfFormat::int8, g, -1, 1).empty());
  CHECK_FALSE(head_slice_refusal(HalfFormat::fp8_block128, g, 0, 2).empty());  // 64 of a 128-tile
  CHECK(head_slice_refusal(HalfFormat::fp8_block128, g, 0, 4).empty());
  const PageGeometry g16{16, 4, 16};
  CHECK_FALSE(head_slice_refusal(HalfFormat::q4_0, g16, 1, 1).empty());  // half a 32-block
  CHECK(head_slice_refusal(HalfFormat::q4_0, g16, 2, 2).empty());         // heads 2, 3: block 1
}
