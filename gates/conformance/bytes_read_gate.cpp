// STO.bytes_read.<preset>: bytes-moved accounting of the CPU read path. A decode step at context n
// reads, per layer and half, the pages that hold its n keys, each once: ceil(n / B) pages of the
// half's page bytes (docs/FORMATS.md "Geometry", written out in gates/common/format_bytes.hpp, not
// the runtime's table). So the bytes read are at least the format's need, n_layers x n x (K token
// bytes + V token bytes), and exceed it by less than one page per (layer, half): the unused slots
// of the page being filled. A silent full-pool dequantize, a page read twice, or a window layer that
// reads the pages before its window fails the exact count. The count is the store's own
// (PagedKvStore::set_read_counter: every page lookup of the read path, page() const).
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "conformance_fixtures.hpp"
#include "format_bytes.hpp"
#include "kvgate/engine.hpp"
#include "kvgate/format_list.hpp"
#include "kvgate/loaders.hpp"
#include "kvgate/model.hpp"
#include "models.hpp"

using namespace kvgate;
using namespace kvgate::gates;

namespace {

// The first page a query at position n - 1 can see on a layer with window w (0: every page).
int first_page(int n, int w, int B) { return w > 0 && n > w ? (n - w) / B : 0; }

// Checks one read against the pages it needs: per half, the pages holding keys [first, n) of every
// layer, each once, and the byte figures that follow from the formulas.
void check_reads(const KvReadCounter& cnt, const KvFormat& f, const ModelConfig& c, int B, int n,
                 std::size_t kv_bytes_held, bool whole_prefix) {
  const std::size_t H = static_cast<std::size_t>(c.n_kv_heads), D = static_cast<std::size_t>(c.head_dim);
  const std::size_t page[2] = {expected_page_bytes(f.k, B, H, D), expected_page_bytes(f.v, B, H, D)};
  // Per layer: the pages read, the keys the query needs (n, or its window's w), and the pages by
  // which the pages read may exceed the need (the page being filled; on a window layer also the
  // first page, which holds keys before the window).
  std::uint64_t want_pages = 0, need_tokens = 0, slack_pages = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const int w = c.window(l);
    want_pages += static_cast<std::uint64_t>((n + B - 1) / B - first_page(n, w, B));
    need_tokens += static_cast<std::uint64_t>(w > 0 && w < n ? w : n);
    slack_pages += w > 0 ? 2 : 1;
  }
  std::uint64_t read_bytes = 0;
  for (int h = 0; h < 2; ++h) {
    INFO((h == 0 ? "K" : "V") << " half, page " << page[h] << " B, context " << n << ", block " << B);
    const std::uint64_t pages = cnt.pages[h].load(), bytes = cnt.bytes[h].load();
    CHECK(pages == want_pages);
    CHECK(bytes == want_pages * page[h]);
    // The format's need, n_layers x n x token bytes (token bytes = page bytes / B, exact for every
    // format), is met and exceeded by less than one page per layer (two on a window layer).
    const std::uint64_t need = need_tokens * (page[h] / static_cast<std::size_t>(B));
    CHECK(bytes >= need);
    CHECK(bytes - need < slack_pages * page[h]);
    read_bytes += bytes;
  }
  // Without windows, the pages read are exactly the pages the sequence holds (EngineStats::kv_bytes).
  if (whole_prefix) CHECK(read_bytes == kv_bytes_held);
}

void run_bytes_read(const KvFormat& f, const std::vector<int>& windows) {
  const Model& m = stories260k(windows);
  std::vector<int> ids = kStories260KGreedy64;
  ids.insert(ids.end(), kStories260KGreedy64.begin(), kStories260KGreedy64.end());
  for (int B : {16, 8, 5}) {
    INFO("format " << f.name() << " block_size " << B << (windows.empty() ? "" : " per-layer windows"));
    EngineOptions o = engine_options_for(f, 1);
    o.block_size = B;
    o.release_outside_window = false;  // the pages before a window stay in the pool: reading them would be silent
    Engine e(m, o);
    REQUIRE(e.stats().effective_kv == f.name());
    auto cnt = std::make_shared<KvReadCounter>();
    e.store().set_read_counter(cnt);
    // One prefill chunk on one thread: attention reads each page of the prompt once per layer.
    const std::vector<int> prompt(ids.begin(), ids.begin() + 37);
    e.prefill(prompt);
    CHECK(cnt->pages[0].load() > 0);  // anti-vacuity: the counter sees the read path
    if (windows.empty()) check_reads(*cnt, f, m.config, B, 37, e.stats().kv_bytes, true);
    // Decode steps across two page boundaries: each reads the pages of its context, once.
    for (int step = 0; step < 2 * B + 1; ++step) {
      cnt->reset();
      const auto& logits = e.decode(ids[static_cast<std::size_t>(37 + step)]);
      REQUIRE(std::isfinite(logits[0]));
      check_reads(*cnt, f, m.config, B, 38 + step, e.stats().kv_bytes, windows.empty());
    }
  }
}

}  // namespace

#define STO_BYTES_READ(id, preset)                                                                                  \
  TEST_CASE("STO.bytes_read." id " a decode step reads each page of its context once, within a page of the need", \
            "[gate:STO][fmt:" preset "]") {                                                                           \
    const auto f = parse_kv_format(preset);                                                                         \
    REQUIRE(f.has_value());                                                                                         \
    run_bytes_read(*f, {});                                                                                         \
  }
#define STO_BYTES_READ_ROW(A, name, k, v, slot, kind) STO_BYTES_READ(#name, #name)
KVGATE_PRESETS(STO_BYTES_READ_ROW, _)  // one row per preset: kvgate/format_list.hpp

TEST_CASE("STO.bytes_read.window sliding-window layers read only the pages holding their window's keys",
          "[gate:STO][fmt:int8][fmt:q4_0]") {
  // Windows on layers 0, 2, 4 (10 and 20 keys), full attention on 1 and 3 (so nothing is released).
  for (const char* p : {"int8", "q4_0"}) run_bytes_read(*parse_kv_format(p), {10, 0, 20, 0, 10});
}
