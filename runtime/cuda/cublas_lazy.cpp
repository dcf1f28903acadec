// cuBLAS, loaded on first use. The CUDA forward (runtime/cuda/model/forward.cpp) calls seven cuBLAS
// functions; linking libcublas.so would load it -- and libcublasLt, several hundred MiB, relocated
// at start -- into every kvgate process, including the CPU-only commands (`kvgate formats`,
// `kvgate run --device cpu`). These definitions stand in for the library: the first call dlopens
// libcublas and every call forwards to the real function, so nothing of cuBLAS is mapped until
// --device cuda creates a handle. Measurements: docs/ARCHITECTURE.md, "CPU-only commands".
#include <dlfcn.h>

#include <cstdio>
#include <string>

#include <cublas_v2.h>

namespace {

void* cublas_library() {
  static void* handle = [] {
    void* h = nullptr;
    std::string tried;
    for (const char* name : {KVGATE_CUBLAS_PATH, KVGATE_CUBLAS_SONAME, "libcublas.so"}) {
      if (!name || !*name) continue;
      if ((h = dlopen(name, RTLD_NOW | RTLD_LOCAL))) return h;
      const char* e = dlerror();
      tried += std::string(tried.empty() ? "" : "; ") + (e ? e : name);
    }
    std::fprintf(stderr,
                 "kvgate: cannot load cuBLAS (%s). --device cuda needs the CUDA toolkit's %s on the library "
                 "path (LD_LIBRARY_PATH or ldconfig)\n",
                 tried.c_str(), KVGATE_CUBLAS_SONAME);
    return h;
  }();
  return handle;
}

template <typename Fn>
Fn cublas_symbol(const char* name) {
  void* h = cublas_library();
  return h ? reinterpret_cast<Fn>(dlsym(h, name)) : nullptr;
}

}  // namespace

// Hidden: the executable never offers these to a shared library (libcublas resolves its own).
#define KVGATE_CUBLAS_FORWARD(name, params, args)                                   \
  extern "C" __attribute__((visibility("hidden"))) cublasStatus_t CUBLASWINAPI name params { \
    using Fn = cublasStatus_t(CUBLASWINAPI*) params; /* cublasGemmEx is overloaded */ \
    static const Fn fn = cublas_symbol<Fn>(#name);                                  \
    return fn ? fn args : CUBLAS_STATUS_NOT_INITIALIZED;                            \
  }

KVGATE_CUBLAS_FORWARD(cublasCreate_v2, (cublasHandle_t* handle), (handle))
KVGATE_CUBLAS_FORWARD(cublasDestroy_v2, (cublasHandle_t handle), (handle))
KVGATE_CUBLAS_FORWARD(cublasSetStream_v2, (cublasHandle_t handle, cudaStream_t stream), (handle, stream))
KVGATE_CUBLAS_FORWARD(cublasSetWorkspace_v2, (cublasHandle_t handle, void* workspace, size_t bytes),
                      (handle, workspace, bytes))
KVGATE_CUBLAS_FORWARD(cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode), (handle, mode))
KVGATE_CUBLAS_FORWARD(cublasSgemm_v2,
                      (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                       const float* alpha, const float* A, int lda, const float* B, int ldb, const float* beta,
                       float* C, int ldc),
                      (handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
KVGATE_CUBLAS_FORWARD(cublasGemmEx,
                      (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
                       const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B,
                       cudaDataType Btype, int ldb, const void* beta, void* C, cudaDataType Ctype, int ldc,
                       cublasComputeType_t computeType, cublasGemmAlgo_t algo),
                      (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc,
                       computeType, algo))
