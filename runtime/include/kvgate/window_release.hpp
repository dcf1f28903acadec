// The sliding-window release of one sequence's block table, shared by the CPU store
// (PagedKvStore::release_before) and the CUDA store (CudaKvStore::release_before).
#pragma once
#include <algorithm>
#include <cstddef>
#include <vector>

#include "kvgate/kv_store.hpp"

namespace kvgate {

// Gives back every whole page of a sequence of `length` tokens whose positions all lie before
// `first_kept_pos` (pages p with (p + 1) * block_size <= first_kept_pos, never the page being
// filled): free_block(b) for each block not released yet, its entry set to
// PagedKvStore::kReleasedBlock, `released` (the leading released entries) raised. Returns the pages
// released by this call.
template <class FreeBlock>
int release_table_prefix(std::vector<int>& blocks, int& released, int length, int block_size, int first_kept_pos,
                         FreeBlock&& free_block) {
  const int upto = std::min(std::max(0, first_kept_pos) / block_size, length / block_size);
  int n = 0;
  for (int p = released; p < upto; ++p, ++n) {
    free_block(blocks[static_cast<std::size_t>(p)]);
    blocks[static_cast<std::size_t>(p)] = PagedKvStore::kReleasedBlock;
  }
  released = std::max(released, upto);
  return n;
}

}  // namespace kvgate
