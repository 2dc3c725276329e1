// What the fused split decode (cuda/attention/combine.cuh) relies on, checked on a GPU: which launch-attribute
// combinations a cooperative launch accepts, and their host cost. One combination per process, since a failed
// cooperative launch can poison the context (a grid sync in a non-cooperative launch did, on the H200):
//   nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o /tmp/coop_probe tools/coop_probe.cu
//   /tmp/coop_probe COOP PDL CLUSTER EXIT GRAPH [GRID]
// k: 384 threads, 200 KB dynamic smem (one CTA per SM), grid = SMs; warps 8..11 leave before the grid sync when
// EXIT=1 (as the attention kernels' producers do); after the sync every CTA checks that all CTAs' pre-sync writes
// are visible. Prints launch / run status, the check, and host us per launch (2000 back to back).
#include <cooperative_groups.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
namespace cg = cooperative_groups;
__global__ void __launch_bounds__(384, 1) k(int *flags, int *bad, int round, int exit_early) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  extern __shared__ int sm[];
  if (exit_early && threadIdx.x >= 256) return;
  if (threadIdx.x == 0) { flags[blockIdx.x] = round; sm[0] = round; }
  cg::this_grid().sync();
  if (threadIdx.x < gridDim.x / 256 + 1) {}
  for (int i = threadIdx.x; i < gridDim.x; i += blockDim.x)
    if (flags[i] != round) atomicAdd(bad, 1);
}
int main(int argc, char **argv) {
  int coop = atoi(argv[1]), pdl = atoi(argv[2]), cluster = atoi(argv[3]), ex = atoi(argv[4]), graph = atoi(argv[5]);
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  int grid = sms - sms % 2, smem = 200 * 1024;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int *flags, *bad; cudaMalloc(&flags, 4096); cudaMalloc(&bad, 4); cudaMemset(flags, 0, 4096); cudaMemset(bad, 0, 4);
  cudaStream_t s; cudaStreamCreate(&s);
  int maxb = -1; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&maxb, k, 384, smem);
  int maxc = -1;
  if (cluster > 1) {
    cudaLaunchConfig_t oc = {}; oc.gridDim = grid; oc.blockDim = 384; oc.dynamicSmemBytes = smem;
    cudaLaunchAttribute ca; ca.id = cudaLaunchAttributeClusterDimension; ca.val.clusterDim.x = cluster; ca.val.clusterDim.y = 1; ca.val.clusterDim.z = 1;
    oc.attrs = &ca; oc.numAttrs = 1; cudaError_t eo = cudaOccupancyMaxActiveClusters(&maxc, k, &oc);
    if (eo != cudaSuccess) { printf("maxActiveClusters: %s\n", cudaGetErrorString(eo)); cudaGetLastError(); }
  }
  if (argc > 6) grid = atoi(argv[6]);
  auto go = [&](int round) {
    cudaLaunchConfig_t cfg = {}; cfg.gridDim = grid; cfg.blockDim = 384; cfg.dynamicSmemBytes = smem; cfg.stream = s;
    cudaLaunchAttribute a[3]; int n = 0;
    if (coop) { a[n].id = cudaLaunchAttributeCooperative; a[n].val.cooperative = 1; ++n; }
    if (pdl) { a[n].id = cudaLaunchAttributeProgrammaticStreamSerialization; a[n].val.programmaticStreamSerializationAllowed = 1; ++n; }
    if (cluster > 1) { a[n].id = cudaLaunchAttributeClusterDimension; a[n].val.clusterDim.x = cluster; a[n].val.clusterDim.y = 1; a[n].val.clusterDim.z = 1; ++n; }
    cfg.attrs = a; cfg.numAttrs = n; return cudaLaunchKernelEx(&cfg, k, flags, bad, round, ex);
  };
  cudaError_t e1 = cudaSuccess, e2 = cudaSuccess; double us = -1;
  if (!graph) {
    e1 = go(1); e2 = cudaStreamSynchronize(s);
    if (e1 == cudaSuccess && e2 == cudaSuccess) {
      for (int r = 0; r < 3; ++r) { auto t0 = std::chrono::steady_clock::now(); for (int i = 0; i < 2000; ++i) go(2 + r * 2000 + i);
        us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 2000; e2 = cudaStreamSynchronize(s); }
    }
  } else {
    cudaGraph_t g; cudaGraphExec_t ge;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal); e1 = go(7); cudaError_t ec = cudaStreamEndCapture(s, &g);
    if (e1 == cudaSuccess) e1 = ec;
    if (e1 == cudaSuccess) e1 = cudaGraphInstantiate(&ge, g, 0);
    if (e1 == cudaSuccess) { for (int i = 0; i < 10; ++i) cudaGraphLaunch(ge, s); e2 = cudaStreamSynchronize(s); }
  }
  int b = -1; cudaMemcpy(&b, bad, 4, cudaMemcpyDeviceToHost);
  printf("coop=%d pdl=%d cluster=%d exit_early=%d graph=%d grid=%d maxActive/SM=%d maxActiveClusters=%d: launch %s, run %s, stale flags seen %d, host us/launch %.2f\n",
         coop, pdl, cluster, ex, graph, grid, maxb, maxc, cudaGetErrorString(e1), cudaGetErrorString(e2), b, us);
  return 0;
}
