// The kernel wl-prog-drv loads with cuModuleLoadData: built alone into a fat binary and embedded.
extern "C" __global__ void wl_drv_add(unsigned *p, unsigned n, unsigned k) {
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] += k + i;
}
