// PAR.stream.lru_model: the streaming window's counters equal those of a reference LRU cache run on
// the same lookups. Per layer the window holds ceil(window / B) blocks; a lookup of a resident block
// is a hit and makes it the most recently used; a miss loads the block into a free slot when there
// is one, else evicts the layer's least recently used block (docs/ARCHITECTURE.md, streaming). The
// class it closes: a window that is still correct (the host mirror serves every read) but evicts the
// wrong block, so misses, evictions and bytes moved grow silently.
// Exact integers: lookups, misses, evictions, and the resident set after every lookup. Anti-vacuity:
// the lookup stream has both hits and evictions, and an MRU policy on it gives other counts.
#include <algorithm>
#include <cstdint>
#include <list>
#include <vector>

#include "par_common.hpp"
#include "kvgate/kv_stream.hpp"
#include "populations.hpp"

using namespace kvgate;
using namespace kvgate::par;

namespace {

struct LruModel {
  int capacity;
  bool mru = false;  // the wrong policy, for the anti-vacuity check
  std::vector<std::list<int>> order;  // per layer: front = least recently used
  long long misses = 0, evictions = 0;
  LruModel(int layers, int cap, bool most_recent = false) : capacity(cap), mru(most_recent), order(static_cast<std::size_t>(layers)) {}
  void lookup(int layer, int block) {
    auto& o = order[static_cast<std::size_t>(layer)];
    auto it = std::find(o.begin(), o.end(), block);
    if (it != o.end()) {
      o.erase(it);
    } else {
      ++misses;
      if (static_cast<int>(o.size()) == capacity) {
        if (mru) o.pop_back(); else o.pop_front();
        ++evictions;
      }
    }
    o.push_back(block);
  }
  bool resident(int layer, int block) const {
    const auto& o = order[static_cast<std::size_t>(layer)];
    return std::find(o.begin(), o.end(), block) != o.end();
  }
};

}  // namespace

TEST_CASE("PAR.stream.lru_model window counters == a reference LRU cache on the same lookups", "[gate:PAR][fmt:f16][fmt:int8]") {
  for (const char* preset : {"f16", "int8"}) {
    const KvFormat f = fmt_of(preset);
    const PageGeometry g{8, 2, 64};
    const int layers = 2, n_blocks = 10, window_tokens = 20;  // ceil(20 / 8) = 3 blocks per layer
    KvWindow w(f, g, layers, n_blocks, window_tokens);
    REQUIRE(w.window_blocks() == 3);
    const std::size_t pb[2] = {page_bytes(f.k, g), page_bytes(f.v, g)};
    std::vector<std::vector<std::uint8_t>> host(static_cast<std::size_t>(layers * 2 * n_blocks));
    for (std::size_t i = 0; i < host.size(); ++i) {
      host[i].resize(pb[i % 2]);
      for (std::size_t b = 0; b < host[i].size(); ++b) host[i][b] = static_cast<std::uint8_t>(i * 31 + b * 7);
    }
    const KvWindow::HostPage hp = [&](int l, int h, int b) -> const std::uint8_t* {
      return host[static_cast<std::size_t>((l * n_blocks + b) * 2 + h)].data();
    };
    LruModel model(layers, 3), mru(layers, 3, true);
    gates::Rng r(2024);
    long long lookups = 0;
    for (int step = 0; step < 600; ++step) {
      const int layer = static_cast<int>(r.next() % layers);
      // Skewed reuse: mostly the 4 most recent blocks of a moving front, sometimes an old one.
      const int front = (step / 20) % n_blocks;
      const int block = r.uniform() < 0.8 ? (front + static_cast<int>(r.next() % 4)) % n_blocks : static_cast<int>(r.next() % n_blocks);
      for (int half = 0; half < 2; ++half) {  // a read asks for the K page, then the V page
        w.lookup(layer, half, block, hp);
        model.lookup(layer, block);
        mru.lookup(layer, block);
        ++lookups;
      }
      INFO(preset << " step " << step << " layer " << layer << " block " << block);
      for (int l = 0; l < layers; ++l)
        for (int b = 0; b < n_blocks; ++b) REQUIRE(w.resident(l, b) == model.resident(l, b));
    }
    const StreamCounters& c = w.counters();
    INFO(preset << ": lookups " << c.lookups << " misses " << c.misses << " (LRU " << model.misses << ", MRU " << mru.misses
                << ") evictions " << c.evictions << " (LRU " << model.evictions << ")");
    CHECK(c.lookups == lookups);
    CHECK(c.misses == model.misses);
    CHECK(c.evictions == model.evictions);
    CHECK(c.bytes_moved > 0);
    CHECK(w.check_coherent(hp).empty());
    // Anti-vacuity: hits and evictions both happen, and the wrong policy counts differently.
    CHECK(model.misses < lookups / 2);
    CHECK(model.evictions > 10);
    CHECK(mru.misses != model.misses);
  }
}
