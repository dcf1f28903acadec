// The provenance's GPU count and topology (bench/matrix/src/provenance.cpp, gpu_topology): what a
// multi-GPU field report says about the rig. The parser reads `nvidia-smi topo -m` text; the
// fixtures below are written in that layout (tab-separated, the diagonal "X", then the CPU
// affinity columns), one of an 8-GPU NVLink board and one of two PCIe cards.
#include <string>

#include "catch_compat.hpp"
#include "kvgate/matrix.hpp"

using kvgate::matrix::gpu_topology;

TEST_CASE("matrix.provenance.gpu_topology every GPU pair's link, in order; none and one GPU named") {
  CHECK(gpu_topology("", 0).empty());
  CHECK(gpu_topology("anything", 1) == "single");
  const std::string pcie =
      "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
      "GPU0\t X \tPHB\t0-31\t0\t\tN/A\n"
      "GPU1\tPHB\t X \t0-31\t0\t\tN/A\n"
      "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe\n";
  CHECK(gpu_topology(pcie, 2) == "GPU0-GPU1:PHB");
  std::string nv = "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n";
  nv += "GPU0\t X \tNV18\tNV18\tSYS\t0-55\n";
  nv += "GPU1\tNV18\t X \tNV12\tNV18\t0-55\n";
  nv += "GPU2\tNV18\tNV12\t X \tNV18\t56-111\n";
  nv += "GPU3\tSYS\tNV18\tNV18\t X \t56-111\n";
  CHECK(gpu_topology(nv, 4) ==
        "GPU0-GPU1:NV18,GPU0-GPU2:NV18,GPU0-GPU3:SYS,GPU1-GPU2:NV12,GPU1-GPU3:NV18,GPU2-GPU3:NV18");
  // A pair the text does not give (nvidia-smi failed, or lists fewer GPUs) is "?", never a guess.
  CHECK(gpu_topology("", 2) == "GPU0-GPU1:?");
  CHECK(gpu_topology("GPU0\t X \tNV4\n", 3) == "GPU0-GPU1:NV4,GPU0-GPU2:?,GPU1-GPU2:?");
}
