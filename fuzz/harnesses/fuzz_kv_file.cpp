// libFuzzer harness: the conversation KV file parser (parse_kv_file), then the checks a restore
// makes against a small store (compatibility, hydratable prefix) and the restore itself.
#include <exception>
#include <span>

#include "fuzz_common.hpp"
#include "kvgate/kv_file.hpp"
#include "kvgate/kv_store.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const kvgate::KvFile f = kvgate::parse_kv_file(std::span<const std::uint8_t>(data, size), "fuzz.kv");
    const int prompt[] = {1, 2, 3, 4, 5, 6, 7, 8};
    (void)kvgate::hydratable_prefix(f, prompt);
    kvgate::StoreConfig sc;
    sc.format = f.header.format();
    sc.n_layers = f.header.n_layers;
    sc.n_kv_heads = f.header.n_kv_heads;
    sc.head_dim = f.header.head_dim;
    sc.block_size = f.header.block_size;
    // Only a store of a sane size is built (the parser already refused impossible shapes).
    const std::uint64_t cells = static_cast<std::uint64_t>(sc.n_layers) * sc.n_kv_heads * sc.head_dim *
                                (static_cast<std::uint64_t>(f.header.used_tokens) + sc.block_size);
    if (cells > (1u << 22)) return 0;
    sc.n_blocks = (f.header.used_tokens + sc.block_size - 1) / sc.block_size + 1;
    kvgate::PagedKvStore store(sc);
    const kvgate::SeqId s = store.create_sequence();
    kvgate::check_kv_file_compatible(f, store, f.header.fingerprint);
    kvgate::restore_kv_file(f, store, s, f.header.used_tokens, f.header.fingerprint);
  } catch (const std::exception&) {
  }
  return 0;
}
