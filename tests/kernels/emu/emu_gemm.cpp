/* The CUDA kernels of kernels/cuda/gemm.cu and gemm_wgmma.cu, compiled for the host emulation. */
#include "gemm.cu"
#include "gemm_wgmma.cu"
