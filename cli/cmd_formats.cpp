// `kvgate formats`: the format catalog as a table or JSON.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "kvgate/format.hpp"

namespace kvgate::cli {

namespace {
struct FormatsOpts {
  int head_dim = 128, kv_heads = 8, block_size = 16;
  bool json = false;
};

nlohmann::json half_json(HalfFormat f, const PageGeometry& g) {
  const auto& i = info(f);
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& r : page_runs(f, g)) runs.push_back({{"name", r.name}, {"offset", r.offset}, {"bytes", r.bytes}});
  const Capability c = supports(f, g);
  return {{"name", i.name},
          {"code_type", i.code_type},
          {"scale_granularity", i.scale_granularity},
          {"scale_dtype", i.scale_dtype},
          {"rotation", i.rotation},
          {"storage_precision", i.storage_precision},
          {"transfer_precision", i.transfer_precision},
          {"execution_precision", i.execution_precision},
          {"envelope", i.envelope},
          {"page_runs", runs},
          {"supported", c.ok},
          {"unsupported_reason", c.reason}};
}

int run_formats(const FormatsOpts& o) {
  const PageGeometry g{o.block_size, o.kv_heads, o.head_dim};
  if (o.block_size < 1 || o.kv_heads < 1 || o.head_dim < 1) {
    std::fprintf(stderr, "kvgate formats: --head-dim, --kv-heads and --block-size must be >= 1\n");
    return 2;
  }
  // Their products size every page: refused before any is formed (the limits of kvgate/limits.hpp).
  if (const Capability c = supports(HalfFormat::f32, g); !c.ok) {
    std::fprintf(stderr, "kvgate formats: --kv-heads %d x --head-dim %d / --block-size %d: %s\n", o.kv_heads, o.head_dim,
                 o.block_size, c.detail.c_str());
    return 2;
  }
  if (o.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& p : presets()) {
      const double kc = bytes_per_cell(p.fmt.k, g), vc = bytes_per_cell(p.fmt.v, g);
      const Capability ck = supports(p.fmt.k, g), cv = supports(p.fmt.v, g);
      arr.push_back({{"name", p.name},
                     {"k", name(p.fmt.k)},
                     {"v", name(p.fmt.v)},
                     {"k_bytes_per_cell", kc},
                     {"v_bytes_per_cell", vc},
                     {"bytes_per_cell", kc + vc},
                     {"page_bytes", page_bytes(p.fmt.k, g) + page_bytes(p.fmt.v, g)},
                     {"k_page_bytes", page_bytes(p.fmt.k, g)},
                     {"v_page_bytes", page_bytes(p.fmt.v, g)},
                     {"supported", ck.ok && cv.ok},
                     {"unsupported_reason", !ck.ok ? ck.reason : cv.reason},
                     {"geometry", {{"head_dim", o.head_dim}, {"kv_heads", o.kv_heads}, {"block_size", o.block_size}}},
                     {"k_half", half_json(p.fmt.k, g)},
                     {"v_half", half_json(p.fmt.v, g)}});
    }
    std::cout << arr.dump(2) << "\n";
    return 0;
  }
  std::printf("KV formats at head_dim=%d, kv_heads=%d, block_size=%d (page = K page + V page of one layer)\n",
              o.head_dim, o.kv_heads, o.block_size);
  int w = 10;  // the preset column is as wide as the longest name (k_mxfp8_v_mxfp4)
  for (const auto& p : presets()) w = std::max(w, static_cast<int>(p.name.size()));
  std::printf("%-*s %-10s %-10s %10s %10s %10s %12s  %s\n", w, "preset", "K", "V", "K B/cell", "V B/cell", "B/cell",
              "page bytes", "status");
  for (const auto& p : presets()) {
    const Capability ck = supports(p.fmt.k, g), cv = supports(p.fmt.v, g);
    std::printf("%-*s %-10s %-10s %10.3f %10.3f %10.3f %12zu  %s\n", w, std::string(p.name).c_str(),
                std::string(name(p.fmt.k)).c_str(), std::string(name(p.fmt.v)).c_str(), bytes_per_cell(p.fmt.k, g),
                bytes_per_cell(p.fmt.v, g), bytes_per_cell(p.fmt.k, g) + bytes_per_cell(p.fmt.v, g),
                page_bytes(p.fmt.k, g) + page_bytes(p.fmt.v, g),
                ck.ok && cv.ok ? "ok" : ("unsupported: " + (!ck.ok ? ck.reason : cv.reason)).c_str());
  }
  std::printf("\nHalf formats and envelopes:\n");
  for (HalfFormat f : all_half_formats())
    std::printf("  %-9s scale %-34s %s\n", std::string(name(f)).c_str(),
                std::string(info(f).scale_granularity).c_str(), std::string(info(f).envelope).c_str());
  return 0;
}
}  // namespace

void register_formats(CLI::App& app) {
  auto o = std::make_shared<FormatsOpts>();
  auto* sub = app.add_subcommand("formats", "Print the KV format catalog (bytes per cell and per page)");
  sub->add_option("--head-dim", o->head_dim, "head_dim (D)")->capture_default_str();
  sub->add_option("--kv-heads", o->kv_heads, "KV heads (H)")->capture_default_str();
  sub->add_option("--block-size", o->block_size, "tokens per page (B)")->capture_default_str();
  sub->add_flag("--json", o->json, "JSON array, one object per preset");
  on_run(sub, [o] { return run_formats(*o); });
}

}  // namespace kvgate::cli
